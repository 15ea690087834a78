package messaging_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

// A tenant's commands carry a broker control header
// (Nats-Expected-Stream: ORDER_COMMANDS is what a careful publisher adds)
// and are malformed. Their dead letters must not carry that header into
// ORDER_COMMANDS_DLQ, which would refuse them (wrong expected stream), and
// as many of them as the consumer may hold unacknowledged (MaxAckPending)
// must not hold up another tenant's command.
func TestCommandsWithBrokerHeadersAreDeadLetteredWithoutHoldingUpOtherTenants(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	acmeJS, err := jetstream.New(w.tenantConn("acme"))
	if err != nil {
		t.Fatal(err)
	}
	globex, globexJS := w.tenantJS("globex")
	results := subscribe(t, globex, messaging.ResultSubject("globex", "create"))

	poison := messaging.ConsumerConfig(time.Second).MaxAckPending
	for i := range poison {
		m := nats.NewMsg(messaging.CommandSubject("acme", "create"))
		m.Header.Set(messaging.HeaderKey, fmt.Sprintf("poison-%d", i))
		m.Header.Set("Nats-Expected-Stream", messaging.CommandsStream)
		m.Header.Set("X-Trace", "poison")
		m.Data = []byte(`{"customer_id":`) // not JSON: dead-lettered at once
		if _, err := acmeJS.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish poison %d: %v", i, err)
		}
	}
	select {
	case <-acmeJS.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("the poison commands were not all stored")
	}
	key := fmt.Sprintf("globex-after-poison-%d", time.Now().UnixNano())
	publish(t, globexJS, messaging.CommandSubject("globex", "create"), key, createBody("cus_"+key))

	t.Run("another tenant's create gets its result promptly", func(t *testing.T) {
		r := within(t, results, 30*time.Second, fmt.Sprintf("result of globex's create, behind %d poison commands of acme", poison))
		if r.Header.Get(messaging.HeaderStatus) != "201" || r.Header.Get(messaging.HeaderKey) != key {
			t.Errorf("globex's create = %v %s", r.Header, r.Data)
		}
	})
	t.Run("every poison command is in the DLQ, without the broker's headers", func(t *testing.T) {
		waitDLQDepth(t, w, uint64(poison))
		letters, err := (&messaging.DLQ{JS: w.js}).List(context.Background())
		if err != nil || len(letters) != poison {
			t.Fatalf("dlq list: %d letters, %v; want %d", len(letters), err, poison)
		}
		d := letters[0]
		if d.Header.Get("Nats-Expected-Stream") != "" {
			t.Errorf("the dead letter kept Nats-Expected-Stream: %v", d.Header)
		}
		if !strings.HasPrefix(d.Header.Get(messaging.HeaderKey), "poison-") || d.Header.Get("X-Trace") != "poison" ||
			!strings.Contains(d.Reason(), "not valid JSON") || d.Header.Get(messaging.HeaderDLSubject) != messaging.CommandSubject("acme", "create") {
			t.Errorf("the tenant's own headers or the dead-letter ones are wrong: %v", d.Header)
		}
	})
}

// In general, a dead letter the DLQ refuses as it
// is (here: larger than the DLQ's max_msg_size, for a header the tenant
// added) is stored in a smaller form, with the body, the Idempotency-Key
// and the dead-letter headers, and says so; it does not stay in
// ORDER_COMMANDS to be redelivered and refused forever.
func TestADeadLetterTheDLQRefusesAsItIsIsStoredWithoutTheTenantsOtherHeaders(t *testing.T) {
	w := newWorld(t)
	limitStream(t, w, messaging.DLQStream, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 2048 })
	w.consumer(messaging.ConsumerHooks{}, nil)
	body := `{"customer_id":`
	publish(t, w.js, messaging.CommandSubject("acme", "create"), "too-big-letter", body, "X-Blob", strings.Repeat("x", 4000))

	// Read from the stream: a core subscriber also sees the refused publish.
	waitDLQDepth(t, w, 1)
	letters, err := (&messaging.DLQ{JS: w.js}).List(context.Background())
	if err != nil || len(letters) != 1 {
		t.Fatalf("dlq list: %+v, %v", letters, err)
	}
	d := letters[0]
	if d.Header.Get("X-Blob") != "" {
		t.Fatalf("the stored letter is the refused one: %d header bytes", len(d.Header.Get("X-Blob")))
	}
	if string(d.Data) != body || d.Header.Get(messaging.HeaderKey) != "too-big-letter" ||
		d.Header.Get(messaging.HeaderDLSubject) != messaging.CommandSubject("acme", "create") {
		t.Errorf("the smaller letter lost what a replay needs: %v %s", d.Header, d.Data)
	}
	if reason := d.Reason(); !strings.Contains(reason, "not valid JSON") || !strings.Contains(reason, "without its other headers") {
		t.Errorf("Dead-Letter-Reason = %q, want the reason and that the letter is incomplete", reason)
	}
	waitAckPending(t, w, 0)
}

