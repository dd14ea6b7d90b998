-- How big are the anchors? Number of anchors per group size (distinct rows n), with the share of all
-- anchors and the size of their change in lines (mean L) and their mean GS.
WITH sizes AS (
    SELECT anchor_id, count(*) AS n_rows
    FROM anchors_rows
    GROUP BY anchor_id
),

with_lines AS (
    SELECT s.anchor_id, s.n_rows, a.mean_lines, a.gs
    FROM sizes AS s
    JOIN staging_anchors AS a USING (anchor_id)
)

SELECT
    n_rows,
    count(*)                                        AS n_anchors,
    count(*) / sum(count(*)) OVER ()                AS share_of_anchors,
    min(mean_lines)                                 AS min_mean_lines,
    favg(mean_lines)                                AS avg_mean_lines,
    max(mean_lines)                                 AS max_mean_lines,
    favg(gs)                                        AS avg_gs
FROM with_lines
GROUP BY n_rows
ORDER BY n_rows
