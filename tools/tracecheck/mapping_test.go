package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/order/steps"
)

// recording builds a run as the order tests' log writes it: one line a
// step, numbered in the order told.
type recording []steps.Line

func (r *recording) add(evs ...steps.Event) {
	for _, ev := range evs {
		data, err := json.Marshal(ev)
		if err != nil {
			panic(err)
		}
		*r = append(*r, steps.Line{Seq: len(*r), Step: ev.Step(), Data: data})
	}
}

// decide is an owner's decision how to ask the channel, well inside the
// key's window.
func decide(in steps.Intent, token int64, channelKey, how string) steps.Decide {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	return steps.Decide{Intent: in, Token: token, ChannelKey: channelKey, How: how,
		Deadline: now.Add(10 * time.Second), FirstAttempt: now, KeyWindow: 24 * time.Hour}
}

// paid records a pay that charged at once and answered 200.
func paid(r *recording, pay steps.Intent) {
	r.add(steps.Claim{Intent: pay, Kind: "new", By: "client", Token: 1, Point: "started"},
		decide(pay, 1, "ck-"+pay.Key, "send"),
		steps.Channel{Call: "charge", Key: "ck-" + pay.Key, Owner: 1, Status: "succeeded"},
		steps.Reply{Intent: pay, Token: 1, Verdict: "moved"},
		steps.Store{Intent: pay, Token: 1, Answer: "done"},
		steps.Answer{Intent: pay, Answer: "done"})
}

// events are a trace's events as the model reads them.
func events(t *trace) []string {
	var s []string
	for _, e := range t.events {
		s = append(s, e.String())
	}
	return s
}

// byName finds the trace named name among ts (nil: none).
func byName(ts []*trace, name string) *trace {
	for _, t := range ts {
		if t.name == name {
			return t
		}
	}
	return nil
}

// A pay, then a cancel whose refund the channel could not take: its owner
// postpones, and the sweeper picks it up, looks the refund up, finds
// nothing and sends it. The order's trace folds the cancel into two
// events; the refund's trace has every step of the cancel, numbered as
// the pay's would be.
func TestARefundPostponedAndSweptMakesARefundTrace(t *testing.T) {
	pay := steps.Intent{Order: "o1", Op: "order.pay", Key: "p1"}
	cancel := steps.Intent{Order: "o1", Op: "order.cancel", Key: "c1"}
	var r recording
	r.add(steps.Unrecorded{What: "settle"})
	paid(&r, pay)
	r.add(steps.Claim{Intent: cancel, Kind: "new", By: "client", Token: 1, Point: "started"},
		decide(cancel, 1, "ck-c1", "send"),
		steps.Channel{Call: "refund", Key: "ck-c1", Owner: 1, Failed: true},
		steps.Reply{Intent: cancel, Token: 1, Verdict: "unknown"},
		steps.Postpone{Intent: cancel, Token: 1},
		steps.Answer{Intent: cancel, Answer: "error"},
		steps.Claim{Intent: cancel, Kind: "sweep", By: "sweeper", Token: 2, Point: "payment_created"},
		decide(cancel, 2, "ck-c1", "lookup"),
		steps.Channel{Call: "lookup_refund", Key: "ck-c1", Owner: 2},
		steps.Channel{Call: "refund", Key: "ck-c1", Owner: 2, Status: "succeeded"},
		steps.Reply{Intent: cancel, Token: 2, Verdict: "moved"},
		steps.Store{Intent: cancel, Token: 2, Answer: "done"},
		steps.Claim{Intent: cancel, Kind: "replay", By: "client", Answer: "done", Point: "finished"},
		steps.Answer{Intent: cancel, Answer: "done"})

	ts := mapRun("run", r)
	if len(ts) != 2 {
		t.Fatalf("%d traces, want the order's and its refund's", len(ts))
	}
	order, refund := byName(ts, "run order o1"), byName(ts, "run order o1 refund")
	if order == nil || refund == nil {
		t.Fatalf("traces %q and %q, want the order's and its refund's", ts[0].name, ts[1].name)
	}
	for _, c := range []struct {
		t      *trace
		config config
		want   []string
	}{
		// claim[kind token answer point], call[token how result replayed
		// past_window]: the cancel, 2 (the refund started), and the
		// refund, 1 (refunded)
		{order, cfgOrder, []string{"claim[1 1 0 1 0]", "call[1 1 1 0 0]", "store[1 1 0 0 0]", "answer[1 0 0 0 0]",
			"cancel[2 0 0 0 0]", "refund[1 0 0 0 0]"}},
		// the failed call unknown (5), postponed; the sweeper's claim at
		// payment_created (5, 2), its lookup that found nothing and the
		// refund sent (how 3) that succeeded (1); the replay of done (1)
		{refund, cfgRefund, []string{"claim[1 1 0 1 0]", "call[1 1 5 0 0]", "postpone[1 0 0 0 0]",
			"claim[5 2 0 2 0]", "call[2 3 1 0 0]", "store[2 1 0 0 0]", "claim[4 0 1 3 0]", "answer[1 0 0 0 0]"}},
	} {
		if c.t.beyond != "" {
			t.Errorf("%s: beyond the model: %s", c.t.name, c.t.beyond)
		}
		if c.t.config != c.config {
			t.Errorf("%s: checked against %s, want %s", c.t.name, c.t.config, c.config)
		}
		if c.t.free != freeSettle {
			t.Errorf("%s: free %d, want the run's %d", c.t.name, c.t.free, freeSettle)
		}
		if got := events(c.t); !slices.Equal(got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.t.name, got, c.want)
		}
	}
	// each event names the recorded step it stands for
	if e := refund.events[1]; e.seq != 9 || !strings.HasPrefix(e.source, "channel ") {
		t.Errorf("the refund's first call stands for step %d (%s), want step 9, the channel's", e.seq, e.source)
	}
}

