"""Units of the credit stage: whole diffs, normalization, near-duplicate clustering, anchor selection."""

from __future__ import annotations

from collections import Counter

import numpy as np

from pipeline.credit import CreditSettings, compute_credit
from pipeline.credit.anchors import Cluster, cut_overlaps, facility_location
from pipeline.credit.batch import cyclic_gc_paused
from pipeline.credit.diffs import line_opcodes, whole_diff
from pipeline.credit.normalize import comparison_tokens, normalize_line
from pipeline.credit.similarity import ShingleSets, band_buckets, cluster_texts, minhash_signatures
from pipeline.credit_io import result_columns

BASE = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n"


def test_whole_file_rewrite_changing_two_lines_is_a_two_line_diff(make_step):
    new = BASE.replace("total = 0", "total = 1").replace("return total", "return total * 2")
    step, _ = make_step("r", "t", "demo/0", 0, 1.0, {"a.py": BASE}, [("write", "a.py", "", new)])
    hunks = whole_diff(step, 10_000, 10_000, Counter())
    added = [line for h in hunks for line in h.added]
    deleted = [line for h in hunks for line in h.deleted]
    assert [a.text for a in added] == ["    total = 1", "    return total * 2"]
    assert [d.text for d in deleted] == ["    total = 0", "    return total"]
    for a in added:  # each added line points at the characters of the payload that wrote it
        s, e = a.span
        assert step.response_text[s:e] == a.text
        assert step.edits[0].replace_span[0] <= s < e <= step.edits[0].replace_span[1]
    assert all(d.span is None for d in deleted)  # a whole-file write has no search text


def test_deleted_lines_map_to_the_search_text(make_step):
    step, _ = make_step(
        "r",
        "t",
        "demo/0",
        0,
        1.0,
        {"a.py": BASE},
        [("replace", "a.py", "        total += x\n", "        total -= x\n")],
    )
    (hunk,) = whole_diff(step, 10_000, 10_000, Counter())
    s, e = hunk.deleted[0].span
    assert step.response_text[s:e] == "        total += x"
    assert step.edits[0].search_span[0] <= s < e <= step.edits[0].search_span[1]


def test_exact_repeat_in_a_trajectory_carries_no_new_credit(make_step):
    fix = ("replace", "a.py", "total += x", "total -= x")
    undo = ("replace", "a.py", "total -= x", "total += x")
    s0, after0 = make_step("a0", "a", "demo/0", 0, 0.0, {"a.py": BASE}, [fix])
    s1, after1 = make_step("a1", "a", "demo/0", 1, 0.0, after0, [undo])
    s2, _ = make_step("a2", "a", "demo/0", 2, 1.0, after1, [fix])
    result = compute_credit([s0, s1, s2], CreditSettings(estimator="didpo"))
    assert result.diagnostics.n_repeated_hunks == 1
    rows = result_columns(result, "subdiffs")["row_id"]
    assert "a2" not in rows and "a0" in rows


def test_normalization_strips_comments_but_not_hashes_in_strings():
    assert normalize_line("    x = 1  # note   ") == "x = 1"
    assert normalize_line("    s = '# not a comment'  # real") == "s = '# not a comment'"
    assert normalize_line('    s = "a\\"#b"') == 's = "a\\"#b"'
    assert normalize_line("   # only a comment") == ""


def test_renamed_loop_variable_still_matches():
    a = comparison_tokens("for x in xs:\ntotal += x", True)
    b = comparison_tokens("for item in xs:\ntotal += item", True)
    assert a == b
    assert comparison_tokens("for x in xs:\ntotal += x", False) != comparison_tokens(
        "for item in xs:\ntotal += item", False
    )
    # attribute names and free names are not renamed
    assert comparison_tokens("y = obj.x + x", True) == ("v0", "=", "obj", ".", "x", "+", "x")


def test_clustering_does_not_chain_transitively():
    # Shingle sets (size 1 shingles = tokens): J(A, B) = 9/11, J(B, C) = 9/11, J(A, C) = 8/12 < 0.8.
    a = tuple("t0 t1 t2 t3 t4 t5 t6 t7 t8 t9".split())
    b = tuple("t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 u1".split()[1:])  # t1..t9 u1
    c = tuple("t2 t3 t4 t5 t6 t7 t8 t9 u1 u2".split())
    shingles = ShingleSets([a, b, c], shingle_size=1)
    assert shingles.jaccard(0, 1) >= 0.8 and shingles.jaccard(1, 2) >= 0.8 and shingles.jaccard(0, 2) < 0.8
    signatures = minhash_signatures(shingles, 64, seed=1)
    rep_of = cluster_texts([0, 1, 2], band_buckets(signatures, 0.5), shingles, eta=0.8)
    assert rep_of == {0: 0, 1: 0, 2: 2}  # C is close to B but not to A, B's representative


