"""Beam's Dask runner, with the fixes a round's graph needs (Beam 2.77's runner is experimental).

Beam's `DaskRunner` turns each leaf transform into a `dask.bag` operation. As shipped it

1. keeps one bag per transform, so every tagged output of a multi-output ParDo (the rollouts' `steps`,
   `trajectories` and `dead_letter`) is fed the outputs of all tags;
2. collects a bundle's outputs before `finish_bundle`, so what a DoFn emits there is lost (Beam's
   `BatchElements`, inside `RunInference`, emits its last batch there);
3. computes only the last transform's bag, so the other sinks of a graph never run.

`DidpoDaskRunner` keeps one bag per output PCollection (a ParDo's bag holds (tag, value) pairs, split by
tag), runs each bundle's DoFn to the end of `finish_bundle` before returning its outputs, and computes every
bag that no transform consumes, in one graph that dask does not fuse (its fused tasks' names can collide,
dask/dask#9964: one table's rows reached another's writer). Two more: a side input is a dependency in the
graph (Beam's runner iterates its bag inside the task that reads it, a second computation of everything
upstream: with the `Count.Globally` that closes a round's graph, every rollout and every task group's credit
ran twice), and a graph's elements are spread over one partition per worker thread (Beam's default of 128
elements a partition put a round's few elements, table parts or task groups, on one worker). It also sets each DoFn up once per
worker process and reuses it for every bundle (Beam's runner sets up and tears down per partition: a policy
or sandbox pool per partition).
Everything else is Beam's runner. Use it as

    --runner=pipeline.dask_runner.DidpoDaskRunner --dask_client_address=HOST:8786

or `didpo pipeline run --runner dask` (a `distributed.LocalCluster` on this machine when no address is given).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any

from apache_beam import pvalue
from apache_beam.internal import pickler
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, Receiver, _OutputHandler
from apache_beam.runners.dask import transform_evaluator as te
from apache_beam.runners.dask.dask_runner import (
    DaskOptions,
    DaskRunner,
    DaskRunnerResult,
)
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.utils.windowed_value import WindowedValue


@dataclasses.dataclass
class _Collect(Receiver):
    """Receives one tag's outputs as (tag, windowed value) pairs into a shared list."""

    tag: str | None
    values: list[tuple[str | None, WindowedValue]]

    def receive(self, windowed_value: WindowedValue) -> None:
        self.values.append((self.tag, windowed_value))


class _Receivers(dict):
    def __init__(self) -> None:
        super().__init__()
        self.values: list[tuple[str | None, WindowedValue]] = []

    def __missing__(self, tag: str | None) -> _Collect:
        self[tag] = _Collect(tag, self.values)
        return self[tag]


# DoFns already set up in this worker process, by transform and pickled content: a DoFn is set up once per
# process and reused for every bundle (as Beam's other runners do), so a model or a sandbox pool that a DoFn
# loads in `setup` loads once per worker, not once per partition.
_SET_UP: dict[str, Any] = {}


class _Windowed:
    """A side input's computed elements as the windowed values `SideInputMap` iterates."""

    def __init__(self, values: list, window_fn: Any) -> None:
        self.values, self.window_fn = values, window_fn

    def __iter__(self):
        for value in self.values:
            yield te.get_windowed_value(value, self.window_fn)


def _whole(partitions: list[list]) -> list:
    return [value for part in partitions for value in part]


def _run_bundle(items: Any, fn: Any, key: str, label: str, window_fn: Any, side_specs: Any, side_values: Any,
                args: Any, kwargs: Any) -> list[tuple[str | None, WindowedValue]]:
    """One Dask partition as one bundle: process every element, then finish_bundle; its outputs. The DoFn is
    this process's set-up instance of `key` (set up on first use). side_values: each side input's elements,
    computed upstream in the same graph."""
    fresh = key not in _SET_UP
    fn = _SET_UP.setdefault(key, fn)
    side_inputs = [SideInputMap(view, options, _Windowed(values, mapping))
                   for (view, options, mapping), values in zip(side_specs, side_values, strict=True)] or None
    receivers = _Receivers()  # made here, per bundle: a partition's outputs never mix with another's
    handler = _OutputHandler(window_fn=window_fn, main_receivers=receivers[None], tagged_receivers=receivers,
                             per_element_output_counter=None, output_batch_converter=None,
                             process_yields_batches=False, process_batch_yields_elements=False)
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn), handler, context=DoFnContext(label, state=None), side_inputs=side_inputs,
        input_args=args, input_kwargs=kwargs, user_state_context=None,
        bundle_finalizer_param=te.DoFn.BundleFinalizerParam())
    if fresh:
        invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(item)
    invoker.invoke_finish_bundle()
    return list(receivers.values)