// A cancel answered at once makes no refund trace: an unpaid order
// cancelled without the channel, and a paid one whose cancel the order's
// rule refused.
func TestACancelAnsweredAtOnceMakesNoRefundTrace(t *testing.T) {
	var r recording
	unpaid := steps.Intent{Order: "o1", Op: "order.cancel", Key: "c1"}
	r.add(steps.Claim{Intent: unpaid, Kind: "new", By: "client", Token: 1, Answer: "done", Point: "started"},
		steps.Answer{Intent: unpaid, Answer: "done"},
		steps.Claim{Intent: unpaid, Kind: "replay", By: "client", Answer: "done", Point: "finished"},
		steps.Answer{Intent: unpaid, Answer: "done"})
	paid(&r, steps.Intent{Order: "o2", Op: "order.pay", Key: "p2"})
	refused := steps.Intent{Order: "o2", Op: "order.cancel", Key: "c2"}
	r.add(steps.Claim{Intent: refused, Kind: "new", By: "client", Token: 1, Answer: "failed:invalid_transition", Point: "started"},
		steps.Answer{Intent: refused, Answer: "failed:invalid_transition"})

	ts := mapRun("run", r)
	var names []string
	for _, t := range ts {
		names = append(names, t.name)
	}
	if want := []string{"run order o1", "run order o2"}; !slices.Equal(names, want) {
		t.Fatalf("traces %q, want %q: no refund's", names, want)
	}
	if got, want := events(ts[0]), []string{"cancel[1 0 0 0 0]"}; !slices.Equal(got, want) {
		t.Errorf("%s: got %v, want %v", ts[0].name, got, want)
	}
	if got := events(ts[1]); len(got) != 5 || got[4] != "cancel[3 0 0 0 0]" {
		t.Errorf("%s: got %v, want the pay's four events and cancel[3]", ts[1].name, got)
	}
}

