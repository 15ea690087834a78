package mockchannel

// The key window. A real acquirer deduplicates an idempotency key for a
// while (a day is common), not for ever: past that, the same key sent again
// is a new request and moves money again. What it made under the key it
// keeps, and a lookup by the key still finds it. The order service relies
// on exactly that (docs/api.md, "The channel's key window"): an intent it
// resumes past the window asks what the channel holds before it sends
// anything. The mock behaves the same, so that tests can show both halves.
//
// A charge (or refund) is its own idempotency record: its key is the
// primary key. Forgetting a key for deduplication therefore moves the old
// row off the key, once, when a POST with the key arrives past the window;
// the row keeps its id, its money and its events, under a name no POST
// can send (it has a space). Until such a POST, a lookup by the key finds
// the old row; after it, the new one the key now names.

import (
	"context"
	"fmt"
)

// forgottenKey is the SQL expression naming a row whose key the channel no
// longer deduplicates: the start of the key, "forgotten", and the row's id.
// It fits the 255-character check and no valid key has a space in it.
const forgottenKey = `left(idempotency_key, 190) || ' forgotten ' || id`

// forgetExpired moves the charge (or refund) under key off the key when
// the key is older than the window, so that the POST being served makes a
// new one. A charge or refund still pending, or a charge that requires
// action, is not forgotten: the channel has not finished with it. The row's webhook events move with it, in the same
// statement, so that the new row's events are not taken for duplicates of
// the old one's. Of two POSTs racing past the window, one moves the row
// (the other's UPDATE finds the key gone once the row lock is released),
// and the primary key then lets one of them make the new charge, which the
// other replays.
func (s *store) forgetExpired(ctx context.Context, kind opKind, key string) error {
	table := map[opKind]string{opCharge: "charges", opRefund: "refunds"}[kind]
	return ledgerErr(s.db.WithContext(ctx).Exec(fmt.Sprintf(`
		WITH forgotten AS (
			UPDATE %s SET idempotency_key = %s
			WHERE idempotency_key = ? AND status NOT IN ('pending', 'requires_action')
			  AND created_at < now() - make_interval(secs => ?)
			RETURNING id, idempotency_key)
		UPDATE webhook_events e SET object_key = f.idempotency_key
		FROM forgotten f WHERE e.object_id = f.id`, table, forgottenKey),
		key, s.keyWindow.Seconds()).Error)
}
