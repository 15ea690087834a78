package order

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/sync/semaphore"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order/steps"
)

// Caller is who asks, as the API key proved it, and the Idempotency-Key
// that names this intent.
type Caller struct {
	TenantID string
	Key      string
	// Yield, when set, gives back what the door holds for the caller only
	// while the service works for it (the HTTP door's admission slot). A
	// use case calls it when it goes on to wait on something other than
	// the service, holding no database connection: a pay or cancel for the
	// payment channel, or a duplicate for its first attempt's outcome. It
	// may be called more than once; the first counts.
	Yield func()
	// Wait is how long a duplicate of an intent whose first attempt is
	// still in flight waits for that attempt's outcome (HTTP's Prefer:
	// wait), capped by Deps.MaxWait. Zero: it is answered 409 at once.
	Wait time.Duration
	// Waited, when set, is told how long the caller was let wait when its
	// answer came after such a wait (HTTP's Preference-Applied).
	Waited func(time.Duration)
}

// scope names the intent op of c's key.
func (c Caller) scope(op string) idempotency.Scope {
	return idempotency.Scope{TenantID: c.TenantID, Operation: op, Key: c.Key}
}

// yield calls c.Yield, if any.
func (c Caller) yield() {
	if c.Yield != nil {
		c.Yield()
	}
}

func (c Caller) intent(op, resource string, fields any) (idempotency.Intent, error) {
	fp, err := idempotency.Fingerprint(op, resource, fields)
	return idempotency.Intent{
		Scope:       c.scope(op),
		Fingerprint: fp,
		ResourceID:  resource,
	}, err
}

// intentOn is the intent of an operation on the order named in the path.
// A malformed id names no order, as an unknown one does, and gets the same
// definitive answer the same way: the intent is on the nil id, which no
// order has, so it is recorded as order_not_found and replayed.
func (c Caller) intentOn(op, orderID string, fields any) (uuid.UUID, idempotency.Intent, error) {
	id, err := parseID(orderID)
	if err != nil {
		id = uuid.Nil
	}
	in, err := c.intent(op, id.String(), fields)
	return id, in, err
}

// Deps are what the order use cases run on.
type Deps struct {
	DB      *gorm.DB
	Records *idempotency.Store
	// Inbox remembers the payment channel's webhook deliveries
	// (ReceiveChannelEvent).
	Inbox   *idempotency.Inbox
	Channel Channel
	Money   MoneyConfig
	Observe Observer
	Logger  *slog.Logger
	// Waiter lets a duplicate wait for its intent's first outcome
	// (Caller.Wait), up to MaxWait; nil: it is answered 409 at once.
	Waiter  Waiter
	MaxWait time.Duration
	// Stopping is closed when the service begins to shut down: waiting
	// duplicates then get their 409 at once. Nil is never closed.
	Stopping <-chan struct{}
	// Done is closed at the shutdown deadline. It bounds the work that
	// outlives the request or sweep that started it (a payment's channel
	// call and the storing of its reply): that work stops then, and its
	// intent is left to the lease and the sweeper. Nil means the work
	// always runs to its end.
	Done <-chan struct{}
	// WindowSources names where each replay window comes from (a setting,
	// or a stream's max_age read from the broker at start), and
	// OutboxRetention how long published outbox events are kept: both are
	// shown with the policy (IdempotencyPolicy).
	WindowSources   map[string]string
	OutboxRetention time.Duration
	// Steps, when set, is told each step of the idempotency protocol as
	// it is taken (internal/order/steps): tests record runs with it and
	// tools/tracecheck replays them against the model. Nil in production:
	// a step then costs a nil check.
	Steps steps.Recorder
}

// Service runs the order use cases on its Deps. Build it with NewService.
type Service struct {
	Deps
	// Hooks inject failures at the points where a crash would hurt most.
	Hooks Hooks

	// calls bounds how many intents are at the channel at once
	// (Money.MaxChannelCalls; nil: no bound). See channelPlace.
	calls *semaphore.Weighted
}

// NewService returns the order use cases on deps, with the bound on the
// intents at the payment channel (deps.Money.MaxChannelCalls) made once,
// here.
func NewService(deps Deps) *Service {
	s := &Service{Deps: deps}
	if deps.Money.MaxChannelCalls > 0 {
		s.calls = semaphore.NewWeighted(int64(deps.Money.MaxChannelCalls))
	}
	return s
}

