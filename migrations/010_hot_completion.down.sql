ALTER TABLE idempotency_records RESET (fillfactor);
DROP INDEX IF EXISTS idempotency_records_expires;
DROP INDEX IF EXISTS idempotency_records_due;
CREATE INDEX idempotency_records_expiry ON idempotency_records (expires_at)
    WHERE state IN ('SUCCEEDED', 'FAILED_FINAL');
CREATE INDEX idempotency_records_resumable ON idempotency_records (lease_expires_at)
    WHERE state IN ('PROCESSING', 'FAILED_RETRYABLE');
ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_lease_present;
-- The old constraint wants a lease on every unfinished record.
UPDATE idempotency_records SET lease_expires_at = now()
    WHERE lease_expires_at IS NULL AND state IN ('PROCESSING', 'FAILED_RETRYABLE');
ALTER TABLE idempotency_records ADD CONSTRAINT idempotency_records_lease_present CHECK (
    state NOT IN ('PROCESSING', 'FAILED_RETRYABLE') OR lease_expires_at IS NOT NULL);
ALTER TABLE idempotency_records DROP COLUMN resumable;
