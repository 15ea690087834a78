package lessons

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/lab/naiveorders/naive"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

// dbURL is this package's own database, created fresh by TestMain.
var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "lessons"))
}

// events collects what a session emits.
type events struct {
	mu   sync.Mutex
	list []Event
}

func (e *events) sink(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, ev)
}

func (e *events) of(lesson int) []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Event
	for _, ev := range e.list {
		if ev.Lesson == lesson {
			out = append(out, ev)
		}
	}
	return out
}

// TestEveryLessonTellsAWellFormedStory plays every lesson, stepping, with
// the lanes observed, and checks the shape every front end relies on.
func TestEveryLessonTellsAWellFormedStory(t *testing.T) {
	m := apptest.Start(t, dbURL, apptest.LessonEnv)
	// A bound against a hang, with room for the whole suite's load.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var got events
	s := NewSession(Config{BaseURL: m.URL(), ChannelURL: "http://" + m.ChannelAddr, APIKey: apptest.KeyAcme,
		Tenant: "acme", NATSURL: m.NATSURL, NATSOperator: "orderservice:" + m.Config.NATS.ServicePassword,
		SweepWait: 15 * time.Second, Observe: true, NaiveDatabaseURL: dbURL,
		NeighbourAPIKey: apptest.KeyGlobex, NeighbourTenant: "globex"}, got.sink)
	defer s.Close()
	if err := s.Preflight(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	stepped := map[int]bool{}
	step := func(_ context.Context, r Request) error {
		mu.Lock()
		defer mu.Unlock()
		stepped[r.ID] = true
		return nil
	}

	for _, l := range All() {
		t.Run(l.Title, func(t *testing.T) {
			out := s.Play(ctx, l, step)
			evs := got.of(l.Number)
			if !out.Passed {
				var told []string
				for _, e := range evs {
					if e.Kind == KindSay || e.Kind == KindCheck || e.Kind == KindAnswer && e.Answer != nil {
						told = append(told, fmt.Sprintf("%s %v %s %+v", e.Kind, e.OK, e.Text, e.Answer))
					}
				}
				t.Fatalf("lesson %d did not pass: %v\n%s", l.Number, out.Err, strings.Join(told, "\n"))
			}
			if evs[0].Kind != KindLessonStart || evs[0].Text != l.Title {
				t.Errorf("first event = %+v, want lesson_start with the title", evs[0])
			}
			if last := evs[len(evs)-1]; last.Kind != KindLessonEnd || !last.OK {
				t.Errorf("last event = %+v, want a passed lesson_end", last)
			}
			requests, answered := map[int]Request{}, map[int]bool{}
			var checks, whys, metrics int
			for i, e := range evs {
				if i > 0 && e.Seq <= evs[i-1].Seq {
					t.Errorf("event %d has seq %d after %d", i, e.Seq, evs[i-1].Seq)
				}
				switch e.Kind {
				case KindRequest:
					requests[e.Request.ID] = *e.Request
					// The lab's ↻ sends what the timeline holds: a POST the Go
					// client sent (it drops GetBody) must be held with its body.
					if e.Request.Method == http.MethodPost && e.Request.Operation != "" && e.Request.Body == "" {
						t.Errorf("request %d (%s %s) is on the timeline without its body: a re-send would go out empty", e.Request.ID, e.Request.Method, e.Request.Path)
					}
					mu.Lock()
					skipped := i > 0 && evs[i-1].Kind == KindSay && (evs[i-1].Text == fmt.Sprintf(stepSkipped, e.Request.ID) ||
						evs[i-1].Text == fmt.Sprintf(stepBurst, e.Request.ID))
					if !stepped[e.Request.ID] && !skipped {
						t.Errorf("request %d was sent without its step, and not while another was in flight", e.Request.ID)
					}
					mu.Unlock()
				case KindAnswer:
					if _, ok := requests[e.Answer.RequestID]; !ok {
						t.Errorf("answer to request %d before (or without) the request", e.Answer.RequestID)
					}
					answered[e.Answer.RequestID] = true
				case KindCheck:
					checks++
					if whys != 1 {
						t.Errorf("a check before the why")
					}
				case KindWhy:
					whys++
					if e.Text != l.Why {
						t.Errorf("why = %q", e.Text)
					}
				case KindMetrics:
					metrics++
					if len(e.Signals) != len(signalSeries) {
						t.Errorf("metrics carry %d signals, want %d", len(e.Signals), len(signalSeries))
					}
					// A card counts what the lesson did: lesson 2 executes
					// exactly its two creates.
					for _, sig := range e.Signals {
						if l.Number == 2 && strings.HasPrefix(sig.Name, "intents executed") && sig.After-sig.Before != 2 {
							t.Errorf("lesson 2's %q card moved %v, want 2", sig.Name, sig.After-sig.Before)
						}
					}
				}
			}
			for id := range requests {
				if !answered[id] {
					t.Errorf("request %d has no answer event", id)
				}
				if r := requests[id]; r.TraceID != "" || r.TraceURL != "" {
					t.Errorf("request %d carries trace %q (%q) with no trace URL set", id, r.TraceID, r.TraceURL)
				}
			}
			if l.Pitfall != "" {
				pitfallHasBothHalves(t, l, requests, evs)
			}
			if checks == 0 || whys != 1 || metrics != 1 {
				t.Errorf("%d checks, %d whys, %d metrics events; want some, one, one", checks, whys, metrics)
			}
		})
	}

	t.Run("lanes show each change once", func(t *testing.T) {
		seen := map[string]bool{}
		for _, e := range got.of(7) {
			if e.Kind != KindRecord {
				continue
			}
			r := e.Record
			id := fmt.Sprintf("%s %s %s %d %d", r.Key, r.Operation, r.State, r.Attempts, r.LeaseToken)
			if seen[id] {
				t.Errorf("record %+v emitted twice unchanged", r)
			}
			seen[id] = true
		}
		if len(seen) < 3 {
			t.Errorf("lesson 7's record lane has %d states, want create SUCCEEDED, pay FAILED_RETRYABLE and pay SUCCEEDED", len(seen))
		}
	})

	t.Run("a naive service's request sent again goes to that naive service", func(t *testing.T) {
		var first Request
		var firstOrder string
		for _, l := range All() {
			if l.Pitfall != "dedup-on-customer-product" {
				continue
			}
			for _, e := range got.of(l.Number) {
				if e.Kind == KindRequest && e.Request.Naive != "" && first.ID == 0 {
					first = *e.Request
				}
				if e.Kind == KindAnswer && e.Answer.RequestID == first.ID && first.ID != 0 && firstOrder == "" {
					firstOrder = e.Answer.OrderID
				}
			}
		}
		if first.ID == 0 || firstOrder == "" {
			t.Fatalf("no answered request to the naive service in the dedup-on-customer-product lesson")
		}
		again, err := s.Resend(ctx, first.ID, false)
		if err != nil || again.Status != http.StatusCreated || !again.Replayed || again.OrderID != firstOrder {
			t.Errorf("re-send of naive request %d: %+v, %v; want the naive service's first order %s replayed", first.ID, again, err, firstOrder)
		}
		got.mu.Lock()
		var resent *Request
		for i := len(got.list) - 1; i >= 0 && resent == nil; i-- {
			if got.list[i].Kind == KindRequest {
				resent = got.list[i].Request
			}
		}
		got.mu.Unlock()
		if resent == nil || resent.Naive != first.Naive || resent.Resend != first.ID {
			t.Errorf("the re-send's request event = %+v, want one to the naive service making %s", resent, first.Naive)
		}
	})

	t.Run("a re-send with the same key is replayed, with a new key it is a new intent, and neither waits for a step", func(t *testing.T) {
		var create Request
		for _, e := range got.of(1) {
			if e.Kind == KindRequest && e.Request.Operation == "order.create" {
				create = *e.Request
				break
			}
		}
		mu.Lock()
		clear(stepped)
		mu.Unlock()
		same, err := s.Resend(ctx, create.ID, false)
		if err != nil || same.Status != 201 || !same.Replayed || same.OrderID == "" {
			t.Errorf("same key: %+v, %v; want 201 replayed", same, err)
		}
		fresh, err := s.Resend(ctx, create.ID, true)
		if err != nil || fresh.Status != 201 || fresh.Replayed || fresh.OrderID == same.OrderID {
			t.Errorf("new key: %+v, %v; want a new 201 order", fresh, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(stepped) != 0 {
			t.Errorf("re-sends waited for a step: %v", stepped)
		}
	})
}

// pitfallHasBothHalves: a pitfall lesson sends its story to the naive
// service making its mistake, then to the service, and checks both halves.
func pitfallHasBothHalves(t *testing.T, l Lesson, requests map[int]Request, evs []Event) {
	t.Helper()
	toNaive, toService := 0, 0
	for _, r := range requests {
		switch r.Naive {
		case l.Pitfall:
			toNaive++
		case "":
			toService++
		default:
			t.Errorf("request %d went to the naive service making %s, not %s", r.ID, r.Naive, l.Pitfall)
		}
	}
	var naiveChecks, serviceChecks int
	for _, e := range evs {
		if e.Kind == KindCheck && strings.HasPrefix(e.Text, "naive service:") {
			naiveChecks++
		}
		if e.Kind == KindCheck && strings.HasPrefix(e.Text, "the service:") {
			serviceChecks++
		}
	}
	if toNaive == 0 || toService == 0 || naiveChecks == 0 || serviceChecks == 0 {
		t.Errorf("pitfall %s: %d requests to the naive service, %d to the service, %d checks of the harm, %d of its absence; want some of each",
			l.Pitfall, toNaive, toService, naiveChecks, serviceChecks)
	}
}

// TestEveryPitfallIsANaiveMistake: each pitfall lesson switches on one of
// the naive service's mistakes, and each mistake has its lesson.
func TestEveryPitfallIsANaiveMistake(t *testing.T) {
	var got []string
	for _, l := range All() {
		if l.Pitfall != "" {
			got = append(got, l.Pitfall)
		}
	}
	if want := naive.Names(); !slices.Equal(got, want) {
		t.Errorf("pitfall lessons %v, want one per mistake, in order: %v", got, want)
	}
}

// TestPitfallsSayWhatTheyNeed: a pitfall lesson whose naive service cannot
// have its database stops with the reason and the setting to pass.
func TestPitfallsSayWhatTheyNeed(t *testing.T) {
	fake := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})) // an empty /metrics
	defer fake.Close()
	var l Lesson // the last pitfall
	for _, p := range All() {
		if p.Pitfall != "" {
			l = p
		}
	}
	for url, want := range map[string]string{
		"": "the naive service needs a PostgreSQL database (pass -naive-database)",
		"postgres://postgres:secret@127.0.0.1:1/naiveorders?connect_timeout=2": "the naive service needs PostgreSQL at postgres://postgres:xxxxx@127.0.0.1:1/naiveorders",
	} {
		s := NewSession(Config{BaseURL: fake.URL, ChannelURL: fake.URL, NaiveDatabaseURL: url}, nil)
		out := s.Play(context.Background(), l, nil)
		s.Close()
		if out.Passed || out.Err == nil || !strings.Contains(out.Err.Error(), want) {
			t.Errorf("with the naive database %q: %+v, want it stopped with %q", url, out, want)
		}
	}
}

