-- The idempotency record: one row per (tenant, operation, Idempotency-Key).
-- The primary key is the last line of defence against racing duplicates: an
-- intent's record is written with INSERT ... ON CONFLICT DO NOTHING, never
-- "select, then insert".
CREATE TABLE idempotency_records (
    tenant_id        text        NOT NULL,
    operation        text        NOT NULL,
    idempotency_key  text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint      text        NOT NULL CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    state            text        NOT NULL CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL')),
    resource_id      text,
    -- What came of the intent, in words no door owns: each door renders its
    -- own answer (an HTTP status, a result message) from these, the same way
    -- for the first answer and for every replay.
    outcome          text        CHECK (outcome IN ('created', 'done', 'failed')),
    result_code      text,       -- a failure's domain code
    result_body      bytea,      -- the representation a replay sends again, byte for byte
    -- Fencing token: every takeover increments it, and every write of an
    -- outcome names the token it holds, so a superseded owner writes 0 rows.
    lease_token      bigint      NOT NULL DEFAULT 1,
    lease_expires_at timestamptz,
    -- An intent that spans several transactions (a payment) can be seen
    -- unfinished, and its lease lets a retry or the sweeper resume it. One
    -- that runs in ONE transaction (create, ship, deliver) is written once,
    -- already definitive, and never needs a lease.
    resumable        boolean     NOT NULL DEFAULT true,
    attempts         integer     NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz,
    PRIMARY KEY (tenant_id, operation, idempotency_key),
    -- A definitive outcome always carries the result it will replay.
    CONSTRAINT idempotency_records_outcome_stored CHECK (
        state NOT IN ('SUCCEEDED', 'FAILED_FINAL')
        OR (outcome IS NOT NULL AND result_body IS NOT NULL AND completed_at IS NOT NULL)
    ),
    -- FAILED_FINAL is exactly a failed outcome, and only a failure has a code.
    CONSTRAINT idempotency_records_outcome_state CHECK (
        outcome IS NULL OR ((outcome = 'failed') = (state = 'FAILED_FINAL')
                            AND (outcome = 'failed') = (result_code IS NOT NULL))
    ),
    -- Resumable work in flight or waiting for a retry always has a lease to expire.
    CONSTRAINT idempotency_records_lease_present CHECK (
        NOT resumable OR state NOT IN ('PROCESSING', 'FAILED_RETRYABLE') OR lease_expires_at IS NOT NULL
    )
);

-- The sweeper's index: only unfinished resumable intents have a lease. One
-- column in the predicate, so the planner's estimate (its NULL fraction) is
-- right at any table size. A completion drops the lease.
CREATE INDEX idempotency_records_due ON idempotency_records (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

-- The cleanup's index. expires_at is written when the record is inserted
-- (now() plus the operation's retention) and again by a payment's
-- completion; a one-transaction intent's record is written once, so its
-- row is never updated and no index gets a second entry for it.
CREATE INDEX idempotency_records_expires ON idempotency_records (expires_at);
