package steps

import (
	"context"
	"sync/atomic"
)

// A step the code takes in a database transaction (a claim, phase 3's
// store, a postpone, a late verdict, the cleanup's removal of a record) is
// recorded inside it, before it commits. That is deliberate: a transaction
// that conflicts with it waits on its row locks until it commits, so the
// order in which such steps are recorded is the order in which the
// database serialized them. But the transaction may still roll back after
// its step was recorded: its commit fails, or database.Transact reruns it
// after a deadlock or a serialization failure. Then its step never
// happened, and a rerun would record it twice.
//
// So each attempt of a recorded transaction runs under a context Attempt
// marks (database.TransactAttempts), and a step recorded under that
// context is tentative: it keeps its place in the run, and stands only
// once its attempt committed. What a Log writes is the steps that stand.

// attempt is one attempt of a transaction, as the steps recorded in it
// see it: committed once it committed; until then, or rolled back, its
// steps do not stand.
type attempt struct{ committed atomic.Bool }

type attemptKey struct{}

// Attempt marks one attempt of a transaction (it is a database.Attempt):
// the steps recorded under the context it returns stand only if end is
// told that the attempt committed.
func Attempt(ctx context.Context) (context.Context, func(committed bool)) {
	a := &attempt{}
	return context.WithValue(ctx, attemptKey{}, a), a.committed.Store
}

// attemptOf is the attempt ctx runs under; nil outside a transaction,
// where a step stands as soon as it is recorded.
func attemptOf(ctx context.Context) *attempt {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return a
}

// stands says whether a step recorded under a took place.
func (a *attempt) stands() bool { return a == nil || a.committed.Load() }
