"""Gemma 4 (dense with per-layer inputs and KV sharing, and the MoE form with k_eq_v) against
transformers' own tiny models: logits and greedy text past the sliding window, with and
without the KV cache; full fine-tuning and LoRA on a 4-bit base resume bit for bit, the
per-layer table stays frozen under LoRA, and the hf and PEFT exports are what transformers
and peft load with equal logits."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from helpers import StopAfter, tiny_config  # noqa: E402
from hf_models import GEMMA4_CONFIGS, TEXT, make_model  # noqa: E402

from core.runs.folder import read_metrics  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids  # noqa: E402
from core.weights import families  # noqa: E402
from core.weights.loader import info_line, load, open_pretrained  # noqa: E402

PROMPT = "def add(a, b): hello world 12 The quick brown fox jumps over the lazy dog."


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    model.generation_config.eos_token_id = None  # n tokens, whatever they are
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(ids) :].tolist()


def assert_logits_equal(model, hf_model, ids, atol: float = 1e-5):
    """Within fp32 rounding of the two summation orders: 1e-5, relative past logits of 1."""
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(model.logits(x), hf_model(x).logits, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("form", list(GEMMA4_CONFIGS))
def test_logits_and_greedy_text_equal_transformers_past_the_window(tmp_path, form):
    hf_model, tok = make_model(tmp_path, form)
    loaded = load(tmp_path)
    c = loaded.model.config
    p = c.per_layer
    assert loaded.family == "gemma4" and p.input_dim == 8 and p.kv_shared_layers == 2
    assert p.full_head_dim == 32 and c.sliding_window == 8
    assert bool(c.moe) == (form == "gemma4_moe") and p.k_eq_v == (form == "gemma4_moe")
    ids = tok(PROMPT)["input_ids"]
    assert len(ids) > 2 * c.sliding_window
    assert_logits_equal(loaded.model, hf_model, ids)
    want = hf_greedy(hf_model, ids[:12], 10)
    for cache in (True, False):
        assert list(generate_ids(loaded.model, ids[:12], 10, 0, use_cache=cache)) == want
    line = info_line(open_pretrained(str(tmp_path)).info())
    assert "per-layer inputs: a " in line and "2 layers sharing keys and values" in line


def run_config(tmp_path, **extra):
    (tmp_path / "text.txt").write_text(TEXT * 3, encoding="utf-8")
    return tiny_config(
        init_from=str(tmp_path / "model"),
        tokenizer="model",
        data=str(tmp_path / "text.txt"),
        max_steps=4,
        log_every=1,
        eval_every=4,
        ckpt_every=4,
        eval_batches=1,
        batch_size=2,
        dropout=0.0,
        sample_tokens=0,
        seq_len=20,
        **{"lr": None, **extra},
    )


def straight_and_resumed(tmp_path, cfg) -> list[dict]:
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(2))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    Trainer(cfg, tmp_path / "split", resume_from=latest).run()
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")[0]
    split = read_metrics(tmp_path / "split" / "metrics.jsonl")[0]
    assert [r["loss"] for r in split] == [r["loss"] for r in straight]
    return straight


def test_full_fine_tuning_of_the_moe_form_resumes_bitwise_and_exports_what_transformers_loads(
    tmp_path,
):
    from transformers import AutoModelForCausalLM

    _, tok = make_model(tmp_path / "model", "gemma4_moe")
    records = straight_and_resumed(tmp_path, run_config(tmp_path))
    assert all(len(r["moe/expert_load"]) == 6 for r in records)
    export(tmp_path / "straight", "hf", tmp_path / "hf", which="latest")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").float().eval()
    assert type(exported).__name__ == families.get("gemma4").hf_arch
    trained = load(tmp_path / "straight").model
    base = load(tmp_path / "model").model
    ids = tok(PROMPT)["input_ids"]
    assert_logits_equal(trained, exported, ids, atol=5e-5)  # trained weights: larger sums
    # every kind of weight trained, the per-layer table and the router's scales included
    start, end = base.state_dict(), trained.state_dict()
    for name in ("per_layer_inputs.table.weight", "blocks.0.mlp.router_scale", "tok_emb.weight"):
        assert not torch.equal(start[name], end[name]), name


def test_lora_on_a_4_bit_base_keeps_the_per_layer_table_and_peft_equals_the_merged_export(
    tmp_path,
):
    pytest.importorskip("bitsandbytes")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, tok = make_model(tmp_path / "model", "gemma4", initializer_range=0.05)
    cfg = run_config(tmp_path, lora_rank=4, lora_alpha=32.0, base_bits="4", lr=3e-3)
    straight_and_resumed(tmp_path, cfg)
    state = torch.load(tmp_path / "straight" / "checkpoints" / "latest.pt", weights_only=True)
    assert not any("per_layer" in name for name in state["model"])  # only adapters train
    export(tmp_path / "straight", "hf", tmp_path / "merged", which="latest")
    export(tmp_path / "straight", "peft", tmp_path / "peft", which="latest")
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        want = merged(ids).logits
        assert (base(ids).logits - want).abs().max() > 1e-3  # the adapters changed it
        adapted = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        assert (adapted(ids).logits - want).abs().max() < 1e-4
    from safetensors.torch import load_file

    table = "model.embed_tokens_per_layer.weight"
    before, after = (load_file(tmp_path / d / "model.safetensors") for d in ("model", "merged"))
    assert torch.equal(before[table], after[table])


@pytest.mark.parametrize("form", list(GEMMA4_CONFIGS))
def test_f32_gguf_scores_a_text_in_llama_cpp_as_transformers_does(tmp_path, form):
    """llama.cpp's gemma4: per-layer inputs, shared keys and values, the full layers' own
    head size and proportional RoPE (rope_freqs), the router's scales and fused experts. An
    init of realistic size: at 0.3 the logits reach where ggml's GELU (an f16 table) alone
    moves log-likelihoods past 2e-3."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import numpy as np

    hf_model, tok = make_model(tmp_path / "model", form, initializer_range=0.05)
    export(tmp_path / "model", "gguf", tmp_path / "gguf", quant="f32")
    ids = tok(PROMPT)["input_ids"]
    with torch.no_grad():
        want = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].double(), -1)
    llm = llama_cpp.Llama(
        str(tmp_path / "gguf" / "model.gguf"),
        n_ctx=64,
        logits_all=True,
        n_threads=1,
        type_k=0,  # an f32 KV cache
        type_v=0,
        verbose=False,
    )
    assert llm.metadata["general.architecture"] == "gemma4"
    llm.eval(ids)
    got = torch.log_softmax(torch.tensor(np.array(llm.scores[: len(ids)]), dtype=torch.float64), -1)
    rows, targets = torch.arange(len(ids) - 1), torch.tensor(ids[1:])
    diff = (got[rows, targets] - want[rows, targets]).abs().max().item()
    assert diff < 2e-3


