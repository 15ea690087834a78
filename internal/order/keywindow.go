package order

// The channel's key window, decided at the call. An acquirer deduplicates
// an idempotency key for a window only (PAYMENT_CHANNEL_KEY_WINDOW, a day
// is common); a POST that reaches it later under the same key moves money
// again, while a lookup by the key still finds what was made under it
// (docs/api.md). So the same key is sent again only when the call is sure
// to land inside the window, and that is known only at the call: a process
// may stall for any time between its claim and its call. The decision is
// therefore made where the call's deadline starts, and the call cannot
// outlive that deadline; a stall after the decision ends in the deadline,
// not in a late request.

import (
	"context"
	"time"
)

// atTheCall is how a call whose deadline ctx carries asks the channel
// about p: a send becomes a lookup first (lookUpThenSend) unless the
// channel still deduplicates p's key when the call's deadline passes.
func (s *Service) atTheCall(ctx context.Context, p Payment, how asking) asking {
	if how != send {
		return how
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(s.Money.ChannelTimeout)
	}
	if s.keyRemembered(p, deadline) {
		return send
	}
	return lookUpThenSend
}

// keyRemembered reports whether the channel still deduplicates p's key at
// the instant by: the key was first sent no earlier than p was written, in
// phase 1, and the channel remembers it for ChannelKeyWindow from then.
func (s *Service) keyRemembered(p Payment, by time.Time) bool {
	return p.CreatedAt.Add(s.Money.ChannelKeyWindow).After(by)
}
