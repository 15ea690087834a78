package main

// The mapping of a recorded run onto the model (model/README.md, "Trace
// validation"). The model has one order, one pay intent, its cancel, and
// tokens that count claims; a run has many orders, so it is cut into one
// trace per order. Each step that changes what the model holds becomes one
// model event; the rest (the reply as the code read it, the calls and
// stores of the cancel's refund, the removal of the cancel's record) is
// dropped, as the model folds it into another step or holds no such thing.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/orderservice/orderservice/internal/order/steps"
)

// The model's event kinds, answers and results, as idempotency.pml
// numbers them.
const (
	eClaim, eCall, eLapsed, ePostpone, eStore, eLateLook, eLate, eCancel, eRefund, eAnswer, eCleanup, eSettle, eForget = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13

	// not an event: the trace's first line, naming the channel's own steps
	// the run did not record (a bit each), which the model takes freely
	eFree, freeSettle, freeForget = 14, 1, 2

	kNew, kResume, kTakeover, kReplay, kSweep = 1, 2, 3, 4, 5

	aPaid, aDeclined, aAccepted, aRefused, aUnavailable = 1, 2, 3, 4, 5

	rCharged, rDeclined, rPending, rRefused, rUnknown = 1, 2, 3, 4, 5

	// the record's states (rec), and the recovery points a claim reads
	sProc, sDone, sRetry = 1, 2, 3

	pStarted, pPaymentCreated, pFinished = 1, 2, 3
)

var kindNames = map[int]string{eClaim: "claim", eCall: "call", eLapsed: "lapsed", ePostpone: "postpone", eStore: "store",
	eLateLook: "late_lookup", eLate: "late_store", eCancel: "cancel", eRefund: "refund", eAnswer: "answer", eCleanup: "cleanup",
	eSettle: "settle", eForget: "forget"}

// event is one model event: its kind and up to five arguments, and the
// recorded step it stands for.
type event struct {
	kind   int
	args   [5]int
	seq    int
	source string
}

func (e event) String() string {
	return fmt.Sprintf("%s%v", kindNames[e.kind], e.args)
}

// trace is one order's events.
type trace struct {
	name   string
	events []event
	beyond string // why the model's configuration cannot hold it ("": it can)
	free   int    // the channel's own steps the run did not record (freeSettle, freeForget)
	result result
}

// readRun reads a recorded run.
func readRun(path string) ([]steps.Line, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []steps.Line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l steps.Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		lines = append(lines, l)
	}
	return lines, sc.Err()
}

// call is an owner's phase 2 in progress: its decision, and whether its
// lookup found nothing (the send follows).
type call struct {
	how  int
	aged int
}

// orderRun is what the mapping keeps of one order.
type orderRun struct {
	t      *trace
	payKey string
	calls  map[int64]*call
}

