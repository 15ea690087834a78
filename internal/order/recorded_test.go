package order_test

// Recorded runs. With ORDERSERVICE_TRACE_DIR set (make model sets it), every
// service a test makes (useCasesOn) records the protocol's steps, and every
// call to its channel as the channel answered it, into one log per test,
// written to that directory as <test>.jsonl when the test ends. Only the
// tests' runs record: tools/tracecheck then replays each against the model
// (model/README.md, "Trace validation").

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
)

var (
	logsMu sync.Mutex
	logs   = map[*testing.T]*steps.Log{}
)

// recorded is t's log, made (and set to be written when t ends) on first
// use; nil when no trace directory is set.
func recorded(t *testing.T) *steps.Log {
	dir := os.Getenv("ORDERSERVICE_TRACE_DIR")
	if dir == "" {
		return nil
	}
	logsMu.Lock()
	defer logsMu.Unlock()
	if l, ok := logs[t]; ok {
		return l
	}
	l := &steps.Log{}
	logs[t] = l
	t.Cleanup(func() {
		logsMu.Lock()
		delete(logs, t)
		logsMu.Unlock()
		if len(l.Lines()) == 0 {
			return
		}
		name := strings.NewReplacer("/", "__", " ", "_").Replace(t.Name())
		if err := l.Write(filepath.Join(dir, name+".jsonl")); err != nil {
			t.Errorf("writing the recorded run: %v", err)
		}
	})
	return l
}

// stepsOf is t's log as a recorder: nil (recording nothing) without a
// trace directory.
func stepsOf(t *testing.T) steps.Recorder {
	if l := recorded(t); l != nil {
		return l
	}
	return nil
}

// playedClaim records a claim the test made itself, through the store,
// playing an owner the service does not run.
func playedClaim(t *testing.T, orderID string, c idempotency.Claim) {
	if l := recorded(t); l != nil {
		kind := map[idempotency.State]string{"": "new", idempotency.Processing: "takeover", idempotency.FailedRetryable: "resume"}[c.ResumedFrom]
		l.Record(t.Context(), steps.Claim{Intent: steps.Intent{Order: orderID, Op: c.Record.Operation, Key: c.Record.IdempotencyKey},
			Kind: kind, By: "client", Token: c.Token(), Point: string(c.Record.RecoveryPoint)})
	}
}

// recordedChannel is ch with each call recorded as the channel answered
// it, when t records.
func recordedChannel(t *testing.T, ch order.Channel) order.Channel {
	if l := recorded(t); l != nil && ch != nil {
		return &callLog{ch: ch, log: l}
	}
	return ch
}

// callLog records the calls to ch. A channel in memory records its own
// step where it acts, under its lock (atTheChannel), so that calls under
// one key are recorded in the order the channel took them; any other is
// recorded as the caller received its answer.
type callLog struct {
	ch  order.Channel
	log *steps.Log
}

// callNote is how a call tells the channel in memory where to record, and
// learns that it did.
type callNote struct {
	log      *steps.Log
	recorded bool
}

type callNoteKey struct{}

// atTheChannel records, where the channel in memory acts, one call: the
// status it holds under key after the call (empty: nothing), replayed, or
// that it acted and its answer will be lost, or failed without acting.
func atTheChannel(ctx context.Context, ev steps.Channel) {
	if n, ok := ctx.Value(callNoteKey{}).(*callNote); ok {
		ev.Owner = steps.OwnerOf(ctx)
		n.log.Record(ctx, ev)
		n.recorded = true
	}
}

// call is one call's step, unless the channel recorded it: what the
// channel holds under key as its answer says, or how the call failed.
func (c *callLog) call(ctx context.Context, call, key, status string, replayed bool, err error) {
	if n, ok := ctx.Value(callNoteKey{}).(*callNote); ok && n.recorded {
		return
	}
	ev := steps.Channel{Call: call, Key: key, Owner: steps.OwnerOf(ctx), Status: status, Replayed: replayed}
	switch {
	case err == nil:
	case errors.Is(err, payment.ErrNotFound):
		ev.Status = ""
	case errors.Is(err, payment.ErrRejected):
		ev.Status = "refused"
	case errors.Is(err, errLost):
		ev.Lost = true // the acquirer acted, and says so
	default:
		ev.Status, ev.Failed = "", true // no answer: it may or may not have acted
	}
	c.log.Record(ctx, ev)
}

// noting is ctx with a fresh note for the channel in memory.
func (c *callLog) noting(ctx context.Context) context.Context {
	return context.WithValue(ctx, callNoteKey{}, &callNote{log: c.log})
}

func (c *callLog) Charge(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
	ctx = c.noting(ctx)
	r, err := c.ch.Charge(ctx, key, req)
	c.call(ctx, "charge", key, r.Value.Status, r.Replayed, err)
	return r, err
}

func (c *callLog) LookupCharge(ctx context.Context, key string) (payment.Charge, error) {
	ctx = c.noting(ctx)
	r, err := c.ch.LookupCharge(ctx, key)
	c.call(ctx, "lookup_charge", key, r.Status, false, err)
	return r, err
}

func (c *callLog) Refund(ctx context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error) {
	ctx = c.noting(ctx)
	r, err := c.ch.Refund(ctx, key, req)
	c.call(ctx, "refund", key, r.Value.Status, r.Replayed, err)
	return r, err
}

func (c *callLog) LookupRefund(ctx context.Context, key string) (payment.Refund, error) {
	ctx = c.noting(ctx)
	r, err := c.ch.LookupRefund(ctx, key)
	c.call(ctx, "lookup_refund", key, r.Status, false, err)
	return r, err
}
