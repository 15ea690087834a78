package naive

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/payment"
)

// Retention is how long records are kept when ShortRetention is off:
// longer than the longest replay window (an operator's replay, 30 days).
const Retention = 31 * 24 * time.Hour

// ShortRetentionWindow is what ShortRetention keeps them for.
const ShortRetentionWindow = 24 * time.Hour

// DefaultCacheTTL is the ExpiringCache's TTL: SET key NX EX 600.
const DefaultCacheTTL = 10 * time.Minute

// Config is what a Service needs.
type Config struct {
	// DB is the PostgreSQL the service keeps its orders and records in,
	// in a schema of its own ("naive_" and its mistakes), created if missing.
	DB *gorm.DB
	// ChannelURL is the real mock payment channel (cmd/paymentchannel, or
	// the one `make run` embeds on 127.0.0.1:8081).
	ChannelURL string
	// Mistakes switches the mistakes on.
	Mistakes Mistakes
	// CacheTTL is the ExpiringCache's TTL (default DefaultCacheTTL).
	CacheTTL time.Duration
}

// Service is the naive order service. Its handler serves
//
//	POST /v1/orders            create (Idempotency-Key required)
//	POST /v1/orders/{id}/pay   pay through the channel (Idempotency-Key required)
//	GET  /v1/orders/{id}, GET /v1/orders?customer_id=…
//	POST /admin/advance?by=48h move its clock on; POST /admin/cleanup apply its retention
type Service struct {
	db       *gorm.DB
	m        Mistakes
	channel  *payment.Client
	clock    Clock
	cache    *ttlCache
	orders   string // the tables, schema-qualified
	requests string

	mu   sync.Mutex
	hold *gate // CheckThenInsert: holds requests between the check and the insert
}

// reply is an answer, as a record stores and replays it.
type reply struct {
	Status int
	Body   []byte
}