// detach returns a context for work that must not stop when ctx's caller
// hangs up (the result is recorded so its retry gets the replay), but does
// stop with the service (Done).
func (s *Service) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := cancelOn(s.Done, cancel)
	return work, func() { stop(); cancel() }
}

// Hooks are fault-injection points for tests; nil functions do nothing.
// Each may return an error or panic, as a crashing process would stop there.
type Hooks struct {
	// AfterOrderInsert runs inside the create transaction once the order
	// rows are written.
	AfterOrderInsert func() error
	// AfterPhase1 runs after a money intent's phase 1 committed, before the
	// channel is called.
	AfterPhase1 func() error
	// BeforeChannelCall runs in phase 2 once it has fixed the call's
	// deadline and decided against it how to ask the channel, before the
	// request leaves: a stall here is a stall between deciding and calling.
	BeforeChannelCall func() error
	// AfterChannelCall runs once the channel answered, before phase 3.
	AfterChannelCall func() error
	// BeforeReplyCommit runs inside phase 3, just before it commits.
	BeforeReplyCommit func() error
}

func (h Hooks) run(f func() error) error {
	if f == nil {
		return nil
	}
	return f()
}

// Observer is told what the metrics count. A nil Observer is fine.
type Observer interface {
	// ChannelCall reports one call to the payment channel and how it
	// ended: ok, rejected, unavailable or no_outcome (callOutcome).
	// ctx is the call's (its trace becomes the latency's exemplar).
	ChannelCall(ctx context.Context, kind string, took time.Duration, outcome string, replayed bool)
	// Takeover reports that an unfinished intent got a new owner.
	Takeover(operation, by string)
}

type noObserver struct{}

func (noObserver) ChannelCall(context.Context, string, time.Duration, string, bool) {}
func (noObserver) Takeover(string, string)                                          {}

func (s *Service) observe() Observer {
	if s.Observe == nil {
		return noObserver{}
	}
	return s.Observe
}

func (s *Service) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// once runs c's single-transaction intent in (runOnce), letting a duplicate
// of one still in flight wait for its outcome when c asked to (awaitFirst).
func (s *Service) once(ctx context.Context, c Caller, in idempotency.Intent, exec func(tx *gorm.DB) (idempotency.Result, error)) (idempotency.Result, error) {
	return s.awaitFirst(ctx, c, in.Scope, func() (idempotency.Result, error) { return s.runOnce(ctx, in, exec) })
}

// runOnce runs a single-transaction operation exactly once per intent:
//
//  1. answer with the stored result, found by one plain read, if there is one;
//  2. otherwise run exec, which executes the business write and records its
//     result (insertRecordFirst, insertRecordLast), in ONE transaction, so a crash
//     leaves both or neither;
//  3. if a concurrent duplicate recorded the intent first, roll ours back
//     and go to 1, which now finds the duplicate's result.
//
// The record is written once, SUCCEEDED or FAILED_FINAL
// (idempotency.Store.Insert): PROCESSING would be seen by nobody. Any error
// but a final one rolls everything back and records nothing, so the same
// key may simply be sent again.
func (s *Service) runOnce(ctx context.Context, in idempotency.Intent, exec func(tx *gorm.DB) (idempotency.Result, error)) (res idempotency.Result, err error) {
	ctx, end := traced(ctx, in)
	defer func() { end(res, err) }()
	for race := 1; ; race++ {
		replay, err := s.Records.Replay(s.DB.WithContext(ctx), in)
		if err != nil {
			return idempotency.Result{}, err
		}
		if replay != nil {
			mark(ctx, "replayed")
			return *replay, nil
		}
		err = database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
			var err error
			res, err = exec(tx)
			return err
		})
		switch {
		case !errors.Is(err, idempotency.ErrTaken):
			if err == nil {
				mark(ctx, "inserted", attribute.String("idempotency.record.state", string(stateAfter(res, nil))))
			}
			return res, err
		case race == maxRecordRaces: // the key is held by a record the read cannot replay
			return idempotency.Result{}, errSuperseded()
		}
		mark(ctx, "lost_race")
	}
}

