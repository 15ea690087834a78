-- A duplicate that chose to wait (Prefer: wait) for an intent in flight sets
-- this flag; whoever moves the record on (completes it, fails it retryably or
-- takes it over) then sends a NOTIFY from the same transaction. Intents
-- nobody waits for never notify, so their commits never queue on
-- PostgreSQL's notification lock.
ALTER TABLE idempotency_records ADD COLUMN waiting boolean NOT NULL DEFAULT false;
