package idempotency

import (
	"errors"
	"time"

	"gorm.io/gorm"
)

// Inbox is the idempotency record of a webhook: the channel delivers each
// event at least once, under a stable webhook-id, for as long as its
// replay window runs (days). A delivery is noted in the transaction that
// acts on it, so the note and the effect commit together or not at all;
// the primary key, not a cache, decides that a second delivery of the same
// id does nothing, whichever instance receives it and however late.
type Inbox struct {
	// Retention is how long a delivery is remembered: the channel's webhook
	// replay window plus the margin (Policy.InboxRetention).
	Retention time.Duration
}

// ErrDelivered is Note's answer for a webhook-id noted before: the caller
// rolls back and answers the delivery as a duplicate.
var ErrDelivered = errors.New("idempotency: this webhook was delivered before")

// Seen reports whether the delivery id was noted: a cheap read that spares
// a duplicate the work before the note, which still decides.
func (i *Inbox) Seen(db *gorm.DB, id string) (bool, error) {
	var seen bool
	err := db.Raw("SELECT EXISTS (SELECT 1 FROM webhook_inbox WHERE webhook_id = ?)", id).Find(&seen).Error
	return seen, err
}

// Note records the delivery id of an event of eventType, with what came of
// it (applied, ignored), in the caller's transaction. A concurrent
// delivery of the same id waits on the first's uncommitted key, then gets
// ErrDelivered (or goes ahead, if the first rolled back).
func (i *Inbox) Note(tx *gorm.DB, id, eventType, outcome string) error {
	res := tx.Exec(`
		INSERT INTO webhook_inbox (webhook_id, event_type, outcome, expires_at)
		VALUES (?, ?, ?, now() + make_interval(secs => ?))
		ON CONFLICT DO NOTHING`, id, eventType, outcome, i.Retention.Seconds())
	if res.Error == nil && res.RowsAffected == 0 {
		return ErrDelivered
	}
	return res.Error
}

// CleanupBatch forgets up to limit deliveries whose retention has run out.
func (i *Inbox) CleanupBatch(tx *gorm.DB, limit int) (int, error) {
	res := tx.Exec(`
		DELETE FROM webhook_inbox WHERE ctid = ANY (ARRAY(
			SELECT ctid FROM webhook_inbox WHERE expires_at < now()
			ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED))`, limit)
	return int(res.RowsAffected), res.Error
}