// mapRun cuts a run into one trace per order and maps its steps.
func mapRun(name string, lines []steps.Line) []*trace {
	type keyOf struct{ order, op string }
	byChannelKey := map[string]keyOf{}
	runs := map[string]*orderRun{}
	var order []string
	free := 0
	run := func(o string) *orderRun {
		r, ok := runs[o]
		if !ok {
			r = &orderRun{t: &trace{name: name + " order " + o}, calls: map[int64]*call{}}
			runs[o] = r
			order = append(order, o)
		}
		return r
	}
	for _, l := range lines {
		src := l.Step + " " + string(l.Data)
		add := func(r *orderRun, kind int, args ...int) {
			if len(r.t.events) == 0 && kind != eClaim && kind != eCancel && r.t.beyond == "" {
				// a pending payment swept up from before the run began
				r.t.beyond = fmt.Sprintf("its intent ran before the run was recorded (step %d: %s)", l.Seq, l.Step)
			}
			if r.t.beyond != "" {
				return
			}
			e := event{kind: kind, seq: l.Seq, source: src}
			copy(e.args[:], args)
			r.t.events = append(r.t.events, e)
		}
		var in steps.Intent
		_ = json.Unmarshal(l.Data, &in)
		switch l.Step {
		case "unrecorded":
			var u steps.Unrecorded
			must(json.Unmarshal(l.Data, &u))
			free |= map[string]int{"settle": freeSettle, "forget": freeForget}[u.What]
		case "claim":
			var c steps.Claim
			must(json.Unmarshal(l.Data, &c))
			r := run(c.Order)
			if c.Op == "order.cancel" {
				if c.Kind == "new" {
					switch {
					case c.Answer == "":
						add(r, eCancel, 2)
					case c.Answer == "done":
						add(r, eCancel, 1)
					default:
						add(r, eCancel, 3)
					}
				}
				continue
			}
			if !r.pay(c.Key) {
				continue
			}
			kind := map[string]int{"new": kNew, "resume": kResume, "takeover": kTakeover, "replay": kReplay, "sweep": kSweep}[c.Kind]
			// the recovery point the claim read: the model checks it
			// against what its state implies (0: not recorded)
			point := map[string]int{"started": pStarted, "payment_created": pPaymentCreated, "finished": pFinished}[c.Point]
			add(r, eClaim, kind, int(c.Token), answer(c.Answer), point)
		case "decide":
			var d steps.Decide
			must(json.Unmarshal(l.Data, &d))
			byChannelKey[d.ChannelKey] = keyOf{d.Order, d.Op}
			r := run(d.Order)
			if d.Op != "order.pay" || d.How == "lookup_only" || !r.pay(d.Key) {
				continue
			}
			c := &call{how: 1}
			if d.How == "lookup" {
				c.how = 2
			}
			// the key window judged from the call's deadline, with the
			// code's margin (order.KeyWindowMargin), from the timestamps
			if !d.FirstAttempt.Add(d.KeyWindow).After(d.Deadline.Add(time.Minute)) {
				c.aged = 1
			}
			r.calls[d.Token] = c
		case "channel":
			var ch steps.Channel
			must(json.Unmarshal(l.Data, &ch))
			k, ok := byChannelKey[ch.Key]
			if !ok || k.op != "order.pay" {
				continue // a refund's call: the model's refund is one step
			}
			r := run(k.order)
			if r.t.beyond != "" {
				continue
			}
			res := result3(ch)
			if ch.Owner == 0 {
				switch ch.Call {
				case "lookup_charge":
					add(r, eLateLook, res)
				case "settle": // the channel's own: what it took on reached its verdict
					add(r, eSettle, res)
				case "forget": // the channel's own: the key's window passed
					add(r, eForget)
				}
				continue
			}
			c := r.calls[ch.Owner]
			if c == nil {
				r.t.beyond = fmt.Sprintf("a call by owner %d with no decision (step %d)", ch.Owner, l.Seq)
				continue
			}
			if ch.Call == "lookup_charge" && ch.Status == "" && !ch.Failed {
				continue // found nothing: the send that follows is the call's result
			}
			replayed := 0
			if ch.Replayed {
				replayed = 1
			}
			how := c.how
			if c.how == 2 && !strings.HasPrefix(ch.Call, "lookup") {
				how = 3 // the lookup found nothing, and the key was sent
			}
			add(r, eCall, int(ch.Owner), how, res, replayed, c.aged)
			delete(r.calls, ch.Owner)
		case "lapsed":
			var e steps.Lapsed
			must(json.Unmarshal(l.Data, &e))
			if r := run(e.Order); e.Op == "order.pay" && r.pay(e.Key) {
				add(r, eLapsed, int(e.Token))
			}
		case "postpone":
			var e steps.Postpone
			must(json.Unmarshal(l.Data, &e))
			if r := run(e.Order); e.Op == "order.pay" && r.pay(e.Key) {
				add(r, ePostpone, int(e.Token), b(e.Fenced))
			}
		case "store":
			var e steps.Store
			must(json.Unmarshal(l.Data, &e))
			r := run(e.Order)
			if e.Op == "order.cancel" {
				switch {
				case e.Fenced || e.Answer == "accepted":
				case e.Answer == "done":
					add(r, eRefund, 1)
				default:
					add(r, eRefund, 2)
				}
				continue
			}
			if !r.pay(e.Key) {
				continue
			}
			if e.Fenced {
				add(r, eStore, int(e.Token), 0)
			} else {
				add(r, eStore, int(e.Token), answer(e.Answer))
			}
		case "answer":
			var e steps.Answer
			must(json.Unmarshal(l.Data, &e))
			// an answer from what was stored; an error (409 in flight, 503
			// postponed) is not stored and is left out
			if r := run(e.Order); e.Op == "order.pay" && e.Answer != "error" && r.pay(e.Key) {
				add(r, eAnswer, answer(e.Answer))
			}
		case "cleanup":
			var e steps.Cleanup
			must(json.Unmarshal(l.Data, &e))
			// the pay intent's record removed, in the state it had; the
			// cancel's record is not in the model
			if e.Op != "order.pay" || e.Order == "" {
				continue
			}
			state := map[string]int{"PROCESSING": sProc, "SUCCEEDED": sDone, "FAILED_FINAL": sDone, "FAILED_RETRYABLE": sRetry}[e.State]
			if r := run(e.Order); r.pay(e.Key) {
				add(r, eCleanup, state)
			}
		case "late":
			var e steps.Late
			must(json.Unmarshal(l.Data, &e))
			if r := run(e.Order); e.Op == "order.pay" && r.pay(e.Key) {
				add(r, eLate, b(e.Applied))
			}
		}
	}
	var ts []*trace
	for _, o := range order {
		r := runs[o]
		r.t.free = free
		if len(r.t.events) > 250 && r.t.beyond == "" {
			r.t.beyond = fmt.Sprintf("%d events, more than the model's trace holds", len(r.t.events))
		}
		if len(r.t.events) > 0 || r.t.beyond != "" {
			ts = append(ts, r.t)
		}
	}
	return ts
}

// pay reports whether key is the order's pay intent: the model has one.
// A second key marks the order as beyond the model.
func (r *orderRun) pay(key string) bool {
	switch {
	case r.t.beyond != "":
		return false
	case r.payKey == "":
		r.payKey = key
	case r.payKey != key:
		r.t.beyond = "a second pay intent on the order (a new key)"
		return false
	}
	return true
}

// answer is the model's answer for a stored or replayed one (0: none).
func answer(a string) int {
	switch {
	case a == "":
		return 0
	case a == "done":
		return aPaid
	case a == "accepted":
		return aAccepted
	case a == "failed:payment_declined":
		return aDeclined
	case a == "failed:service_unavailable":
		return aUnavailable // stored: the model never stores it
	}
	return aRefused
}

// result3 is what the model's channel holds or answered for a call.
func result3(ch steps.Channel) int {
	switch {
	case ch.Failed || ch.Lost:
		return rUnknown
	case ch.Status == "succeeded":
		return rCharged
	case ch.Status == "declined":
		return rDeclined
	case ch.Status == "pending" || ch.Status == "requires_action":
		return rPending
	case ch.Status == "refused":
		return rRefused
	}
	return rUnknown // a status that proves nothing
}

func b(v bool) int {
	if v {
		return 1
	}
	return 0
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
