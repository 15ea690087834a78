package messaging_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/decode"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/tests/testdb"
)

// A pay at its last delivery (COMMAND_MAX_DELIVER is 1 here: its first is
// its last), or past it, meets its intent still PROCESSING: another owner
// holds it (an HTTP request, here the use case called directly) or the
// sweeper is finishing it. That is no failure of the command: it is postponed, not
// dead-lettered, spends no delivery, and once the intent completes it is
// answered with the stored result, replayed; the channel charged once.
func TestAPayThatMeetsItsIntentInFlightAtItsLastDeliveryWaitsForIt(t *testing.T) {
	heldByAnotherOwner := func(t *testing.T, svc *order.Service, caller order.Caller, id string, _ *channelGate) {
		go func() { _, _ = svc.Pay(context.Background(), caller, id, order.PayRequest{PaymentMethod: "pm_ok"}) }()
	}
	for name, tc := range map[string]struct {
		method string // the payment method of the pay, whichever door
		held   string // the channel call the gate holds: the owner's charge, or the sweeper's look-up
		hold   func(t *testing.T, svc *order.Service, caller order.Caller, id string, gate *channelGate)
		// firstDies: the instance handling the first delivery dies before
		// running it, so the second is past COMMAND_MAX_DELIVER and finds
		// the intent in flight by its record, unrun.
		firstDies bool
	}{
		"held by another owner":                               {method: "pm_ok", held: http.MethodPost, hold: heldByAnotherOwner},
		"held by another owner, met past COMMAND_MAX_DELIVER": {method: "pm_ok", held: http.MethodPost, hold: heldByAnotherOwner, firstDies: true},
		"being finished by the sweeper": {
			method: "pm_lost_response", held: http.MethodGet,
			hold: func(t *testing.T, svc *order.Service, caller order.Caller, id string, gate *channelGate) {
				// The first attempt's answer is lost: the channel charged,
				// the service does not know it, and the intent waits,
				// retryable, for whoever comes first: here, the sweeper.
				// Its own call must pass the gate (a charge, sent at once):
				// held, it would be the look-up the test waits for, and the
				// sweeper's would come after the command, not before.
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := svc.Pay(ctx, caller, id, order.PayRequest{PaymentMethod: "pm_lost_response"})
				cancel()
				if n := len(gate.held); n != 0 {
					t.Fatalf("the first attempt's own call was held at the gate (%d held): it must reach the channel and lose its answer", n)
				}
				if code := answer.Problem(err).Code; err == nil || code != problem.ServiceUnavailable {
					t.Fatalf("first attempt: %v, want the 503 of an unknown outcome", err)
				}
				go func() {
					for ctx := context.Background(); ; time.Sleep(50 * time.Millisecond) {
						if n, err := svc.Sweep(ctx, 10); n > 0 || err != nil {
							return
						}
					}
				}()
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			gate := newChannelGate(t, w.channel, tc.held)
			// A first attempt sends its charge (gatedService's key window):
			// the gate holds the owner's charge, or the sweeper's look-up,
			// not the first attempt's own look-up.
			svc := gatedService(t, w, gate)
			var runs atomic.Int32
			hooks := messaging.ConsumerHooks{BeforeRun: func(string, string) error {
				if runs.Add(1) == 1 && tc.firstDies {
					return errors.New("killed")
				}
				return nil
			}}
			w.consumer(hooks, nil, func(c *messaging.Consumer) { c.Orders, c.MaxDeliver = svc, 1 })
			results := subscribe(t, w.nc, messaging.ResultSubject("acme", "pay"))

			run := time.Now().UnixNano()
			var create order.CreateRequest
			if err := decode.JSON([]byte(createBody("cus_inflight")), &create); err != nil {
				t.Fatal(err)
			}
			created, err := svc.Create(context.Background(), order.Caller{TenantID: "acme", Key: fmt.Sprintf("inflight-create-%d", run)}, create)
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			id := created.Resource
			key := fmt.Sprintf("inflight-pay-%d", run)
			caller := order.Caller{TenantID: "acme", Key: key}
			tc.hold(t, svc, caller, id, gate)
			gate.waitHeld(t)

			publish(t, w.js, messaging.CommandSubject("acme", "pay"), key, fmt.Sprintf(`{"order_id":%q,"payment_method":%q}`, id, tc.method))
			select {
			case <-w.counters.postponedCh:
			case <-w.counters.deadCh:
				letters, _ := (&messaging.DLQ{JS: w.js}).List(context.Background())
				var reasons []string
				for _, l := range letters {
					reasons = append(reasons, l.Reason())
				}
				t.Fatalf("dead-lettered at its last delivery while its intent was in flight: %q", reasons)
			case r := <-results:
				t.Fatalf("answered while its intent was in flight: %v %s", r.Header, r.Data)
			case <-time.After(60 * time.Second):
				t.Fatal("the command was neither postponed nor dead-lettered")
			}
			gate.release()

			r := next(t, results, "result of the postponed pay")
			<-w.counters.ackedCh
			t.Run("it is answered with the intent's stored result, replayed", func(t *testing.T) {
				if r.Header.Get(messaging.HeaderStatus) != "200" || r.Header.Get(messaging.HeaderReplayed) != "true" || jsonField(t, r.Data, "status") != "PAID" {
					t.Errorf("result %v %s, want a 200 PAID replay", r.Header, r.Data)
				}
				res, err := svc.Pay(context.Background(), caller, id, order.PayRequest{PaymentMethod: tc.method})
				if replay := answer.Render(res); err != nil || replay.Status != http.StatusOK || !replay.Replayed || string(replay.Body) != string(r.Data) {
					t.Errorf("the intent's replay %d %s (%v), result %s", replay.Status, replay.Body, err, r.Data)
				}
			})
			t.Run("one charge", func(t *testing.T) {
				if stats := w.channelStats(); stats["charges"] != float64(1) {
					t.Errorf("channel stats %v, want 1 charge", stats)
				}
			})
			t.Run("not dead-lettered, postponed once, spending no delivery", func(t *testing.T) {
				deliveries := 1
				if tc.firstDies {
					deliveries = 2
				}
				c := w.counters
				if dead, got, postponed := c.get(c.dead, "pay"), c.get(c.received, "pay"), c.get(c.postponed, "pay"); dead != 0 || got != deliveries || postponed != 1 {
					t.Errorf("dead-lettered %d, deliveries %d, postponed %d; want 0, %d, 1", dead, got, postponed, deliveries)
				}
				waitDLQDepth(t, w, 0)
			})
		})
	}
}

