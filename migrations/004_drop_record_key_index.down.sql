CREATE INDEX idempotency_records_tenant_key ON idempotency_records (tenant_id, idempotency_key);
