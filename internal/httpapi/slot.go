package httpapi

import (
	"context"
	"sync"
)

// Admission bounds how many requests run at once: a request holds a slot
// while it runs. A request that goes on to wait on something other than
// the service's own capacity, holding no database connection (a pay or
// refund waiting for the payment channel, through the channel app wraps;
// a duplicate waiting for its first attempt's outcome), gives its slot
// back with Yield, so that requests with work to do are admitted
// meanwhile. What it does after the wait runs without a slot: a pay stores
// the channel's answer while it still holds its place at the channel
// (order.MoneyConfig.MaxChannelCalls), a duplicate asks again once.

// slot gives a request's slot back; only its first call does anything.
type slot func()

type slotKey struct{}

// withSlot returns ctx carrying the request's slot, and the function that
// gives the slot back. Only the first of the calls to it and to Yield
// releases the slot; the door defers the call, so the slot is back when
// the request ends at the latest.
func withSlot(ctx context.Context, release func()) (context.Context, func()) {
	once := slot(sync.OnceFunc(release))
	return context.WithValue(ctx, slotKey{}, once), once
}

// Yield gives back the slot ctx carries, if any: the request waits now
// without using the service's capacity.
func Yield(ctx context.Context) {
	if release, ok := ctx.Value(slotKey{}).(slot); ok {
		release()
	}
}
