"""The newer families (Gemma 2, Gemma 3, Phi-3, SmolLM3) beyond what the tests over every
family (test_pretrained, test_llamacpp) check: LoRA on a 4-bit base trains and resumes bit for
bit and exports to transformers and PEFT alike; options past the tiny defaults (attention
scales, RoPE scaling kinds, NoPE layers, windows) equal transformers (Gemma 3's multimodal
checkpoints: test_composites); GGUF refuses what llama.cpp would run otherwise."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import StopAfter, tiny_config  # noqa: E402
from hf_models import TEXT, make_model  # noqa: E402

from core.models.per_layer import table_params  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.common import ExportError  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids  # noqa: E402
from core.weights import families  # noqa: E402
from core.weights.loader import load  # noqa: E402

NEW = ("gemma2", "gemma3", "phi3", "smollm3")
PROMPT = "def add(a, b): hello world 12 The quick brown fox jumps over the lazy dog."


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    model.generation_config.eos_token_id = None  # n tokens, whatever they are
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(ids) :].tolist()


def assert_equal_to_transformers(folder, hf_model, tok, n_new: int = 10):
    """Logits equal in fp32 (1e-5) for a short and a long prompt, and greedy text with and
    without the KV cache equal to transformers' generate."""
    loaded = load(folder)
    ids = tok(PROMPT)["input_ids"]
    for n in (5, len(ids)):
        x = torch.tensor([ids[:n]])
        with torch.no_grad():
            ref = hf_model(x).logits
        ours = loaded.model.logits(x)
        assert (ref - ours).abs().max().item() < 1e-5, n
    expected = hf_greedy(hf_model, ids[:12], n_new)
    for cache in (True, False):
        assert list(generate_ids(loaded.model, ids[:12], n_new, 0, use_cache=cache)) == expected
    return loaded