// The model has one cancel, which starts at its new claim: a refund
// trace is beyond it when a second cancel key's refund starts, when the
// run holds a late verdict's lookup of the refund, or when the refund's
// start was not recorded.
func TestARefundTraceBeyondTheModel(t *testing.T) {
	pay := steps.Intent{Order: "o1", Op: "order.pay", Key: "p1"}
	first := steps.Intent{Order: "o1", Op: "order.cancel", Key: "c1"}
	second := steps.Intent{Order: "o1", Op: "order.cancel", Key: "c2"}
	refused := func(r *recording, cancel steps.Intent) {
		r.add(steps.Claim{Intent: cancel, Kind: "new", By: "client", Token: 1, Point: "started"},
			decide(cancel, 1, "ck-"+cancel.Key, "send"),
			steps.Channel{Call: "refund", Key: "ck-" + cancel.Key, Owner: 1, Status: "refused"},
			steps.Store{Intent: cancel, Token: 1, Answer: "failed:refund_refused"},
			steps.Answer{Intent: cancel, Answer: "failed:refund_refused"})
	}
	for _, c := range []struct {
		name   string
		run    func(*recording)
		beyond string
		events []string // the refund trace's, up to where it went beyond
	}{
		{"a second cancel key whose refund starts", func(r *recording) {
			paid(r, pay)
			refused(r, first)
			refused(r, second)
		}, "a second cancel intent", []string{"claim[1 1 0 1 0]", "call[1 1 4 0 0]", "store[1 4 0 0 0]", "answer[4 0 0 0 0]"}},
		{"a late verdict's lookup of the refund", func(r *recording) {
			paid(r, pay)
			refused(r, first)
			r.add(decide(first, 0, "ck-c1", "lookup_only"),
				steps.Channel{Call: "lookup_refund", Key: "ck-c1", Status: "failed"})
		}, "a late verdict's lookup", []string{"claim[1 1 0 1 0]", "call[1 1 4 0 0]", "store[1 4 0 0 0]", "answer[4 0 0 0 0]"}},
		{"a refund picked up before its start was recorded", func(r *recording) {
			paid(r, pay)
			r.add(steps.Claim{Intent: first, Kind: "sweep", By: "sweeper", Token: 2, Point: "payment_created"})
		}, "its refund started before the run was recorded", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r recording
			c.run(&r)
			refund := byName(mapRun("run", r), "run order o1 refund")
			if refund == nil {
				t.Fatal("no refund trace")
			}
			if !strings.HasPrefix(refund.beyond, c.beyond) {
				t.Errorf("beyond: %q, want %q…", refund.beyond, c.beyond)
			}
			if got := events(refund); !slices.Equal(got, c.events) {
				t.Errorf("events %v, want %v", got, c.events)
			}
		})
	}
}

