ALTER TABLE idempotency_records DROP COLUMN waiting;
