// Package steps names the idempotency protocol's steps as the code takes
// them, so that a test can record a run and tools/tracecheck can replay it
// against the model (model/idempotency.pml, model/README.md "Trace
// validation"). In production nothing records: order.Deps.Steps is nil,
// and each step costs one nil check.
//
// One event is one step the model takes at once: a transaction (a claim,
// phase 3's store, a postpone, a late verdict, the cleanup's removal of a
// record; recorded before it commits, and kept only if it does: Attempt),
// the decision how to ask the channel, one call to the channel as the
// channel answered it, or a step the channel takes of its own (settling a
// charge it took on, forgetting a key).
package steps

import (
	"context"
	"time"
)

// Recorder is told each step. It must be safe for concurrent use; the order
// in which it is told is the order of the run. A step told under the
// context of a transaction's attempt (Attempt) is tentative: it keeps its
// place, and stands only if the attempt commits (Log keeps only those).
type Recorder interface {
	Record(ctx context.Context, ev Event)
}

// Event is one step. Step names its kind, as the trace spells it.
type Event interface{ Step() string }

// Intent names the intent a step belongs to, and the order it acts on.
type Intent struct {
	Order string `json:"order"`
	Op    string `json:"op"`
	Key   string `json:"key"`
}

// Claim is phase 1's transaction: Kind is new, resume (from
// FAILED_RETRYABLE), takeover (from an expired PROCESSING lease) or replay;
// By is client or sweeper. Token is the lease token the claim took (0 for a
// replay). Answer is set when the intent ended in phase 1 (a replay, or a
// refusal of the order's rule). Point is the recovery point the claim read
// on the record (idempotency_records.recovery_point: started,
// payment_created, finished), the one the code then switches on: started
// for a new claim, where a resumed claim picks the intent up, finished for
// a replay.
type Claim struct {
	Intent
	Kind   string `json:"kind"`
	By     string `json:"by"`
	Token  int64  `json:"token"`
	Answer string `json:"answer,omitempty"`
	Point  string `json:"point,omitempty"`
}

// Decide is phase 2's decision how to ask the channel, made at the call:
// send, lookup (then send) or lookup_only (a late verdict). Deadline is the
// call's; FirstAttempt and KeyWindow say when the channel forgets the key.
type Decide struct {
	Intent
	Token        int64         `json:"token"`
	ChannelKey   string        `json:"channel_key"`
	How          string        `json:"how"`
	Deadline     time.Time     `json:"deadline"`
	FirstAttempt time.Time     `json:"first_attempt"`
	KeyWindow    time.Duration `json:"key_window"`
}

// Reply is what the code made of the channel's answer: its verdict
// (moved, declined, refused, pending, unknown).
type Reply struct {
	Intent
	Token    int64  `json:"token"`
	Verdict  string `json:"verdict"`
	Replayed bool   `json:"replayed,omitempty"`
}

// Lapsed is an owner whose lease ran out between its claim and its call:
// it does not call.
type Lapsed struct {
	Intent
	Token int64 `json:"token"`
}

// Postpone is the owner giving the intent back (FAILED_RETRYABLE), or
// fenced off it.
type Postpone struct {
	Intent
	Token  int64 `json:"token"`
	Fenced bool  `json:"fenced,omitempty"`
}

// Store is phase 3's transaction: the payment before and after, the order
// after, and the answer stored; or fenced, when it stored nothing.
type Store struct {
	Intent
	Token         int64  `json:"token"`
	Fenced        bool   `json:"fenced,omitempty"`
	Answer        string `json:"answer,omitempty"`
	PaymentBefore string `json:"payment_before,omitempty"`
	PaymentAfter  string `json:"payment_after,omitempty"`
	OrderAfter    string `json:"order_after,omitempty"`
}

// Late is a late verdict's transaction (a webhook, ResolvePending, the
// sweeper's SweepPending): the verdict the channel told, and whether it
// was applied (the payment was still pending).
type Late struct {
	Intent
	Verdict string `json:"verdict"`
	Applied bool   `json:"applied"`
}

// Cleanup is the retention job removing an intent's record
// (idempotency.Store.CleanupBatch), in the transaction that removes it:
// State is the state the record was in (SUCCEEDED, FAILED_FINAL; never,
// when the code is right, PROCESSING or FAILED_RETRYABLE). Intent.Order is
// the record's resource, empty when it names none.
type Cleanup struct {
	Intent
	State string `json:"state"`
}

// Answer is what a client of the intent was given.
type Answer struct {
	Intent
	Answer string `json:"answer"`
}

// Channel is one call as the channel answered it: Call is charge, refund,
// lookup_charge or lookup_refund; Status what it holds under Key (empty:
// nothing, a lookup's 404); Replayed a POST answered from the key's first
// answer; Lost that it acted but its answer never came back; Failed that
// it answered an error and did nothing (unavailable, a refused lookup).
// Owner is the lease token of the intent's owner that called (0: a late
// verdict's lookup, or a step of the channel's own).
//
// Two steps are the channel's own, taken without a call, Owner 0: settle,
// a charge it took on as pending reaching its verdict (Status: succeeded
// or declined), and forget, the key window of Key passing, so that the
// channel no longer deduplicates it (a POST under it would move money
// again; a lookup still finds what it made). The channel records them
// where it takes them, ordered with its calls; one that cannot says so
// once in the run (Unrecorded), and the model takes that step freely.
type Channel struct {
	Call     string `json:"call"`
	Key      string `json:"channel_key"`
	Owner    int64  `json:"owner"`
	Status   string `json:"status,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	Lost     bool   `json:"lost,omitempty"`
	Failed   bool   `json:"failed,omitempty"`
}

// Unrecorded is a run's note that its channel takes one of its own steps
// (What: settle or forget) without recording it: the mock channel over
// HTTP settles on its own clock, in its own process, where no call of the
// run can be ordered against it. tracecheck then leaves that step free to
// the model for the whole run, as it was before the step was recorded.
type Unrecorded struct {
	What string `json:"what"`
}

func (Claim) Step() string      { return "claim" }
func (Decide) Step() string     { return "decide" }
func (Reply) Step() string      { return "reply" }
func (Lapsed) Step() string     { return "lapsed" }
func (Postpone) Step() string   { return "postpone" }
func (Store) Step() string      { return "store" }
func (Late) Step() string       { return "late" }
func (Answer) Step() string     { return "answer" }
func (Cleanup) Step() string    { return "cleanup" }
func (Channel) Step() string    { return "channel" }
func (Unrecorded) Step() string { return "unrecorded" }

type ownerKey struct{}

// Owning is ctx carrying the lease token of the owner that works under it,
// so that the channel's steps name who called.
func Owning(ctx context.Context, token int64) context.Context {
	return context.WithValue(ctx, ownerKey{}, token)
}

// OwnerOf is the lease token ctx carries (0: none).
func OwnerOf(ctx context.Context) int64 {
	t, _ := ctx.Value(ownerKey{}).(int64)
	return t
}