// The other side of "too large": a DLQ that refuses a letter for another
// reason (here it has no room: max_bytes with discard new) has said
// nothing about the letter's size. The letter is not cut to fit: the
// command is tried again, whole, on later deliveries, and once the DLQ has
// room its letter is stored with its body.
func TestADeadLetterTheDLQHasNoRoomForIsTriedAgainWhole(t *testing.T) {
	w := newWorld(t)
	limitStream(t, w, messaging.DLQStream, func(c *jetstream.StreamConfig) { c.MaxBytes, c.Discard = 1024, jetstream.DiscardNew })
	errs := &errorLog{records: make(chan slog.Record, 64)}
	w.consumer(messaging.ConsumerHooks{}, nil, func(c *messaging.Consumer) {
		c.Logger = slog.New(errs)
		c.MaxDeliver = 50 // room for the test to give the DLQ room before the letter is given up
	})
	body := strings.Repeat("b", 4096) // a letter of some 4.5 KB; without its body it would fit
	publish(t, w.js, messaging.CommandSubject("acme", "create"), "", body)

	select {
	case r := <-errs.records:
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		if !strings.Contains(r.Message, "tried again") || attrs["delivery"] != "1" {
			t.Fatalf("first error log: %q %v, want the letter to be tried again after delivery 1", r.Message, attrs)
		}
		t.Logf("the DLQ's refusal: %s", attrs["err"])
	case <-time.After(60 * time.Second):
		t.Fatal("no error log: the letter was stored, cut to fit, or not tried")
	}
	if n := dlqDepth(t, w); n != 0 {
		t.Fatalf("the DLQ holds %d letters while it had no room for the whole one, want 0: none cut to fit", n)
	}
	limitStream(t, w, messaging.DLQStream, func(c *jetstream.StreamConfig) { c.MaxBytes = -1 })
	waitDLQDepth(t, w, 1)
	waitAckPending(t, w, 0)

	letters, err := (&messaging.DLQ{JS: w.js}).List(context.Background())
	if err != nil || len(letters) != 1 {
		t.Fatalf("dlq list: %d letters, %v", len(letters), err)
	}
	if d := letters[0]; string(d.Data) != body || d.Header.Get(messaging.HeaderDLBodySize) != "" || strings.Contains(d.Reason(), "without") {
		t.Errorf("the letter: body %d bytes, reason %q, want the whole command and its reason alone", len(d.Data), d.Reason())
	}
	c := w.counters
	if dead, givenUp := c.get(c.dead, "create"), c.get(c.givenUp, "create"); dead != 1 || givenUp != 0 {
		t.Errorf("dead-lettered %d, given up %d; want 1, 0", dead, givenUp)
	}
}