class _ParDo(te.ParDo):
    def apply(self, input_bag: Any, side_inputs: Any = None) -> Any:
        """side_inputs: (view class, view options, bag, window mapping) per side input. Each bag enters the
        graph as one dependency of every partition (Beam's runner iterates it inside the task instead: a
        separate computation of everything upstream of it, once per use)."""
        import dask

        transform = self.transform
        args, kwargs = transform.raw_side_inputs
        main_input = next(iter(self.applied.main_inputs.values()))
        window_fn = main_input.windowing.windowfn if hasattr(main_input, "windowing") else None
        key = f"{transform.label}:{hashlib.sha256(pickler.dumps(transform.fn)).hexdigest()[:20]}"
        specs = [(view, options, mapping) for view, options, _, mapping in side_inputs or ()]
        values = dask.delayed([dask.delayed(_whole)(bag.to_delayed(optimize_graph=False))
                               for _, _, bag, _ in side_inputs or ()])
        return input_bag.map(te.get_windowed_value, window_fn).map_partitions(
            _run_bundle, transform.fn, key, transform.label, window_fn, specs, values, list(args), kwargs)


def _untag(pair: tuple[str | None, WindowedValue]) -> Any:
    """The element itself: between transforms Beam's Dask ops pass plain elements (global windows)."""
    return pair[1].value


def _has_tag(pair: tuple[str | None, WindowedValue], tag: str | None) -> bool:
    return pair[0] == tag


def _main_or_tag(tag: str | None) -> str | None:
    """A transform's output tag, its main output as None (Beam names it None or "None" by place)."""
    return None if tag in (None, "None") else tag


def _output_key(value: pvalue.PValue) -> tuple[AppliedPTransform, str | None]:
    return value.producer, _main_or_tag(getattr(value, "tag", None))


class _Result(DaskRunnerResult):
    """Closes the runner's client once the pipeline is done (else it keeps reconnecting to a cluster that
    may be gone)."""

    def wait_until_finish(self, duration: Any = None) -> str:
        try:
            return super().wait_until_finish(duration)
        finally:
            self.client.close()


class DidpoDaskRunner(DaskRunner):
    """Beam's DaskRunner with per-output bags, finish_bundle outputs and every sink computed."""

    @staticmethod
    def to_dask_bag_visitor(bag_kwargs: dict | None = None) -> PipelineVisitor:
        bag_kwargs = bag_kwargs or {}

        class Visitor(PipelineVisitor):
            def __init__(self) -> None:
                self.bags: dict[tuple[AppliedPTransform, str | None], Any] = {}
                self.consumed: set[tuple[AppliedPTransform, str | None]] = set()

            def _bag(self, value: pvalue.PValue) -> Any:
                key = _output_key(value)
                self.consumed.add(key)
                return self.bags[key]

            def visit_transform(self, node: AppliedPTransform) -> None:
                op_class = te.TRANSLATIONS.get(node.transform.__class__, te.NoOp)
                op_class = _ParDo if op_class is te.ParDo else op_class
                op = op_class(node, bag_kwargs=bag_kwargs)
                inputs = [self._bag(v) for v in node.inputs if not isinstance(v, pvalue.PBegin)]
                kws: dict[str, Any] = {"input_bag": None, "side_inputs": None}
                if inputs:
                    kws["input_bag"] = inputs[0] if len(inputs) == 1 and not isinstance(op, te.Flatten) else inputs
                if node.side_inputs and isinstance(op, _ParDo):  # the only op that reads side inputs
                    kws["side_inputs"] = [(type(si), si._view_options(), self._bag(si.pvalue), si._window_mapping_fn)
                                          for si in node.side_inputs]
                bag = op.apply(**kws)
                if isinstance(op, _ParDo):
                    for tag in map(_main_or_tag, node.outputs):
                        self.bags[(node, tag)] = bag.filter(functools.partial(_has_tag, tag=tag)).map(_untag)
                else:
                    for tag in node.outputs or [None]:
                        self.bags[(node, _main_or_tag(tag))] = bag

            def sinks(self) -> list[Any]:
                return [bag for key, bag in self.bags.items() if key not in self.consumed]

        return Visitor()

    def run_pipeline(self, pipeline: Any, options: Any) -> _Result:
        import dask.distributed as ddist
        from apache_beam.runners.dask.overrides import dask_overrides

        dask_options = options.view_as(DaskOptions).get_all_options(drop_default=True, current_only=True)
        bag_kwargs = DaskOptions._extract_bag_kwargs(dask_options)
        client = ddist.Client(**dask_options)
        if not bag_kwargs:  # Beam's default (128 elements a partition) puts a round's few elements (task groups,
            # table parts) in one partition, which one worker runs: one partition per worker thread instead
            # (--dask_npartitions / --dask_partition_size still decide when given)
            threads = sum(w.get("nthreads", 1) for w in client.scheduler_info().get("workers", {}).values())
            bag_kwargs = {"npartitions": threads} if threads else {}
        pipeline.replace_all(dask_overrides())
        visitor = self.to_dask_bag_visitor(bag_kwargs)
        pipeline.visit(visitor)
        # every sink in one graph (`dask.optimize(*sinks)` optimises each sink's graph apart, and what two sinks
        # share would run once for each), not fused: dask names a fused chain by its functions' names cut to 115
        # characters plus four hex characters of the per-process `hash()`, so two chains can get one name and one
        # aliases the other (dask/dask#9964): a table's writer was handed another table's rows
        futures = client.compute(visitor.sinks(), optimize_graph=False)
        return _Result(client, futures)