// insertRecordFirst is how an intent whose result is known before it writes
// anything runs, inside once's transaction (a create: the new order's id,
// times and representation are chosen before its first statement): its
// record goes first, so a concurrent duplicate waits at the record's key
// before it does any work, then write runs.
func (s *Service) insertRecordFirst(tx *gorm.DB, in idempotency.Intent, res idempotency.Result, write func() error) (idempotency.Result, error) {
	if err := s.Records.Insert(tx, in, res); err != nil {
		return idempotency.Result{}, err
	}
	return res, write()
}

// insertRecordLast is how an intent whose result is only known once it has run
// runs (a transition, which reads the order it changes under its row lock):
// exec runs, then its record stores what it ended with, success or final
// error (see resultOf). A final error must be returned before exec writes
// anything.
func (s *Service) insertRecordLast(in idempotency.Intent, exec func(tx *gorm.DB) (idempotency.Result, error)) func(tx *gorm.DB) (idempotency.Result, error) {
	return func(tx *gorm.DB) (idempotency.Result, error) {
		executed, err := exec(tx)
		res, err := resultOf(in, executed, err)
		if err != nil {
			return idempotency.Result{}, err
		}
		return res, s.Records.Insert(tx, in, res)
	}
}

// maxRecordRaces bounds how often once goes back to the read after losing
// the record's insert: once is enough, for the winner's result is committed.
// Only a key held by a record the read cannot replay (removed in between,
// or not definitive: never written by a one-transaction intent) loses every
// round; that ends in 409.
const maxRecordRaces = 3

// resultOf is the result an intent's execution ended with: its success, or
// the final error it ended with, as a failed result to store and replay.
// Any other error is returned for a rollback.
func resultOf(in idempotency.Intent, res idempotency.Result, err error) (idempotency.Result, error) {
	if err == nil {
		return res, nil
	}
	failure, ok := asFinal(err)
	if !ok {
		return idempotency.Result{}, err
	}
	return idempotency.Failed(in.ResourceID, failure), nil
}

// finish stores the result of a claimed intent on its record, in the
// caller's transaction (see resultOf).
func (s *Service) finish(tx *gorm.DB, in idempotency.Intent, token int64, res idempotency.Result, err error) (idempotency.Result, error) {
	if res, err = resultOf(in, res, err); err != nil {
		return idempotency.Result{}, err
	}
	return res, s.Records.Complete(tx, in.Scope, token, res)
}

// IntentState is the state of the intent (c, op)'s record, "" when it
// has none. The message door asks it of a command delivered more often
// than it allows: a definitive state can only be replayed, a retryable
// one ran to its end and may be run again, and only an intent no run
// finished (PROCESSING, or no record) is a command no instance survives.
func (s *Service) IntentState(ctx context.Context, c Caller, op string) (idempotency.State, error) {
	rec, err := s.Records.Get(s.DB.WithContext(ctx), idempotency.Scope{TenantID: c.TenantID, Operation: op, Key: c.Key})
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return "", nil
	}
	return rec.State, err
}

// Create makes a new order. The Idempotency-Key is what makes a lost
// response safe to retry: the client has no order id yet, so only the key
// can lead the retry to the order the first attempt created.
func (s *Service) Create(ctx context.Context, c Caller, req CreateRequest) (idempotency.Result, error) {
	n, total, err := req.normalize()
	if err != nil {
		return idempotency.Result{}, err
	}
	in, err := c.intent(OpCreate, "", n)
	if err != nil {
		return idempotency.Result{}, err
	}
	return s.once(ctx, c, in, func(tx *gorm.DB) (idempotency.Result, error) {
		// Built once the read found nothing to replay: a replay never pays for it.
		o, err := newOrder(c.TenantID, n, total)
		if err != nil {
			return idempotency.Result{}, err
		}
		res, err := created(o)
		if err != nil {
			return idempotency.Result{}, err
		}
		return s.insertRecordFirst(tx, in, res, func() error {
			if err := insertOrder(tx, o, OpCreate, c.Key); err != nil {
				return err
			}
			return s.Hooks.run(s.Hooks.AfterOrderInsert)
		})
	})
}