// A first pay key declined, then a second key that pays: each key that
// went on to the channel is a generation with a trace of its own. The
// first takes the second's new claim as pay2[1] and keeps its own key's
// later steps (the replay of its decline); the cancel that follows goes
// to the second, which holds the order.
func TestASecondPayKeyThatGoesToTheChannelMakesAGeneration(t *testing.T) {
	first := steps.Intent{Order: "o1", Op: "order.pay", Key: "p1"}
	second := steps.Intent{Order: "o1", Op: "order.pay", Key: "p2"}
	cancel := steps.Intent{Order: "o1", Op: "order.cancel", Key: "c1"}
	var r recording
	r.add(steps.Claim{Intent: first, Kind: "new", By: "client", Token: 1, Point: "started"},
		decide(first, 1, "ck-p1", "send"),
		steps.Channel{Call: "charge", Key: "ck-p1", Owner: 1, Status: "declined"},
		steps.Reply{Intent: first, Token: 1, Verdict: "declined"},
		steps.Store{Intent: first, Token: 1, Answer: "failed:payment_declined"},
		steps.Answer{Intent: first, Answer: "failed:payment_declined"})
	paid(&r, second)
	r.add(steps.Claim{Intent: first, Kind: "replay", By: "client", Answer: "failed:payment_declined", Point: "finished"},
		steps.Answer{Intent: first, Answer: "failed:payment_declined"},
		steps.Claim{Intent: cancel, Kind: "new", By: "client", Token: 1, Point: "started"},
		decide(cancel, 1, "ck-c1", "send"),
		steps.Channel{Call: "refund", Key: "ck-c1", Owner: 1, Status: "succeeded"},
		steps.Reply{Intent: cancel, Token: 1, Verdict: "moved"},
		steps.Store{Intent: cancel, Token: 1, Answer: "done"},
		steps.Answer{Intent: cancel, Answer: "done"})

	ts := mapRun("run", r)
	var names []string
	for _, t := range ts {
		names = append(names, t.name)
	}
	if want := []string{"run order o1", "run order o1 pay 2", "run order o1 refund"}; !slices.Equal(names, want) {
		t.Fatalf("traces %q, want %q", names, want)
	}
	for _, c := range []struct {
		t    *trace
		want []string
	}{
		// declined (2) and answered so; the second key's new claim, on to
		// the channel (pay2[1]); the replay of the decline (4, answer 2)
		{ts[0], []string{"claim[1 1 0 1 0]", "call[1 1 2 0 0]", "store[1 2 0 0 0]", "answer[2 0 0 0 0]",
			"pay2[1 0 0 0 0]", "claim[4 0 2 3 0]", "answer[2 0 0 0 0]"}},
		// the second key from its new claim, its own tokens; then the cancel
		{ts[1], []string{"claim[1 1 0 1 0]", "call[1 1 1 0 0]", "store[1 1 0 0 0]", "answer[1 0 0 0 0]",
			"cancel[2 0 0 0 0]", "refund[1 0 0 0 0]"}},
	} {
		if c.t.beyond != "" {
			t.Errorf("%s: beyond the model: %s", c.t.name, c.t.beyond)
		}
		if c.t.config != cfgOrder {
			t.Errorf("%s: checked against %s, want %s", c.t.name, c.t.config, cfgOrder)
		}
		if got := events(c.t); !slices.Equal(got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.t.name, got, c.want)
		}
	}
	// the pay2 event stands for the second key's new claim, which also
	// starts its generation's trace
	if e, f := ts[0].events[4], ts[1].events[0]; e.seq != 6 || f.seq != 6 {
		t.Errorf("pay2 stands for step %d and the second trace starts at step %d, want both at step 6, the second key's claim", e.seq, f.seq)
	}
}

// secondRefusedWhileFirstCalls records a first pay key on its way to the
// channel and a second key of the order refused in phase 1 meanwhile.
func secondRefusedWhileFirstCalls() (first, second steps.Intent, r recording) {
	first = steps.Intent{Order: "o1", Op: "order.pay", Key: "p1"}
	second = steps.Intent{Order: "o1", Op: "order.pay", Key: "p2"}
	r.add(steps.Claim{Intent: first, Kind: "new", By: "client", Token: 1, Point: "started"},
		decide(first, 1, "ck-p1", "send"),
		steps.Claim{Intent: second, Kind: "new", By: "client", Token: 1, Answer: "failed:invalid_transition", Point: "started"})
	return first, second, r
}

