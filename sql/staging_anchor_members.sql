-- staging_anchor_members: one row per (anchor, member occurrence); the stored A^D is kept for comparison.
WITH source AS (
    SELECT * FROM anchor_members
),

typed AS (
    SELECT
        anchor_id,
        subdiff_id,
        row_id,
        task_id,
        diff_advantage::DOUBLE  AS stored_diff_advantage
    FROM source
)

SELECT * FROM typed
