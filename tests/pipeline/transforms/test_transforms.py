"""Every composite PTransform under TestPipeline (FnApiRunner: never Prism, which downloads a binary)."""

from __future__ import annotations

import dataclasses

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to, is_not_empty
from builders import FIX, OTHER, rewrite_step

from pipeline.agent.settings import EpisodeSettings
from pipeline.credit.settings import CreditSettings
from pipeline.policy.handlers import make_handler
from pipeline.policy.settings import PolicySettings
from pipeline.sandbox.settings import SandboxSettings
from pipeline.schema import to_arrow
from pipeline.tasks import load_source
from pipeline.transforms.credit import DEAD, OUTPUTS, Credit
from pipeline.transforms.rollouts import Rollouts
from pipeline.transforms.tables import ReadTable, WriteTable, shard_of


def _pipeline() -> TestPipeline:
    return TestPipeline(runner="FnApiRunner")


@pytest.mark.slow
def test_write_then_read_table_roundtrip(tmp_path):
    rows = [rewrite_step("t/1", i, FIX, 1.0) for i in range(5)]
    with _pipeline() as p:
        written = p | beam.Create(rows) | WriteTable(tmp_path, "steps", "traj_id", num_shards=3)
        counts = written | beam.Map(lambda w: w[2]) | beam.CombineGlobally(sum)
        assert_that(counts, equal_to([5]))
    expected_parts = {f"part-{shard_of(r.traj_id, 3):05d}.parquet" for r in rows}
    assert {p.name for p in (tmp_path / "steps").iterdir()} == expected_parts
    with _pipeline() as p:
        back = p | ReadTable(tmp_path, "steps") | beam.FlatMap(lambda t: t.column("row_id").to_pylist())
        assert_that(back, equal_to([r.row_id for r in rows]))


def test_write_table_is_deterministic(tmp_path):
    """The same rows, as single rows in any order or as tables of several rows, write the same bytes."""
    rows = [rewrite_step("t/1", i, FIX, 1.0) for i in range(4)]
    tables = [to_arrow("steps", rows[2:]), to_arrow("steps", rows[:2])]
    for folder, order in (("a", rows), ("b", rows[::-1]), ("c", tables)):
        with _pipeline() as p:
            _ = p | beam.Create(order) | WriteTable(tmp_path / folder, "steps", "traj_id", num_shards=2)
    parts = {folder: [f.read_bytes() for f in sorted((tmp_path / folder / "steps").iterdir())] for folder in "abc"}
    assert parts["a"] and parts["a"] == parts["b"] == parts["c"]


@pytest.mark.slow
def test_credit_groups_shared_changes_per_task_and_routes_bad_rows():
    rows = [rewrite_step("t/1", i, FIX, 1.0) for i in range(3)] + [rewrite_step("t/1", 3, OTHER, 0.0)]
    rows += [rewrite_step("t/2", i, FIX, float(i % 2)) for i in range(4)]
    bad = dataclasses.replace(rewrite_step("t/2", 9, FIX, 1.0), action_json="{not json")
    with _pipeline() as p:
        # two steps tables, a task's rows in both: Credit groups them by task
        out = p | beam.Create([to_arrow("steps", rows[:5]), to_arrow("steps", [*rows[5:], bad])]) | Credit(
            CreditSettings())
        rows_of = {name: out[name] | f"{name}Rows" >> beam.FlatMap(pa.Table.to_pylist) for name in OUTPUTS}
        anchors = rows_of["anchors"] | "AnchorTasks" >> beam.Map(lambda a: (a["task_id"], a["n_rows"] >= 2))
        assert_that(anchors | beam.Distinct(), equal_to([("t/1", True), ("t/2", True)]), label="anchors")
        members = rows_of["anchor_members"] | beam.Map(lambda m: m["row_id"]) | "Rows" >> beam.Distinct()
        assert_that(members, is_not_empty(), label="members")
        assert_that(rows_of["subdiffs"] | beam.Map(lambda s: s["edit_type"]) | "Types" >> beam.Distinct(),
                    equal_to(["add", "del"]), label="subdiffs")
        assert_that(out[DEAD] | beam.Map(lambda d: (d.key, d.stage)), equal_to([(bad.row_id, "credit_inputs")]),
                    label="dead")


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["didpo", "reinforce_pp_baseline"])
def test_credit_advantages_equal_the_core_on_the_whole_batch(estimator):
    """Per task, and for a batch-scoped estimator whitened with a global combine of one value per
    trajectory: either way the advantages Beam writes are those of `compute_credit` over the whole batch."""
    from pipeline.credit import compute_credit
    from pipeline.credit_io import step_input

    rows = [rewrite_step("t/1", i, FIX, float(i % 2)) for i in range(3)] + [rewrite_step("t/1", 3, OTHER, 0.0)]
    rows += [rewrite_step("t/2", i, FIX, float(i > 1)) for i in range(4)]
    settings = CreditSettings(estimator=estimator)
    whole = compute_credit([step_input(dataclasses.asdict(r), source="steps") for r in rows], settings)
    expected = {a.step.row_id: [round(float(x), 5) for x in a.token_advantages] for a in whole.advantages}
    assert len({tuple(v) for v in expected.values()}) > 1  # not a degenerate batch
    with _pipeline() as p:
        out = p | beam.Create([to_arrow("steps", rows[:3]), to_arrow("steps", rows[3:])]) | Credit(settings)
        got = (out["advantages"] | beam.FlatMap(pa.Table.to_pylist)
               | beam.Map(lambda a: (a["row_id"], [round(float(x), 5) for x in a["token_advantages"]])))
        assert_that(got, equal_to(sorted(expected.items())), label="advantages")


@pytest.mark.slow
def test_rollouts_with_the_tiny_policy(tiny_policy):
    tasks = load_source("mbpp", split="train", limit=1)
    policy = PolicySettings(checkpoint=str(tiny_policy), size="tiny", max_new_tokens=24)
    episode = EpisodeSettings(max_turns=2, max_response_tokens=24)
    with _pipeline() as p:
        out = p | beam.Create(tasks) | Rollouts(
            handler=make_handler(policy), checkpoint=str(tiny_policy), policy_version="v0", run_id="t",
            round_k=0, samples=2, root_seed=0, gamma=0.95, episode=episode, sandbox=SandboxSettings(pool_size=1))
        trajs = out["trajectories"] | beam.Map(lambda t: (t.task_id, t.n_turns, t.sample_index))
        assert_that(trajs, equal_to([(tasks[0].task_id, 2, 0), (tasks[0].task_id, 2, 1)]), label="trajs")
        steps = out["steps"] | beam.Map(lambda s: (s.turn, len(s.response_token_ids) == len(s.token_char_starts)))
        assert_that(steps, equal_to([(0, True), (0, True), (1, True), (1, True)]), label="steps")
        assert_that(out["dead_letter"], equal_to([]), label="dead")


def test_a_table_transform_naming_an_unknown_column_is_refused_when_the_graph_is_built(tmp_path):
    from pipeline.schema import SchemaError
    from pipeline.transforms.tables import ReadTable, WriteTable

    with pytest.raises(SchemaError, match=r"table 'advantages' has no column\(s\) \['rowid'\]"):
        WriteTable(tmp_path, "advantages", "task_id", ("rowid",))
    with pytest.raises(SchemaError, match=r"table 'steps' has no column\(s\) \['prompt'\]"):
        ReadTable(tmp_path, "steps", ["row_id", "prompt"])