// A second pay key refused in phase 1 (the order's rule: 409) while the
// first is at the channel is one event in the first key's trace, pay2[2];
// nothing else of it is modelled: its answer, its replay and the cleanup
// of its record are dropped, and it makes no trace of its own.
func TestASecondPayKeyRefusedInPhaseOneIsOneEvent(t *testing.T) {
	first, second, r := secondRefusedWhileFirstCalls()
	r.add(steps.Answer{Intent: second, Answer: "failed:invalid_transition"},
		steps.Channel{Call: "charge", Key: "ck-p1", Owner: 1, Status: "succeeded"},
		steps.Reply{Intent: first, Token: 1, Verdict: "moved"},
		steps.Store{Intent: first, Token: 1, Answer: "done"},
		steps.Answer{Intent: first, Answer: "done"},
		steps.Claim{Intent: second, Kind: "replay", By: "client", Answer: "failed:invalid_transition", Point: "finished"},
		steps.Answer{Intent: second, Answer: "failed:invalid_transition"},
		steps.Cleanup{Intent: second, State: "FAILED_FINAL"})

	ts := mapRun("run", r)
	if len(ts) != 1 {
		t.Fatalf("%d traces, want the first key's alone", len(ts))
	}
	if ts[0].beyond != "" {
		t.Errorf("beyond the model: %s", ts[0].beyond)
	}
	want := []string{"claim[1 1 0 1 0]", "pay2[2 0 0 0 0]", "call[1 1 1 0 0]", "store[1 1 0 0 0]", "answer[1 0 0 0 0]"}
	if got := events(ts[0]); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// A second pay key whose first recorded step is not its new claim (a
// sweep of a payment it left before the run began) acted on the order
// where no trace saw it: the trace that held the order is beyond the
// model, and the key makes no trace of its own.
func TestASecondPayKeyThatRanBeforeTheRunIsBeyondTheModel(t *testing.T) {
	first := steps.Intent{Order: "o1", Op: "order.pay", Key: "p1"}
	second := steps.Intent{Order: "o1", Op: "order.pay", Key: "p2"}
	var r recording
	paid(&r, first)
	r.add(steps.Claim{Intent: second, Kind: "sweep", By: "sweeper", Token: 2, Point: "payment_created"},
		decide(second, 2, "ck-p2", "lookup"),
		steps.Channel{Call: "lookup_charge", Key: "ck-p2", Owner: 2, Status: "succeeded"})

	ts := mapRun("run", r)
	if len(ts) != 1 {
		t.Fatalf("%d traces, want the first key's alone", len(ts))
	}
	if want := "another pay key whose intent ran before the run was recorded (step 6: claim)"; ts[0].beyond != want {
		t.Errorf("beyond: %q, want %q", ts[0].beyond, want)
	}
}

// A key refused in phase 1 whose record the cleanup later removed may be
// sent again and claim afresh: then it is a new key again, and its claim
// that goes on to the channel starts a generation of its own.
func TestARefusedPayKeyThatClaimsAfreshMakesAGeneration(t *testing.T) {
	first, second, r := secondRefusedWhileFirstCalls()
	r.add(steps.Channel{Call: "charge", Key: "ck-p1", Owner: 1, Status: "declined"},
		steps.Store{Intent: first, Token: 1, Answer: "failed:payment_declined"},
		steps.Cleanup{Intent: second, State: "FAILED_FINAL"})
	r.add(steps.Claim{Intent: second, Kind: "new", By: "client", Token: 1, Point: "started"},
		decide(second, 1, "ck-p2", "send"),
		steps.Channel{Call: "charge", Key: "ck-p2", Owner: 1, Status: "succeeded"},
		steps.Store{Intent: second, Token: 1, Answer: "done"})

	ts := mapRun("run", r)
	if len(ts) != 2 {
		t.Fatalf("%d traces, want the first key's and the second's", len(ts))
	}
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"run order o1", []string{"claim[1 1 0 1 0]", "pay2[2 0 0 0 0]", "call[1 1 2 0 0]", "store[1 2 0 0 0]", "pay2[1 0 0 0 0]"}},
		{"run order o1 pay 2", []string{"claim[1 1 0 1 0]", "call[1 1 1 0 0]", "store[1 1 0 0 0]"}},
	} {
		tr := byName(ts, tc.name)
		if tr == nil || tr.beyond != "" {
			t.Fatalf("%s: %v", tc.name, tr)
		}
		if got := events(tr); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
