-- Looking a key up across operations probes the primary key once per
-- operation (tenant_id, operation IN (...), idempotency_key), so this index
-- only cost every claim and every completion one more index write.
DROP INDEX IF EXISTS idempotency_records_tenant_key;
