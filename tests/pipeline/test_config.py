"""One config drives every stage; a wrong one is refused with the key path and what is allowed. The root
config (`training.config`) is the pipeline's sections plus the trainer's; the pipeline reads only its own."""

from __future__ import annotations

import pytest

from pipeline.config import (
    DEFAULT_CONFIG,
    TRAINER_SECTIONS,
    ConfigError,
    PipelineConfig,
    config_hash,
    to_yaml,
)
from pipeline.config import load_config as load_pipeline_config
from training.config import DidpoConfig, load_config


def test_default_config_loads_every_section():
    cfg = load_config()
    assert cfg.pipeline.runner == "FnApiRunner"  # never Prism locally
    assert cfg.credit.estimator == "didpo_did" and cfg.credit.lam == 1.0
    assert cfg.policy.backend == "transformers" and cfg.tasks.train


def test_overrides_are_typed_and_change_the_hash():
    base = load_config()
    cfg = load_config(None, ["credit.lam=0.6", "pipeline.samples_per_task=8", "run.run_id=abl"])
    assert cfg.credit.lam == 0.6 and cfg.pipeline.samples_per_task == 8 and cfg.run.run_id == "abl"
    assert config_hash(cfg) != config_hash(base)
    assert config_hash(load_config()) == config_hash(base)


def test_typo_names_the_key_path_and_allowed_keys(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text(DEFAULT_CONFIG.read_text().replace("  lam: 1.0", "  lamda: 1.0"))
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    msg = str(err.value)
    assert "credit.lamda: unknown key" in msg and "lam," in msg and str(bad) in msg


def test_wrong_type_and_impossible_values_are_explained():
    with pytest.raises(ConfigError, match=r"pipeline\.samples_per_task: .*integer"):
        load_config(None, ["pipeline.samples_per_task=many"])
    with pytest.raises(ConfigError, match=r"pipeline\.samples_per_task: .*greater than or equal to 2"):
        load_config(None, ["pipeline.samples_per_task=1"])
    with pytest.raises(ConfigError, match=r"pipeline\.runner: .*downloads a binary"):
        load_config(None, ["pipeline.runner=PrismRunner"])
    with pytest.raises(ConfigError, match=r"tasks\.train\.0\.source: .*allowed: humaneval"):
        load_config(None, ["tasks.train=[{source: leetcode}]"])


def test_unknown_section_and_bad_override_syntax():
    with pytest.raises(ConfigError, match=r"trainer: unknown key; allowed here: .*credit"):
        load_config(None, ["trainer.lr=1"])
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        load_config(None, ["credit.lam"])
    with pytest.raises(ConfigError, match="is not a section"):
        load_config(None, ["credit.lam.x=1"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "x.yaml").write_text("credit: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "x.yaml")
    (tmp_path / "y.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(tmp_path / "y.yaml")


def test_config_is_frozen_and_show_roundtrips(tmp_path):
    cfg = load_config()
    with pytest.raises(Exception, match="frozen"):
        cfg.credit.lam = 2.0
    (tmp_path / "resolved.yaml").write_text(to_yaml(cfg))
    assert load_config(tmp_path / "resolved.yaml") == cfg


def test_the_pipeline_reads_its_sections_and_leaves_the_trainers_unread(tmp_path):
    assert set(TRAINER_SECTIONS) == set(DidpoConfig.model_fields) - set(PipelineConfig.model_fields)
    full, own = load_config(), load_pipeline_config()
    assert type(own) is PipelineConfig and not set(TRAINER_SECTIONS) & set(own.model_dump())
    assert own.model_dump() == {k: v for k, v in full.model_dump().items() if k not in TRAINER_SECTIONS}
    # a trainer section with a wrong value is the trainer's to refuse; a typo in a section name is still refused
    assert load_pipeline_config(None, ["train.lr=fast"]) == own
    with pytest.raises(ConfigError, match=r"train\.lr: "):
        load_config(None, ["train.lr=fast"])
    with pytest.raises(ConfigError, match=r"trian: unknown key; allowed here: .*sandbox"):
        load_pipeline_config(None, ["trian.lr=1"])
