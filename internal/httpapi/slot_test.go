package httpapi

import (
	"context"
	"testing"
)

func TestASlotIsGivenBackOnceHoweverOftenItIsReleased(t *testing.T) {
	released := 0
	ctx, release := withSlot(context.Background(), func() { released++ })
	yieldSlot(ctx)
	slotOf(context.WithoutCancel(ctx))() // the use case's Yield, from a detached context
	release()                            // the door's deferred release
	if released != 1 {
		t.Errorf("the slot was released %d times, want 1", released)
	}
	if slotOf(context.Background()) != nil { // a request no door limits: nothing to give back
		t.Error("a request without a slot has a give-back")
	}
	yieldSlot(context.Background())
}
