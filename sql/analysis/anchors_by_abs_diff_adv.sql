-- Which anchors carry the most diff-level credit? Anchors ranked by mean |A^D| over their distinct rows,
-- with their size, GS, the spread of returns inside the group and the start of their text.
WITH per_row AS (
    SELECT DISTINCT anchor_id, row_id, return_to_go, diff_advantage
    FROM advantages_diff
),

per_anchor AS (
    SELECT
        anchor_id,
        count(*)                        AS n_rows,
        favg(abs(diff_advantage))       AS mean_abs_diff_adv,
        max(abs(diff_advantage))        AS max_abs_diff_adv,
        max(return_to_go) - min(return_to_go) AS return_spread
    FROM per_row
    GROUP BY anchor_id
),

occurrence_counts AS (
    SELECT anchor_id, count(*) AS n_occurrences
    FROM advantages_diff
    GROUP BY anchor_id
)

SELECT
    p.anchor_id,
    a.task_id,
    a.edit_type,
    p.n_rows,
    c.n_occurrences,
    a.mean_lines,
    a.gs,
    p.mean_abs_diff_adv,
    p.max_abs_diff_adv,
    p.return_spread,
    left(replace(a.text, chr(10), ' | '), 80) AS text_start
FROM per_anchor AS p
JOIN occurrence_counts AS c USING (anchor_id)
JOIN staging_anchors AS a USING (anchor_id)
ORDER BY p.mean_abs_diff_adv DESC, p.anchor_id