// TestTraceparentWhenATraceURLIsSet: with a trace URL every request a lesson
// sends starts a trace of its own (a W3C traceparent), recorded with its
// link on the request's event; without one, neither header nor link.
func TestTraceparentWhenATraceURLIsSet(t *testing.T) {
	var mu sync.Mutex
	var headers []string
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		headers = append(headers, r.Header.Get("traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer fake.Close()
	ctx := context.Background()
	send := func(traceURL string) []Request {
		var got events
		s := NewSession(Config{BaseURL: fake.URL, TraceURL: traceURL}, got.sink)
		defer s.Close()
		for range 2 {
			if _, err := s.Send(ctx, http.MethodPost, "/v1/orders", "K", "{}"); err != nil {
				t.Fatal(err)
			}
		}
		var out []Request
		for _, e := range got.list {
			if e.Kind == KindRequest {
				out = append(out, *e.Request)
			}
		}
		return out
	}

	sent := send("http://localhost:16686/trace/{trace_id}")
	format := regexp.MustCompile(`^00-([0-9a-f]{32})-[0-9a-f]{16}-01$`)
	if len(sent) != 2 || len(headers) != 2 {
		t.Fatalf("%d request events, %d requests received; want 2 of each", len(sent), len(headers))
	}
	for i, r := range sent {
		m := format.FindStringSubmatch(headers[i])
		if m == nil {
			t.Errorf("request %d: traceparent %q, want 00-<32 hex>-<16 hex>-01", i, headers[i])
			continue
		}
		if r.TraceID != m[1] || r.TraceURL != "http://localhost:16686/trace/"+m[1] {
			t.Errorf("request %d: event trace %q, link %q; want the header's trace id %s and its link", i, r.TraceID, r.TraceURL, m[1])
		}
	}
	if sent[0].TraceID == sent[1].TraceID {
		t.Errorf("two requests share trace %s: each must start its own", sent[0].TraceID)
	}

	headers = nil
	for i, r := range send("") {
		if headers[i] != "" || r.TraceID != "" || r.TraceURL != "" {
			t.Errorf("without a trace URL, request %d: traceparent %q, event trace %q, link %q; want none", i, headers[i], r.TraceID, r.TraceURL)
		}
	}
}

func TestOperationOfNamesTheRecordsOperation(t *testing.T) {
	cases := map[string]string{
		"POST /v1/orders":            "order.create",
		"POST /v1/orders/abc/pay":    "order.pay",
		"POST /v1/orders/abc/cancel": "order.cancel",
		"GET /v1/orders/abc":         "",
		"POST /v1/other":             "",
	}
	for in, want := range cases {
		method, path, _ := strings.Cut(in, " ")
		if got := operationOf(method, path); got != want {
			t.Errorf("operationOf(%s) = %q, want %q", in, got, want)
		}
	}
}

// TestBrokerLessonsWithoutTheOperator plays the lessons that need the
// operator's NATS user with none: the DLQ replay is shown as the command to
// run and stood in for by the client's own copy of the command, the relay's
// republish is told, and both still pass on what a tenant can see.
func TestBrokerLessonsWithoutTheOperator(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got events
	s := NewSession(Config{BaseURL: m.URL(), ChannelURL: "http://" + m.ChannelAddr, APIKey: apptest.KeyAcme,
		Tenant: "acme", NATSURL: m.NATSURL}, got.sink)
	defer s.Close()
	for _, n := range []int{11, 12} {
		l, _ := ByNumber(n)
		if out := s.Play(ctx, l, nil); !out.Passed {
			t.Errorf("lesson %d without the operator did not pass: %v", n, out.Err)
		}
		var said []string
		for _, e := range got.of(n) {
			if e.Kind == KindSay {
				said = append(said, e.Text)
			}
			if e.Kind == KindCheck && !e.OK {
				t.Errorf("lesson %d: red check %q", n, e.Text)
			}
		}
		if text := strings.Join(said, "\n"); !strings.Contains(text, "no operator NATS credentials") {
			t.Errorf("lesson %d does not say it runs without the operator:\n%s", n, text)
		}
	}
}

// TestBrokerLessonsSayWhenTheBrokerRefusesTheTenant: a wrong API key for
// the tenant's NATS user stops the lesson with the broker's refusal and a
// hint, not a hang.
func TestBrokerLessonsSayWhenTheBrokerRefusesTheTenant(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := NewSession(Config{BaseURL: m.URL(), ChannelURL: "http://" + m.ChannelAddr, APIKey: apptest.KeyAcme,
		Tenant: "globex", NATSURL: m.NATSURL}, nil)
	defer s.Close()
	l, _ := ByNumber(9)
	out := s.Play(ctx, l, nil)
	if out.Passed || out.Err == nil || !strings.Contains(out.Err.Error(), "the broker refuses tenant globex") {
		t.Errorf("lesson 9 as globex with acme's key: %+v, want the broker's refusal", out)
	}
}

// timingSession is a session of its own against a service of its own,
// started with env, for a lesson played in a timing the test sets up.
type timingSession struct {
	*Session
	m   *app.Main
	got *events
}

func newTimingSession(t *testing.T, env map[string]string) timingSession {
	m := apptest.Start(t, dbURL, env)
	got := &events{}
	s := NewSession(Config{BaseURL: m.URL(), ChannelURL: "http://" + m.ChannelAddr, APIKey: apptest.KeyAcme,
		Tenant: "acme", Observe: true, NaiveDatabaseURL: dbURL}, got.sink)
	t.Cleanup(s.Close)
	return timingSession{s, m, got}
}

// sweepBefore is a step that lets the service's nth pay go only once the
// sweeper has resumed an intent: a learner pausing past Retry-After, with
// the service's own sweeper off (SWEEP_INTERVAL 1h) and swept by hand.
func (ts timingSession) sweepBefore(nth int) StepFunc {
	pays := 0
	return func(ctx context.Context, r Request) error {
		if r.Operation != "order.pay" || r.Naive != "" {
			return nil
		}
		if pays++; pays < nth {
			return nil
		}
		for {
			n, err := ts.m.Orders.Sweep(ctx, 10)
			if err != nil || n > 0 {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// play plays lesson n and fails the test unless it passed and its checks
// say want; it returns what the lesson said and checked.
func (ts timingSession) play(t *testing.T, n int, step StepFunc, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, _ := ByNumber(n)
	from := len(ts.got.of(n))
	out := ts.Play(ctx, l, step)
	var lines []string
	for _, e := range ts.got.of(n)[from:] {
		if e.Kind == KindCheck || e.Kind == KindSay {
			lines = append(lines, fmt.Sprintf("%v %s", e.OK, e.Text))
		}
	}
	story := strings.Join(lines, "\n")
	if !out.Passed {
		t.Fatalf("lesson %d did not pass (%v):\n%s", n, out.Err, story)
	}
	if !strings.Contains(story, want) {
		t.Errorf("lesson %d does not say %q:\n%s", n, want, story)
	}
	return story
}

// TestLostChannelResponseHoldsWhoeverResumesTheIntent plays lesson 7 in
// both timings a learner can meet. Its first attempt leaves the intent
// FAILED_RETRYABLE until Retry-After; a retry sent before then resumes it
// and sends the charge again under the stored key, while one sent after
// (a learner stepping slowly, a loaded machine) may find that the sweeper
// resumed it first, asking the channel what it holds under the key. The
// service's own sweeper is off here and the test sweeps by hand, so each
// timing happens for sure; in both the lesson's checks hold and tell what
// happened.
func TestLostChannelResponseHoldsWhoeverResumesTheIntent(t *testing.T) {
	ts := newTimingSession(t, map[string]string{"SWEEP_INTERVAL": "1h"})

	t.Run("a retry at once resumes the intent and the channel absorbs the charge sent again", func(t *testing.T) {
		ts.play(t, 7, nil, "the retry sent the charge again under that key and the channel absorbed the duplicate")
	})

	t.Run("a retry after the sweeper finished the intent gets its result, looked up under the same key", func(t *testing.T) {
		ts.play(t, 7, ts.sweepBefore(2), "the sweeper asked the channel what it holds under the key")
	})

	// The pitfall of a new channel key per retry tells the service's half
	// of the same story (its naive half runs where no sweeper goes).
	l, _ := ByNumber(1)
	for _, p := range All() {
		if p.Pitfall == "new-channel-key-per-retry" {
			l = p
		}
	}
	t.Run("the new-channel-key pitfall's retry, at once", func(t *testing.T) {
		ts.play(t, l.Number, nil, "absorbed the retry")
	})
	t.Run("the new-channel-key pitfall's retry, after the sweeper", func(t *testing.T) {
		ts.play(t, l.Number, ts.sweepBefore(2), "which the sweeper looked up under the same key")
	})
}

// TestInFlightHoldsWhenTheFirstFinishesFirst plays lesson 4 against a
// channel whose pm_slow is not slow at all, as a machine too busy to send
// the duplicates while the first runs would: the first has finished before
// they come (the waiting one, at least), and the lesson says so and checks
// that story (the first result, replayed, and one charge) instead of
// failing.
func TestInFlightHoldsWhenTheFirstFinishesFirst(t *testing.T) {
	ts := newTimingSession(t, map[string]string{"PAYMENT_SLOW_DELAY": "1ms"})
	t.Log(ts.play(t, 4, nil, "the channel holds exactly 1 charge for the order"))
}
