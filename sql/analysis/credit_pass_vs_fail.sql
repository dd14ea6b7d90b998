-- Does the credit point the right way? The advantages the trainer used (the stored `advantages` table, so
-- the arm's own estimator, whichever it is) on rollouts whose hidden tests pass (outcome 1) versus fail
-- (outcome 0): passing rollouts should get positive credit on average, failing ones negative. A row's
-- diff-level term is its mean, over the tokens that received one (n_diff_tokens), of token advantage - A^E.
WITH rows_with_outcome AS (
    SELECT a.row_id, a.traj_id, a.episode_advantage, a.n_diff_tokens, a.token_advantages, a.loss_mask,
           t.outcome
    FROM advantages AS a
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

-- the two lists unnest side by side: one row per token
token_terms AS (
    SELECT row_id, outcome, n_diff_tokens, episode_advantage,
           unnest(token_advantages) AS token_adv, unnest(loss_mask) AS kept
    FROM rows_with_outcome
    WHERE n_diff_tokens > 0
),

diff_rows AS (
    SELECT row_id, outcome,
           fsum(CASE WHEN kept = 1 THEN token_adv - episode_advantage ELSE 0 END) / any_value(n_diff_tokens)
               AS diff_term
    FROM token_terms
    GROUP BY row_id, outcome
),

diff_level AS (
    SELECT outcome,
           count(*)                                 AS n_rows_with_diff_term,
           favg(diff_term)                          AS mean_diff_term,
           avg((diff_term > 0)::INTEGER)            AS share_positive_diff_term
    FROM diff_rows
    GROUP BY outcome
)

SELECT
    t.outcome,
    t.n_trajectories,
    t.n_rows,
    e.mean_episode_adv_per_trajectory,
    t.mean_episode_adv_per_row,
    coalesce(d.n_rows_with_diff_term, 0)            AS n_rows_with_diff_term,
    d.mean_diff_term,
    d.share_positive_diff_term
FROM trajectory_level AS t
JOIN episode_per_trajectory AS e USING (outcome)
LEFT JOIN diff_level AS d USING (outcome)
ORDER BY t.outcome DESC
