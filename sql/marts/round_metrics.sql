-- round_metrics: the figures of one round, one row: what the summary after a pipeline run, the rounds table,
-- `didpo compare` and the HTML report all show. Rollouts lost to sandbox failures (dead-lettered at the retry
-- cap: stage 'execute', pipeline.schema.SANDBOX_LOST) count as started and not passing, because a policy can
-- make the sandbox fail on purpose. Credit figures read the stored advantages table (what the trainer read,
-- whichever estimator wrote it). A figure with nothing to average is NULL.
WITH lost AS (
    SELECT DISTINCT key, json_extract_string(payload_json, '$.task_id') AS task_id
    FROM dead_letter
    WHERE stage = 'execute'
),

finished AS (
    SELECT
        count(*)                                 AS finished,
        count(*) FILTER (WHERE outcome = 1.0)    AS passed,
        avg(episode_return)                      AS mean_return
    FROM staging_trajectories
),

task_groups AS (
    SELECT task_id, count(DISTINCT outcome) AS n_outcomes
    FROM staging_trajectories
    GROUP BY task_id
),

all_tasks AS (
    SELECT task_id FROM staging_trajectories
    UNION
    SELECT task_id FROM lost
),

status_counts AS (
    SELECT exec_status, count(*) AS n
    FROM staging_steps
    GROUP BY exec_status
),

row_advantages AS (
    SELECT
        t.outcome = 1.0                                                          AS passing,  -- NULL: no rollout
        list_sum(list_transform(a.token_advantages, lambda x: x::DOUBLE))             AS total,
        len(a.token_advantages)                                                  AS n_tokens,
        a.n_diff_tokens
    FROM advantages AS a
    LEFT JOIN staging_trajectories AS t USING (traj_id)
)

SELECT
    (SELECT count(*) FROM all_tasks)                                             AS tasks,
    f.finished + (SELECT count(*) FROM lost)                                     AS rollouts,
    f.passed,
    (SELECT count(*) FROM lost)                                                  AS lost_to_sandbox,
    f.passed / nullif(f.finished + (SELECT count(*) FROM lost), 0)               AS pass_rate,
    f.mean_return,
    (SELECT count(*) FROM staging_steps)                                         AS steps,
    (SELECT coalesce(list(struct_pack(status := exec_status, n := n) ORDER BY exec_status), [])
     FROM status_counts)                                                         AS steps_by_status,
    (SELECT count(*) FILTER (WHERE exec_status = 'invalid_action') / nullif(count(*), 0)
     FROM staging_steps)                                                         AS invalid_rate,
    (SELECT count(*) FROM subdiffs)                                              AS subdiffs,
    (SELECT count(*) FROM anchors)                                               AS anchors,
    (SELECT avg(n_rows) FROM anchors)                                            AS mean_anchor_rows,
    (SELECT sum(n_diff_tokens) FROM row_advantages)
        / nullif((SELECT count(*) FROM staging_changed_tokens), 0)               AS coverage,
    (SELECT avg((n_outcomes > 1)::INTEGER) FROM task_groups)                     AS mixed_groups,
    (SELECT sum(total) / nullif(sum(n_tokens), 0) FROM row_advantages WHERE passing)   AS mean_adv_passing,
    (SELECT sum(total) / nullif(sum(n_tokens), 0) FROM row_advantages WHERE passing IS NOT TRUE)
                                                                                 AS mean_adv_failing,
    (SELECT count(*) FROM dead_letter)                                           AS dead_letters
FROM finished AS f