def test_minhash_estimates_jaccard():
    rng = np.random.default_rng(0)
    base = [f"tok{i}" for i in rng.permutation(200)]
    other = base[:150] + [f"new{i}" for i in range(50)]
    shingles = ShingleSets([tuple(base), tuple(other)], shingle_size=1)
    sig = minhash_signatures(shingles, 256, seed=3)
    estimate = float(np.mean(sig[0] == sig[1]))
    assert abs(estimate - shingles.jaccard(0, 1)) < 0.1


def test_facility_location_prefers_the_covering_anchor_and_cut_removes_overlaps():
    # Units 0..3 of one hunk. Candidate 0 covers [0, 4) (GS 0.5); 1 covers [0, 2) (GS 0.3); 2 covers [2, 4).
    unit_start, unit_end = np.array([0, 0, 2, 10]), np.array([4, 2, 4, 14])
    clusters = [Cluster("big", [0, 3], 0.5), Cluster("small", [1], 0.3), Cluster("other", [2], 0.2)]
    chosen = facility_location(clusters, unit_start, unit_end, 14, max_anchors=5)
    assert chosen == [0]  # the smaller ones gain nothing once the big one covers their lines
    kept = cut_overlaps([clusters[0], clusters[1]], unit_start, unit_end, 14)
    assert kept == [[0, 3], []]


def test_subdiff_token_ranges_match_their_characters(same_function_batch):
    result = compute_credit(same_function_batch, CreditSettings(estimator="didpo"))  # didpo reads sub-diffs
    sub = result_columns(result, "subdiffs")
    steps = {s.row_id: s for s in same_function_batch}
    checked = 0
    for i, row_id in enumerate(sub["row_id"]):
        cs, ce, ts, te = sub["char_start"][i], sub["char_end"][i], sub["token_start"][i], sub["token_end"][i]
        if cs < 0:
            continue
        starts, ends = steps[row_id].token_char_starts, steps[row_id].token_char_ends
        touching = np.flatnonzero((starts < ce) & (ends > cs) & (ends > starts))
        assert (ts, te) == (touching[0], touching[-1] + 1)
        # the exact spans: char_spans within the bounds, token_spans = the tokens touching them, nothing else
        chars = list(sub["char_spans"][i])
        assert chars[0][0] == cs and chars[-1][1] == ce and chars == sorted(chars)
        exact = np.zeros(len(starts), bool)
        for c0, c1 in chars:
            exact |= (starts < c1) & (ends > c0) & (ends > starts)
        tokens = np.zeros(len(starts), bool)
        for t0, t1 in sub["token_spans"][i]:
            tokens[t0:t1] = True
        np.testing.assert_array_equal(tokens, exact)
        checked += 1
    assert checked == len(sub["row_id"]) > 10


def test_locator_prefers_reading_order_across_edit_blocks():
    from pipeline.credit.diffs import _Locator

    response = "A: x = 1\ny = 2\nB: x = 1\n"
    first, second = (3, 15), (18, 24)  # block A writes "x = 1\ny = 2", block B writes "x = 1"
    loc = _Locator(response, [first, second])
    assert loc.find("x = 1") == (3, 8)
    assert loc.find("y = 2") == (9, 14)
    # the third added line "x = 1" was written by block B: not block A's earlier copy
    assert loc.find("x = 1") == (18, 23)


def _added_spans(make_step, files, edits):
    step, _ = make_step("r", "t", "demo/0", 0, 1.0, files, edits)
    added = [line for h in whole_diff(step, 10_000, 10_000, Counter()) for line in h.added]
    return step, added


def test_an_added_line_is_located_on_a_whole_line_not_inside_a_longer_one(make_step):
    # "    count" (a dropped return) follows the unchanged context line "    count = 0" in the payload: it
    # must land on its own line, not on the start of the longer one
    before = "def f(xs):\n    count = 0\n    return count\n"
    edit = ("replace", "a.py", "    count = 0\n    return count\n", "    count = 0\n    count\n")
    step, added = _added_spans(make_step, {"a.py": before}, [edit])
    (line,) = added
    s, e = line.span
    assert line.text == "    count" and step.response_text[s:e] == "    count"
    assert step.response_text[s - 1] == "\n" and step.response_text[e] == "\n"


