package order

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
)

// The SQL of the order capability: unexported helpers that take the
// transaction their use case opened.

// insertOrder writes a new order, its items, its "create" history entry and
// its "created" event in the outbox.
func insertOrder(tx *gorm.DB, o *Order, op, key string) error {
	if err := tx.Omit(clause.Associations).Create(o).Error; err != nil {
		return err
	}
	if err := tx.Create(&o.Items).Error; err != nil {
		return err
	}
	if err := tx.Create(&HistoryEntry{OrderID: o.ID, Event: EventCreate, Operation: op, IdempotencyKey: key,
		ToStatus: o.Status, CreatedAt: o.CreatedAt}).Error; err != nil {
		return err
	}
	return writeOutbox(tx, o, "", EventCreate, op, key, o.CreatedAt)
}

// lockOrder reads the tenant's order with SELECT … FOR UPDATE: concurrent
// transitions of one order, from any instance, queue here.
func lockOrder(tx *gorm.DB, tenantID string, id uuid.UUID) (*Order, error) {
	var o Order
	err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).
		Where("tenant_id = ? AND id = ?", tenantID, id).Take(&o).Error
	if errors.Is(err, gorm.ErrRecordNotFound) && id == uuid.Nil { // a path that named no order at all
		return nil, errNoSuchID()
	}
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, errNotFound(id.String())
	}
	if err != nil {
		return nil, err
	}
	return &o, loadDetails(tx, &o)
}

// getOrder reads the tenant's order without locking it.
func getOrder(db *gorm.DB, tenantID string, id uuid.UUID) (*Order, error) {
	var o Order
	err := db.Where("tenant_id = ? AND id = ?", tenantID, id).Take(&o).Error
	if errors.Is(err, gorm.ErrRecordNotFound) && id == uuid.Nil { // a path that named no order at all
		return nil, errNoSuchID()
	}
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, errNotFound(id.String())
	}
	if err != nil {
		return nil, err
	}
	return &o, loadDetails(db, &o)
}

func loadDetails(db *gorm.DB, o *Order) error {
	if err := db.Where("order_id = ?", o.ID).Order("line_no").Find(&o.Items).Error; err != nil {
		return err
	}
	return db.Where("order_id = ?", o.ID).Order("created_at, id").Find(&o.payments).Error
}

// saveTransition writes the order's new status (and shipment fields), the
// history entry of the transition and its event in the outbox, in the
// caller's transaction. The version check is a second guard behind the row
// lock.
func saveTransition(tx *gorm.DB, o *Order, from Status, ev Event, op, key string) error {
	now := tx.NowFunc()
	res := tx.Model(&Order{}).Where("id = ? AND version = ?", o.ID, o.Version).Updates(map[string]any{
		"status": o.Status, "carrier": o.Carrier, "tracking_number": o.TrackingNumber,
		"version": o.Version + 1, "updated_at": now,
	})
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("order %s changed under its row lock", o.ID)
	}
	o.Version++
	o.UpdatedAt = now
	if err := tx.Create(&HistoryEntry{OrderID: o.ID, Event: ev, Operation: op, IdempotencyKey: key,
		FromStatus: from, ToStatus: o.Status, CreatedAt: now}).Error; err != nil {
		return err
	}
	return writeOutbox(tx, o, from, ev, op, key, now)
}

// insertPayment writes the pending payment of a money intent's phase 1.
func insertPayment(tx *gorm.DB, p *Payment) error { return tx.Create(p).Error }

// pendingPayment finds the payment an earlier attempt of the intent wrote.
func pendingPayment(db *gorm.DB, scope idempotency.Scope) (p Payment, found bool, err error) {
	err = db.Where("tenant_id = ? AND operation = ? AND idempotency_key = ?", scope.TenantID, scope.Operation, scope.Key).Take(&p).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Payment{}, false, nil
	}
	return p, err == nil, err
}

// storePaymentReply stores the channel's reply on the pending payment id and
// returns when it did; errNotPending when the payment's verdict is stored
// already.
func storePaymentReply(tx *gorm.DB, id uuid.UUID, status PaymentStatus, channelRef *string) (time.Time, error) {
	now := tx.NowFunc()
	res := tx.Model(&Payment{}).Where("id = ? AND status = ?", id, PaymentPending).
		Updates(map[string]any{"status": status, "channel_ref": channelRef, "updated_at": now})
	if res.Error != nil {
		return now, res.Error
	}
	if res.RowsAffected != 1 {
		return now, errNotPending
	}
	return now, nil
}

// errNotPending: the payment's verdict was stored before this reply's.
var errNotPending = errors.New("the payment is not pending")

// paymentByChannelKey finds the payment an intent asked the channel for
// under key, in any tenant (the channel's events name the key, not the
// tenant).
func paymentByChannelKey(db *gorm.DB, key string) (p Payment, found bool, err error) {
	err = db.Where("channel_key = ?", key).Take(&p).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Payment{}, false, nil
	}
	return p, err == nil, err
}

// pendingAfterTheirIntent lists up to limit payments still pending whose
// intent has ended (its record is definitive, or gone) and that nobody
// asked the channel about since before: the charges the channel took on
// and whose verdict no webhook has brought yet.
func pendingAfterTheirIntent(db *gorm.DB, before time.Time, limit int) ([]Payment, error) {
	var ps []Payment
	err := db.Raw(`
		SELECT p.* FROM payments p
		WHERE p.status = 'pending' AND p.updated_at < ?
		  AND NOT EXISTS (SELECT 1 FROM idempotency_records r
		                  WHERE r.tenant_id = p.tenant_id AND r.operation = p.operation
		                    AND r.idempotency_key = p.idempotency_key
		                    AND r.state IN ('PROCESSING', 'FAILED_RETRYABLE'))
		ORDER BY p.updated_at
		LIMIT ?`, before, limit).Find(&ps).Error
	return ps, err
}

