ALTER TABLE idempotency_records DROP COLUMN recovery_point;
