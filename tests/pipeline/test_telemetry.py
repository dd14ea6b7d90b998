from __future__ import annotations

import json
import math

from pipeline.telemetry import MetricsLog, progress


def test_metrics_jsonl_roundtrip_and_nonfinite(tmp_path):
    m = MetricsLog(tmp_path)
    m.log("train", step=0, loss=1.5, kl=math.nan)
    m.log("eval", step=0, pass_rate=0.25)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["scope"] for x in lines] == ["train", "eval"]
    train = m.read("train")
    assert train[0]["loss"] == 1.5 and train[0]["kl"] is None


def test_tensorboard_writes_events(tmp_path):
    m = MetricsLog(tmp_path, tensorboard=True)
    m.log("train", step=1, loss=0.5)
    m.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_progress_yields_everything(monkeypatch):
    monkeypatch.setenv("DIDPO_PROGRESS", "0")
    assert list(progress(range(5), "x")) == [0, 1, 2, 3, 4]
