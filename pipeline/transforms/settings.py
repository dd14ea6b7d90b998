"""Config section `pipeline`: how a round runs on Beam."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner")
DASK_RUNNER = "pipeline.dask_runner.DidpoDaskRunner"  # `runner: dask`


class PipelineSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    runner: str = Field("FnApiRunner", description="Beam runner; local default never reaches the network (no "
                        "Prism); DataflowRunner, FlinkRunner, SparkRunner take their options in beam_args; 'dask': "
                        "Beam's Dask runner with our fixes (pipeline/dask_runner.py) on the cluster at "
                        "--dask_client_address, or a local one")
    samples_per_task: int = Field(4, ge=2, description="G: rollouts per task (anchors need at least 2)")
    num_shards: int = Field(4, ge=1, le=1024, description="Parquet parts per table")
    min_batch_size: int = Field(1, ge=1, description="RunInference batching: smallest batch")
    max_batch_size: int = Field(8, ge=1, description="RunInference batching: largest batch")
    beam_args: tuple[str, ...] = Field((), description="extra Beam pipeline options, e.g. ['--project=p']")

    @field_validator("runner")
    @classmethod
    def _runner(cls, v: str) -> str:
        if v.lower() == "dask":
            return DASK_RUNNER
        if v == "PrismRunner":
            raise ValueError("PrismRunner downloads a binary at run time; use FnApiRunner or DirectRunner locally")
        if not v.endswith("Runner"):
            raise ValueError(f"runner {v!r} is not a Beam runner name (e.g. FnApiRunner, DirectRunner, "
                             "DataflowRunner, FlinkRunner, SparkRunner)")
        return v

    @field_validator("max_batch_size")
    @classmethod
    def _batch(cls, v: int, info) -> int:
        lo = info.data.get("min_batch_size", 1)
        if v < lo:
            raise ValueError(f"max_batch_size ({v}) must be >= min_batch_size ({lo})")
        return v
