-- Does the credit point the right way? Mean A^E and A^D on rollouts whose hidden tests pass (outcome 1)
-- versus fail (outcome 0): passing rollouts should get positive credit on average, failing ones negative.
WITH rows_with_outcome AS (
    SELECT e.row_id, e.traj_id, e.episode_advantage, t.outcome
    FROM advantages_episode AS e
    JOIN staging_trajectories AS t USING (traj_id)
),

trajectory_level AS (
    SELECT outcome, count(DISTINCT traj_id) AS n_trajectories, count(*) AS n_rows,
           favg(episode_advantage) AS mean_episode_adv_per_row
    FROM rows_with_outcome
    GROUP BY outcome
),

per_trajectory AS (
    SELECT DISTINCT traj_id, outcome, episode_advantage
    FROM rows_with_outcome
),

episode_per_trajectory AS (
    SELECT outcome, favg(episode_advantage) AS mean_episode_adv_per_trajectory
    FROM per_trajectory
    GROUP BY outcome
),

diff_level AS (
    SELECT
        r.outcome,
        count(*)                                    AS n_occurrences,
        favg(d.diff_advantage)                      AS mean_diff_adv,
        avg((d.diff_advantage > 0)::INTEGER)        AS share_positive_diff_adv
    FROM advantages_diff AS d
    JOIN rows_with_outcome AS r USING (row_id)
    GROUP BY r.outcome
)

SELECT
    t.outcome,
    t.n_trajectories,
    t.n_rows,
    e.mean_episode_adv_per_trajectory,
    t.mean_episode_adv_per_row,
    coalesce(d.n_occurrences, 0)                    AS n_occurrences,
    d.mean_diff_adv,
    d.share_positive_diff_adv
FROM trajectory_level AS t
JOIN episode_per_trajectory AS e USING (outcome)
LEFT JOIN diff_level AS d USING (outcome)
ORDER BY t.outcome DESC
