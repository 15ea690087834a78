package order

// How many intents may be at the payment channel at once
// (MoneyConfig.MaxChannelCalls, made into Service.calls by NewService): the
// request's intents take a place in phase 1, the sweeper takes its places
// before it claims any intent, so that it never claims one it cannot
// start.

import "golang.org/x/sync/semaphore"

// channelPlace is an intent's place among the MaxChannelCalls intents at
// the channel at once. Phase 1 takes it when the intent is about to move
// money, so an intent the channel has no room for is shed while
// everything it wrote can still be rolled back; the intent holds it
// through the call and until the reply is stored (phase 3).
type channelPlace struct {
	calls *semaphore.Weighted // nil: no bound
	held  bool
}

// take reserves the place, or sheds the intent with 503 when every place
// is taken. A place already held is kept: a transaction that is tried
// again takes it once.
func (p *channelPlace) take() error {
	if p.calls == nil || p.held {
		return nil
	}
	if !p.calls.TryAcquire(1) {
		return errChannelBusy()
	}
	p.held = true
	return nil
}

func (p *channelPlace) release() {
	if p.held {
		p.calls.Release(1)
		p.held = false
	}
}

// channelPlace is a new, empty place for one intent.
func (s *Service) channelPlace() *channelPlace { return &channelPlace{calls: s.calls} }

// freePlaces takes up to n places at the channel that are free now.
func (s *Service) freePlaces(n int) []*channelPlace {
	var places []*channelPlace
	for range n {
		p := s.channelPlace()
		if p.take() != nil {
			break
		}
		places = append(places, p)
	}
	return places
}