// dlqDepth is how many dead letters the DLQ holds now.
func dlqDepth(t *testing.T, w *world) uint64 {
	t.Helper()
	n, err := (&messaging.DLQ{JS: w.js}).Depth(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The last resort: a dead letter that cannot be stored
// at all (here the DLQ stream is gone) is tried again on a bounded number
// of deliveries, and then the command is terminated with an error log
// naming it; it stays readable in ORDER_COMMANDS until its max_age. It
// never holds a slot among the consumer's unacknowledged commands forever.
func TestADeadLetterThatCannotBeStoredIsGivenUpLoudlyNotRetriedForever(t *testing.T) {
	w := newWorld(t)
	if err := w.js.DeleteStream(context.Background(), messaging.DLQStream); err != nil {
		t.Fatal(err)
	}
	errs := &errorLog{records: make(chan slog.Record, 64)}
	w.consumer(messaging.ConsumerHooks{}, nil, func(c *messaging.Consumer) {
		c.MaxDeliver = 2
		c.Backoff = messaging.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}
		c.Logger = slog.New(errs)
	})
	publish(t, w.js, messaging.CommandSubject("acme", "create"), "", createBody("cus_no_dlq")) // no key: malformed

	// Wait for the log itself: the consumers holding nothing unacknowledged
	// is also true before the command was first delivered (or before the
	// tenant's consumer exists), and proves nothing then.
	seen := map[string]bool{}
	timeout := time.After(20 * time.Second)
	for {
		select {
		case r := <-errs.records:
			seen[r.Message] = true
			if !strings.Contains(r.Message, "given up") {
				continue
			}
			attrs := map[string]string{}
			r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
			if attrs["sequence"] != "1" || attrs["subject"] != messaging.CommandSubject("acme", "create") || !strings.Contains(attrs["reason"], "Idempotency-Key") {
				t.Errorf("the error log does not name the command: %v", attrs)
			}
			waitAckPending(t, w, 0) // terminated, after it was counted
			w.counters.mu.Lock()
			defer w.counters.mu.Unlock()
			if n := w.counters.givenUp["create"]; n != 1 {
				t.Errorf("%d dead letters counted as given up, want 1 (orderservice_messages_dead_letters_given_up_total)", n)
			}
			return
		case <-timeout:
			t.Fatalf("no error log said the dead letter was given up within 20 s; error logs: %v", seen)
		}
	}
}

// Two distinct commands carry the same client Nats-Msg-Id (which alone
// dead-letters them), published further apart than ORDER_COMMANDS's
// duplicate window so that the broker keeps both. Each gets its own dead
// letter: the DLQ must not drop the second as a duplicate of the first.
func TestTwoBadCommandsWithTheSameClientMsgIdAreBothDeadLettered(t *testing.T) {
	w := newWorld(t)
	const window = 100 * time.Millisecond // the shortest JetStream allows
	limitStream(t, w, messaging.CommandsStream, func(c *jetstream.StreamConfig) { c.Duplicates = window })
	w.consumer(messaging.ConsumerHooks{}, nil)

	bodies := []string{`{"customer_id":"first"`, `{"customer_id":"second"`} // not JSON
	for _, body := range bodies {
		m := nats.NewMsg(messaging.CommandSubject("acme", "create"))
		m.Header.Set(messaging.HeaderKey, "same-client-id")
		m.Header.Set(messaging.HeaderMsgID, "client-msg-1")
		m.Data = []byte(body)
		ack, err := w.js.PublishMsg(context.Background(), m)
		if err != nil || ack.Duplicate {
			t.Fatalf("publish %s: %+v %v; the test needs both commands in %s", body, ack, err, messaging.CommandsStream)
		}
		time.Sleep(3 * window)
	}
	for range bodies {
		select {
		case <-w.counters.deadCh:
		case <-time.After(30 * time.Second):
			t.Fatal("the two commands were not both dead-lettered")
		}
	}
	waitAckPending(t, w, 0)
	letters, err := (&messaging.DLQ{JS: w.js}).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range letters {
		got = append(got, string(l.Data))
	}
	if len(letters) != 2 || got[0] != bodies[0] || got[1] != bodies[1] {
		t.Errorf("the DLQ holds %d letters %q; want both commands %q", len(letters), got, bodies)
	}
}

// The other way round: a command dead-lettered again
// after its term was lost (its instance died in between) is the letter the
// DLQ already holds, not a second one, and is counted once.
func TestACommandDeadLetteredAgainAfterItsTermWasLostIsOneLetter(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	publish(t, w.js, messaging.CommandSubject("acme", "create"), "dead-twice", `{"customer_id":`)
	commands, err := w.js.Stream(ctx, messaging.CommandsStream)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := commands.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// What an earlier delivery of that command left behind before it died:
	// its letter, with the id letters are given (docs/messaging.md).
	m := nats.NewMsg(messaging.DLQPrefix + "commands.acme.create")
	m.Header.Set(messaging.HeaderMsgID, fmt.Sprintf("dead-letter-1-%d", stored.Time.UnixNano()))
	m.Header.Set(messaging.HeaderReason, "body is not JSON")
	m.Data = stored.Data
	if _, err := w.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	w.consumer(messaging.ConsumerHooks{}, nil)

	waitAckPending(t, w, 0)
	waitDLQDepth(t, w, 1)
	if got := w.counters.get(w.counters.dead, "create"); got != 0 {
		t.Errorf("dead-lettered = %d, want 0: the earlier delivery counted it", got)
	}
}

// An operator recreates ORDER_COMMANDS (to change its storage, say): its
// sequence starts again at 1, within the duplicate window of the results
// and dead letters its old commands left. The new commands' results and
// letters are kept all the same: their ids name the command, not only its
// sequence.
func TestCommandsOfARecreatedStreamKeepTheirResultsAndDeadLetters(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	run := time.Now().UnixNano()
	commandsOf := func(incarnation int) (resultKey string) {
		t.Helper()
		consumer := w.consumer(messaging.ConsumerHooks{}, nil)
		publish(t, w.js, messaging.CommandSubject("acme", "create"), fmt.Sprintf("recreated-bad-%d-%d", incarnation, run), `{"customer_id":`)
		resultKey = fmt.Sprintf("recreated-good-%d-%d", incarnation, run)
		publish(t, w.js, messaging.CommandSubject("acme", "create"), resultKey, createBody(resultKey))
		waitAckPending(t, w, 0)
		if err := consumer.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		return resultKey
	}
	first := commandsOf(1)
	if err := w.js.DeleteStream(ctx, messaging.CommandsStream); err != nil {
		t.Fatal(err)
	}
	if _, err := messaging.EnsureStreams(ctx, w.js, messaging.StreamWindows{Redelivery: 168 * time.Hour, Compensation: 720 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	second := commandsOf(2)

	waitDLQDepth(t, w, 2)
	for _, key := range []string{first, second} {
		if n := streamResults(t, w, key); n != 1 {
			t.Errorf("%s holds %d results for %s, want 1", messaging.ResultsStream, n, key)
		}
	}
}

// within waits at most d for the next message on ch.
func within(t *testing.T, ch chan *nats.Msg, d time.Duration, what string) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(d):
		t.Fatalf("no %s within %s", what, d)
		return nil
	}
}

// limitStream changes one setting of a stream the world created.
func limitStream(t *testing.T, w *world, name string, change func(*jetstream.StreamConfig)) {
	t.Helper()
	ctx := context.Background()
	s, err := w.js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	change(&cfg)
	if _, err := w.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("update stream %s: %v", name, err)
	}
}

