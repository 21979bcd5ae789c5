"""The fit ladder for a pretrained start (full AdamW -> full 8-bit AdamW -> LoRA -> QLoRA, each
then with activation checkpointing, LoRA's then with the checkpoints offloaded to RAM), answered
from a config.json alone, and 8-bit AdamW."""

import dataclasses
import json

import pytest
from helpers import StopAfter, tiny_config

from core.config.spec import TrainConfig, validate
from core.runs import checkpoint as ckpt
from core.runs.folder import read_metrics
from core.training.estimate import GB, estimate, usable_bytes
from core.training.planner import (
    CONTEXT_STEP,
    context_line,
    fit_pretrained,
    longest_context,
    next_rung,
    walk_ladder,
)
from core.training.trainer import Trainer

pytest.importorskip("bitsandbytes")

QWEN3_8B = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}


@pytest.fixture
def qwen3_8b(tmp_path):
    """A folder with nothing but a Qwen3-8B config.json: no weights, no tokenizer."""
    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_8B))
    return validate(
        TrainConfig(
            init_from=str(folder),
            tokenizer="model",
            hidden_dim=4096,
            n_layers=36,
            n_heads=32,
            bias=False,
            qk_norm=True,
            seq_len=2048,
            batch_size=8,
            grad_accum=1,
        )
    )


def test_a_qwen3_8b_fits_12_gb_as_qlora_from_its_config_json_alone(qwen3_8b):
    full = estimate(qwen3_8b)
    assert 8.0e9 < full.n_params < 8.4e9  # Qwen3-8B: 8.19B with its own head
    fitted, why = fit_pretrained(qwen3_8b, 12 * GB)
    assert fitted is not None and fitted.lora_rank == 16 and fitted.base_bits == "4"
    assert fitted.batch_size * fitted.grad_accum == 8  # the effective batch kept
    assert estimate(fitted).device_total <= 0.9 * 12 * GB
    assert why.startswith("QLoRA")
    # a 16-bit base alone is 16 GB: every rung above QLoRA is named as not fitting
    assert "LoRA rank 16 (16-bit base) with activation checkpointing" in why
    assert "do not fit" in why


def test_the_window_table_judges_every_rung_and_marks_one_chosen(qwen3_8b):
    rungs = walk_ladder(qwen3_8b, 12 * GB)
    assert len(rungs) == 10 and sum(r.chosen for r in rungs) == 1
    needs = [r.need_at_one for r in rungs]
    # each method needs less than the one above it; checkpointing saves within a method, and
    # offloading its inputs to RAM saves more (LoRA's rungs)
    assert needs[0] > needs[2] > needs[4] > needs[7]
    assert all(needs[i] > needs[i + 1] for i in (0, 2, 4, 5, 7, 8))
    assert [r.config.offload_checkpoints for r in rungs] == [False] * 6 + [True, False, False, True]
    assert [r.config.optimizer for r in rungs[:4]] == ["adamw"] * 2 + ["adamw8bit"] * 2
    chosen = next(r for r in rungs if r.chosen)
    assert chosen.fitted.base_bits == "4" and chosen.need <= 0.9 * 12 * GB


def test_each_rung_names_the_longest_context_it_fits(qwen3_8b):
    budget = usable_bytes(24 * GB)
    rungs = walk_ladder(qwen3_8b, 24 * GB)
    longest = [r.longest for r in rungs]
    # full fine-tuning of 8B fits no context in 24 GB; QLoRA with checkpointing the longest
    assert longest[:4] == [0, 0, 0, 0] and longest[9] == 40960 > longest[8] > 8192
    assert longest[7] < longest[8] < longest[9]  # checkpointing buys context, offloading more
    assert longest[4] < longest[5] < longest[6]
    for r in rungs[4:9]:  # at batch 1 it fits, one step longer does not (9: the model's own)
        one = dataclasses.replace(r.config, batch_size=1, grad_accum=1)
        at = dataclasses.replace(one, seq_len=r.longest)
        past = dataclasses.replace(one, seq_len=r.longest + CONTEXT_STEP)
        assert estimate(at).device_total <= budget < estimate(past).device_total
    # a context none of them fits: the message names the longest one that would
    too_long = dataclasses.replace(qwen3_8b, seq_len=40960)
    fitted, why = fit_pretrained(too_long, 12 * GB)
    assert fitted is None
    offloaded = walk_ladder(qwen3_8b, 12 * GB)[9]
    assert f"lower seq_len to {offloaded.longest:,} or less ({offloaded.name})" in why


