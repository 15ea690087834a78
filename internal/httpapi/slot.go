package httpapi

import (
	"context"
	"sync"
)

// Admission bounds how many requests run at once: a request holds a slot
// while it runs. A request that goes on to wait on something other than
// the service's own capacity, holding no database connection (a pay or
// refund waiting for the payment channel; a duplicate waiting for its
// first attempt's outcome), gives its slot back, so that requests with
// work to do are admitted meanwhile. The door hands the give-back to the
// use case as its Yield (order.Door), and the use case calls it
// when it starts to wait. What it does after the wait runs without a slot:
// a pay stores the channel's answer while it still holds its slot at the
// channel (order.MoneyConfig.MaxChannelCalls), a duplicate asks again once.

// slot gives a request's slot back; only its first call does anything.
type slot func()

type slotKey struct{}

// withSlot returns ctx carrying the request's slot, from the admission
// limit to the handler, and the function that gives the slot back. Only
// the first call to it, or to what slotOf returns, releases the slot; the
// door defers the call, so the slot is back when the request ends at the
// latest.
func withSlot(ctx context.Context, release func()) (context.Context, func()) {
	once := slot(sync.OnceFunc(release))
	return context.WithValue(ctx, slotKey{}, once), once
}

// slotOf is the give-back of the slot ctx carries, or nil when the request
// holds none (admission off, or a route it does not limit).
func slotOf(ctx context.Context) func() {
	if release, ok := ctx.Value(slotKey{}).(slot); ok {
		return release
	}
	return nil
}
