-- Expired records of money operations are archived, not just deleted: the
-- key, fingerprint, outcome, resource and times stay for audit; the result
-- body is dropped and only its SHA-256 kept, which keeps the archive compact.
CREATE TABLE idempotency_archive (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       text        NOT NULL,
    operation       text        NOT NULL,
    idempotency_key text        NOT NULL,
    fingerprint     text        NOT NULL,
    state           text        NOT NULL,
    resource_id     text,
    outcome         text,
    result_code     text,
    result_sha256   bytea,
    attempts        integer     NOT NULL,
    created_at      timestamptz NOT NULL,
    completed_at    timestamptz,
    expires_at      timestamptz,
    archived_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idempotency_archive_tenant_key ON idempotency_archive (tenant_id, idempotency_key);
