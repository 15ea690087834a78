package order

// How many intents may be at the payment channel at once
// (MoneyConfig.MaxChannelCalls, made into Service.calls by NewService): the
// request's intents take a slot in phase 1, the sweeper takes its slots
// before it claims any intent, so that it never claims one it cannot
// start.

import "golang.org/x/sync/semaphore"

// channelSlot is an intent's slot among the MaxChannelCalls intents at
// the channel at once. Phase 1 takes it when the intent is about to move
// money, so an intent the channel has no room for is shed while
// everything it wrote can still be rolled back; the intent holds it
// through the call and until the reply is stored (phase 3).
type channelSlot struct {
	calls *semaphore.Weighted // nil: no bound
	held  bool
}

// take reserves the slot, or sheds the intent with 503 when every slot
// is taken. A slot already held is kept: a transaction that is tried
// again takes it once.
func (sl *channelSlot) take() error {
	if sl.calls == nil || sl.held {
		return nil
	}
	if !sl.calls.TryAcquire(1) {
		return errChannelBusy()
	}
	sl.held = true
	return nil
}

func (sl *channelSlot) release() {
	if sl.held {
		sl.calls.Release(1)
		sl.held = false
	}
}

// channelSlot is a new, empty slot for one intent.
func (s *Service) channelSlot() *channelSlot { return &channelSlot{calls: s.calls} }

// freeSlots takes up to n slots at the channel that are free now.
func (s *Service) freeSlots(n int) []*channelSlot {
	var slots []*channelSlot
	for range n {
		sl := s.channelSlot()
		if sl.take() != nil {
			break
		}
		slots = append(slots, sl)
	}
	return slots
}
