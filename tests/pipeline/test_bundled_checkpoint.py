"""Checkpoints shipped in models/: `bundled:NAME` resolves to the folder once its weights match the sha256
recorded beside them; an unknown name, a missing record or a tampered file is refused with a one-line error."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

import pipeline.assets as assets
from pipeline.policy.loading import check_checkpoint, checkpoint_parameters, load_policy
from pipeline.policy.settings import PolicySettings


@pytest.fixture
def shipped(tmp_path, monkeypatch, tiny_policy):
    """A models/ folder holding a copy of the tiny checkpoint as `tiny`, with its recorded sha256."""
    models = tmp_path / "models"
    shutil.copytree(tiny_policy, models / "tiny")
    digest = hashlib.sha256((models / "tiny" / "model.safetensors").read_bytes()).hexdigest()
    (models / "tiny" / assets.PRETRAIN_REPORT).write_text(json.dumps({"sha256": {"model.safetensors": digest}}))
    real = assets.asset_dir
    monkeypatch.setattr(assets, "asset_dir", lambda name: models if name == "models" else real(name))
    assets._verified.cache_clear()
    yield models
    assets._verified.cache_clear()


def test_a_bundled_name_resolves_to_its_checked_folder(shipped):
    policy = PolicySettings(checkpoint="bundled:tiny")
    assert policy.checkpoint == str(shipped / "tiny")
    assert check_checkpoint(policy.checkpoint) == shipped / "tiny"
    assert PolicySettings(checkpoint="runs/models/mine").checkpoint == "runs/models/mine"  # a path stays


def test_unknown_unrecorded_and_tampered_checkpoints_are_refused(shipped):
    with pytest.raises(ValueError, match="no bundled checkpoint 'nope'.*shipped: tiny"):
        PolicySettings(checkpoint="bundled:nope")
    weights = shipped / "tiny" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256 .* records .*refused"):
        PolicySettings(checkpoint="bundled:tiny")
    (shipped / "tiny" / assets.PRETRAIN_REPORT).unlink()
    assets._verified.cache_clear()
    with pytest.raises(ValueError, match="no sha256"):
        PolicySettings(checkpoint="bundled:tiny")


SHIPPED = sorted(p.name for p in assets.asset_dir("models").iterdir() if (p / "model.safetensors").is_file())


def test_the_default_base_is_shipped():
    assert "base" in SHIPPED  # configs/local.yaml's policy.checkpoint: bundled:base


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_checkpoint_matches_its_recorded_hash_and_loads(name):
    """models/NAME as committed: the weights hash to what its report records, they load as a policy, and its
    model card names the command and seed that made it."""
    assets._verified.cache_clear()
    folder = Path(assets.resolve_checkpoint(f"bundled:{name}"))  # raises on a hash mismatch or a Git LFS pointer
    assert folder == assets.asset_dir("models") / name
    report = json.loads((folder / assets.PRETRAIN_REPORT).read_text())
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert digest == report["sha256"]["model.safetensors"]
    assert report["command"].startswith("didpo model pretrain")
    card = (folder / "README.md").read_text()
    assert f"seed {report['settings']['seed']}" in card and "didpo model pretrain" in card
    model = load_policy(folder)
    assert sum(p.numel() for p in model.parameters()) == report["parameters"] == checkpoint_parameters(folder)
