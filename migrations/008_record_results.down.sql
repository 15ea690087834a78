-- Back to HTTP responses on the record. A success gets its status (201 for
-- created, 200 for done), its Location and its body back unchanged; a
-- refusal gets its problem document rebuilt from the code table of this
-- version (same members; jsonb may order them differently from the bytes
-- first sent).
CREATE TEMPORARY TABLE problem_codes (code text PRIMARY KEY, status integer, title text);
INSERT INTO problem_codes VALUES
    ('invalid_request', 400, 'The request is invalid'),
    ('idempotency_key_missing', 400, 'Idempotency-Key is required'),
    ('idempotency_key_invalid', 400, 'Idempotency-Key is malformed'),
    ('unauthenticated', 401, 'Missing or unknown API key'),
    ('payment_declined', 402, 'The payment was declined'),
    ('payment_refused', 402, 'The payment channel refused the charge'),
    ('refund_refused', 409, 'The payment channel refused the refund'),
    ('order_not_found', 404, 'Order not found'),
    ('not_found', 404, 'Not found'),
    ('method_not_allowed', 405, 'Method not allowed'),
    ('request_in_progress', 409, 'A request with this key is in progress'),
    ('invalid_transition', 409, 'The order cannot make this transition'),
    ('payload_too_large', 413, 'The request body is too large'),
    ('unsupported_media_type', 415, 'Unsupported media type'),
    ('idempotency_key_reused', 422, 'Idempotency-Key reused with different parameters'),
    ('internal', 500, 'Internal error'),
    ('service_unavailable', 503, 'Service temporarily unavailable');

ALTER TABLE idempotency_records
    DROP CONSTRAINT idempotency_records_outcome_state,
    DROP CONSTRAINT idempotency_records_outcome_stored,
    ADD COLUMN response_status integer,
    ADD COLUMN response_location text,
    ADD COLUMN response_content_type text;
ALTER TABLE idempotency_records RENAME COLUMN result_body TO response_body;

UPDATE idempotency_records
SET response_status = CASE outcome WHEN 'created' THEN 201 ELSE 200 END,
    response_location = CASE outcome WHEN 'created' THEN '/v1/orders/' || resource_id END,
    response_content_type = 'application/json'
WHERE outcome IN ('created', 'done');

UPDATE idempotency_records r
SET response_status = COALESCE(p.status, 500),
    response_content_type = 'application/problem+json',
    response_body = convert_to((COALESCE(old.doc -> 'extensions', '{}'::jsonb) || jsonb_build_object(
        'type', 'urn:orderservice:problem:' || (old.doc ->> 'code'),
        'title', p.title,
        'status', COALESCE(p.status, 500),
        'detail', old.doc -> 'detail',
        'code', old.doc -> 'code'))::text, 'UTF8')
FROM (SELECT tenant_id, operation, idempotency_key, convert_from(response_body, 'UTF8')::jsonb AS doc
      FROM idempotency_records WHERE outcome = 'failed') old
LEFT JOIN problem_codes p ON p.code = old.doc ->> 'code'
WHERE r.tenant_id = old.tenant_id AND r.operation = old.operation AND r.idempotency_key = old.idempotency_key;

ALTER TABLE idempotency_records
    DROP COLUMN outcome,
    DROP COLUMN result_code,
    ADD CONSTRAINT idempotency_records_outcome_stored CHECK (
        state NOT IN ('SUCCEEDED', 'FAILED_FINAL')
        OR (response_status IS NOT NULL AND response_body IS NOT NULL AND completed_at IS NOT NULL)
    );

ALTER TABLE idempotency_archive RENAME COLUMN result_sha256 TO response_sha256;
ALTER TABLE idempotency_archive DROP COLUMN outcome, DROP COLUMN result_code;
DROP TABLE problem_codes;
