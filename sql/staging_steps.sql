-- staging_steps: one typed row per thought-action step (= one training row), heavy columns left out.
-- Rewards are widened to DOUBLE so every later layer computes in double precision.
WITH source AS (
    SELECT * FROM steps
),

typed AS (
    SELECT
        row_id,
        traj_id,
        task_id,
        round::INTEGER                        AS round,
        turn::INTEGER                         AS turn,
        len(response_token_ids)::INTEGER      AS n_tokens,
        length(response_text)::INTEGER        AS n_chars,   -- Unicode code points, like Python str indices
        action_kind,
        action_status,
        action_status <> 'ok'                 AS is_invalid_action,
        exec_status,
        visible_passed,
        visible_total,
        CASE WHEN visible_total > 0 THEN visible_passed::DOUBLE / visible_total END AS visible_pass_fraction,
        step_reward::DOUBLE                   AS step_reward,
        return_to_go::DOUBLE                  AS return_to_go,
        done
    FROM source
)

SELECT * FROM typed
