-- How does reward evolve over an episode? Per turn: rows still running, mean step reward and return-to-go,
-- share of steps whose visible tests all pass, mean visible pass fraction and share of invalid actions.
WITH typed AS (
    SELECT * FROM staging_steps
)

SELECT
    turn,
    count(*)                                        AS n_rows,
    favg(step_reward)                               AS mean_step_reward,
    favg(return_to_go)                              AS mean_return_to_go,
    avg((exec_status = 'passed')::INTEGER)          AS share_passed,
    avg(visible_pass_fraction)                      AS mean_visible_pass_fraction,
    avg(is_invalid_action::INTEGER)                 AS share_invalid_action,
    avg(done::INTEGER)                              AS share_done
FROM typed
GROUP BY turn
ORDER BY turn
