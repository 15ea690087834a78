package httpapi

import (
	"context"
	"testing"
)

func TestASlotIsGivenBackOnceHoweverOftenItIsReleased(t *testing.T) {
	released := 0
	ctx, release := withSlot(context.Background(), func() { released++ })
	Yield(ctx)
	Yield(context.WithoutCancel(ctx)) // the detached work of a pay still carries it
	release()                         // the door's deferred release
	if released != 1 {
		t.Errorf("the slot was released %d times, want 1", released)
	}
	Yield(context.Background()) // a request no door limits: nothing to give back
}
