-- A one-transaction intent (create, ship, deliver) now writes its record
-- once, already SUCCEEDED or FAILED_FINAL, in the transaction that executes
-- it (idempotency.Store.Record: a create's first statement, a transition's
-- last); only a payment's record is updated
-- after its insert, and that update drops the lease, an indexed column, so it
-- cannot be HOT anyway. The room migration 010 left on every page for a
-- second version of each row is no longer used: pages are filled again. Only
-- pages written from now on are affected.
ALTER TABLE idempotency_records RESET (fillfactor);
