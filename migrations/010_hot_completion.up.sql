-- A completion that touches no indexed column can be a HOT update: the new
-- row version goes on the same page and no index gets a new entry. The old
-- partial indexes named `state` in their predicates and indexed the two
-- columns a completion sets (lease_expires_at, expires_at), so every
-- completion wrote a new entry into the primary key and the expiry index.
--
-- resumable: the intent spans several transactions (a payment), so it can
-- be seen unfinished and the sweeper may have to resume it. An intent that
-- claims, writes and completes in ONE transaction (create, ship, deliver)
-- is never seen PROCESSING by anyone else: the sweeper never needs to find
-- it, and it keeps its lease_expires_at when it completes.
-- Rows written before this migration count as resumable: the finished ones
-- have no lease left, so they stay out of the sweeper's index anyway.
ALTER TABLE idempotency_records ADD COLUMN resumable boolean NOT NULL DEFAULT true;

-- The sweeper's index: unfinished resumable intents by lease. A resumable
-- completion sets lease_expires_at to NULL and leaves it.
DROP INDEX IF EXISTS idempotency_records_resumable;
CREATE INDEX idempotency_records_due ON idempotency_records (lease_expires_at)
    WHERE resumable AND lease_expires_at IS NOT NULL;

-- The cleanup's index: expires_at is written by the claim (now() plus the
-- operation's retention) and again by the completion, which in a
-- one-transaction intent is the same now(), so the value does not change.
DROP INDEX IF EXISTS idempotency_records_expiry;
CREATE INDEX idempotency_records_expires ON idempotency_records (expires_at);

-- Room on every page for the completed version of the rows inserted on it:
-- the completion adds the stored response (a few hundred bytes) to a row.
ALTER TABLE idempotency_records SET (fillfactor = 80);