def test_what_it_cannot_build_or_llama_cpp_would_run_otherwise_is_one_line():
    from hf_models import make_config

    from core.errors import UserError

    hf = make_config("gemma4", 100).to_dict()
    hf = {**{k: v for k, v in hf.items() if k != "per_layer_config"}, "global_head_dim": 32}
    bad = {
        "per_layer_config": (
            {"per_layer_config": {"3": {"head_dim": 32}, "5": {"head_dim": 64}}},
            "per_layer_config gives the full-attention layers different shapes",
        ),
        "sliding layer override": (
            {"per_layer_config": {"0": {"head_dim": 32}}},
            "per_layer_config sets .* on layer 0; supported: .* on full-attention layers",
        ),
        "bidirectional": (
            {"use_bidirectional_attention": "all"},
            "use_bidirectional_attention 'all' is not supported",
        ),
        "all layers shared": ({"num_kv_shared_layers": 6}, "num_kv_shared_layers must be 0 to 5"),
        "no full layer to share": (
            {"layer_types": ["sliding_attention"] * 4 + ["full_attention"] * 2},
            "layer 4 is full-attention but no earlier layer of that kind",
        ),
        "layer type": (
            {"layer_types": ["sliding_attention"] * 5 + ["chunked_attention"]},
            "layer_types must be 6 of sliding_attention and full_attention, got 6 with "
            "'chunked_attention'",
        ),
        "rope": (
            {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}},
            "rope_parameters 'yarn' on full-attention layers is not supported",
        ),
    }
    for change, message in bad.values():
        with pytest.raises(UserError, match=message):
            families.model_config({**hf, **change})
    # transformers shares keys as this layer pattern says; llama.cpp takes the last two
    # layers before the shared ones: the export names the difference
    types = ["sliding_attention", "full_attention", "sliding_attention"] * 2
    _, c = families.model_config({**hf, "layer_types": types})
    assert "llama.cpp's gemma4 takes shared keys and values" in families.get("gemma4").gguf_check(c)
