package order

// The channel's key window, decided at the call. An acquirer deduplicates
// an idempotency key for a window only (PAYMENT_CHANNEL_KEY_WINDOW, a day
// is common); a POST that reaches it later under the same key moves money
// again, while a lookup by the key still finds what was made under it
// (docs/api.md). So the same key is sent again only when the call is sure
// to land inside the window, and that is known only at the call: a process
// may stall for any time between its claim and its call. The call's
// deadline is therefore fixed first and the window judged against it
// (askChannel), and the call cannot outlive that deadline: a stall after
// the decision runs the deadline out, it never sends the key late.

import "time"

// KeyWindowMargin is how long before the end of the channel's key window
// a call's deadline must fall for the key to be sent again. The deadline
// bounds the client only: a request that reaches the channel just before
// it may be processed there a little later, and the key's first attempt is
// dated by the clock of the instance that wrote the payment, not by the
// channel's. Looking the key up instead costs one round trip, on an intent
// nearly a window old; sending it late costs a second charge.
const KeyWindowMargin = time.Minute

// atTheCall is how a call that ends by deadline asks the channel about p:
// a send becomes a lookup first (lookUpThenSend) unless the channel still
// deduplicates p's key, with KeyWindowMargin to spare, when the deadline
// passes.
func (s *Service) atTheCall(p Payment, how asking, deadline time.Time) asking {
	if how == send && !s.keyRemembered(p, deadline.Add(KeyWindowMargin)) {
		return lookUpThenSend
	}
	return how
}

// keyRemembered reports whether the channel still deduplicates p's key at
// the instant by: the key was first sent no earlier than p was written, in
// phase 1, and the channel remembers it for ChannelKeyWindow from then.
func (s *Service) keyRemembered(p Payment, by time.Time) bool {
	return p.CreatedAt.Add(s.Money.ChannelKeyWindow).After(by)
}
