"""Beam RunInference model handlers of the policy: GenerationRequest in, GenerationResult out.

    results = requests | RunInference(make_handler(config.policy))

The handlers are thin: `load_model` builds a generator from `pipeline.policy.generation`, `run_inference`
calls its `generate` on the batch Beam formed. Handlers hold only settings (they are pickled to workers);
torch, transformers and vLLM load inside `load_model`, and vLLM only when that backend is selected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler

from pipeline.policy.generation import (
    GenerationRequest,
    GenerationResult,
    TransformersGenerator,
    VllmGenerator,
    load_generator,
)
from pipeline.policy.settings import PolicySettings

METRICS_NAMESPACE = "didpo_policy"


class _PolicyHandler(ModelHandler[GenerationRequest, GenerationResult, Any]):
    """What both backends share: batching, metrics, no inference args."""

    backend: str

    def __init__(
        self,
        settings: PolicySettings,
        *,
        min_batch_size: int = 1,
        max_batch_size: int = 8,
        share_across_processes: bool = False,
    ) -> None:
        if settings.backend != self.backend:
            raise ValueError(
                f"{type(self).__name__} serves policy.backend={self.backend!r}, got {settings.backend!r} "
                "(use make_handler to pick the handler from the settings)"
            )
        if not 1 <= min_batch_size <= max_batch_size:
            raise ValueError(
                f"batch sizes must satisfy 1 <= min_batch_size <= max_batch_size, got {min_batch_size}, "
                f"{max_batch_size}"
            )
        # large_model=True makes Beam load one model per machine and share it across worker processes.
        super().__init__(
            min_batch_size=min_batch_size, max_batch_size=max_batch_size, large_model=share_across_processes
        )
        self.settings = settings

    def run_inference(
        self, batch: Sequence[GenerationRequest], model: Any, inference_args: dict[str, Any] | None = None
    ) -> Iterable[GenerationResult]:
        results = model.generate(list(batch))
        Metrics.counter(METRICS_NAMESPACE, "responses").inc(len(results))
        Metrics.counter(METRICS_NAMESPACE, "generated_tokens").inc(
            sum(len(r.response_token_ids) for r in results)
        )
        Metrics.counter(METRICS_NAMESPACE, "truncated_responses").inc(sum(r.truncated for r in results))
        return results

    def validate_inference_args(self, inference_args: dict[str, Any] | None) -> None:
        if inference_args:
            raise ValueError(
                f"policy handlers take no inference_args (got {sorted(inference_args)}): "
                "sampling is configured by PolicySettings"
            )

    def get_metrics_namespace(self) -> str:
        return f"{METRICS_NAMESPACE}_{self.backend}"

    def batch_elements_kwargs(self) -> Mapping[str, Any]:
        return dict(self._batching_kwargs)


class TransformersPolicyHandler(_PolicyHandler):
    """transformers on CPU (or a torch CUDA device): loads the checkpoint with `loading.load_policy`."""

    backend = "transformers"

    def __init__(
        self,
        settings: PolicySettings,
        *,
        min_batch_size: int = 1,
        max_batch_size: int = 8,
        share_across_processes: bool = False,
        batch_invariant: bool = True,
    ) -> None:
        super().__init__(
            settings,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            share_across_processes=share_across_processes,
        )
        self.batch_invariant = batch_invariant  # see pipeline.policy.generation's docstring

    def load_model(self) -> TransformersGenerator:
        return load_generator(self.settings, batch_invariant=self.batch_invariant)


class VllmPolicyHandler(_PolicyHandler):
    """vLLM on GPU (the `gpu` extra). `engine_kwargs` go to `vllm.LLM` (e.g. gpu_memory_utilization,
    tensor_parallel_size, max_model_len)."""

    backend = "vllm"

    def __init__(
        self,
        settings: PolicySettings,
        *,
        min_batch_size: int = 1,
        max_batch_size: int = 256,
        share_across_processes: bool = False,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            settings,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            share_across_processes=share_across_processes,
        )
        self.engine_kwargs = dict(engine_kwargs or {})

    def load_model(self) -> VllmGenerator:
        return load_generator(self.settings, engine_kwargs=self.engine_kwargs)


def make_handler(settings: PolicySettings, **kwargs: Any) -> _PolicyHandler:
    """The handler of `settings.backend`; kwargs go to its constructor (batch sizes, ...)."""
    handlers: dict[str, type[_PolicyHandler]] = {
        "transformers": TransformersPolicyHandler,
        "vllm": VllmPolicyHandler,
    }
    return handlers[settings.backend](settings, **kwargs)
