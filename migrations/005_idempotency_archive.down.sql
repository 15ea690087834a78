DROP TABLE idempotency_archive;
