package lessons

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/apptest"
	"github.com/orderservice/orderservice/internal/testdb"
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
	m := apptest.Start(t, dbURL, map[string]string{"PAYMENT_SLOW_DELAY": "1s"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got events
	s := NewSession(Config{BaseURL: m.URL(), ChannelURL: "http://" + m.ChannelAddr, APIKey: apptest.KeyAcme,
		Tenant: "acme", NATSURL: m.NATSURL, NATSOperator: "orderservice:" + m.Config.NATSServicePassword,
		SweepWait: 15 * time.Second, Observe: true}, got.sink)
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
			if !out.Passed {
				t.Fatalf("lesson %d did not pass: %v", l.Number, out.Err)
			}
			evs := got.of(l.Number)
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
					skipped := i > 0 && evs[i-1].Kind == KindSay && evs[i-1].Text == fmt.Sprintf(stepSkipped, e.Request.ID)
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
