-- How much of the changed code receives a diff-level term? Per task: response tokens that wrote a change
-- (covered by any sub-diff with a token span) and the share of them covered by an anchored occurrence,
-- i.e. the tokens whose advantage is A^E + lambda * A^D rather than A^E alone.
WITH rows_per_task AS (
    SELECT task_id, count(*) AS n_rows, sum(n_tokens)::BIGINT AS response_tokens
    FROM staging_steps
    GROUP BY task_id
),

anchored_spans AS (
    SELECT task_id, row_id, unnest(token_spans) AS span
    FROM anchors_occurrences
),

anchored_tokens AS (
    SELECT DISTINCT task_id, row_id, unnest(range(span.start, span."end")) AS token
    FROM anchored_spans
),

changed_per_task AS (
    SELECT task_id, count(DISTINCT row_id) AS rows_with_changes, count(*) AS changed_tokens
    FROM staging_changed_tokens
    GROUP BY task_id
),

anchored_per_task AS (
    SELECT task_id, count(DISTINCT row_id) AS rows_with_anchors, count(*) AS anchored_tokens
    FROM anchored_tokens
    GROUP BY task_id
)

SELECT
    r.task_id,
    r.n_rows,
    coalesce(c.rows_with_changes, 0)                AS rows_with_changes,
    coalesce(a.rows_with_anchors, 0)                AS rows_with_anchors,
    r.response_tokens,
    coalesce(c.changed_tokens, 0)                   AS changed_tokens,
    coalesce(a.anchored_tokens, 0)                  AS anchored_tokens,
    coalesce(a.anchored_tokens, 0) / nullif(c.changed_tokens, 0) AS coverage_of_changed,
    coalesce(a.anchored_tokens, 0) / nullif(r.response_tokens, 0) AS coverage_of_response
FROM rows_per_task AS r
LEFT JOIN changed_per_task AS c USING (task_id)
LEFT JOIN anchored_per_task AS a USING (task_id)
ORDER BY r.task_id
