DROP TRIGGER idempotency_record_moved ON idempotency_records;
DROP FUNCTION idempotency_record_moved();
ALTER TABLE idempotency_records DROP COLUMN waiting;