// waitDLQDepth waits until the DLQ holds n dead letters.
func waitDLQDepth(t *testing.T, w *world, n uint64) {
	t.Helper()
	q := &messaging.DLQ{JS: w.js}
	var depth uint64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if depth, err = q.Depth(context.Background()); err == nil && depth == n {
			return
		}
	}
	t.Fatalf("the DLQ holds %d dead letters, want %d", depth, n)
}

// waitAckPending waits until the durable consumers hold n commands
// delivered and not yet acknowledged or terminated, all of them together.
func waitAckPending(t *testing.T, w *world, n int) {
	t.Helper()
	ctx := context.Background()
	stream, err := w.js.Stream(ctx, messaging.CommandsStream)
	if err != nil {
		t.Fatal(err)
	}
	var ackPending, pending int
	var behind string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ackPending, pending, behind = 0, 0, ""
		infos := stream.ListConsumers(ctx)
		for info := range infos.Info() {
			ackPending, pending = ackPending+info.NumAckPending, pending+int(info.NumPending)
			if n == 0 && behind == "" {
				behind = notYetSeen(ctx, stream, info)
			}
		}
		if err = infos.Err(); err == nil && ackPending == n && pending == 0 && behind == "" {
			return
		}
	}
	t.Fatalf("the consumers still hold %d unacknowledged commands (%d not delivered%s), want %d (%v)", ackPending, pending, behind, n, err)
}

// notYetSeen names a command a consumer holds nothing of yet has not
// acknowledged either: a consumer counts a command just published as
// pending only once the server got round to it, so "none held" may be
// "none seen yet". Empty when the last command of its subjects is behind
// its ack floor.
func notYetSeen(ctx context.Context, stream jetstream.Stream, info *jetstream.ConsumerInfo) string {
	m, err := stream.GetLastMsgForSubject(ctx, info.Config.FilterSubject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return "" // no command of its subjects at all
	case err != nil:
		return fmt.Sprintf("; the last command of %s's subjects: %v", info.Name, err)
	case m.Sequence <= info.AckFloor.Stream:
		return ""
	}
	return fmt.Sprintf("; %s has not acknowledged command %d", info.Name, m.Sequence)
}

// errorLog is a slog.Handler that keeps the error records.
type errorLog struct{ records chan slog.Record }

func (h *errorLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h *errorLog) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.records <- r.Clone():
	default:
	}
	return nil
}
func (h *errorLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorLog) WithGroup(string) slog.Handler      { return h }

