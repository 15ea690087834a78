-- A completion that touches no indexed column can be a HOT update: the new
-- row version goes on the same page and no index gets a new entry. The old
-- partial indexes named `state` in their predicates and indexed the two
-- columns a completion set (lease_expires_at, expires_at), so every
-- completion wrote a new entry into the primary key and the expiry index.
--
-- resumable: the intent spans several transactions (a payment), so it can
-- be seen unfinished, and its lease is what lets a retry or the sweeper
-- resume it. An intent that claims, writes and completes in ONE transaction
-- (create, ship, deliver) is never seen PROCESSING by anyone else: it needs
-- no lease, and the sweeper never needs to find it. Its lease_expires_at is
-- NULL from the claim on, so the completion (which sets it to NULL) does not
-- change it. Rows written before this migration count as resumable.
ALTER TABLE idempotency_records ADD COLUMN resumable boolean NOT NULL DEFAULT true;
ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_lease_present;
ALTER TABLE idempotency_records ADD CONSTRAINT idempotency_records_lease_present CHECK (
    NOT resumable OR state NOT IN ('PROCESSING', 'FAILED_RETRYABLE') OR lease_expires_at IS NOT NULL);

-- The sweeper's index: only unfinished resumable intents have a lease. One
-- column in the predicate, so the planner's estimate (its NULL fraction) is
-- right and the index is used at any table size.
DROP INDEX IF EXISTS idempotency_records_resumable;
CREATE INDEX idempotency_records_due ON idempotency_records (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

-- The cleanup's index: expires_at is written by the claim (now() plus the
-- operation's retention) and again by the completion, which in a
-- one-transaction intent is the same now(), so the value does not change.
DROP INDEX IF EXISTS idempotency_records_expiry;
CREATE INDEX idempotency_records_expires ON idempotency_records (expires_at);

-- Room on every page for the completed version of the rows inserted on it:
-- the completion adds the stored response (a few hundred bytes) to a row.
ALTER TABLE idempotency_records SET (fillfactor = 80);