// gatedService is the order use cases on a database of their own, whose
// channel calls pass through gate: the sweeper finishes only the intents
// of its test, not another test's left retryable. Its lease and channel
// deadline are longer than any test, so an intent is in flight exactly as
// long as the gate holds its call; its key window is a day, so a first
// attempt sends its charge at once (with none, every call looks its key
// up first).
func gatedService(t *testing.T, w *world, gate *channelGate) *order.Service {
	t.Helper()
	url, drop, err := testdb.Create("messaging_inflight")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	db, err := database.Open(context.Background(), url, database.Options{MaxConns: 10, StatementTimeout: 5 * time.Second, LockTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	return order.NewService(order.Deps{DB: db, Logger: w.logger,
		Records: &idempotency.Store{Lease: 5 * time.Minute, Policy: w.policy},
		Channel: payment.NewClient(gate.URL, &http.Client{}),
		Money:   order.MoneyConfig{ChannelTimeout: 4 * time.Minute, RetryAfter: time.Millisecond, ChannelKeyWindow: 24 * time.Hour}})
}

// channelGate stands in front of the mock channel and holds every request
// of one method until released, as a slow acquirer would.
type channelGate struct {
	URL      string
	held     chan struct{} // a request is held
	released chan struct{}
}

func newChannelGate(t *testing.T, channelURL, method string) *channelGate {
	t.Helper()
	target, err := url.Parse(channelURL)
	if err != nil {
		t.Fatal(err)
	}
	g := &channelGate{held: make(chan struct{}, 16), released: make(chan struct{})}
	proxy := httputil.NewSingleHostReverseProxy(target)
	// The channel closing the connection (pm_lost_response) is passed on
	// as it is: the answer is lost, not turned into a 502.
	proxy.ErrorHandler = func(http.ResponseWriter, *http.Request, error) { panic(http.ErrAbortHandler) }
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == method && r.URL.Path == "/v1/charges" {
			g.held <- struct{}{}
			<-g.released
		}
		proxy.ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(g.release)
	g.URL = srv.URL
	return g
}

// waitHeld waits until the gate holds a request.
func (g *channelGate) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-g.held:
	case <-time.After(60 * time.Second):
		t.Fatal("no channel call reached the gate")
	}
}

// release lets every held request, and every later one, through.
func (g *channelGate) release() {
	select {
	case <-g.released:
	default:
		close(g.released)
	}
}
