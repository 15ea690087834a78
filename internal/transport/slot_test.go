package transport_test

import (
	"context"
	"testing"

	"github.com/orderservice/orderservice/internal/transport"
)

func TestASlotIsGivenBackOnceHoweverOftenItIsReleased(t *testing.T) {
	released := 0
	ctx, release := transport.WithSlot(context.Background(), func() { released++ })
	transport.Yield(ctx)
	transport.Yield(context.WithoutCancel(ctx)) // the detached work of a pay still carries it
	release()                                   // the door's deferred release
	if released != 1 {
		t.Errorf("the slot was released %d times, want 1", released)
	}
	transport.Yield(context.Background()) // a request no door limits: nothing to give back
}
