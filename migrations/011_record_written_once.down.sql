ALTER TABLE idempotency_records SET (fillfactor = 80);
