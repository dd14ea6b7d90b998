-- anchors_occurrences: every anchored sub-diff occurrence with its spans, its anchor's GS and its row's R_t.
-- A member whose anchor, sub-diff or step row is missing, whose spans fall outside its response, or whose
-- token_spans disagree with its token bounds, stops the query with an error naming it: an occurrence is
-- never dropped silently.
WITH members AS (
    SELECT * FROM staging_anchor_members
),

joined AS (
    SELECT
        m.anchor_id,
        m.subdiff_id,
        m.row_id,
        m.task_id,
        a.anchor_id IS NOT NULL     AS found_anchor,
        s.subdiff_id IS NOT NULL    AS found_subdiff,
        st.row_id IS NOT NULL       AS found_step,
        s.row_id                    AS subdiff_row_id,
        a.edit_type,
        a.gs,
        a.mean_lines,
        s.n_lines,
        s.char_start,
        s.char_end,
        s.char_len,
        s.token_start,
        s.token_end,
        s.token_len,
        s.char_spans,
        s.token_spans,
        s.has_tokens,
        s.has_chars,
        st.traj_id,
        st.turn,
        st.n_tokens,
        st.n_chars,
        st.return_to_go
    FROM members AS m
    LEFT JOIN staging_anchors AS a ON a.anchor_id = m.anchor_id
    LEFT JOIN staging_subdiffs AS s ON s.subdiff_id = m.subdiff_id
    LEFT JOIN staging_steps AS st ON st.row_id = m.row_id
),

checked AS (
    SELECT
        * REPLACE (
            CASE
                WHEN NOT found_anchor THEN error(format(
                    'anchor_members: anchor {} (member {}) is not in table anchors', anchor_id, subdiff_id))
                WHEN NOT found_subdiff THEN error(format(
                    'anchor_members: member {} of anchor {} is not in table subdiffs', subdiff_id, anchor_id))
                WHEN NOT found_step THEN error(format(
                    'anchor_members: row {} of member {} (anchor {}) is not in table steps',
                    row_id, subdiff_id, anchor_id))
                WHEN subdiff_row_id <> row_id THEN error(format(
                    'anchor_members: member {} says row {}, table subdiffs says row {}',
                    subdiff_id, row_id, subdiff_row_id))
                WHEN coalesce(token_spans[1].start, -1) <> token_start
                    OR coalesce(token_spans[-1]."end", -1) <> token_end THEN error(format(
                    'subdiffs: {} has token bounds [{}, {}) but token_spans {}',
                    subdiff_id, token_start, token_end, token_spans::VARCHAR))
                WHEN has_tokens AND token_end > n_tokens THEN error(format(
                    'subdiffs: {} has token span [{}, {}) beyond the {} response tokens of row {}',
                    subdiff_id, token_start, token_end, n_tokens, row_id))
                WHEN has_chars AND char_end > n_chars THEN error(format(
                    'subdiffs: {} has char span [{}, {}) beyond the {} response characters of row {}',
                    subdiff_id, char_start, char_end, n_chars, row_id))
                ELSE return_to_go
            END AS return_to_go
        )
    FROM joined
)

SELECT
    anchor_id,
    subdiff_id,
    row_id,
    task_id,
    traj_id,
    turn,
    edit_type,
    gs,
    mean_lines,
    n_lines,
    char_start,
    char_end,
    char_len,
    token_start,
    token_end,
    token_len,
    char_spans,
    token_spans,
    has_tokens,
    return_to_go
FROM checked
