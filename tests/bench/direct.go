package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/orderservice/orderservice/internal/order"
)

// directCreate is the SQL baseline: an http.RoundTripper that, instead of
// sending the request anywhere, runs a create transaction itself over pgx
// and answers a synthetic 201. Given to vegeta as its client's Transport, it
// is measured by the same load generator as the service, with no HTTP
// server, router, GORM or idempotency package in the way: what is left is
// the database's own cost of the transaction.
//
// The statements mirror internal/order and internal/idempotency one for
// one, each its own round trip as there (no pipelining). With a record
// (the default), as the service runs a create:
//
//	SELECT … FROM idempotency_records WHERE <key> AND state IN ('SUCCEEDED', 'FAILED_FINAL')   (Store.Replay; autocommit)
//	BEGIN
//	INSERT INTO idempotency_records … 'SUCCEEDED', <the order's JSON> … ON CONFLICT DO NOTHING   (Store.Record)
//	INSERT INTO orders …
//	INSERT INTO order_items … (all lines in one statement)
//	INSERT INTO order_events …
//	INSERT INTO order_outbox … (the "created" event, with the order as its payload)
//	COMMIT
//
// withoutRecord writes the same order rows and nothing else, in the same
// transaction: the layer's cost is the difference. claimFirst is the
// protocol the service ran before Store.Record, the before half of what it
// bought: the same read, then a claim (INSERT … 'PROCESSING' … ON CONFLICT
// DO NOTHING) as the transaction's first write and a completion (a HOT
// UPDATE to SUCCEEDED with the body) as its last. replayRead and replayTx
// answer a key that already succeeded, by one SELECT or by the transaction
// the service used to run for a replay. The oneTrip modes send withRecord's
// and withoutRecord's statements as one pipelined batch each, as no
// service here does (the record's insert without its ON CONFLICT, which a
// batch cannot use): they measure the floor, what the record costs the
// database when round trips cost nothing.
type directCreate struct {
	pool      *pgxpool.Pool
	lease     time.Duration
	retention time.Duration
	mode      directMode
}

// directMode is what a directCreate runs.
type directMode int

const (
	withRecord directMode = iota
	withoutRecord
	claimFirst
	replayRead
	replayTx
	// oneTripWithRecord and oneTripWithoutRecord send withRecord's and
	// withoutRecord's statements as one pipelined batch each
	// (createInOneTrip), the record's insert a plain INSERT there: what the
	// layer costs once round trips cost nothing.
	oneTripWithRecord
	oneTripWithoutRecord
)

// newDirectCreate opens a pgx pool of maxConns connections with the
// session settings the service gives its own.
func newDirectCreate(ctx context.Context, dbURL string, mode directMode, maxConns int, lease, retention, statementTimeout, lockTimeout time.Duration) (*directCreate, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(maxConns)
	rp := cfg.ConnConfig.RuntimeParams
	rp["statement_timeout"] = strconv.FormatInt(statementTimeout.Milliseconds(), 10)
	rp["lock_timeout"] = strconv.FormatInt(lockTimeout.Milliseconds(), 10)
	rp["idle_in_transaction_session_timeout"] = "60000"
	rp["application_name"] = "bench-direct"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &directCreate{pool: pool, lease: lease, retention: retention, mode: mode}, nil
}

func (d *directCreate) Close() { d.pool.Close() }

// sharing is a directCreate that runs mode over d's pool: the database's
// connections are few, and two paths never run at once.
func (d *directCreate) sharing(mode directMode) *directCreate {
	shared := *d
	shared.mode = mode
	return &shared
}

var errDirectDuplicate = errors.New("direct create: the idempotency key was already claimed")

