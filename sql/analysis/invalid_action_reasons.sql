-- Why do actions fail to parse or apply? Invalid-action reasons (action_status other than 'ok') by action
-- kind, with their share of the invalid rows and of all rows, the mean step reward and one example row.
WITH typed AS (
    SELECT * FROM staging_steps
),

invalid AS (
    SELECT * FROM typed WHERE is_invalid_action
)

SELECT
    action_kind,
    action_status                                   AS reason,
    count(*)                                        AS n_rows,
    count(*) / sum(count(*)) OVER ()                AS share_of_invalid,
    count(*) / (SELECT count(*) FROM typed)         AS share_of_all_rows,
    favg(step_reward)                               AS mean_step_reward,
    min(row_id)                                     AS example_row_id
FROM invalid
GROUP BY action_kind, action_status
ORDER BY n_rows DESC, action_kind, reason
