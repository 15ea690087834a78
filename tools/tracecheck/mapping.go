package main

// The mapping of a recorded run onto the model (model/README.md, "Trace
// validation"). The model has one order and tokens that count claims, in
// two configurations: -DORDER, one pay intent and its cancel, and
// -DREFUND, an order PAID whose cancel is the intent, its refund running
// the pay's three phases. A run has many orders, so it is cut into one
// trace per order, checked against -DORDER, and one more per order whose
// cancel sent a refund, checked against -DREFUND. Each step that changes
// what the model holds becomes one model event. In the order's trace the
// cancel is two events and the refund's own steps are dropped; in the
// refund's trace the cancel's steps map as the pay's do in the order's,
// by the same code (intentRun.step), and the pay is done before it
// starts. The rest (the reply as the code read it, the removal of the
// cancel's record from the order's trace) is dropped, as the model folds
// it into another step or holds no such thing.
//
// An order's pay keys make generations: the model has one pay intent, so
// each pay key that went on to the channel has a -DORDER trace of its own,
// from its new claim. The generation before it holds the order until then,
// and takes the new key's claim as one event, pay2 (E_PAY2): 1 when the
// key went on to the channel, which the model allows only from an order
// that can be paid, 2 when phase 1 refused it, allowed only from one that
// cannot. A refused key is that event alone: its replays, answers and the
// cleanup of its record are dropped. The cancel's two events go to the
// newest generation, which holds the order. A later pay key whose new
// claim the run did not record is still beyond the model.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
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

	// another pay key's new claim, in the trace of the generation before
	// it: 1 it went on to the channel, 2 refused in phase 1
	ePay2, pay2Channel, pay2Refused = 15, 1, 2

	kNew, kResume, kTakeover, kReplay, kSweep = 1, 2, 3, 4, 5

	aPaid, aDeclined, aAccepted, aRefused, aUnavailable = 1, 2, 3, 4, 5

	rCharged, rDeclined, rPending, rRefused, rUnknown = 1, 2, 3, 4, 5

	// the record's states (rec), and the recovery points a claim reads
	sProc, sDone, sRetry = 1, 2, 3

	pStarted, pPaymentCreated, pFinished = 1, 2, 3
)

var kindNames = map[int]string{eClaim: "claim", eCall: "call", eLapsed: "lapsed", ePostpone: "postpone", eStore: "store",
	eLateLook: "late_lookup", eLate: "late_store", eCancel: "cancel", eRefund: "refund", eAnswer: "answer", eCleanup: "cleanup",
	eSettle: "settle", eForget: "forget", ePay2: "pay2"}

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

// config is the configuration of the model a trace is checked against.
type config int

const (
	cfgOrder  config = iota // -DORDER: the pay intent, its cancel folded into two events
	cfgRefund               // -DREFUND: the order PAID, the cancel's refund as the intent
)

var configs = []config{cfgOrder, cfgRefund}

// define is the macro that compiles the model in the configuration.
func (c config) define() string {
	if c == cfgRefund {
		return "-DREFUND"
	}
	return "-DORDER"
}

func (c config) String() string {
	if c == cfgRefund {
		return "refund"
	}
	return "order"
}

