"""A fine-tune saved before the fused operations existed (its checkpoint's shape has no
"fused") resumes with the plain ones, bit for bit; a new fine-tune keeps the fused ones."""

from __future__ import annotations

import pytest
from helpers import StopAfter, tiny_config
from hf_models import TEXT, make_model

from core.runs import checkpoint as ckpt
from core.runs.folder import read_metrics
from core.training import inputs
from core.training.trainer import Trainer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    make_model(root / "model", "llama")
    (root / "text.txt").write_text(TEXT * 5, encoding="utf-8")
    data = str(root / "text.txt")
    return tiny_config(
        init_from=str(root / "model"),
        tokenizer="model",
        data=data,
        lora_rank=4,
        lr=1e-3,
        dropout=0.0,
        max_steps=6,
        ckpt_every=3,
        eval_every=3,
        log_every=1,
        sample_tokens=0,
    )


def losses(run) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl")[0]]


def test_an_older_fine_tune_resumes_with_the_plain_ops_bit_for_bit(cfg, tmp_path, monkeypatch):
    real = inputs.build_model

    def old_code(*args, **kwargs):  # the code before the fused operations
        return real(*args[:5], fused=False)

    monkeypatch.setattr(inputs, "build_model", old_code)
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "old").run(None, StopAfter(3))
    monkeypatch.setattr(inputs, "build_model", real)
    latest = tmp_path / "old" / "checkpoints" / "latest.pt"
    state = ckpt.load(latest)
    del state["model_config"]["fused"]  # as an older checkpoint has it
    ckpt.save(state, latest)
    resumed = Trainer(cfg, tmp_path / "old", resume_from=latest)
    resumed.run()
    assert not resumed.model.config.fused
    assert losses(tmp_path / "old") == losses(tmp_path / "straight")


def test_a_new_fine_tune_trains_and_resumes_fused(cfg, tmp_path):
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(3))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    assert ckpt.load(latest)["model_config"]["fused"] is True
    resumed = Trainer(cfg, tmp_path / "split", resume_from=latest)
    resumed.run()
    assert resumed.model.config.fused
    assert losses(tmp_path / "split") == losses(tmp_path / "straight")
