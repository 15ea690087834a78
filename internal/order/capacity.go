package order

// How many intents may be at the payment channel at once
// (MoneyConfig.MaxChannelCalls): the request's intents take a place in
// phase 1, the sweeper takes its places before it claims any intent, so
// that it never claims one it cannot start.

import "golang.org/x/sync/semaphore"

// channelPlace is an intent's place among the MaxChannelCalls intents at
// the channel at once. Phase 1 takes it when the intent is about to move
// money, so an intent the channel has no room for is refused while
// everything it wrote can still be rolled back; the intent holds it
// through the call and until the reply is stored (phase 3).
type channelPlace struct {
	calls *semaphore.Weighted // nil: no bound
	held  bool
}

// take reserves the place, or refuses with 503 when every place is taken.
// A place already held is kept: a transaction that is tried again takes it
// once.
func (p *channelPlace) take() error {
	return p.hold(func() error {
		if !p.calls.TryAcquire(1) {
			return errChannelBusy()
		}
		return nil
	})
}

// hold takes the place with acquire, unless there is no bound or the place
// is held already.
func (p *channelPlace) hold(acquire func() error) error {
	if p.calls == nil || p.held {
		return nil
	}
	if err := acquire(); err != nil {
		return err
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

// channelCalls is the bound of MaxChannelCalls, made on first use; nil
// when there is none.
func (s *Service) channelCalls() *semaphore.Weighted {
	s.callsOnce.Do(func() {
		if s.Money.MaxChannelCalls > 0 {
			s.calls = semaphore.NewWeighted(int64(s.Money.MaxChannelCalls))
		}
	})
	return s.calls
}

// channelPlace is a new, empty place for one intent.
func (s *Service) channelPlace() *channelPlace { return &channelPlace{calls: s.channelCalls()} }

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