// RoundTrip runs one create and answers as the service would: 201, Location
// and the order as JSON.
func (d *directCreate) RoundTrip(req *http.Request) (*http.Response, error) {
	raw, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	var in createBody
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, err
	}
	// The service hashes a canonical form of the fields; the raw body is an
	// equally long input, and the column only needs 64 hex digits.
	sum := sha256.Sum256(raw)
	key, fingerprint := req.Header.Get("Idempotency-Key"), hex.EncodeToString(sum[:])
	var body []byte
	var location string
	switch d.mode {
	case replayRead:
		body, location, err = d.replayByRead(req.Context(), key, fingerprint)
	case replayTx:
		body, location, err = d.replayInTx(req.Context(), key, fingerprint)
	default:
		body, location, err = d.create(req.Context(), key, fingerprint, in)
	}
	if err != nil {
		return nil, err
	}
	return &http.Response{
		Status: "201 Created", StatusCode: http.StatusCreated,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}, "Location": {location}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}, nil
}

// orderView is the order as the service renders it (internal/order/view.go),
// so the stored response body has the same size.
type orderView struct {
	ID          string            `json:"id"`
	CustomerID  string            `json:"customer_id"`
	Status      string            `json:"status"`
	Currency    string            `json:"currency"`
	Items       []itemView        `json:"items"`
	TotalAmount int64             `json:"total_amount"`
	Metadata    map[string]string `json:"metadata"`
	Payment     *struct{}         `json:"payment"`
	Shipment    *struct{}         `json:"shipment"`
	Version     int64             `json:"version"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
}

type itemView struct {
	SKU       string `json:"sku"`
	Quantity  int    `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
	LineTotal int64  `json:"line_total"`
}

func (d *directCreate) create(ctx context.Context, key, fingerprint string, in createBody) (body []byte, location string, err error) {
	rows, err := renderCreate(key, in)
	if err != nil {
		return nil, "", err
	}
	location = "/v1/orders/" + rows.order.ID
	if d.mode == oneTripWithRecord || d.mode == oneTripWithoutRecord {
		return rows.body, location, d.createInOneTrip(ctx, key, fingerprint, rows)
	}
	if d.mode != withoutRecord {
		if _, _, err := d.replayByRead(ctx, key, fingerprint); !errors.Is(err, errDirectNoOutcome) {
			return nil, "", fmt.Errorf("direct create: the read before the write found %v", err)
		}
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, "", err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	var token int64
	switch d.mode {
	case withRecord:
		tag, err := tx.Exec(ctx, sqlRecord+` ON CONFLICT DO NOTHING`, d.recordArgs(key, fingerprint, rows)...)
		if err != nil {
			return nil, "", err
		}
		if tag.RowsAffected() != 1 {
			return nil, "", errDirectDuplicate
		}
	case claimFirst:
		err = tx.QueryRow(ctx, `
			INSERT INTO idempotency_records
				(tenant_id, operation, idempotency_key, fingerprint, state, resource_id, lease_token, lease_expires_at, attempts,
				 expires_at, resumable)
			VALUES ($1, $2, $3, $4, 'PROCESSING', NULLIF($5, ''), 1, CASE WHEN $6 THEN now() + make_interval(secs => $7) END, 1,
				now() + make_interval(secs => $8), $9)
			ON CONFLICT DO NOTHING
			RETURNING lease_token`,
			benchTenant, "order.create", key, fingerprint, "", false, d.lease.Seconds(), d.retention.Seconds(), false).Scan(&token)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, "", errDirectDuplicate
		}
		if err != nil {
			return nil, "", err
		}
	}

	if _, err := tx.Exec(ctx, sqlOrder, rows.orderArgs()...); err != nil {
		return nil, "", err
	}
	if _, err := tx.Exec(ctx, rows.itemsSQL, rows.itemsArgs...); err != nil {
		return nil, "", err
	}
	// GORM reads back the generated ids of the history and outbox rows.
	var historyID, outboxID int64
	if err := tx.QueryRow(ctx, sqlEvent, rows.eventArgs(key)...).Scan(&historyID); err != nil {
		return nil, "", err
	}
	if err := tx.QueryRow(ctx, sqlOutbox, rows.outboxArgs()...).Scan(&outboxID); err != nil {
		return nil, "", err
	}

	if d.mode == claimFirst {
		tag, err := tx.Exec(ctx, `
			UPDATE idempotency_records
			SET state = $1, resource_id = COALESCE(NULLIF($2, ''), resource_id),
			    outcome = 'created', result_body = $3,
			    completed_at = now(), expires_at = now() + make_interval(secs => $4),
			    lease_expires_at = NULL, updated_at = now()
			WHERE tenant_id = $5 AND operation = $6 AND idempotency_key = $7
			  AND lease_token = $8 AND state = 'PROCESSING'`,
			"SUCCEEDED", rows.order.ID, rows.body, d.retention.Seconds(),
			benchTenant, "order.create", key, token)
		if err != nil {
			return nil, "", err
		}
		if tag.RowsAffected() != 1 {
			return nil, "", errors.New("direct create: the record was not PROCESSING under our token")
		}
	}
	return rows.body, location, tx.Commit(ctx)
}

