package httpapi

import (
	"context"
	"testing"
)

func TestASlotIsGivenBackOnceHoweverOftenItIsReleased(t *testing.T) {
	released := 0
	ctx, release := withSlot(context.Background(), func() { released++ })
	slotOf(ctx)()                        // the use case's Yield
	slotOf(context.WithoutCancel(ctx))() // again, from a detached context
	release()                            // the door's deferred release
	if released != 1 {
		t.Errorf("the slot was released %d times, want 1", released)
	}
	if slotOf(context.Background()) != nil { // a request no door limits: nothing to give back
		t.Error("a request without a slot has a give-back")
	}
}