// trace is one order's events, or its cancel's refund's.
type trace struct {
	name   string
	config config
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

// intentMapping is what tells apart the two intents the model runs through
// the same three phases (in Go both are runPaymentIntent): the pay, whose
// call charges, and the cancel, whose call refunds. Their claims, calls,
// lapses, postpones, stores, answers and cleanups map onto the model's
// events alike (intentRun.step), and so do their answers (answer: done is
// 200, the order paid or cancelled; a refund's failure is a refusal); the
// op, the configuration, the channel's lookup and the statuses that are
// its outcomes are the intent's own.
type intentMapping struct {
	op       string
	cfg      config         // the configuration its traces are checked against
	lookup   string         // the channel's lookup of the intent's key
	statuses map[string]int // the channel's statuses that are outcomes, as the model numbers them
	late     bool           // the model's intent takes late verdicts (a lookup without an owner, a late store)
	second   string         // why a second key of the op on the order is beyond the model
}

var (
	// the pay intent, checked against -DORDER: one generation a key (the
	// order routes each key's steps to its own, orderRun.payStep), so a
	// second key in one trace is the mapping's own mistake
	payMapping = intentMapping{op: "order.pay", cfg: cfgOrder, lookup: "lookup_charge", statuses: chargeStatuses, late: true,
		second: "a second pay key in one generation's trace"}
	// the cancel's refund, checked against -DREFUND: the model's order
	// starts PAID, and takes no late verdict on the refund
	refundMapping = intentMapping{op: "order.cancel", cfg: cfgRefund, lookup: "lookup_refund", statuses: refundStatuses,
		second: "a second cancel intent on the order whose refund started (a new key)"}
)

// intentRun is one intent's trace in the making.
type intentRun struct {
	m     *intentMapping
	t     *trace
	key   string          // the intent's key: the model has one
	calls map[int64]*call // each owner's decision, until its call
}

func newIntentRun(m *intentMapping, name string) *intentRun {
	return &intentRun{m: m, t: &trace{name: name, config: m.cfg}, calls: map[int64]*call{}}
}

// orderRun is what the mapping keeps of one order: its pay generations'
// traces (the first key's first, then one for each later key that went on
// to the channel), and its cancel's refund's trace once the refund started
// (nil until then).
type orderRun struct {
	pays    []*intentRun
	refused map[string]bool // later pay keys refused in phase 1: nothing more of them is modelled
	refund  *intentRun
}

// pay is the newest pay generation, which holds the order: another key's
// claim and the cancel's events go to its trace.
func (r *orderRun) pay() *intentRun { return r.pays[len(r.pays)-1] }

// mapRun cuts a run into one trace per order (the pay intent, with its
// cancel folded into two events), one more for each later pay key of the
// order that went on to the channel, and one more per order whose cancel
// sent a refund (the refund's own steps), and maps their steps.
func mapRun(name string, lines []steps.Line) []*trace {
	type keyOf struct{ order, op, key string }
	byChannelKey := map[string]keyOf{}
	runs := map[string]*orderRun{}
	var orders []string
	free := 0
	for _, l := range lines {
		var in steps.Intent
		_ = json.Unmarshal(l.Data, &in)
		switch l.Step {
		case "unrecorded":
			var u steps.Unrecorded
			must(json.Unmarshal(l.Data, &u))
			free |= map[string]int{"settle": freeSettle, "forget": freeForget}[u.What]
			continue
		case "reply":
			continue // folded into the call
		case "decide":
			var d steps.Decide
			must(json.Unmarshal(l.Data, &d))
			byChannelKey[d.ChannelKey] = keyOf{d.Order, d.Op, d.Key}
		case "channel":
			// the channel's events join their intent by the channel key
			// its decide named
			var ch steps.Channel
			must(json.Unmarshal(l.Data, &ch))
			k, ok := byChannelKey[ch.Key]
			if !ok {
				continue
			}
			in = steps.Intent{Order: k.order, Op: k.op, Key: k.key}
		case "cleanup":
			if in.Order == "" {
				continue // a record that names no order: not the model's
			}
		}
		r, ok := runs[in.Order]
		if !ok {
			r = &orderRun{pays: []*intentRun{newIntentRun(&payMapping, name+" order "+in.Order)}, refused: map[string]bool{}}
			runs[in.Order] = r
			orders = append(orders, in.Order)
		}
		switch in.Op {
		case payMapping.op:
			r.payStep(l, in.Key)
		case refundMapping.op:
			r.cancel(l)
			r.refundStep(l, in.Key)
		}
	}
	var ts []*trace
	for _, o := range orders {
		for _, it := range append(slices.Clone(runs[o].pays), runs[o].refund) {
			if it == nil {
				continue
			}
			t := it.t
			t.free = free
			if len(t.events) > 250 && t.beyond == "" {
				t.beyond = fmt.Sprintf("%d events, more than the model's trace holds", len(t.events))
			}
			if len(t.events) > 0 || t.beyond != "" {
				ts = append(ts, t)
			}
		}
	}
	return ts
}

// payStep maps a step of the order's pay under key onto the trace of the
// key's generation. The first key is the first generation's, as is any
// step before another key's; another key starts at its new claim, which
// the newest generation takes as pay2: a key that went on to the channel
// starts a generation of its own, and a key refused in phase 1 is that
// event alone. Another key whose new claim the run did not record acted on
// the order where no trace saw it: the newest generation, which held the
// order meanwhile, is beyond the model.
func (r *orderRun) payStep(l steps.Line, key string) {
	for _, g := range r.pays {
		if g.key == key {
			g.step(l, key)
			return
		}
	}
	var c steps.Claim
	if l.Step == "claim" {
		must(json.Unmarshal(l.Data, &c))
	}
	newClaim := l.Step == "claim" && c.Kind == "new"
	first := r.pays[0]
	switch {
	case r.refused[key] && !newClaim:
		return // its replays, answers and the cleanup of its record
	case r.refused[key]:
		delete(r.refused, key) // its record removed, the key claims afresh: a new key again
	case first.key == "":
		first.step(l, key) // the first key, or a step that names none yet (a late verdict's decision)
		return
	}
	switch {
	case l.Step == "claim" && c.Kind == "new" && c.Answer == "":
		r.pay().add(l, ePay2, pay2Channel)
		g := newIntentRun(&payMapping, fmt.Sprintf("%s pay %d", first.t.name, len(r.pays)+1))
		r.pays = append(r.pays, g)
		g.step(l, key)
	case l.Step == "claim" && c.Kind == "new":
		r.pay().add(l, ePay2, pay2Refused)
		r.refused[key] = true
	case l.Step == "decide" && lookupOnly(l):
		// a late verdict's decision maps onto nothing: its lookup tells
	default:
		if r.pay().t.beyond == "" {
			r.pay().t.beyond = fmt.Sprintf("another pay key whose intent ran before the run was recorded (step %d: %s)", l.Seq, l.Step)
		}
	}
}

// lookupOnly reports whether a decide is a late verdict's.
func lookupOnly(l steps.Line) bool {
	var d steps.Decide
	must(json.Unmarshal(l.Data, &d))
	return d.How == "lookup_only"
}

// cancel maps a step of the order's cancel onto the trace of the newest
// pay generation, which holds the order, where the cancel is two events:
// cancel at its new claim (1 cancelled at once, 2 the refund started, 3
// refused), refund at its final store (1 refunded, 2 refused). The
// refund's own steps are dropped there.
func (r *orderRun) cancel(l steps.Line) {
	switch l.Step {
	case "claim":
		var c steps.Claim
		must(json.Unmarshal(l.Data, &c))
		if c.Kind != "new" {
			return
		}
		switch {
		case c.Answer == "":
			r.pay().add(l, eCancel, 2)
		case c.Answer == "done":
			r.pay().add(l, eCancel, 1)
		default:
			r.pay().add(l, eCancel, 3)
		}
	case "store":
		var e steps.Store
		must(json.Unmarshal(l.Data, &e))
		switch {
		case e.Fenced || e.Answer == "accepted":
		case e.Answer == "done":
			r.pay().add(l, eRefund, 1)
		default:
			r.pay().add(l, eRefund, 2)
		}
	}
}

// refundStep maps a step of the order's cancel, under key, onto the
// refund's trace. That trace starts at the claim that takes a cancel to
// the channel (a new claim with no answer: the refund started); a cancel
// answered at once (done without the channel, or refused) makes none. The
// model has one cancel, which starts with that claim: a second cancel key
// whose refund starts or runs, or a refund whose start the run did not
// record, is beyond it.
func (r *orderRun) refundStep(l steps.Line, key string) {
	starts, runs := refundSteps(l)
	switch {
	case r.refund == nil && !starts && !runs:
		return // a cancel answered at once, its replays and its answers
	case r.refund == nil:
		r.refund = newIntentRun(&refundMapping, r.pays[0].t.name+" refund")
		if !starts {
			r.refund.t.beyond = fmt.Sprintf("its refund started before the run was recorded (step %d: %s)", l.Seq, l.Step)
		}
	case key != r.refund.key && !starts && !runs:
		return // another cancel answered at once
	}
	r.refund.step(l, key) // a second key marks the trace beyond the model
}

// refundSteps tells whether a step of a cancel starts its refund (its new
// claim, going on to the channel), or is one only a refund under way takes
// (a claim that picks it up, a decision, a call, a lapse, a postpone, a
// store, a late verdict).
func refundSteps(l steps.Line) (starts, runs bool) {
	switch l.Step {
	case "claim":
		var c steps.Claim
		must(json.Unmarshal(l.Data, &c))
		return c.Kind == "new" && c.Answer == "", c.Kind == "resume" || c.Kind == "takeover" || c.Kind == "sweep"
	case "decide", "channel", "lapsed", "postpone", "store", "late":
		return false, true
	}
	return false, false
}

// owns reports whether key is the intent's: the model has one of each op.
// A second key marks the trace as beyond the model.
func (it *intentRun) owns(key string) bool {
	switch {
	case it.t.beyond != "":
		return false
	case it.key == "":
		it.key = key
	case it.key != key:
		it.t.beyond = it.m.second
		return false
	}
	return true
}

// add appends the model event kind that the recorded step l stands for.
func (it *intentRun) add(l steps.Line, kind int, args ...int) {
	if len(it.t.events) == 0 && kind != eClaim && kind != eCancel && it.t.beyond == "" {
		// a pending payment swept up from before the run began
		it.t.beyond = fmt.Sprintf("its intent ran before the run was recorded (step %d: %s)", l.Seq, l.Step)
	}
	if it.t.beyond != "" {
		return
	}
	e := event{kind: kind, seq: l.Seq, source: l.Step + " " + string(l.Data)}
	copy(e.args[:], args)
	it.t.events = append(it.t.events, e)
}

// step maps one step of the intent, under its key, onto its trace: the
// same for the pay and the cancel's refund, the intent's mapping (it.m)
// telling them apart.
func (it *intentRun) step(l steps.Line, key string) {
	var d steps.Decide
	if l.Step == "decide" {
		must(json.Unmarshal(l.Data, &d))
		if d.How == "lookup_only" {
			return // a late verdict's: its lookup is the event
		}
	}
	if !it.owns(key) {
		return
	}
	switch l.Step {
	case "claim":
		var c steps.Claim
		must(json.Unmarshal(l.Data, &c))
		kind := map[string]int{"new": kNew, "resume": kResume, "takeover": kTakeover, "replay": kReplay, "sweep": kSweep}[c.Kind]
		// the recovery point the claim read: the model checks it against
		// what its state implies (0: not recorded)
		point := map[string]int{"started": pStarted, "payment_created": pPaymentCreated, "finished": pFinished}[c.Point]
		it.add(l, eClaim, kind, int(c.Token), answer(c.Answer), point)
	case "decide":
		c := &call{how: 1}
		if d.How == "lookup" {
			c.how = 2
		}
		// the key window judged from the call's deadline, with the code's
		// margin (order.KeyWindowMargin), from the timestamps
		if !d.FirstAttempt.Add(d.KeyWindow).After(d.Deadline.Add(time.Minute)) {
			c.aged = 1
		}
		it.calls[d.Token] = c
	case "channel":
		var ch steps.Channel
		must(json.Unmarshal(l.Data, &ch))
		res := it.m.result(ch)
		if ch.Owner == 0 {
			switch {
			case ch.Call == it.m.lookup && !it.m.late:
				it.t.beyond = fmt.Sprintf("a late verdict's lookup, which the model's intent does not take (step %d)", l.Seq)
			case ch.Call == it.m.lookup:
				it.add(l, eLateLook, res)
			case ch.Call == "settle": // the channel's own: what it took on reached its verdict
				it.add(l, eSettle, res)
			case ch.Call == "forget": // the channel's own: the key's window passed
				it.add(l, eForget)
			}
			return
		}
		c := it.calls[ch.Owner]
		if c == nil {
			it.t.beyond = fmt.Sprintf("a call by owner %d with no decision (step %d)", ch.Owner, l.Seq)
			return
		}
		if ch.Call == it.m.lookup && ch.Status == "" && !ch.Failed {
			return // found nothing: the send that follows is the call's result
		}
		how := c.how
		if c.how == 2 && !strings.HasPrefix(ch.Call, "lookup") {
			how = 3 // the lookup found nothing, and the key was sent
		}
		it.add(l, eCall, int(ch.Owner), how, res, b(ch.Replayed), c.aged)
		delete(it.calls, ch.Owner)
	case "lapsed":
		var e steps.Lapsed
		must(json.Unmarshal(l.Data, &e))
		it.add(l, eLapsed, int(e.Token))
	case "postpone":
		var e steps.Postpone
		must(json.Unmarshal(l.Data, &e))
		it.add(l, ePostpone, int(e.Token), b(e.Fenced))
	case "store":
		var e steps.Store
		must(json.Unmarshal(l.Data, &e))
		if e.Fenced {
			it.add(l, eStore, int(e.Token), 0)
		} else {
			it.add(l, eStore, int(e.Token), answer(e.Answer))
		}
	case "answer":
		var e steps.Answer
		must(json.Unmarshal(l.Data, &e))
		// an answer from what was stored; an error (409 in flight, 503
		// postponed) is not stored and is left out
		if e.Answer != "error" {
			it.add(l, eAnswer, answer(e.Answer))
		}
	case "cleanup":
		var e steps.Cleanup
		must(json.Unmarshal(l.Data, &e))
		// the intent's record removed, in the state it had
		state := map[string]int{"PROCESSING": sProc, "SUCCEEDED": sDone, "FAILED_FINAL": sDone, "FAILED_RETRYABLE": sRetry}[e.State]
		it.add(l, eCleanup, state)
	case "late":
		var e steps.Late
		must(json.Unmarshal(l.Data, &e))
		if !it.m.late {
			it.t.beyond = fmt.Sprintf("a late verdict, which the model's intent does not take (step %d)", l.Seq)
			return
		}
		it.add(l, eLate, b(e.Applied))
	}
}

// answer is the model's answer for a stored or replayed one (0: none), a
// pay's or a cancel's: a cancel stores done, or a refusal (refund_refused,
// invalid_transition, …), never a decline.
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

// The channel's statuses that tell an outcome, for a charge and for a
// refund (reply.go's chargeReply and refundReply): succeeded, the money
// moved (rCharged; for a refund, back); declined, or a refund failed, it
// did not (rDeclined); taken on to finish later (rPending); refused, a
// 4xx (rRefused). Any other status proves nothing (rUnknown).
var (
	chargeStatuses = map[string]int{"succeeded": rCharged, "declined": rDeclined, "pending": rPending, "requires_action": rPending, "refused": rRefused}
	refundStatuses = map[string]int{"succeeded": rCharged, "failed": rDeclined, "pending": rPending, "refused": rRefused}
)

// result is what the model's channel holds or answered for a call of the
// intent: a call that got no answer, or lost it, is unknown.
func (m *intentMapping) result(ch steps.Channel) int {
	if r, ok := m.statuses[ch.Status]; ok && !ch.Failed && !ch.Lost {
		return r
	}
	return rUnknown
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