def test_a_whole_file_write_locates_each_line_at_its_own_position(make_step):
    # the added "    return x" repeats an unchanged line above it: it is the payload's line at its own index
    before = "def f(x):\n    if x:\n        return x\n    return 0\n"
    after = "def f(x):\n    if x:\n        return x\n    return x\n"
    step, added = _added_spans(make_step, {"a.py": before}, [("write", "a.py", "", after)])
    (line,) = added
    assert line.text == "    return x" and line.line_no == 3
    payload_start = step.edits[0].replace_span[0]
    s, e = line.span
    assert step.response_text[s:e] == "    return x"
    assert step.response_text[payload_start:s].count("\n") == 3  # the payload's fourth line, not its third


def test_an_added_line_repeating_a_context_line_of_its_payload_is_located_on_its_own(make_step):
    # the payload starts with the unchanged "y = 1" and ends with an added copy of it
    before = "y = 1\nx = 0\n"
    step, added = _added_spans(make_step, {"a.py": before}, [("replace", "a.py", before, "y = 1\nx = 0\ny = 1\n")])
    (line,) = added
    s, e = line.span
    assert line.line_no == 2 and step.response_text[s:e] == "y = 1"
    assert step.response_text[step.edits[0].replace_span[0]:s] == "y = 1\nx = 0\n"


def test_a_line_equal_up_to_indentation_is_located_on_its_code(make_step):
    # a partial-line search/replace: the payload is the line's code without its indentation
    before = "def f(xs):\n    total += x\n"
    step, added = _added_spans(make_step, {"a.py": before}, [("replace", "a.py", "total += x", "total -= x")])
    (line,) = added
    s, e = line.span
    assert line.text == "    total -= x" and step.response_text[s:e] == "total -= x"


def test_line_opcodes_are_difflibs_changed_regions_after_trimming_the_common_ends():
    """The shortcuts (a pure insertion or deletion, one line for one) give what difflib gives; where both
    sides' middles are as long, lines rewritten in place win when they change no more lines."""
    import difflib
    import random

    rng = random.Random(0)
    for _ in range(2000):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 7))]
        b = [rng.choice("abcde") for _ in range(rng.randint(0, 7))]
        before, after = "".join(x + "\n" for x in a), "".join(x + "\n" for x in b)
        lo = 0
        while lo < min(len(a), len(b)) and a[lo] == b[lo]:
            lo += 1
        ha, hb = len(a), len(b)
        while ha > lo and hb > lo and a[ha - 1] == b[hb - 1]:
            ha, hb = ha - 1, hb - 1
        want = tuple((i1 + lo, i2 + lo, j1 + lo, j2 + lo) for tag, i1, i2, j1, j2
                     in difflib.SequenceMatcher(None, a[lo:ha], b[lo:hb]).get_opcodes() if tag != "equal")
        differ = [k for k in range(lo, ha) if ha - lo == hb - lo and a[k] != b[k]]
        if differ and 2 * len(differ) <= sum(i2 - i1 + j2 - j1 for i1, i2, j1, j2 in want):
            got = line_opcodes(before, after, 50)
            assert all(i1 == j1 and i2 == j2 for i1, i2, j1, j2 in got), (a, b)  # in place
            assert [k for i1, i2, _, _ in got for k in range(i1, i2)] == differ, (a, b)
            continue
        assert line_opcodes(before, after, 50) == want, (a, b)


def test_a_line_rewritten_into_its_twin_is_two_rewrites_not_a_move():
    """`x = a + 1` held twice: one copy rewritten, the other rewritten into it. difflib sees a move (two
    lines inserted, two deleted); in place it is two one-line rewrites, which is what the action wrote."""
    before = "x = a + 1\nq = 5\nx + 1\n"
    after = "x + 1\nq = 5\nx = a + 1\n"
    assert line_opcodes(before, after, 50) == ((0, 1, 0, 1), (2, 3, 2, 3))


def test_the_collector_is_paused_inside_and_restored_after_even_on_error():
    import gc

    assert gc.isenabled()
    with cyclic_gc_paused():
        assert not gc.isenabled()
        with cyclic_gc_paused():  # nested: the outer one restores
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with cyclic_gc_paused():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:  # off before: stays off
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
