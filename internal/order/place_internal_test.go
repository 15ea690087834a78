package order

import (
	"testing"

	"golang.org/x/sync/semaphore"

	"github.com/orderservice/orderservice/internal/problem"
)

func TestAPlaceAtTheChannelIsTakenOnce(t *testing.T) {
	calls := semaphore.NewWeighted(1)
	first := &channelPlace{calls: calls}
	if err := first.take(); err != nil {
		t.Fatalf("the first take: %v", err)
	}
	if err := first.take(); err != nil { // a phase-1 transaction tried again
		t.Fatalf("taking a place already held: %v", err)
	}

	second := &channelPlace{calls: calls}
	if err := second.take(); problem.CodeOf(err) != problem.ServiceUnavailable {
		t.Fatalf("a take with no place free = %v, want service_unavailable", err)
	}
	first.release()
	first.release() // the deferred release after an earlier one: nothing more
	if err := second.take(); err != nil {
		t.Fatalf("a take once the place is free: %v", err)
	}
	second.release()
	if !calls.TryAcquire(1) || calls.TryAcquire(1) {
		t.Error("after both released, exactly one place should be free")
	}
}

// The sweeper takes only the places that are free: as many as it may claim
// intents, since a claimed intent's lease runs whether it started or not.
func TestTheSweeperTakesOnlyFreePlaces(t *testing.T) {
	s := NewService(Deps{Money: MoneyConfig{MaxChannelCalls: 3}})
	held := s.channelPlace()
	if err := held.take(); err != nil {
		t.Fatal(err)
	}
	places := s.freePlaces(10)
	if len(places) != 2 {
		t.Fatalf("free places = %d, want 2 of 3 (one is held)", len(places))
	}
	if got := s.freePlaces(10); len(got) != 0 {
		t.Fatalf("free places with all taken = %d, want 0", len(got))
	}
	for _, p := range places {
		p.release()
	}
	held.release()
	if got := len(s.freePlaces(2)); got != 2 {
		t.Errorf("a batch of 2 takes %d places, want 2", got)
	}
	if got := len(NewService(Deps{}).freePlaces(5)); got != 5 {
		t.Errorf("without a bound a batch of 5 takes %d places, want 5", got)
	}
}
