DROP TABLE idempotency_records;
