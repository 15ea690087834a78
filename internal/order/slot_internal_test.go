package order

import (
	"testing"

	"golang.org/x/sync/semaphore"

	"github.com/orderservice/orderservice/internal/problem"
)

func TestASlotAtTheChannelIsTakenOnce(t *testing.T) {
	calls := semaphore.NewWeighted(1)
	first := &channelSlot{calls: calls}
	if err := first.take(); err != nil {
		t.Fatalf("the first take: %v", err)
	}
	if err := first.take(); err != nil { // a phase-1 transaction tried again
		t.Fatalf("taking a slot already held: %v", err)
	}

	second := &channelSlot{calls: calls}
	if err := second.take(); problem.CodeOf(err) != problem.ServiceUnavailable {
		t.Fatalf("a take with no slot free = %v, want service_unavailable", err)
	}
	first.release()
	first.release() // the deferred release after an earlier one: nothing more
	if err := second.take(); err != nil {
		t.Fatalf("a take once the slot is free: %v", err)
	}
	second.release()
	if !calls.TryAcquire(1) || calls.TryAcquire(1) {
		t.Error("after both released, exactly one slot should be free")
	}
}

// The sweeper takes only the slots that are free: as many as it may claim
// intents, since a claimed intent's lease runs whether it started or not.
func TestTheSweeperTakesOnlyFreeSlots(t *testing.T) {
	s := NewService(Deps{Money: MoneyConfig{MaxChannelCalls: 3}})
	held := s.channelSlot()
	if err := held.take(); err != nil {
		t.Fatal(err)
	}
	slots := s.freeSlots(10)
	if len(slots) != 2 {
		t.Fatalf("free slots = %d, want 2 of 3 (one is held)", len(slots))
	}
	if got := s.freeSlots(10); len(got) != 0 {
		t.Fatalf("free slots with all taken = %d, want 0", len(got))
	}
	for _, p := range slots {
		p.release()
	}
	held.release()
	if got := len(s.freeSlots(2)); got != 2 {
		t.Errorf("a batch of 2 takes %d slots, want 2", got)
	}
	if got := len(NewService(Deps{}).freeSlots(5)); got != 5 {
		t.Errorf("without a bound a batch of 5 takes %d slots, want 5", got)
	}
}
