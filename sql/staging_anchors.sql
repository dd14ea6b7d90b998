-- staging_anchors: one typed row per selected anchor (a group of near-identical sub-diffs of one task).
WITH source AS (
    SELECT * FROM anchors
),

typed AS (
    SELECT
        anchor_id,
        task_id,
        edit_type,
        n_rows::INTEGER         AS n_rows,
        n_members::INTEGER      AS n_members,
        mean_lines::DOUBLE      AS mean_lines,
        gs::DOUBLE              AS gs,
        representative_subdiff_id,
        text
    FROM source
)

SELECT * FROM typed
