"""Policy model handlers inside Beam RunInference (FnApiRunner: in-process, offline)."""

from __future__ import annotations

import pickle
import sys

import apache_beam as beam
import pytest
import torch
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import RunInference
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.policy.generation import BackendUnavailable, GenerationRequest, TransformersGenerator
from pipeline.policy.handlers import (
    METRICS_NAMESPACE,
    TransformersPolicyHandler,
    VllmPolicyHandler,
    make_handler,
)
from pipeline.policy.loading import load_tokenizer
from pipeline.policy.settings import PolicySettings

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def settings(tiny_checkpoint) -> PolicySettings:
    return PolicySettings(checkpoint=str(tiny_checkpoint.path), temperature=1.0, top_p=0.9, max_new_tokens=8)


@pytest.fixture(scope="module")
def requests(tiny_checkpoint) -> list[GenerationRequest]:
    tok = load_tokenizer(tiny_checkpoint.path)
    texts = ["a", "fix it", "write def add(a, b)", "héllo", "return x + 1", "日本語"]
    return [
        GenerationRequest(
            f"task{i}",
            tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)[
                "input_ids"
            ],
            seed=100 + i,
        )
        for i, t in enumerate(texts)
    ]


@pytest.fixture(scope="module")
def expected(settings, requests):
    """Each request generated on its own, outside Beam."""
    generator = TransformersPolicyHandler(settings).load_model()
    return [generator.generate([r])[0] for r in requests]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_run_inference_gives_the_same_results_whatever_the_batching(settings, requests, expected, batch_size):
    handler = TransformersPolicyHandler(settings, min_batch_size=batch_size, max_batch_size=batch_size)
    pipeline = TestPipeline(runner="FnApiRunner")
    results = pipeline | beam.Create(requests, reshuffle=False) | RunInference(handler)
    assert_that(results, equal_to(expected))
    run = pipeline.run()
    run.wait_until_finish()
    counters = {
        c.key.metric.name: c.committed
        for c in run.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    }
    assert counters["responses"] == len(requests)
    assert counters["generated_tokens"] == sum(len(r.response_token_ids) for r in expected)
    assert counters["truncated_responses"] == sum(r.truncated for r in expected)
    # Beam really batched as asked (6 requests: batches of 1, or of 4 then 2).
    (sizes,) = run.metrics().query(
        MetricsFilter()
        .with_namespace(handler.get_metrics_namespace())
        .with_name("inference_request_batch_size")
    )["distributions"]
    assert sizes.committed.max == batch_size and sizes.committed.sum == len(requests)


def test_handler_contract(settings):
    handler = TransformersPolicyHandler(settings, min_batch_size=2, max_batch_size=6)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 2, "max_batch_size": 6}
    assert not handler.share_model_across_processes()
    assert TransformersPolicyHandler(settings, share_across_processes=True).share_model_across_processes()
    assert handler.get_metrics_namespace() == f"{METRICS_NAMESPACE}_transformers"
    with pytest.raises(ValueError, match="no inference_args"):
        handler.validate_inference_args({"temperature": 0.5})
    handler.validate_inference_args(None)
    with pytest.raises(ValueError, match="min_batch_size <= max_batch_size"):
        TransformersPolicyHandler(settings, min_batch_size=5, max_batch_size=2)
    # Beam pickles handlers to its workers: they must carry settings only.
    clone = pickle.loads(pickle.dumps(handler))
    assert clone.settings == settings and clone.batch_elements_kwargs() == handler.batch_elements_kwargs()


def test_load_model_reads_the_checkpoint(settings):
    generator = TransformersPolicyHandler(settings, batch_invariant=False).load_model()
    assert isinstance(generator, TransformersGenerator) and not generator.batch_invariant
    assert generator.settings == settings and generator.tokenizer.padding_side == "left"


def test_make_handler_picks_the_backend(settings):
    assert type(make_handler(settings)) is TransformersPolicyHandler
    vllm_settings = settings.model_copy(update={"backend": "vllm"})
    handler = make_handler(vllm_settings, max_batch_size=64)
    assert type(handler) is VllmPolicyHandler and handler.batch_elements_kwargs()["max_batch_size"] == 64
    with pytest.raises(ValueError, match="serves policy.backend='vllm', got 'transformers'"):
        VllmPolicyHandler(settings)


def test_vllm_without_the_gpu_extra_is_a_clear_error(settings, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, installed or not
    handler = VllmPolicyHandler(settings.model_copy(update={"backend": "vllm"}))
    with pytest.raises(
        BackendUnavailable, match=r"vllm backend selected but the `gpu` extra is not installed"
    ):
        handler.load_model()