// touchPending notes that the channel was asked about a payment that is
// still pending, so the next sweeps ask about the others first.
func touchPending(db *gorm.DB, id uuid.UUID) error {
	return db.Exec("UPDATE payments SET updated_at = now() WHERE id = ? AND status = 'pending'", id).Error
}

// PageRequest is one page of a keyset-paginated list: at most Limit rows
// (1–100, default 20) after the position Cursor names ("" for the start).
type PageRequest struct {
	Limit  int
	Cursor string
}

// Bounds of a page, as api/openapi.yaml states them.
const (
	defaultPageLimit = 20
	maxPageLimit     = 100
)

// check applies the default limit and rejects one out of bounds.
func (p *PageRequest) check() error {
	if p.Limit == 0 {
		p.Limit = defaultPageLimit
	}
	if p.Limit < 1 || p.Limit > maxPageLimit {
		return invalid("limit", "must be between 1 and %d", maxPageLimit)
	}
	return nil
}

// ListFilter selects and pages a tenant's orders, newest first.
type ListFilter struct {
	Status     Status
	CustomerID string
	Page       PageRequest
}

// Page is one page of orders and the cursor of the next page ("" at the end).
type Page struct {
	Orders     []*Order `json:"orders"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// listOrders pages with a keyset on the id: UUIDv7 ids sort by creation
// time, so "WHERE id < cursor ORDER BY id DESC" is newest first and stays
// stable while new orders arrive.
func listOrders(db *gorm.DB, tenantID string, f ListFilter) (Page, error) {
	q := db.Where("tenant_id = ?", tenantID)
	if f.Status != "" {
		q = q.Where("status = ?", f.Status)
	}
	if f.CustomerID != "" {
		q = q.Where("customer_id = ?", f.CustomerID)
	}
	if f.Page.Cursor != "" {
		after, err := decodeCursor(f.Page.Cursor)
		if err != nil {
			return Page{}, err
		}
		q = q.Where("id < ?", after)
	}
	var orders []*Order
	limit := f.Page.Limit
	if err := q.Order("id DESC").Limit(limit + 1).Find(&orders).Error; err != nil {
		return Page{}, err
	}
	page := Page{Orders: orders}
	if len(orders) > limit {
		page.Orders = orders[:limit]
		page.NextCursor = encodeCursor(page.Orders[limit-1].ID[:])
	}
	if err := loadPageDetails(db, page.Orders); err != nil {
		return Page{}, err
	}
	return page, nil
}

// loadPageDetails loads items and payments of a page in two queries.
func loadPageDetails(db *gorm.DB, orders []*Order) error {
	if len(orders) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(orders))
	byID := make(map[uuid.UUID]*Order, len(orders))
	for i, o := range orders {
		ids[i], byID[o.ID] = o.ID, o
		o.Items = []Item{}
	}
	var items []Item
	if err := db.Where("order_id IN ?", ids).Order("order_id, line_no").Find(&items).Error; err != nil {
		return err
	}
	for _, it := range items {
		byID[it.OrderID].Items = append(byID[it.OrderID].Items, it)
	}
	var payments []Payment
	if err := db.Where("order_id IN ?", ids).Order("created_at, id").Find(&payments).Error; err != nil {
		return err
	}
	for _, p := range payments {
		byID[p.OrderID].payments = append(byID[p.OrderID].payments, p)
	}
	return nil
}

// A cursor is the opaque, URL-safe form of the last row's key.
func encodeCursor(key []byte) string { return base64.RawURLEncoding.EncodeToString(key) }

func decodeCursor(s string) (uuid.UUID, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != 16 {
		return uuid.UUID{}, badCursor()
	}
	return uuid.UUID(b), nil
}

func badCursor() error {
	return problem.Errorf(problem.InvalidRequest, "cursor: is not a cursor this service returned").With("field", "cursor")
}

// orderExists reports order_not_found unless the tenant has the order.
func orderExists(db *gorm.DB, tenantID string, id uuid.UUID) error {
	var n int64
	if err := db.Model(&Order{}).Where("tenant_id = ? AND id = ?", tenantID, id).Count(&n).Error; err != nil {
		return err
	}
	if n == 0 {
		return errNotFound(id.String())
	}
	return nil
}

// HistoryPage is one page of an order's history and the cursor of the next
// page ("" at the end).
type HistoryPage struct {
	Events     []HistoryEntry `json:"events"`
	NextCursor string         `json:"next_cursor,omitempty"`
}

// history pages through the order's transitions, oldest first, keyed on
// the entry's id (assigned in commit order of one order's row lock).
func history(db *gorm.DB, orderID uuid.UUID, pg PageRequest) (HistoryPage, error) {
	q := db.Where("order_id = ?", orderID)
	if pg.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(pg.Cursor)
		if err != nil || len(b) != 8 {
			return HistoryPage{}, badCursor()
		}
		q = q.Where("id > ?", int64(binary.BigEndian.Uint64(b)))
	}
	entries := []HistoryEntry{}
	if err := q.Order("id").Limit(pg.Limit + 1).Find(&entries).Error; err != nil {
		return HistoryPage{}, err
	}
	page := HistoryPage{Events: entries}
	if len(entries) > pg.Limit {
		page.Events = entries[:pg.Limit]
		page.NextCursor = encodeCursor(binary.BigEndian.AppendUint64(nil, uint64(page.Events[pg.Limit-1].ID)))
	}
	return page, nil
}