// A pay fails for a reason that may pass (the channel is down) at
// delivery COMMAND_MAX_DELIVER, and its dead letter cannot be stored
// (ORDER_COMMANDS_DLQ is gone). The next delivery is over the limit, but
// its intent is FAILED_RETRYABLE: a run that ended, not an instance that
// died. It is run again: it completes if the channel is back, and if the
// channel still fails it is dead-lettered with that failure as its
// reason, not blamed on instances that stopped.
func TestAnOverDeliveredCommandWhoseLastRunFailedIsRunAgainNotBlamedOnDeadInstances(t *testing.T) {
	for name, tc := range map[string]struct {
		mend func(w *world) // what comes back before the third delivery runs
		want func(t *testing.T, w *world, results chan *nats.Msg, id string)
	}{
		"the channel is back: the pay completes": {
			mend: func(w *world) { w.faults(map[string]any{"unavailable_rate": 0}) },
			want: func(t *testing.T, w *world, results chan *nats.Msg, id string) {
				r := next(t, results, "result of the third delivery")
				if r.Header.Get(messaging.HeaderStatus) != "200" || jsonField(t, r.Data, "status") != "PAID" {
					t.Errorf("result %v %s, want 200 PAID", r.Header, r.Data)
				}
				if n := w.count("SELECT count(*) FROM payments WHERE order_id = ? AND status = 'succeeded'", id); n != 1 {
					t.Errorf("succeeded payments = %d, want 1", n)
				}
				if got := w.counters.get(w.counters.dead, "pay") + w.counters.get(w.counters.givenUp, "pay"); got != 0 {
					t.Errorf("dead-lettered or given up = %d, want 0", got)
				}
			},
		},
		"the DLQ is back, the channel is not: the letter says why": {
			mend: func(w *world) {
				if _, err := messaging.EnsureStreams(context.Background(), w.js, messaging.StreamWindows{Redelivery: time.Hour, Compensation: time.Hour}); err != nil {
					w.t.Fatal(err)
				}
			},
			want: func(t *testing.T, w *world, results chan *nats.Msg, _ string) {
				select {
				case <-w.counters.deadCh:
				case <-time.After(30 * time.Second):
					t.Fatal("not dead-lettered")
				}
				letters, err := (&messaging.DLQ{JS: w.js}).List(context.Background())
				if err != nil || len(letters) != 1 {
					t.Fatalf("the DLQ holds %d letters (%v), want 1", len(letters), err)
				}
				if reason := letters[0].Header.Get(messaging.HeaderReason); !strings.Contains(reason, "still failing after 3 deliveries: 503") {
					t.Errorf("Dead-Letter-Reason = %q, want the channel's failure", reason)
				}
				if len(results) != 0 {
					t.Errorf("%d results for a pay that never completed", len(results))
				}
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			if err := w.js.DeleteStream(context.Background(), messaging.DLQStream); err != nil {
				t.Fatal(err)
			}
			run := time.Now().UnixNano()
			created := w.api.Do(t, http.MethodPost, "/v1/orders", fmt.Sprintf("overdelivered-create-%d", run), createBody("cus_overdelivered"))
			if created.Status != http.StatusCreated {
				t.Fatalf("create: %d %s", created.Status, created.Body)
			}
			id := jsonField(t, created.Body, "id")
			w.faults(map[string]any{"unavailable_rate": 1})

			third, resume := make(chan struct{}), make(chan struct{})
			var runs atomic.Int32
			w.consumer(messaging.ConsumerHooks{BeforeRun: func(string, string) error {
				if runs.Add(1) == 3 {
					close(third)
					<-resume
				}
				return nil
			}}, nil, func(c *messaging.Consumer) {
				c.MaxDeliver = 2
				c.Backoff = messaging.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}
			})
			results := subscribe(t, w.nc, messaging.ResultSubject("acme", "pay"))
			publish(t, w.js, messaging.CommandSubject("acme", "pay"), fmt.Sprintf("overdelivered-pay-%d", run),
				fmt.Sprintf(`{"order_id":%q,"payment_method":"pm_ok"}`, id))

			select {
			case <-third:
			case <-time.After(30 * time.Second):
				t.Fatalf("the third delivery was not run (runs: %d, dead-lettered: %d, given up: %d)", runs.Load(),
					w.counters.get(w.counters.dead, "pay"), w.counters.get(w.counters.givenUp, "pay"))
			}
			tc.mend(w)
			close(resume)
			tc.want(t, w, results, id)
		})
	}
}
