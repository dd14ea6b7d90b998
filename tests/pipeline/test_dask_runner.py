"""A round's Beam graph on a real distributed runner: Beam's Dask runner with our fixes
(pipeline/dask_runner.py) against a `distributed.LocalCluster` of two worker processes writes byte for byte
the tables FnApiRunner writes, for the rollouts stage (multi-output rollouts, RunInference) and for the
credit stage (sub-diffs and anchors per task, a batch-wide combine)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from builders import FIX, OTHER, rewrite_step

from pipeline import schema
from pipeline.config import load_config
from pipeline.run import beam_options, build_credit_pipeline, run_round
from pipeline.tasks import load_source
from pipeline.transforms.settings import DASK_RUNNER

pytestmark = pytest.mark.slow  # a two-process Dask cluster and the tiny policy on each worker


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        assert len(c.workers) == 2
        yield c.scheduler_address


def _checksums(round_dir: Path) -> dict[str, str]:
    return {f"{table}/{part.name}": hashlib.sha256(part.read_bytes()).hexdigest()
            for table in schema.TABLES if schema.table_dir(round_dir, table).is_dir()
            for part in schema.part_files(schema.table_dir(round_dir, table))}


def _config(root: Path, runner: str, *extra: str):
    return load_config(None, [f"run.root={root}", "policy.size=tiny", "policy.max_new_tokens=32",
                              "episode.max_turns=2", "episode.max_response_tokens=32", "pipeline.samples_per_task=2",
                              "pipeline.num_shards=2", "sandbox.pool_size=1", f"pipeline.runner={runner}", *extra])


def test_the_dask_shortcut_names_our_runner():
    assert _config(Path("/tmp"), "dask").pipeline.runner == DASK_RUNNER


def test_a_round_on_dask_writes_the_tables_of_fnapi(tiny_policy, cluster, tmp_path):
    tasks = load_source("mbpp", split="train", limit=2)
    local = run_round(_config(tmp_path / "fnapi", "FnApiRunner"), 0, tiny_policy, tasks)
    dask = run_round(_config(tmp_path / "dask", "dask"), 0, tiny_policy, tasks,
                     beam_args=[f"--dask_client_address={cluster}"])
    expected = _checksums(local.round_dir)
    assert {"steps/part-00000.parquet", "trajectories/part-00000.parquet"} <= set(expected)
    assert _checksums(dask.round_dir) == expected


@pytest.mark.parametrize("estimator", ["didpo", "didpo_did", "reinforce_pp_baseline"])  # per task; a batch-wide combine
def test_credit_on_dask_writes_the_units_and_advantages_of_fnapi(cluster, tmp_path, estimator):
    rows = [rewrite_step(f"t/{t}", i, FIX if (i + t) % 3 else OTHER, float((i + t) % 3 > 0))
            for t in range(3) for i in range(4)]
    sums = {}
    for runner in ("FnApiRunner", "dask"):
        cfg = _config(tmp_path / runner, runner, f"credit.estimator={estimator}")
        round_dir = schema.round_dir(cfg.run.root, cfg.run.run_id, 0)
        schema.write_table(rows, schema.table_dir(round_dir, "steps"), "steps")
        args = [f"--dask_client_address={cluster}"] if runner == "dask" else []
        build_credit_pipeline(beam_options(cfg.pipeline, args), cfg, round_dir).run().wait_until_finish()
        sums[runner] = _checksums(round_dir)
    assert any(k.startswith("anchors/") for k in sums["FnApiRunner"]) or estimator != "didpo"
    assert any(k.startswith("advantages/") for k in sums["FnApiRunner"])
    assert sums["dask"] == sums["FnApiRunner"]


def test_a_dofn_with_several_consumed_outputs_runs_each_element_once_spread_over_the_workers(cluster, tmp_path):
    """Dask's task fusion used to copy a multi-output ParDo into each consumer's chain (every credit task group
    ran twice), and Beam's default of 128 elements a partition ran a round's few elements on one worker."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    class Once(beam.DoFn):  # defined here: pickled by value (the workers cannot import a test module)
        """Records each element it processes (a file per element and bundle); two tagged outputs."""

        def __init__(self, folder: str) -> None:
            self.folder = folder

        def start_bundle(self):
            import uuid

            self.bundle = uuid.uuid4().hex

        def process(self, x):
            (Path(self.folder) / f"{x}-{self.bundle}").touch()
            yield x
            yield beam.pvalue.TaggedOutput("odd" if x % 2 else "even", x)

    seen = tmp_path / "seen"
    seen.mkdir()
    with beam.Pipeline(DASK_RUNNER, options=PipelineOptions([f"--dask_client_address={cluster}"])) as p:
        out = p | beam.Create(list(range(12))) | beam.ParDo(Once(str(seen))).with_outputs("odd", "even", main="all")
        for tag in ("all", "odd", "even"):  # three sinks read the one ParDo
            _ = out[tag] | f"Sum{tag}" >> beam.CombineGlobally(sum)
    runs = [f.name.split("-") for f in seen.iterdir()]
    assert sorted(int(x) for x, _ in runs) == list(range(12))  # each element exactly once
    assert len({bundle for _, bundle in runs}) == 2  # one partition (bundle) per worker thread


def test_tagged_outputs_stay_apart_when_dask_would_give_two_fused_chains_one_name(cluster, tmp_path, monkeypatch):
    """Dask's low-level fusion names a fused chain by its functions' names cut to 115 characters and four hex
    characters of Python's per-process `hash()` (dask/dask#9964): two chains that collide alias one to the
    other, and a table's writer got another table's rows (`anchors` missing `edit_type`, one CI run in many).
    Here every fused chain gets one name, the extreme of that collision: each tag's consumer must still see
    only its own elements, so the runner must not fuse."""
    import apache_beam as beam
    import dask.optimization
    from apache_beam.options.pipeline_options import PipelineOptions

    def one_name(keys):
        first = keys[-1]
        return ("fused-collision", *first[1:]) if isinstance(first, tuple) else "fused-collision"

    monkeypatch.setattr(dask.optimization, "default_fused_keys_renamer", one_name)

    class Split(beam.DoFn):  # defined here: pickled by value (the workers cannot import a test module)
        def process(self, x):
            yield beam.pvalue.TaggedOutput("odd" if x % 2 else "even", x)

    class Record(beam.DoFn):
        def __init__(self, folder: str, name: str) -> None:
            self.folder, self.name = folder, name

        def process(self, x):
            (Path(self.folder) / f"{self.name}-{x}").touch()
            yield x

    seen = tmp_path / "seen"
    seen.mkdir()
    with beam.Pipeline(DASK_RUNNER, options=PipelineOptions([f"--dask_client_address={cluster}"])) as p:
        out = p | beam.Create(list(range(12))) | beam.ParDo(Split()).with_outputs("odd", "even")
        for tag in ("odd", "even"):
            _ = out[tag] | f"Same{tag}" >> beam.Map(lambda x: x) | f"Record{tag}" >> beam.ParDo(Record(str(seen), tag))
    got = sorted(f.name for f in seen.iterdir())
    assert got == sorted(f"{'odd' if x % 2 else 'even'}-{x}" for x in range(12))