// createInOneTrip sends the create's statements, the read before it
// included, as one pipelined batch: PostgreSQL runs a batch as one
// implicit transaction and commits it at its end, so the whole create is
// one round trip, the least it can cost in round trips. With both paths
// sent so, what the record still costs is its own read and write. The
// read's answer is looked at only once the whole batch has run, so it
// stops nothing: the record's insert has no ON CONFLICT here, and a key
// already taken fails it and aborts the batch, the order's rows with it.
func (d *directCreate) createInOneTrip(ctx context.Context, key, fingerprint string, rows createRows) error {
	var b pgx.Batch
	if d.mode == oneTripWithRecord {
		b.Queue(sqlReplayRead, benchTenant, "order.create", key).Query(func(found pgx.Rows) error {
			if found.Next() {
				return errors.New("direct create: the read before the write found an outcome")
			}
			return found.Err()
		})
		b.Queue(sqlRecord, d.recordArgs(key, fingerprint, rows)...)
	}
	b.Queue(sqlOrder, rows.orderArgs()...)
	b.Queue(rows.itemsSQL, rows.itemsArgs...)
	b.Queue(sqlEvent, rows.eventArgs(key)...)
	b.Queue(sqlOutbox, rows.outboxArgs()...)
	return d.pool.SendBatch(ctx, &b).Close()
}

// The statements of a create, as internal/idempotency and internal/order
// send them.
const (
	sqlReplayRead = `
		SELECT fingerprint, state, resource_id, outcome, result_code, result_body
		FROM idempotency_records
		WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND state IN ('SUCCEEDED', 'FAILED_FINAL')`
	sqlRecord = `
		INSERT INTO idempotency_records
			(tenant_id, operation, idempotency_key, fingerprint, state, resource_id, outcome, result_code, result_body,
			 lease_token, attempts, completed_at, expires_at, resumable)
		VALUES ($1, $2, $3, $4, 'SUCCEEDED', $5, 'created', NULL, $6,
			1, 1, now(), now() + make_interval(secs => $7), false)`
	sqlOrder = `
		INSERT INTO orders (id, tenant_id, customer_id, status, currency, total_amount, metadata,
			carrier, tracking_number, version, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`
	sqlEvent = `
		INSERT INTO order_events (order_id, event, operation, idempotency_key, from_status, to_status, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`
	sqlOutbox = `
		INSERT INTO order_outbox (event_id, tenant_id, order_id, event, payload, created_at)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`
)

// createRows is what one create writes, rendered once, before any
// statement is sent, as Service.Create renders it.
type createRows struct {
	id        uuid.UUID
	now       time.Time
	order     orderView
	body      []byte // the order's JSON: the 201's body, the record's result and the event's payload
	itemsSQL  string // all lines in one statement
	itemsArgs []any
	eventID   uuid.UUID
	payload   []byte
}