# Options past the tiny models of hf_models (which test_pretrained runs for every family).
VARIANTS = {
    "gemma2-scalar": ("gemma2", {"query_pre_attn_scalar": 24, "sliding_window": 6}),
    "gemma3-1b-like": (
        "gemma3",
        {
            "num_hidden_layers": 3,
            "rope_parameters": None,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
    ),
    "phi3-mini-4k-like": (
        "phi3",
        {"rope_scaling": None, "partial_rotary_factor": 1.0, "sliding_window": 7},
    ),
    "phi4-mini-like": ("phi3", {"tie_word_embeddings": True}),
    "phi3-window": ("phi3", {"sliding_window": 9}),
    # the greedy text passes LongRoPE's original context: the cache is made again there
    "phi3-longrope-switch": ("phi3", {"original_max_position_embeddings": 16}),
    "smollm3-nope-yarn": (
        "smollm3",
        {
            "no_rope_layers": [1, 0, 1, 1],
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 2.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "qwen2-yarn": (
        "qwen2",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_options_past_the_tiny_defaults_equal_transformers(tmp_path, variant):
    family, extra = VARIANTS[variant]
    model, tok = make_model(tmp_path, family, **extra)
    loaded = assert_equal_to_transformers(tmp_path, model, tok)
    assert loaded.family == family


def test_each_new_familys_options_are_on(tmp_path):
    """The tiny models of hf_models do exercise what makes each family itself."""
    shapes = {f: families.model_config(make_config_json(tmp_path, f))[1] for f in NEW}
    g2, g3, phi, smol = (shapes[f] for f in NEW)
    assert g2.attn_softcap == 2.0 and g2.logit_softcap == 3.0 and g2.mlp == "geglu"
    assert g2.layer_types[:2] == ["sliding_attention", "full_attention"] and g2.post_norms
    assert g3.qk_norm and g3.rope_local_theta == 1e4 and g3.rope_scaling["factor"] == 8.0
    assert g3.layer_types.count("full_attention") == 1 and g3.embed_scale == 32**0.5
    assert phi.rope_dim == 6 and phi.rope_scaling["rope_type"] == "longrope"
    assert phi.rope_scaling["original_max_position_embeddings"] == 8
    assert smol.nope_layers == [3]


def make_config_json(tmp_path, family) -> dict:
    make_model(tmp_path / family, family)
    return json.loads((tmp_path / family / "config.json").read_text())


# A 4-bit base needs widths bitsandbytes' blocks take (64); Phi-3's rope factors fit 8 heads.
QLORA_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "initializer_range": 0.02,
}


@pytest.mark.parametrize("family", [*NEW, "qwen3_5"])  # Qwen3.5: its DeltaNet's projections
def test_lora_on_a_4_bit_base_resumes_bitwise_and_peft_equals_the_merged_export(tmp_path, family):
    pytest.importorskip("bitsandbytes")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    shape = {**QLORA_SHAPE, "num_attention_heads": 8} if family == "phi3" else QLORA_SHAPE
    _, tok = make_model(tmp_path / "model", family, **shape)
    (tmp_path / "text.txt").write_text(TEXT * 5, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(tmp_path / "model"),
        tokenizer="model",
        lr=None,
        data=str(tmp_path / "text.txt"),
        lora_rank=8,
        base_bits="4",
        max_steps=8,
        eval_every=4,
        ckpt_every=4,
        hidden_dim=64,
        n_heads=shape["num_attention_heads"],
        bias=False,
        dropout=0.0,
        sample_tokens=0,
        seq_len=24,
    )
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(3))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    Trainer(cfg, tmp_path / "split", resume_from=latest).run()
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    split = read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [r["loss"] for r in split[0]] == [r["loss"] for r in straight[0]]
    assert straight[1][-1]["val_loss"] < straight[1][0]["val_loss"]

    export(tmp_path / "straight", "hf", tmp_path / "merged", which="latest")
    export(tmp_path / "straight", "peft", tmp_path / "peft", which="latest")
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert type(merged).__name__ == families.get(family).hf_arch
    with torch.no_grad():
        before = base(ids).logits
        want = merged(ids).logits
        assert (before - want).abs().max() > 1e-3  # the adapters changed it
        adapted = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        assert (adapted(ids).logits - want).abs().max() < 1e-4
        # The merged export is the original weights plus B A: TrainDeck's own model with
        # the dequantized base differs from it only by the 4-bit rounding.
        ours = load(tmp_path / "straight", "latest").model.logits(ids)
        assert (ours - want).abs().max() < 0.1


@pytest.mark.parametrize(
    "family, extra, needle",
    [
        ("gemma2", {"query_pre_attn_scalar": 24}, "query_pre_attn_scalar"),
        ("smollm3", {"no_rope_layers": [1, 0, 1, 1]}, "every 4th layer ([3])"),
        (
            "gemma3",
            {
                "num_hidden_layers": 3,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            },
            "every 6th layer as full attention",
        ),
    ],
)
def test_gguf_refuses_what_llama_cpp_would_run_otherwise(tmp_path, family, extra, needle):
    make_model(tmp_path / "model", family, **extra)
    with pytest.raises(ExportError) as e:
        export(tmp_path / "model", "gguf", tmp_path / "gguf")
    assert needle in str(e.value) and "--format hf" in str(e.value)
    assert not (tmp_path / "gguf").exists()


def test_a_256k_vocabulary_goes_through_the_chunked_loss_with_soft_capping():
    """Gemma's 256k vocabulary: the loss a chunk at a time equals the whole logits' loss,
    soft-capping included; the estimate counts one chunk of logits, not all of them."""
    from core.models.loss import lm_loss
    from core.models.model import GPT, GPTConfig

    c = GPTConfig(
        hidden_dim=16,
        n_layers=1,
        n_heads=2,
        seq_len=32,
        vocab_size=262_144,
        norm="rmsnorm",
        positions="rope",
        mlp="geglu",
        norm_offset=1.0,
        post_norms=True,
        embed_scale=4.0,
        logit_softcap=3.0,
        bias=False,
    )
    torch.manual_seed(0)
    model = GPT(c)
    x = torch.randint(0, c.vocab_size, (2, 32))
    y = torch.randint(0, c.vocab_size, (2, 32))
    logits = model.logits(x)
    plain = torch.nn.functional.cross_entropy(logits.reshape(-1, c.vocab_size), y.reshape(-1))
    _, chunked = model(x, y)
    assert abs(plain.item() - chunked.item()) < 1e-5
    hidden = torch.randn(64, 16)
    assert torch.allclose(
        lm_loss(model.output_head(), hidden, y.reshape(-1), chunk=7),
        lm_loss(model.output_head(), hidden, y.reshape(-1), chunk=64),
        atol=1e-6,
    )


# config.json files as the hub has them: Gemma 2 2B, and Gemma 3 4B, a multimodal checkpoint
# whose text_config leaves most settings at Gemma3TextConfig's defaults.
GEMMA2_2B = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "vocab_size": 256000,
}
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "image_token_index": 262144,
    "mm_tokens_per_image": 256,
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"},
}


# Gemma 4 E2B's language model (google/gemma-4-E2B's text_config, the fields read)
GEMMA4_E2B = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "hidden_size": 1536,
    "intermediate_size": 6144,
    "num_hidden_layers": 35,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "global_head_dim": 512,
    "vocab_size": 262144,
    "vocab_size_per_layer_input": 262144,
    "hidden_size_per_layer_input": 256,
    "num_kv_shared_layers": 20,
    "use_double_wide_mlp": True,
    "sliding_window": 512,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 131072,
    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
    "rope_parameters": {
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
}


@pytest.mark.parametrize(
    "config, low, high",
    [(GEMMA2_2B, 2.60e9, 2.62e9), (GEMMA3_4B, 3.87e9, 3.89e9), (GEMMA4_E2B, 4.6e9, 4.7e9)],
)
def test_the_fit_ladder_answers_for_gemma_from_config_json_alone(tmp_path, config, low, high):
    """Gemma 2 2B has 2.61B parameters, Gemma 3 4B's language model 3.88B, Gemma 4 E2B's
    4.6B, 2.35B of them its per-layer table (a lookup: no FLOPs); their 256k vocabularies'
    logits are counted a chunk at a time, not for every position."""
    from core.config.spec import TrainConfig, validate
    from core.training.estimate import GB, estimate
    from core.training.planner import fit_pretrained
    from core.weights.loader import apply_pretrained, config_only

    (tmp_path / "config.json").write_text(json.dumps(config))
    pre = config_only(tmp_path)
    cfg = TrainConfig(init_from=str(tmp_path), tokenizer="model", seq_len=2048, batch_size=8)
    cfg = validate(apply_pretrained(cfg, pre))
    est = estimate(cfg)
    assert low < est.n_params < high
    vocab = pre.config.vocab_size
    assert vocab >= 256_000 and est.logits < 0.5 * GB < 8 * 2048 * vocab * 4
    fitted, why = fit_pretrained(cfg, 12 * GB)
    assert fitted is not None and estimate(fitted).device_total <= 0.9 * 12 * GB, why
    table = table_params(pre.config)
    assert est.flops_per_token < 6 * (est.n_params - table) + 12 * 2048 * 35 * 8 * 512


@pytest.mark.parametrize("family", [*NEW, "qwen3_5"])
def test_dpo_starts_at_ln2_and_learns_the_preference(tmp_path, family):
    """DPO through a soft-capped head (Gemma 2), local and global RoPE (Gemma 3), fused
    q/k/v with LongRoPE (Phi-3), a NoPE layer (SmolLM3) and DeltaNet layers (Qwen3.5)."""
    import math

    make_model(tmp_path / "model", family)
    rows = [
        {
            "prompt": f"Add {i} and {i + 1}.",
            "chosen": f"{2 * i + 1}. Done!",
            "rejected": f"{2 * i + 1}. Hmm?",
        }
        for i in range(40)
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = tiny_config(
        init_from=str(tmp_path / "model"),
        tokenizer="model",
        data=str(data),
        method="dpo",
        lora_rank=4,
        lr=1e-2,
        seq_len=48,
        dropout=0.0,
        max_steps=12,
        eval_every=12,
        ckpt_every=12,
        sample_tokens=0,
        val_fraction=0.1,
        warmup_steps=1,
    )
    Trainer(cfg, tmp_path / "run").run()
    train, evals = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert train[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert train[-1]["rewards/margins"] > 0


def test_gguf_logs_where_llama_cpp_runs_phi3_otherwise(tmp_path, capsys):
    make_model(tmp_path / "model", "phi3", sliding_window=9)
    export(tmp_path / "model", "gguf", tmp_path / "gguf", quant="f32")
    out = capsys.readouterr().out
    assert "llama.cpp runs phi3 without its sliding window (9 tokens)" in out
    assert "LongRoPE: llama.cpp takes the long factors for every position" in out
    assert (tmp_path / "gguf" / "model.gguf").is_file()


@pytest.mark.parametrize("family", ["phi3", "gemma2", "qwen3_5"])
def test_packed_examples_score_as_they_would_alone(tmp_path, family):
    """Chat data packs examples into one window: each counts positions from 0, so LongRoPE
    keeps its short factors for short examples, a sliding window stays inside each, and a
    DeltaNet layer starts each from a fresh state."""
    _, tok = make_model(tmp_path, family)
    model = load(tmp_path).model
    a, b = tok("def add(a")["input_ids"], tok("hello world 12 fox")["input_ids"]
    assert len(a) < 8 < len(a) + len(b)  # each under the original context, together over
    segments = torch.tensor([[0] * len(a) + [1] * len(b)])
    with torch.no_grad():
        packed = model.logits(torch.tensor([a + b]), segments=segments)
        alone = torch.cat([model.logits(torch.tensor([a])), model.logits(torch.tensor([b]))], dim=1)
    assert (packed - alone).abs().max() < 1e-5