func newOrder(tenantID string, n CreateRequest, total int64) (*Order, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return nil, err
	}
	// PostgreSQL keeps microseconds; so does the representation we store.
	now := time.Now().UTC().Truncate(time.Microsecond)
	o := &Order{ID: id, TenantID: tenantID, CustomerID: n.CustomerID, Status: StatusCreated,
		Currency: n.Currency, TotalAmount: total, Metadata: n.Metadata, Version: 1,
		CreatedAt: now, UpdatedAt: now, Items: make([]Item, len(n.Items))}
	for i, it := range n.Items {
		o.Items[i] = Item{OrderID: id, LineNo: i + 1, SKU: it.SKU, Quantity: it.Quantity,
			UnitPrice: it.UnitPrice, LineTotal: it.UnitPrice * int64(it.Quantity)}
	}
	return o, nil
}

// transition runs a one-transaction state change under an idempotency key:
// lock the order, apply change (pure: it only fires the state machine and
// sets fields, so a final error comes before any write), save the
// transition.
func (s *Service) transition(ctx context.Context, c Caller, op string, ev Event, orderID string, fields any, change func(*Order) error) (idempotency.Result, error) {
	id, in, err := c.intentOn(op, orderID, fields)
	if err != nil {
		return idempotency.Result{}, err
	}
	return s.once(ctx, c, in, s.insertRecordLast(in, func(tx *gorm.DB) (idempotency.Result, error) {
		o, err := lockOrder(tx, c.TenantID, id)
		if err != nil {
			return idempotency.Result{}, err
		}
		from := o.Status
		if err := change(o); err != nil {
			return idempotency.Result{}, err
		}
		if err := saveTransition(tx, o, from, ev, op, c.Key); err != nil {
			return idempotency.Result{}, err
		}
		return done(o)
	}))
}

// Ship marks a paid order shipped.
func (s *Service) Ship(ctx context.Context, c Caller, orderID string, req ShipRequest) (idempotency.Result, error) {
	n, err := req.normalize()
	if err != nil {
		return idempotency.Result{}, err
	}
	return s.transition(ctx, c, OpShip, EventShip, orderID, n, func(o *Order) error {
		return o.Ship(n.Carrier, n.TrackingNumber)
	})
}

// Deliver marks a shipped order delivered.
func (s *Service) Deliver(ctx context.Context, c Caller, orderID string, _ DeliverRequest) (idempotency.Result, error) {
	return s.transition(ctx, c, OpDeliver, EventDeliver, orderID, DeliverRequest{}, (*Order).Deliver)
}

// Get reads one of the tenant's orders, with its items and payments, from
// one snapshot.
func (s *Service) Get(ctx context.Context, tenantID, orderID string) (*Order, error) {
	id, err := parseID(orderID)
	if err != nil {
		return nil, err
	}
	var o *Order
	err = database.Snapshot(ctx, s.DB, func(tx *gorm.DB) error {
		o, err = getOrder(tx, tenantID, id)
		return err
	})
	return o, err
}

// List pages through the tenant's orders, newest first.
func (s *Service) List(ctx context.Context, tenantID string, f ListFilter) (Page, error) {
	if f.Status != "" && !slices.Contains(Statuses, f.Status) {
		return Page{}, invalid("status", "must be one of the order statuses")
	}
	if err := f.Page.check(); err != nil {
		return Page{}, err
	}
	var page Page
	err := database.Snapshot(ctx, s.DB, func(tx *gorm.DB) error {
		var err error
		page, err = listOrders(tx, tenantID, f)
		return err
	})
	return page, err
}

// History pages through the order's transitions, oldest first, with the
// keys that caused them, from one snapshot.
func (s *Service) History(ctx context.Context, tenantID, orderID string, pg PageRequest) (HistoryPage, error) {
	id, err := parseID(orderID)
	if err != nil {
		return HistoryPage{}, err
	}
	if err := pg.check(); err != nil {
		return HistoryPage{}, err
	}
	var page HistoryPage
	err = database.Snapshot(ctx, s.DB, func(tx *gorm.DB) error {
		if err := orderExists(tx, tenantID, id); err != nil {
			return err
		}
		page, err = history(tx, id, pg)
		return err
	})
	return page, err
}

// parseID reads an order id from a path. A malformed id names no order.
func parseID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return uuid.UUID{}, errNoSuchID()
	}
	return id, nil
}
