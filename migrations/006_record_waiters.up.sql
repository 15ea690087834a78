-- Waking the duplicates that wait (Prefer: wait) for an intent in flight,
-- beside the record's protocol rather than inside it. A waiting duplicate
-- sets `waiting` (idempotency.Waiter); when the record then moves on (it
-- is completed, failed retryably, or taken over by a new owner), this
-- trigger sends a NOTIFY from the transaction that moved it. PostgreSQL
-- delivers it only if and when that transaction commits, so a waiter never
-- hears of an outcome that rolled back. Records nobody waits for never
-- notify, so their commits never queue on PostgreSQL's notification lock.
ALTER TABLE idempotency_records ADD COLUMN waiting boolean NOT NULL DEFAULT false;

-- The payload names the scope at a fixed length, whatever the key holds:
-- the first 16 bytes of SHA-256(tenant NUL operation NUL key), in hex
-- (idempotency.scopeID computes the same in Go).
CREATE FUNCTION idempotency_record_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idempotency_record_moved', encode(substr(sha256(
        convert_to(NEW.tenant_id, 'UTF8') || '\x00'::bytea ||
        convert_to(NEW.operation, 'UTF8') || '\x00'::bytea ||
        convert_to(NEW.idempotency_key, 'UTF8')), 1, 16), 'hex'));
    RETURN NULL;
END
$$;

CREATE TRIGGER idempotency_record_moved AFTER UPDATE ON idempotency_records
    FOR EACH ROW
    WHEN (OLD.waiting AND (NEW.state <> OLD.state OR NEW.lease_token <> OLD.lease_token))
    EXECUTE FUNCTION idempotency_record_moved();
