-- staging_subdiffs: one typed row per sub-diff candidate, with its exact spans, their sizes and whether it
-- has response tokens. char_spans / token_spans are the exact ranges (merged, sorted, half-open); the
-- char_start..char_end and token_start..token_end columns are only their outer bounds (gaps may lie between,
-- e.g. lines written by two edits of one response), so coverage is always taken from the span lists.
WITH source AS (
    SELECT * FROM subdiffs
),

typed AS (
    SELECT
        subdiff_id,
        row_id,
        traj_id,
        task_id,
        file,
        edit_type,
        scale,
        line_start,
        line_end,
        n_lines,
        char_start,
        char_end,
        token_start,
        token_end,
        char_spans,
        token_spans,
        -- an empty span list means "not written by the response" (e.g. a deletion without search text)
        len(char_spans) > 0                                                          AS has_chars,
        len(token_spans) > 0                                                         AS has_tokens,
        coalesce(list_sum(list_transform(char_spans, lambda s: s."end" - s.start)), 0)::BIGINT  AS char_len,
        coalesce(list_sum(list_transform(token_spans, lambda s: s."end" - s.start)), 0)::BIGINT AS token_len,
        normalized_text
    FROM source
)

SELECT * FROM typed
