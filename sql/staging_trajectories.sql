-- staging_trajectories: one typed row per rollout, with its hidden-test outcome as a pass/fail flag.
WITH source AS (
    SELECT * FROM trajectories
),

typed AS (
    SELECT
        traj_id,
        run_id,
        task_id,
        round::INTEGER              AS round,
        sample_index::INTEGER       AS sample_index,
        n_turns::INTEGER            AS n_turns,
        episode_return::DOUBLE      AS episode_return,
        outcome::DOUBLE             AS outcome,
        outcome >= 1.0              AS passed,
        status
    FROM source
)

SELECT * FROM typed
