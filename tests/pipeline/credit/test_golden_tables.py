"""Golden checksums of the credit tables: every built-in estimator, on one fixed batch, both credit paths.

The checksums below are the behaviour of the code BEFORE the table assembly moved out of
`pipeline/credit/batch.py` into `pipeline/credit_io.py` (issue 15, item 7): they were recorded by running this
file's `_checksums()` on the unchanged code, not written by hand. They hold the refactor (and any later one
that claims to change no number) to byte-identical tables. A change that means to alter what credit computes
updates them, saying why.

Per estimator and path ("compute_credit": sub-diffs and anchors only when the estimator reads them;
"stage": `credit_units` then `assign_advantages`, what the Beam stage and `didpo credit` run), each contract
table is made by `pipeline.credit_io.result_tables` and hashed as sha256 over `table.to_pylist()` as JSON
(sort_keys); the diagnostics (less wall times) are hashed the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import builders
import numpy as np
import pytest

from pipeline.credit import ESTIMATORS, CreditSettings, assign_advantages, compute_credit, credit_units
from pipeline.credit_io import CREDIT_TABLES, result_tables

SOURCE = (
    "def total(items):\n    total = 0\n    for x in items:\n        total += x\n    return total\n"
    "\n\ndef fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"
    "\n\ndef flip(text):\n    words = text.split()\n    return ' '.join(reversed(words))\n"
)
CHANGES = {  # name -> (search, replace) in SOURCE
    "sum": ("    total = 0\n    for x in items:\n        total += x\n    return total\n",
            "    return sum(items)\n"),
    "neg": ("        total += x\n", "        total -= x\n"),
    "fib": ("    if n < 2:\n        return n\n",
            "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"),
    "fib1": ("    if n < 2:\n        return n\n", "    if n <= 2:\n        return n\n"),
    "flip": ("    return ' '.join(reversed(words))\n", "    return ' '.join(words[::-1])\n"),
    "flip_bad": ("    return ' '.join(reversed(words))\n", "    return ' # '.join(reversed(words))\n"),
}
# task golden/b: per trajectory, per turn: (changes, reward, visible pass fraction); [] = a turn with no edit
PLAN = {
    "b0": [(["sum"], 0.2, 0.5), (["fib", "flip"], 1.0, 1.0)],
    "b1": [(["sum"], 0.2, 0.5), (["fib1"], 0.0, 0.4), ([], 0.0, 0.4)],
    "b2": [(["neg"], 0.0, 0.2), (["fib", "flip_bad"], 0.3, 0.6)],
    "b3": [(["fib", "flip"], 0.4, 0.7), (["sum"], 1.0, 1.0)],
    "b4": [(["neg", "flip_bad"], 0.0, 0.1)],
}


def _zero_width_offsets(text: str) -> tuple[np.ndarray, np.ndarray]:
    """The regex tokenizer with an empty token (start == end) after every newline: tokens that cover no
    character, which never receive a diff-level value."""
    starts, ends = builders.offsets(text)
    out_s, out_e = [], []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        out_s.append(s)
        out_e.append(e)
        if text[s:e].endswith("\n"):
            out_s.append(e)
            out_e.append(e)
    return np.array(out_s, np.int64), np.array(out_e, np.int64)


def golden_batch() -> list:
    """Three tasks: four rollouts writing one function (one row with a partial loss mask), five multi-turn
    multi-edit rollouts of one file (visible pass fractions, shared workspaces, a turn with no edit, an
    empty-token tokenizer on one trajectory), and two rollouts that redo a change they undid."""
    steps = list(builders.same_function_batch())
    mask = np.ones(steps[1].n_tokens)
    mask[:7] = 0
    steps[1] = dataclasses.replace(steps[1], loss_mask=mask)
    for traj, turns in PLAN.items():
        files = {"solution.py": SOURCE}
        for turn, (names, reward, visible) in enumerate(turns):
            edits = [("replace", "solution.py", *CHANGES[n]) for n in names]
            state = "start" if turn == 0 else "+".join(n for t in turns[:turn] for n in t[0])
            step, files = builders.build_step(
                f"{traj}/{turn}", traj, "golden/b", turn, reward, files, edits, think=f"{traj} turn {turn}",
                workspace_hash=state, tokenizer=_zero_width_offsets if traj == "b2" else None,
            )
            steps.append(dataclasses.replace(step, visible_pass_fraction=visible))
    for traj, reward in (("c0", 1.0), ("c1", 0.0)):
        files = {"util.py": SOURCE}
        redo = [("replace", "util.py", *CHANGES["sum"])]
        undo = [("replace", "util.py", CHANGES["sum"][1], CHANGES["sum"][0])]
        for turn, edits in enumerate((redo, undo, redo)):
            step, files = builders.build_step(f"{traj}/{turn}", traj, "golden/c", turn,
                                              reward if turn == 2 else 0.1, files, edits, think=traj)
            steps.append(step)
    return steps[::2] + steps[1::2]  # not in canonical order: the advantages table keeps the input order


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _result_digests(result) -> dict[str, str]:
    out = {name: _digest(table.to_pylist()) for name, table in result_tables(result).items()}
    diagnostics = result.diagnostics.to_dict()
    diagnostics.pop("seconds")
    out["diagnostics"] = _digest(diagnostics)
    return out


def _checksums(estimator: str) -> dict[str, str]:
    steps, settings = golden_batch(), CreditSettings(estimator=estimator, gamma=0.9)
    out = {}
    for path, result in (
        ("compute_credit", compute_credit(steps, settings)),
        ("stage", assign_advantages(credit_units(steps, settings), settings)),
    ):
        for name, digest in _result_digests(result).items():
            out[f"{path}/{name}"] = digest
    return out


# Recorded from the code before the refactor (`python test_golden_tables.py` there), not hand-written.
GOLDEN: dict[str, dict[str, str]] = {
    "didpo": {
        "compute_credit/advantages": "7ecf071377869ce4bbd54736320a676e43b38f691ec43b34ece406769af9a72b",
        "compute_credit/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "compute_credit/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "compute_credit/diagnostics": "54c8119a77413c32d74538452dfd0337b9ec32707db7bde37ffcdabcaded06b9",
        "compute_credit/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
        "stage/advantages": "7ecf071377869ce4bbd54736320a676e43b38f691ec43b34ece406769af9a72b",
        "stage/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "stage/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "stage/diagnostics": "54c8119a77413c32d74538452dfd0337b9ec32707db7bde37ffcdabcaded06b9",
        "stage/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
    },
    "didpo_did": {
        "compute_credit/advantages": "67759de17b12b8beb8276eb7ada736d38f13dd3e1df7e94f0abe2b73c1bc6167",
        "compute_credit/anchor_members": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/anchors": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/diagnostics": "65645db89444eaa6bb49a46e83652caa6dcb01a44f094dd1bdcbbc06a250fdaa",
        "compute_credit/subdiffs": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "stage/advantages": "67759de17b12b8beb8276eb7ada736d38f13dd3e1df7e94f0abe2b73c1bc6167",
        "stage/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "stage/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "stage/diagnostics": "4347e5cff75289913917f1a19ef400851d1872b8a1e6421b314f1be987199568",
        "stage/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
    },
    "dr_grpo": {
        "compute_credit/advantages": "4acc44607cf4620fdd62c0927ca1f5636cf43e60379c0d1cd8d8dbcfaf44b460",
        "compute_credit/anchor_members": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/anchors": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/diagnostics": "c170d7012911105102a8b71c7ddd2e9ccb3db60a74dfc03d308ddfbc22dc524b",
        "compute_credit/subdiffs": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "stage/advantages": "4acc44607cf4620fdd62c0927ca1f5636cf43e60379c0d1cd8d8dbcfaf44b460",
        "stage/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "stage/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "stage/diagnostics": "54c8119a77413c32d74538452dfd0337b9ec32707db7bde37ffcdabcaded06b9",
        "stage/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
    },
    "gigpo": {
        "compute_credit/advantages": "d6a220ad789429d7aa9c15a0b8e58a032bc5a5b2c7fa4239c48591c00241948c",
        "compute_credit/anchor_members": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/anchors": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/diagnostics": "c170d7012911105102a8b71c7ddd2e9ccb3db60a74dfc03d308ddfbc22dc524b",
        "compute_credit/subdiffs": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "stage/advantages": "d6a220ad789429d7aa9c15a0b8e58a032bc5a5b2c7fa4239c48591c00241948c",
        "stage/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "stage/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "stage/diagnostics": "54c8119a77413c32d74538452dfd0337b9ec32707db7bde37ffcdabcaded06b9",
        "stage/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
    },
    "grpo": {
        "compute_credit/advantages": "5a44b79efe7945e36db5b4834e87de2ad6e45fff90504ffb488fe91146438977",
        "compute_credit/anchor_members": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/anchors": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/diagnostics": "c170d7012911105102a8b71c7ddd2e9ccb3db60a74dfc03d308ddfbc22dc524b",
        "compute_credit/subdiffs": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "stage/advantages": "5a44b79efe7945e36db5b4834e87de2ad6e45fff90504ffb488fe91146438977",
        "stage/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "stage/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "stage/diagnostics": "54c8119a77413c32d74538452dfd0337b9ec32707db7bde37ffcdabcaded06b9",
        "stage/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
    },
    "reinforce_pp_baseline": {
        "compute_credit/advantages": "5bca12bcf0d3e455376aaad1bda591853965560535e9b29abee7a31cb9a7c625",
        "compute_credit/anchor_members": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/anchors": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/diagnostics": "c170d7012911105102a8b71c7ddd2e9ccb3db60a74dfc03d308ddfbc22dc524b",
        "compute_credit/subdiffs": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "stage/advantages": "5bca12bcf0d3e455376aaad1bda591853965560535e9b29abee7a31cb9a7c625",
        "stage/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "stage/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "stage/diagnostics": "54c8119a77413c32d74538452dfd0337b9ec32707db7bde37ffcdabcaded06b9",
        "stage/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
    },
    "rloo": {
        "compute_credit/advantages": "bd68ceabee898f6411bd9b0d55f91d8e23475c2c473dddcd5411af4e35832d03",
        "compute_credit/anchor_members": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/anchors": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "compute_credit/diagnostics": "c170d7012911105102a8b71c7ddd2e9ccb3db60a74dfc03d308ddfbc22dc524b",
        "compute_credit/subdiffs": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "stage/advantages": "bd68ceabee898f6411bd9b0d55f91d8e23475c2c473dddcd5411af4e35832d03",
        "stage/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "stage/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "stage/diagnostics": "54c8119a77413c32d74538452dfd0337b9ec32707db7bde37ffcdabcaded06b9",
        "stage/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
    },
    "didpo_flipped": {  # didpo's units; only the advantages differ (the anchors' sign reversed)
        "compute_credit/advantages": "0d56770d20bd493a75da865890f1e7a07bb3df6d49bb103be7bc31c4d80432bf",
        "compute_credit/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "compute_credit/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "compute_credit/diagnostics": "54c8119a77413c32d74538452dfd0337b9ec32707db7bde37ffcdabcaded06b9",
        "compute_credit/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
        "stage/advantages": "0d56770d20bd493a75da865890f1e7a07bb3df6d49bb103be7bc31c4d80432bf",
        "stage/anchor_members": "e5d0ccf170e35101f72d95e18ab70f1e2dc3e9135a457181eb5fee6666625c2a",
        "stage/anchors": "3ac94243190a2648d64cc89e7769ec476672eff61bfdcd45b1e605af5b8ca0f3",
        "stage/diagnostics": "54c8119a77413c32d74538452dfd0337b9ec32707db7bde37ffcdabcaded06b9",
        "stage/subdiffs": "98899c3878de5d9ca774846b846c0f72065ad307ba384ae3d06594a715937033",
    },
}


def _builtin_estimators() -> set[str]:
    """The estimators pipeline/credit/__init__.py registers (a test may register its own for a while)."""
    return {name for name, spec in ESTIMATORS.items() if spec.fn.__module__.startswith("pipeline.credit.")}


def test_every_builtin_estimator_has_golden_checksums():
    assert set(GOLDEN) == _builtin_estimators()


def test_the_golden_batch_exercises_the_units():
    """The batch reaches what the tables hold: anchors in two tasks, a dropped repeat, a partial loss mask,
    empty tokens, several turns."""
    steps = golden_batch()
    result = assign_advantages(credit_units(steps, CreditSettings(estimator="didpo", gamma=0.9)), CreditSettings(estimator="didpo", gamma=0.9))
    tables = result_tables(result)
    assert len({a["task_id"] for a in tables["anchors"].to_pylist()}) >= 2
    assert result.diagnostics.n_repeated_hunks >= 1
    assert any(s.loss_mask is not None for s in steps)
    assert any((s.token_char_starts == s.token_char_ends).any() for s in steps)
    assert {s.turn for s in steps} == {0, 1, 2}
    assert [r["row_id"] for r in tables["advantages"].to_pylist()] == [s.row_id for s in steps]


@pytest.mark.parametrize("estimator", sorted(GOLDEN))
def test_tables_match_the_golden_checksums(estimator):
    assert CREDIT_TABLES == ("subdiffs", "anchors", "anchor_members", "advantages")
    assert _checksums(estimator) == GOLDEN[estimator]


if __name__ == "__main__":  # print the checksums of the code as it is (to record them, deliberately)
    import pprint

    pprint.pprint({name: _checksums(name) for name in sorted(_builtin_estimators())}, width=120)
