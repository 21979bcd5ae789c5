"""The VRAM spill warning, from mocked NVML readings (no GPU needed)."""

import dataclasses
import json

import pytest
from helpers import tiny_config

from core.training import spill, trainer
from core.training.trainer import Trainer

FULL = {"nvml_used_mb": 12_200.0, "nvml_total_mb": 12_288.0, "mem_reserved_mb": 11_900.0}
ROOMY = {"nvml_used_mb": 6_000.0, "nvml_total_mb": 12_288.0, "mem_reserved_mb": 5_500.0}
PAST = {"nvml_used_mb": 12_288.0, "nvml_total_mb": 12_288.0, "mem_reserved_mb": 14_000.0}


def test_full_dedicated_vram_is_a_spill_on_windows_only():
    assert spill.spilling(FULL, windows=True)
    assert not spill.spilling(FULL, windows=False)  # Linux: a full card fails with an OOM
    assert not spill.spilling(ROOMY, windows=True)
    assert spill.spilling(PAST, windows=False)  # torch holds more than the card has
    assert not spill.spilling({"rss_mb": 900.0}, windows=True)  # the CPU: no NVML


def test_the_warning_comes_once_and_names_the_next_rung(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()  # a dense Llama's config is all the ladder reads of the model
    llama = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2}
    llama |= {"num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 256}
    (folder / "config.json").write_text(json.dumps(llama))
    cfg = tiny_config(init_from=str(folder), tokenizer="model", batch_size=4)
    watch = spill.SpillWatch(dataclasses.replace(cfg, optimizer="adamw8bit"), windows=True)
    assert watch.check(ROOMY) is None
    line = watch.check(FULL)
    assert line.startswith(spill.PREFIX) and "12,200 of 12,288 MiB" in line
    assert "Next rung of the fit ladder: full fine-tuning (8-bit AdamW) with activation" in line
    assert "Sysmem Fallback Policy" in line and "\n" not in line
    assert watch.check(FULL) is None  # once a run
    new = spill.SpillWatch(tiny_config(batch_size=4), windows=True).check(FULL)
    assert "Lower batch_size" in new


@pytest.mark.parametrize("reading", [PAST])
def test_a_run_logs_the_spill_once(monkeypatch, tmp_path, reading):
    monkeypatch.setattr(trainer, "memory_stats", lambda device, watch=None: dict(reading))
    run_dir = tmp_path / "run"
    Trainer(tiny_config(max_steps=6, log_every=1, eval_every=6, ckpt_every=6), run_dir).run()
    log = (run_dir / "train.log").read_text()
    assert log.count(spill.PREFIX) == 1 and "Lower batch_size" in log