// New creates the service's schema if missing and returns the service.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.DB == nil || cfg.ChannelURL == "" {
		return nil, errors.New("naive: a database and the payment channel's URL are required")
	}
	schema := cfg.Mistakes.schema()
	s := &Service{db: cfg.DB, m: cfg.Mistakes, orders: schema + ".orders", requests: schema + ".requests",
		channel: payment.NewClient(cfg.ChannelURL, &http.Client{Timeout: 10 * time.Second})}
	ttl := cfg.CacheTTL
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	s.cache = &ttlCache{ttl: ttl, clock: &s.clock, entries: map[string]cacheEntry{}}
	ddl := []string{
		`SELECT pg_advisory_xact_lock(hashtext('` + schema + `'))`, // two starts at once must not race on the DDL
		`CREATE SCHEMA IF NOT EXISTS ` + schema,
		`CREATE TABLE IF NOT EXISTS ` + s.orders + ` (id text PRIMARY KEY, customer_id text NOT NULL,
			status text NOT NULL, currency text NOT NULL, items text NOT NULL, total_amount bigint NOT NULL,
			charge_id text NOT NULL DEFAULT '', created_at timestamptz NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + s.requests + ` (operation text NOT NULL, scope text NOT NULL,
			status int NOT NULL DEFAULT 0, body text NOT NULL DEFAULT '', created_at timestamptz NOT NULL)`,
	}
	if !s.m.CheckThenInsert {
		// The right way: the database decides which request owns a key.
		ddl = append(ddl, `CREATE UNIQUE INDEX IF NOT EXISTS requests_scope ON `+s.requests+` (operation, scope)`)
	}
	// (With CheckThenInsert the table has no unique constraint: the SELECT
	// in claim is all that stands between two requests. The wrong line is
	// the one missing here.)
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for _, stmt := range ddl {
			if err := tx.Exec(stmt).Error; err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("naive: schema %s: %w", schema, err)
	}
	return s, nil
}

// Mistakes are the mistakes the service makes.
func (s *Service) Mistakes() Mistakes { return s.m }

// Schema is where the service keeps its tables.
func (s *Service) Schema() string { return s.m.schema() }

// Clock is the service's clock, for lessons and tests to move on.
func (s *Service) Clock() *Clock { return &s.clock }

// The idempotency record, the right way and the wrong ways.

// claim makes this request the one that executes operation under scope, or
// returns the reply stored by the one that did (Status 0: not yet stored).
func (s *Service) claim(db *gorm.DB, operation, scope string) (won bool, first *reply, err error) {
	if s.m.ExpiringCache {
		// WRONG: the key lives in a cache with a TTL. Once the entry
		// expires (or the cache is flushed, or evicts it under memory
		// pressure), the key is forgotten and its retry runs again.
		won, first := s.cache.setNX(operation + " " + scope)
		return won, first, nil
	}
	if s.m.CheckThenInsert {
		// WRONG: look first, insert after. Two requests that look at the
		// same moment both find nothing, and both insert.
		first, err := s.stored(db, operation, scope)
		if err != nil || first != nil {
			return false, first, err
		}
		s.window()
		return true, nil, db.Exec(`INSERT INTO `+s.requests+` (operation, scope, created_at) VALUES (?, ?, ?)`,
			operation, scope, s.clock.Now()).Error
	}
	// Right: insert, and let the unique index decide. A duplicate's insert
	// waits for the first one's transaction, then does nothing; it reads
	// what the first stored.
	res := db.Exec(`INSERT INTO `+s.requests+` (operation, scope, created_at) VALUES (?, ?, ?)
		ON CONFLICT (operation, scope) DO NOTHING`, operation, scope, s.clock.Now())
	if res.Error != nil {
		return false, nil, res.Error
	}
	if res.RowsAffected == 1 {
		return true, nil, nil
	}
	first, err = s.stored(db, operation, scope)
	return false, first, err
}

func (s *Service) stored(db *gorm.DB, operation, scope string) (*reply, error) {
	var rows []reply
	err := db.Raw(`SELECT status, body FROM `+s.requests+` WHERE operation = ? AND scope = ? LIMIT 1`, operation, scope).Scan(&rows).Error
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return &rows[0], nil
}

// complete stores the reply of the request that won the key. A reply once
// stored is never overwritten (status = 0: only a row still waiting for
// its reply). With CheckThenInsert's duplicate rows that also keeps each
// winner to its own row: updating the others' rows too would lock them in
// whatever order each winner met them, and PostgreSQL would end the
// crossing waits as a deadlock.
func (s *Service) complete(db *gorm.DB, operation, scope string, r reply) error {
	if s.m.ExpiringCache {
		s.cache.put(operation+" "+scope, r)
		return nil
	}
	return db.Exec(`UPDATE `+s.requests+` SET status = ?, body = ? WHERE operation = ? AND scope = ? AND status = 0`,
		r.Status, string(r.Body), operation, scope).Error
}

// release forgets a key whose outcome is unknown, so that its retry runs again.
func (s *Service) release(ctx context.Context, operation, scope string) error {
	if s.m.ExpiringCache {
		s.cache.del(operation + " " + scope)
		return nil
	}
	return s.db.WithContext(ctx).Exec(`DELETE FROM `+s.requests+` WHERE operation = ? AND scope = ?`, operation, scope).Error
}

// duplicate is the answer to a request that lost the key to first.
func (s *Service) duplicate(first *reply) (r reply, replayed bool) {
	if s.m.SuccessOnAnyDuplicate {
		// WRONG: whatever the first request's outcome was (declined, not
		// found, still running), the duplicate is told it went well.
		return reply{http.StatusOK, []byte(`{"message":"already processed"}`)}, false
	}
	if first == nil || first.Status == 0 {
		return problem(http.StatusConflict, "request_in_progress", "the first request with this key is still running"), false
	}
	return *first, true // right: the first real result, whatever it was
}

// RetentionWindow is how long the service keeps its records.
func (s *Service) RetentionWindow() time.Duration {
	if s.m.ShortRetention {
		return ShortRetentionWindow // WRONG: shorter than the broker's 7 days and an operator's 30
	}
	return Retention
}

// Cleanup deletes the records older than the retention window, as a
// nightly job would, and returns how many it deleted.
func (s *Service) Cleanup(ctx context.Context) (int64, error) {
	res := s.db.WithContext(ctx).Exec(`DELETE FROM `+s.requests+` WHERE created_at < ?`, s.clock.Now().Add(-s.RetentionWindow()))
	return res.RowsAffected, res.Error
}

// The use cases.

type item struct {
	SKU       string `json:"sku"`
	Quantity  int64  `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
}

type createRequest struct {
	CustomerID string `json:"customer_id"`
	Currency   string `json:"currency"`
	Items      []item `json:"items"`
}

