"""One training loop (training/loop.py) for SFT and the policy update: golden per-step numbers.

The numbers below were recorded from the code BEFORE the refactor that put SFT (`training.sft.train_sft`,
then its own plain-torch loop) and the policy update (`training.trainer.train_round`, then its own
DeepSpeed loop) on the one loop: a seeded 10-step SFT and a seeded 9-step update on the tiny policy. The
refactored code must reproduce them (asserted within 1e-6; they matched bit for bit when recorded), also when
the run is killed part-way and resumed from its train state (the one completion protocol).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import random_round

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

from pipeline.policy.tiny import build_checkpoint  # noqa: E402
from training.demonstrations import SftExample  # noqa: E402
from training.loop import STATE_DIR  # noqa: E402
from training.settings import TrainSettings  # noqa: E402
from training.sft import REPORT_NAME as SFT_REPORT  # noqa: E402
from training.sft import SftReport, train_sft  # noqa: E402
from training.sft_settings import SftSettings  # noqa: E402
from training.trainer import REPORT_NAME as TRAIN_REPORT  # noqa: E402
from training.trainer import train_round  # noqa: E402

CORPUS = ["def add(a, b):\n    return a + b\n" * 20, "for i in range(10):\n    print(i)\n" * 20]
TOL = 1e-6

# (loss, grad_norm, lr) per optimizer step, recorded before the refactor
SFT_GOLDEN = [
    (5.692408561706543, 3.1331989765167236, 0.0015),
    (5.702206611633301, 3.5721986293792725, 0.003),
    (5.685549736022949, 3.779240846633911, 0.003),
    (5.739180564880371, 3.193068265914917, 0.0028972373688902374),
    (5.409111499786377, 2.638378381729126, 0.002604594154601839),
    (5.088770866394043, 3.207118511199951, 0.002166622633692871),
    (5.02308988571167, 2.8775134086608887, 0.0016500000000000002),
    (5.0504631996154785, 3.0475573539733887, 0.0011333773663071288),
    (4.81025505065918, 2.1934256553649902, 0.0006954058453981609),
    (4.908814430236816, 2.522899627685547, 0.0004027626311097629),
]

# (loss, policy_loss, ref_kl, entropy, grad_norm, lr) per optimizer step, recorded before the refactor
UPDATE_GOLDEN = [
    (-1.1244579255580902, -1.0678475499153137, 0.0, 5.661037445068359, 3.598815441131592, 0.003),
    (0.6653262227773666, 0.7217358648777008, 0.0019864359637722373, 5.6608288288116455, 2.792395830154419, 0.003),
    (0.7477343678474426, 0.8034359216690063, 0.009155434556305408, 5.661709308624268, 3.536283254623413, 0.0028972373688902374),
    (-0.6002797037363052, -0.5558500587940216, 0.12147758528590202, 5.657743215560913, 0.5484164357185364, 0.002604594154601839),
    (0.4979244992136955, 0.5412102416157722, 0.1330650895833969, 5.659224033355713, 0.8625478744506836, 0.002166622633692871),
    (-0.956868052482605, -0.908629834651947, 0.08350348472595215, 5.658857345581055, 1.1256884336471558, 0.0016500000000000002),
    (-1.3146317601203918, -1.2676403522491455, 0.0959097295999527, 5.65823769569397, 1.6501613855361938, 0.0011333773663071288),
    (0.33652521669864655, 0.37999317049980164, 0.13131985813379288, 5.659994840621948, 1.4726364612579346, 0.0006954058453981609),
    (0.8098668456077576, 0.8551183938980103, 0.1131836473941803, 5.656994819641113, 0.7395807504653931, 0.0004027626311097629),
]

SFT = SftSettings(lr=3e-3, warmup_steps=2, max_steps=10, epochs=5, max_tokens_per_batch=48, weight_decay=0.01,
                  seed=0)
TRAIN = TrainSettings(lr=3e-3, max_tokens_per_batch=48, micro_batches_per_step=2, epochs=3, warmup_steps=1,
                      schedule="cosine", kl_coef=0.1, entropy_coef=0.01, grad_clip=1.0, seed=0)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", size="tiny", corpus=CORPUS, seed=0).path


@pytest.fixture(scope="module")
def vocab(ckpt) -> int:
    return json.loads((ckpt / "config.json").read_text())["vocab_size"]


def sft_rows(vocab: int, n: int = 12, seed: int = 0) -> list[SftExample]:
    rng = np.random.default_rng(seed)
    return [SftExample(f"t{i}", "write", 0, tuple(int(x) for x in rng.integers(3, vocab, int(rng.integers(4, 12)))),
                       tuple(int(x) for x in rng.integers(3, vocab, int(rng.integers(3, 10)))), "x") for i in range(n)]




def assert_close(got: list[tuple[float, ...]], want: list[tuple[float, ...]]) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True), 1):
        assert max(abs(a - b) for a, b in zip(g, w, strict=True)) <= TOL, (step, g, w)


def sft_numbers(report: SftReport) -> list[tuple[float, ...]]:
    return [(s.loss, s.grad_norm, s.lr) for s in report.steps]


def update_numbers(steps) -> list[tuple[float, ...]]:
    return [(s.loss, s.policy_loss, s.ref_kl, s.entropy, s.grad_norm, s.lr) for s in steps]


@pytest.mark.slow
def test_sft_reproduces_the_losses_of_its_old_loop(ckpt, vocab, tmp_path):
    report = train_sft(ckpt, tmp_path / "sft", sft_rows(vocab), SFT)
    assert_close(sft_numbers(report), SFT_GOLDEN)
    assert (tmp_path / "sft" / SFT_REPORT).is_file() and not (tmp_path / "sft" / STATE_DIR).exists()


@pytest.mark.slow
def test_a_killed_sft_resumes_to_the_same_losses(ckpt, vocab, tmp_path):
    out, settings = tmp_path / "sft", SFT.model_copy(update={"save_every": 2})
    part = train_sft(ckpt, out, sft_rows(vocab), settings, max_steps=5)  # the "kill": after step 5, saved at 4
    assert not part.completed and not (out / SFT_REPORT).exists() and (out / STATE_DIR / "latest").is_file()
    rest = train_sft(ckpt, out, sft_rows(vocab), settings)
    assert rest.completed and rest.resumed_from_step == 5 and (out / SFT_REPORT).is_file()
    assert_close(sft_numbers(rest), SFT_GOLDEN)  # the report keeps the steps trained before the kill


@pytest.mark.slow
def test_the_update_reproduces_the_losses_of_its_old_loop(ckpt, vocab, tmp_path):
    root = random_round(tmp_path / "round", vocab, n_rows=12)
    report = train_round(root, ckpt, tmp_path / "upd", TRAIN)
    assert_close(update_numbers(report.steps), UPDATE_GOLDEN)
    assert (tmp_path / "upd" / TRAIN_REPORT).is_file() and not (tmp_path / "upd" / STATE_DIR).exists()


@pytest.mark.slow
def test_a_killed_update_resumes_to_the_same_losses(ckpt, vocab, tmp_path):
    root = random_round(tmp_path / "round", vocab, n_rows=12)
    part = train_round(root, ckpt, tmp_path / "upd", TRAIN, max_steps=4)
    rest = train_round(root, ckpt, tmp_path / "upd", TRAIN)
    assert rest.completed and rest.resumed_from_step == 4
    assert_close(update_numbers(part.steps + rest.steps), UPDATE_GOLDEN)
