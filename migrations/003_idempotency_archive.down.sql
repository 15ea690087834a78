DROP TABLE IF EXISTS idempotency_archive;
