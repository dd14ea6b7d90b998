-- staging_changed_tokens: one row per response token that wrote a change (inside any sub-diff's exact token
-- spans), with its task and row: what credit coverage is measured against.
WITH spans AS (
    SELECT task_id, row_id, unnest(token_spans) AS span
    FROM staging_subdiffs
)

SELECT DISTINCT task_id, row_id, unnest(range(span.start, span."end")) AS token
FROM spans