def test_offloading_the_checkpoints_is_chosen_where_that_makes_the_context_fit(qwen3_8b):
    # 8k tokens in 12 GB: QLoRA with checkpointing fits 3.5k; its inputs in RAM, 11k
    long = dataclasses.replace(qwen3_8b, seq_len=8192)
    fitted, why = fit_pretrained(long, 12 * GB)
    assert fitted.offload_checkpoints and fitted.grad_checkpointing and fitted.base_bits == "4"
    assert why.startswith("QLoRA: LoRA rank 16 on a 4-bit base + checkpointing offloaded to RAM")
    assert estimate(fitted).device_total <= usable_bytes(12 * GB)
    kept = dataclasses.replace(fitted, offload_checkpoints=False)
    cpu = estimate(fitted, on_gpu=False).activations
    assert cpu == estimate(kept, on_gpu=False).activations  # on the CPU a no-op


def test_the_context_line_stops_at_the_models_own_context(qwen3_8b):
    qlora = dataclasses.replace(qwen3_8b, lora_rank=16, base_bits="4", batch_size=1)
    qlora = dataclasses.replace(qlora, grad_checkpointing=True)
    line, warn = context_line(qlora, 1000 * GB, on_gpu=True)
    assert (line, warn) == ("fits up to 40,960 tokens on this GPU (the model's own limit)", False)
    assert context_line(qlora, 6 * GB, on_gpu=True) == (
        "no context fits on this GPU at this batch and method",
        True,
    )
    longest = longest_context(qlora, usable_bytes(12 * GB))
    assert 2048 < longest < 40960  # QLoRA of an 8B model on a 12 GB card
    past = dataclasses.replace(qlora, seq_len=longest + 256)
    line, warn = context_line(past, 12 * GB, on_gpu=True)
    assert warn and line.startswith(f"{longest + 256:,} will NOT fit")
    assert line.endswith(f"fits up to {longest:,} tokens on this GPU")


def test_8_bit_adamw_is_estimated_at_2_bytes_a_weight(qwen3_8b):
    full = estimate(qwen3_8b)
    eight = estimate(dataclasses.replace(qwen3_8b, optimizer="adamw8bit"))
    assert full.optimizer == 8 * full.n_params and eight.optimizer == 2 * eight.n_params
    assert full.device_total - eight.device_total > 6 * full.n_params  # ~49 GB saved


def test_next_rung_names_what_to_try_when_memory_runs_short(qwen3_8b):
    full = dataclasses.replace(qwen3_8b, optimizer="adamw")
    assert next_rung(full) == "full fine-tuning (AdamW) with activation checkpointing"
    eight = dataclasses.replace(full, optimizer="adamw8bit", grad_checkpointing=True)
    assert next_rung(eight) == "LoRA rank 16 (16-bit base)"
    qlora = dataclasses.replace(qwen3_8b, lora_rank=16, base_bits="4", grad_checkpointing=True)
    assert (
        next_rung(qlora) == "QLoRA: LoRA rank 16 on a 4-bit base + checkpointing offloaded to RAM"
    )
    assert next_rung(dataclasses.replace(qlora, offload_checkpoints=True)) is None  # the last


def losses(run_dir):
    train, _ = read_metrics(run_dir / "metrics.jsonl")
    return [(r["step"], r["loss"]) for r in train]


def test_8_bit_adamw_trains_and_resumes_exactly_on_the_cpu(tmp_path):
    # width 64: the MLP's 64x256 matrices pass bitsandbytes' 4096-element bar for 8-bit state
    cfg = tiny_config(
        hidden_dim=64,
        optimizer="adamw8bit",
        max_steps=6,
        log_every=1,
        ckpt_every=3,
        eval_every=3,
        dropout=0.0,
    )
    straight = tmp_path / "straight"
    assert Trainer(cfg, straight).run()["status"] == "finished"
    stopped = tmp_path / "stopped"
    assert Trainer(cfg, stopped).run(None, StopAfter(3))["step"] == 3
    state = ckpt.load(stopped / "checkpoints" / "latest.pt")["optimizer"]["state"]
    quantized = [s for s in state.values() if "__bnb_optimizer_quant_state__" in s]
    assert quantized  # the checkpoint holds 8-bit moments
    resumed = Trainer(cfg, stopped, resume_from=stopped / "checkpoints" / "latest.pt")
    assert resumed.run()["status"] == "finished"
    assert losses(stopped) == losses(straight)  # exact, every step
    first, last = losses(straight)[0][1], losses(straight)[-1][1]
    assert last < first  # it learns
