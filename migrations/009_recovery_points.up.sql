-- Where a resumed intent picks up: its recovery point, stored, not
-- inferred (the atomic phases of Brandur Leach's "Implementing
-- Stripe-like Idempotency Keys in Postgres"). Each phase of an intent ends
-- by writing the point it reached, in the transaction that did its work,
-- so the point and the work commit together; whoever resumes the intent (a
-- retry, the sweeper) switches on it (internal/order/once.go):
--
--   started          the claim is written and nothing else: run phase 1
--                    (the order's rule);
--   payment_created  phase 1 wrote the intent's payment with its channel
--                    key: ask the channel about it (phase 2), then store
--                    the reply (phase 3);
--   finished         the outcome is stored: replay it.
ALTER TABLE idempotency_records
    ADD COLUMN recovery_point text NOT NULL DEFAULT 'started'
        CHECK (recovery_point IN ('started', 'payment_created', 'finished'));

-- The records written before the point was stored. A definitive one is
-- finished. An unfinished one (PROCESSING, or FAILED_RETRYABLE waiting for
-- a retry) whose payment exists had committed phase 1, which wrote the
-- payment in the claim's transaction, so it is at payment_created: that
-- is what the code used to infer from the payment row. Whatever status
-- the payment has now (a webhook may have settled it since), the intent
-- still has to store the reply and complete its record. An unfinished one
-- without a payment stays started.
UPDATE idempotency_records SET recovery_point = 'finished'
WHERE state IN ('SUCCEEDED', 'FAILED_FINAL');

UPDATE idempotency_records r SET recovery_point = 'payment_created'
WHERE r.state IN ('PROCESSING', 'FAILED_RETRYABLE')
  AND EXISTS (SELECT 1 FROM payments p
              WHERE p.tenant_id = r.tenant_id AND p.operation = r.operation
                AND p.idempotency_key = r.idempotency_key);

-- Only a definitive record is finished.
ALTER TABLE idempotency_records ADD CONSTRAINT idempotency_records_finished_is_definitive
    CHECK (recovery_point <> 'finished' OR state IN ('SUCCEEDED', 'FAILED_FINAL'));