// Order is an order as the naive service answers it.
type Order struct {
	ID          string    `json:"id"`
	CustomerID  string    `json:"customer_id"`
	Status      string    `json:"status"`
	Currency    string    `json:"currency"`
	Items       []item    `json:"items" gorm:"serializer:json"`
	TotalAmount int64     `json:"total_amount"`
	ChargeID    string    `json:"charge_id,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
}

func (s *Service) create(ctx context.Context, key string, req createRequest) (reply, bool, error) {
	scope := key // right: the key names the intent
	if s.m.DedupOnCustomerProduct {
		// WRONG: customer + products name an entity, not an intent. Two real
		// purchases of the same thing look like one.
		skus := make([]string, len(req.Items))
		for i, it := range req.Items {
			skus[i] = it.SKU
		}
		scope = req.CustomerID + " " + strings.Join(skus, ",")
	}
	var out reply
	replayed := false
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		won, first, err := s.claim(tx, "create", scope)
		if err != nil || !won {
			out, replayed = s.duplicate(first)
			return err
		}
		o := Order{ID: uuid.Must(uuid.NewV7()).String(), CustomerID: req.CustomerID, Status: "CREATED",
			Currency: strings.ToUpper(req.Currency), Items: req.Items, CreatedAt: s.clock.Now().UTC()}
		for _, it := range req.Items {
			o.TotalAmount += it.Quantity * it.UnitPrice
		}
		if err := tx.Table(s.orders).Create(&o).Error; err != nil {
			return err
		}
		out = reply{http.StatusCreated, mustJSON(o)}
		return s.complete(tx, "create", scope, out) // in the order's transaction: both or neither
	})
	return out, replayed, err
}

func (s *Service) pay(ctx context.Context, orderID, key, method string) (reply, bool, error) {
	o, err := s.order(ctx, orderID)
	if err != nil || o == nil {
		return problem(http.StatusNotFound, "not_found", "no such order"), false, err
	}
	won, first, err := s.claim(s.db.WithContext(ctx), "pay", key)
	if err != nil || !won {
		out, replayed := s.duplicate(first)
		return out, replayed, err
	}
	// Right: one key for the intent, derived from it, the same on every attempt.
	sum := sha256.Sum256([]byte(o.ID + " " + key))
	channelKey := "naive-" + hex.EncodeToString(sum[:16])
	if s.m.NewChannelKeyPerRetry {
		// WRONG: a new key per attempt. The channel cannot tell a retry from
		// a new payment, so a retry after a lost answer is charged again.
		channelKey = uuid.NewString()
	}
	work := context.WithoutCancel(ctx) // a client that hangs up must not cut a charge in half
	res, err := s.channel.Charge(work, channelKey, payment.ChargeRequest{Amount: o.TotalAmount, Currency: o.Currency,
		Reference: o.ID, PaymentMethod: method})
	if errors.Is(err, payment.ErrUnavailable) {
		// The charge may or may not have been made: forget the key so the
		// retry runs again, under the same channel key (unless that is the mistake).
		r := problem(http.StatusServiceUnavailable, "payment_channel_unavailable", "the outcome is unknown; retry with the same key")
		return r, false, s.release(work, "pay", key)
	}
	var out reply
	switch {
	case err != nil:
		out = problem(http.StatusUnprocessableEntity, "payment_rejected", err.Error())
	case res.Value.Status == payment.StatusDeclined:
		o.Status = "PAYMENT_FAILED"
		out = problem(http.StatusPaymentRequired, "payment_declined", "the payment channel declined the charge")
	case res.Value.Status == payment.StatusPending:
		o.Status, o.ChargeID = "PAYMENT_PENDING", res.Value.ID
		out = reply{http.StatusAccepted, nil}
	default:
		o.Status, o.ChargeID = "PAID", res.Value.ID
		out = reply{http.StatusOK, nil}
	}
	if out.Body == nil {
		out.Body = mustJSON(o)
	}
	err = s.db.WithContext(work).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`UPDATE `+s.orders+` SET status = ?, charge_id = ? WHERE id = ?`, o.Status, o.ChargeID, o.ID).Error; err != nil {
			return err
		}
		return s.complete(tx, "pay", key, out)
	})
	return out, false, err
}

func (s *Service) order(ctx context.Context, id string) (*Order, error) {
	var found []Order
	err := s.db.WithContext(ctx).Table(s.orders).Where("id = ?", id).Find(&found).Error
	if err != nil || len(found) == 0 {
		return nil, err
	}
	return &found[0], nil
}

// OrdersOf lists a customer's orders, oldest first.
func (s *Service) OrdersOf(ctx context.Context, customer string) ([]Order, error) {
	var list []Order
	err := s.db.WithContext(ctx).Table(s.orders).Where("customer_id = ?", customer).Order("created_at, id").Find(&list).Error
	return list, err
}

func problem(status int, code, detail string) reply {
	return reply{status, mustJSON(map[string]any{"status": status, "code": code, "detail": detail})}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own types are marshalled
	}
	return b
}
