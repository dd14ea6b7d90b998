-- advantages_diff: A^D of every anchored occurrence (DESIGN.md step 9).
--   A^D = R_t(its row) - mean over the anchor's distinct rows of R_t       (params.adv_norm = 'mean_norm')
--   A^D = (R_t - mean) / (std + params.std_eps)                             (params.adv_norm = 'mean_std_norm')
-- The group is the anchor's distinct rows (anchors_rows): a row with two occurrences of the anchor counts
-- once, and both occurrences get the row's A^D. std is the population std (ddof = 0), two-pass.
WITH anchor_rows AS (
    SELECT * FROM anchors_rows
),

centered AS (
    SELECT
        anchor_id,
        row_id,
        count(*) OVER anchor_group                          AS group_rows,
        favg(return_to_go) OVER anchor_group                AS group_mean,
        return_to_go - favg(return_to_go) OVER anchor_group AS centered
    FROM anchor_rows
    WINDOW anchor_group AS (PARTITION BY anchor_id)
),

scaled AS (
    SELECT
        *,
        sqrt(favg(centered * centered) OVER (PARTITION BY anchor_id)) AS group_std
    FROM centered
),

row_advantage AS (
    SELECT
        s.anchor_id,
        s.row_id,
        s.group_rows,
        s.group_mean,
        s.group_std,
        CASE p.adv_norm
            WHEN 'mean_norm' THEN s.centered
            WHEN 'mean_std_norm' THEN s.centered / (s.group_std + p.std_eps)
            ELSE error(format('params.adv_norm must be mean_norm or mean_std_norm, got {}', p.adv_norm))
        END AS diff_advantage
    FROM scaled AS s
    CROSS JOIN params AS p
)

SELECT
    o.anchor_id,
    o.subdiff_id,
    o.row_id,
    o.task_id,
    o.traj_id,
    o.turn,
    o.edit_type,
    o.gs,
    o.n_lines,
    o.char_start,
    o.char_end,
    o.char_len,
    o.token_start,
    o.token_end,
    o.char_spans,
    o.token_spans,
    o.has_tokens,
    o.return_to_go,
    r.group_rows,
    r.group_mean,
    r.group_std,
    r.diff_advantage
FROM anchors_occurrences AS o
JOIN row_advantage AS r USING (anchor_id, row_id)
