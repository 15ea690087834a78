-- A record stores what came of its intent, in words no transport owns, not
-- an HTTP response: the outcome (created, done, failed), the failure's
-- domain code, and the body a replay sends again. The HTTP status, Location
-- and problem+json document are rendered from these by internal/httpapi,
-- the same way for the first answer and for every replay.
--
-- The UPDATEs below rewrite every finished record once; on a large table
-- run it in a quiet hour (/readyz answers 503 until every migration is
-- applied).
ALTER TABLE idempotency_records
    ADD COLUMN outcome text CHECK (outcome IN ('created', 'done', 'failed')),
    ADD COLUMN result_code text;
-- A success keeps its representation byte for byte: the column is renamed,
-- its bytes are not touched.
ALTER TABLE idempotency_records RENAME COLUMN response_body TO result_body;

UPDATE idempotency_records
SET outcome = CASE WHEN state = 'FAILED_FINAL' THEN 'failed'
                   WHEN response_status = 201 THEN 'created'
                   ELSE 'done' END
WHERE state IN ('SUCCEEDED', 'FAILED_FINAL');

-- A refusal was stored as its problem document; it becomes the domain error
-- it renders from: {"code", "detail", "extensions"}, where the extensions
-- are every member but the five the renderer writes itself. Rendering it
-- gives the same document (keys sorted, as encoding/json writes a map).
UPDATE idempotency_records r
SET result_code = old.doc ->> 'code',
    result_body = convert_to(jsonb_build_object(
        'code', old.doc -> 'code',
        'detail', COALESCE(old.doc -> 'detail', '""'::jsonb),
        'extensions', old.doc - 'type' - 'title' - 'status' - 'detail' - 'code')::text, 'UTF8')
FROM (SELECT tenant_id, operation, idempotency_key, convert_from(result_body, 'UTF8')::jsonb AS doc
      FROM idempotency_records WHERE state = 'FAILED_FINAL') old
WHERE r.tenant_id = old.tenant_id AND r.operation = old.operation AND r.idempotency_key = old.idempotency_key;

ALTER TABLE idempotency_records
    DROP CONSTRAINT idempotency_records_outcome_stored,
    DROP COLUMN response_status,
    DROP COLUMN response_location,
    DROP COLUMN response_content_type,
    -- A definitive outcome always carries the result it will replay.
    ADD CONSTRAINT idempotency_records_outcome_stored CHECK (
        state NOT IN ('SUCCEEDED', 'FAILED_FINAL')
        OR (outcome IS NOT NULL AND result_body IS NOT NULL AND completed_at IS NOT NULL)
    ),
    -- FAILED_FINAL is exactly a failed outcome, and only a failure has a code.
    ADD CONSTRAINT idempotency_records_outcome_state CHECK (
        outcome IS NULL OR ((outcome = 'failed') = (state = 'FAILED_FINAL')
                            AND (outcome = 'failed') = (result_code IS NOT NULL))
    );

-- The archive keeps the outcome and the code; response_status stays for the
-- rows archived before this migration (NULL after it).
ALTER TABLE idempotency_archive
    ADD COLUMN outcome text,
    ADD COLUMN result_code text;
ALTER TABLE idempotency_archive RENAME COLUMN response_sha256 TO result_sha256;
UPDATE idempotency_archive
SET outcome = CASE WHEN state = 'FAILED_FINAL' THEN 'failed'
                   WHEN response_status = 201 THEN 'created'
                   ELSE 'done' END;