func renderCreate(key string, in createBody) (createRows, error) {
	var r createRows
	var err error
	if r.id, err = uuid.NewV7(); err != nil {
		return r, err
	}
	if r.eventID, err = uuid.NewV7(); err != nil {
		return r, err
	}
	r.now = time.Now().UTC().Truncate(time.Microsecond)
	o := orderView{ID: r.id.String(), CustomerID: in.CustomerID, Status: "CREATED", Currency: in.Currency,
		Metadata: map[string]string{}, Version: 1, CreatedAt: r.now, UpdatedAt: r.now}
	values := make([]string, len(in.Items))
	r.itemsArgs = make([]any, 0, 6*len(in.Items))
	for i, it := range in.Items {
		line := it.UnitPrice * int64(it.Quantity)
		o.Items = append(o.Items, itemView{SKU: it.SKU, Quantity: it.Quantity, UnitPrice: it.UnitPrice, LineTotal: line})
		o.TotalAmount += line
		p := 6 * i
		values[i] = fmt.Sprintf("($%d, $%d, $%d, $%d, $%d, $%d)", p+1, p+2, p+3, p+4, p+5, p+6)
		r.itemsArgs = append(r.itemsArgs, r.id, i+1, it.SKU, it.Quantity, it.UnitPrice, line)
	}
	r.order = o
	r.itemsSQL = `INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price, line_total) VALUES ` + strings.Join(values, ", ")
	if r.body, err = json.Marshal(o); err != nil {
		return r, err
	}
	r.payload, err = json.Marshal(order.EventMessage{EventID: r.eventID.String(), Event: "created", OrderID: o.ID,
		ToStatus: order.Status(o.Status), Operation: "order.create", IdempotencyKey: key, OccurredAt: r.now, Order: r.body})
	return r, err
}

func (d *directCreate) recordArgs(key, fingerprint string, r createRows) []any {
	return []any{benchTenant, "order.create", key, fingerprint, r.order.ID, r.body, d.retention.Seconds()}
}

func (r createRows) orderArgs() []any {
	o := r.order
	return []any{r.id, benchTenant, o.CustomerID, o.Status, o.Currency, o.TotalAmount, "{}", nil, nil, o.Version, r.now, r.now}
}

func (r createRows) eventArgs(key string) []any {
	return []any{r.id, "create", "order.create", key, "", r.order.Status, r.now}
}

func (r createRows) outboxArgs() []any {
	return []any{r.eventID, benchTenant, r.id, "created", r.payload, r.now}
}

var errDirectNoOutcome = errors.New("direct replay: the key has no stored outcome")

// replayByRead is the replay as Store.Replay does it: one autocommit
// SELECT by primary key.
func (d *directCreate) replayByRead(ctx context.Context, key, fingerprint string) ([]byte, string, error) {
	var fp, resource string
	var body []byte
	err := d.pool.QueryRow(ctx, sqlReplayRead, benchTenant, "order.create", key).Scan(&fp, nil, &resource, nil, nil, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, "", errDirectNoOutcome
	}
	return body, "/v1/orders/" + resource, err
}

// replayInTx is the replay as the service ran it before Store.Replay: a
// write transaction whose claim finds the key taken, then reads the row.
func (d *directCreate) replayInTx(ctx context.Context, key, fingerprint string) ([]byte, string, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, "", err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var token int64
	err = tx.QueryRow(ctx, `
		INSERT INTO idempotency_records
			(tenant_id, operation, idempotency_key, fingerprint, state, resource_id, lease_token, lease_expires_at, attempts)
		VALUES ($1, $2, $3, $4, 'PROCESSING', NULL, 1, now() + make_interval(secs => $5), 1)
		ON CONFLICT DO NOTHING
		RETURNING lease_token`,
		benchTenant, "order.create", key, fingerprint, d.lease.Seconds()).Scan(&token)
	if err == nil {
		return nil, "", errors.New("direct replay: the key was free")
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, "", err
	}
	rows, _ := tx.Query(ctx, `
		SELECT *, COALESCE(EXTRACT(EPOCH FROM lease_expires_at - now()), 0)::float8 AS lease_seconds_left
		FROM idempotency_records
		WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3`,
		benchTenant, "order.create", key)
	rec, err := pgx.CollectExactlyOneRow(rows, pgx.RowToMap)
	if err != nil {
		return nil, "", err
	}
	body, _ := rec["result_body"].([]byte)
	resource, _ := rec["resource_id"].(string)
	return body, "/v1/orders/" + resource, tx.Commit(ctx)
}
