-- How groupable are the selected anchors? Histogram of GS in ten bins of width 0.1 over [0, 1], per edit
-- type, with the typical group size and change size in each bin.
WITH binned AS (
    SELECT
        edit_type,
        least(floor(gs * 10), 9)::INTEGER AS bin,
        gs,
        n_rows,
        mean_lines
    FROM staging_anchors
)

SELECT
    edit_type,
    bin / 10.0                                      AS gs_from,
    (bin + 1) / 10.0                                AS gs_to,
    count(*)                                        AS n_anchors,
    count(*) / sum(count(*)) OVER (PARTITION BY edit_type) AS share_of_edit_type,
    favg(n_rows)                                    AS avg_n_rows,
    favg(mean_lines)                                AS avg_mean_lines
FROM binned
GROUP BY edit_type, bin
ORDER BY edit_type, bin
