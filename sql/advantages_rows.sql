-- advantages_rows: per step row, A^E and its anchored occurrences, ready for token projection (DESIGN.md
-- step 10, done in numpy by pipeline/sqlrun.py). Each row's `occurrences` list is in priority order: higher
-- GS first, then more covered characters (total over char_spans), then the smaller subdiff_id, then the
-- smaller anchor_id (the order pipeline/credit uses); a token in the token_spans of several occurrences
-- takes the A^D of the first one in this order. Occurrences without response tokens (empty token_spans)
-- are left out here; they still count in their anchor's comparison group.
WITH episode AS (
    SELECT * FROM advantages_episode
),

occurrences AS (
    SELECT
        row_id,
        count(*) AS n_occurrences,
        list(
            struct_pack(subdiff_id, anchor_id, char_len, token_spans, gs, diff_advantage)
            ORDER BY gs DESC, char_len DESC, subdiff_id, anchor_id
        ) AS occurrences
    FROM advantages_diff
    WHERE has_tokens
    GROUP BY row_id
)

SELECT
    e.row_id,
    e.traj_id,
    e.task_id,
    e.turn,
    e.n_tokens,
    e.episode_advantage,
    coalesce(o.n_occurrences, 0)    AS n_occurrences,
    coalesce(o.occurrences, [])     AS occurrences
FROM episode AS e
LEFT JOIN occurrences AS o USING (row_id)
