-- advantages_episode: A^E of every step row (DESIGN.md step 8), from the steps table alone.
--   R_episode(traj) = return_to_go of the trajectory's lowest-turn row (turn 0 when the trajectory is whole)
--   A^E = R_episode - mean over the task group's trajectories            (params.adv_norm = 'mean_norm')
--   A^E = (R_episode - mean) / (std + params.std_eps)                      (params.adv_norm = 'mean_std_norm')
-- The group is made of trajectories (one value each), not rows. std is the population std (ddof = 0),
-- computed in two passes like numpy.std; favg is DuckDB's compensated mean. A task with a single rollout
-- gets A^E = 0 in both modes. Two rows at the lowest turn, or a trajectory in two tasks, stop the query.
WITH steps_typed AS (
    SELECT * FROM staging_steps
),

with_first_turn AS (
    SELECT
        traj_id,
        task_id,
        turn,
        return_to_go,
        min(turn) OVER (PARTITION BY traj_id)               AS first_turn
    FROM steps_typed
),

episodes AS (
    SELECT
        traj_id,
        any_value(task_id)                                  AS task_id,
        count(DISTINCT task_id)                             AS n_tasks,
        any_value(first_turn)                               AS first_turn,
        count(*) FILTER (WHERE turn = first_turn)           AS n_first_rows,
        any_value(return_to_go) FILTER (WHERE turn = first_turn) AS first_return
    FROM with_first_turn
    GROUP BY traj_id
),

checked AS (
    SELECT
        traj_id,
        task_id,
        CASE
            WHEN n_first_rows > 1 THEN error(format(
                'steps: trajectory {} has {} rows at turn {} (duplicated steps?)', traj_id, n_first_rows,
                first_turn))
            WHEN n_tasks > 1 THEN error(format(
                'steps: trajectory {} has rows of {} different tasks', traj_id, n_tasks))
            ELSE first_return
        END AS episode_return
    FROM episodes
),

centered AS (
    SELECT
        traj_id,
        task_id,
        episode_return,
        count(*) OVER task_group                            AS group_size,
        favg(episode_return) OVER task_group                AS group_mean,
        episode_return - favg(episode_return) OVER task_group AS centered
    FROM checked
    WINDOW task_group AS (PARTITION BY task_id)
),

scaled AS (
    SELECT
        *,
        sqrt(favg(centered * centered) OVER (PARTITION BY task_id)) AS group_std
    FROM centered
),

trajectory_advantage AS (
    SELECT
        s.traj_id,
        s.episode_return,
        s.group_size,
        s.group_mean,
        s.group_std,
        CASE p.adv_norm
            WHEN 'mean_norm' THEN s.centered
            WHEN 'mean_std_norm' THEN s.centered / (s.group_std + p.std_eps)
            ELSE error(format('params.adv_norm must be mean_norm or mean_std_norm, got {}', p.adv_norm))
        END AS episode_advantage
    FROM scaled AS s
    CROSS JOIN params AS p
)

SELECT
    st.row_id,
    st.traj_id,
    st.task_id,
    st.turn,
    st.n_tokens,
    t.episode_return,
    t.group_size,
    t.group_mean,
    t.group_std,
    t.episode_advantage
FROM steps_typed AS st
JOIN trajectory_advantage AS t USING (traj_id)
