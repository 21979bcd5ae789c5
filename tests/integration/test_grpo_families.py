"""GRPO on every family (tiny random models of tests/hf_models): its sampler goes through the
model's own cached forward, so greedy completions of a batch of prompts of different lengths
equal core.generate's and transformers' greedy tokens for each prompt alone (Gemma's sliding
windows, soft-caps and embedding scale, Gemma 3's local RoPE, Phi-3's LongRoPE switching
factors mid-batch, Gemma 4's per-layer inputs and reused keys and values), left- or
right-padded; and two steps of training move the weights (a mixture of experts too, its
load-balancing loss joined)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from hf_models import FAMILIES, HYBRID_FAMILIES, TEXT, make_model  # noqa: E402

from core.errors import ConfigError  # noqa: E402
from core.training import grpo  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.generate import generate_ids, load  # noqa: E402

N_NEW = 8
# Lengths 3, 6 and 11 with 8 new tokens: the windows (8) and LongRoPE's original context (8)
# are passed by each row at another step.
LENGTHS = (3, 11, 6)


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    model.generation_config.eos_token_id = None  # n tokens, whatever they are
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(ids) :].tolist()


def right_padded_greedy(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy tokens of a right-padded batch through GPT.forward_cached."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    valid = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, : len(p)], valid[i, : len(p)] = torch.tensor(p), True
    logits, cache = model.forward_cached(ids, None, valid, last=True)
    out = []
    for _ in range(n):
        out.append(logits.argmax(-1))
        logits, cache = model.forward_cached(out[-1][:, None], cache, last=True)
    return torch.stack(out, 1).tolist()


# A reward that differs between a prompt's completions: each step has something to learn.
SPREAD = """
def spread(completion_ids, **kwargs):
    return [float(sum(ids) % 5) for ids in completion_ids]
"""


def grpo_run(folder, tmp_path, **kw):
    (tmp_path / "rewards.py").write_text(SPREAD)
    prompts = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt": f"What is {a} + {a + 3}?"}) for a in range(12)]
    prompts.write_text("\n".join(lines) + "\n")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        data=str(prompts),
        method="grpo",
        reward=[f"{tmp_path / 'rewards.py'}:spread"],
        num_generations=4,
        max_completion_tokens=4,
        seq_len=32,
        lr=1e-2,
        dropout=0.0,
        max_steps=2,
        batch_size=2,
        warmup_steps=0,
        eval_every=100,
        ckpt_every=100,
        sample_tokens=0,
        log_every=1,
        **kw,
    )
    Trainer(cfg, tmp_path / "run").run()
    return tmp_path / "run"


@pytest.mark.parametrize("family", [*FAMILIES, "gemma4", *HYBRID_FAMILIES, "qwen3_moe"])
def test_grpo_samples_greedily_as_generate_and_transformers_and_trains(tmp_path, family):
    hf, tok = make_model(tmp_path / "model", family)
    model = load(tmp_path / "model").model
    ids = tok(TEXT)["input_ids"]
    prompts = [ids[:n] for n in LENGTHS]
    u = torch.rand((len(prompts), N_NEW), generator=torch.Generator().manual_seed(0))
    drawn = grpo.sample(model, prompts, N_NEW, 0.0, 1.0, [], 0, u, "cpu", "fp32")
    ours = [list(generate_ids(model, p, N_NEW, temperature=0)) for p in prompts]
    theirs = [hf_greedy(hf, p, N_NEW) for p in prompts]
    assert ours == theirs
    assert drawn.completions.tolist() == ours  # left-padded, as GRPO batches its prompts
    assert right_padded_greedy(model, prompts, N_NEW) == ours

    moe = bool(model.moe_layers)  # a mixture of experts: its aux loss joins GRPO's loss
    run = grpo_run(tmp_path / "model", tmp_path, **({"router_aux_loss": 0.05} if moe else {}))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["moe/aux_loss"] > 0 for r in steps) if moe else "moe/aux_loss" not in steps[0]
    assert all(r["frac_reward_zero_std"] < 1 for r in steps)  # something to learn from
    start = load(tmp_path / "model").model.state_dict()
    trained = load(run).model.state_dict()
    assert any(not torch.equal(start[k], trained[k]) for k in start)


def test_temperature_zero_samples_greedily_in_a_run_and_below_zero_is_refused(tmp_path):
    make_model(tmp_path / "model", "qwen2")
    run = grpo_run(tmp_path / "model", tmp_path, temperature=0.0)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["frac_reward_zero_std"] for r in records if "loss" in r] == [1.0, 1.0]
    for line in (run / "completions.jsonl").read_text().splitlines():
        rows = [r["completion"] for r in json.loads(line)["rows"]]
        assert rows[0::4] == rows[1::4] == rows[2::4] == rows[3::4]  # a prompt's G alike
    with pytest.raises(ConfigError, match="temperature"):
        tiny_config(method="grpo", reward=["length"], temperature=-0.5)
