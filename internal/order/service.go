package order

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/semaphore"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order/steps"
)

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
	// (Door.Wait), up to MaxWait; nil: it is answered 409 at once.
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
	// a step then costs a nil check, and its event is never built.
	Steps steps.Recorder
}

// Service runs the order use cases on its Deps. Build it with NewService.
type Service struct {
	Deps
	// Hooks inject failures at the points where a crash would hurt most.
	Hooks Hooks

	// calls bounds how many intents are at the channel at once
	// (Money.MaxChannelCalls; nil: no bound). See channelSlot.
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
