-- anchors_rows: the distinct step rows of each anchor (the comparison group of A^D), with their R_t.
-- A row holding two occurrences of one anchor appears once: the group is made of rows, not occurrences.
WITH occurrences AS (
    SELECT * FROM anchors_occurrences
),

distinct_rows AS (
    SELECT
        anchor_id,
        row_id,
        any_value(task_id)          AS task_id,
        any_value(traj_id)          AS traj_id,
        any_value(turn)             AS turn,
        any_value(return_to_go)     AS return_to_go,
        count(*)                    AS n_occurrences_in_row
    FROM occurrences
    GROUP BY anchor_id, row_id
)

SELECT * FROM distinct_rows
