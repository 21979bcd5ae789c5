"""Tiny random Hugging Face models of each family, built with transformers' own config
classes and saved as a model folder with a small tokenizer: what --init-from reads."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA_CHAT = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start|>' + message['role'] + "
    "'<|sep|>' + message['content'] | trim + '<|eot|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant<|sep|>' }}{% endif %}"
)
TEXT = (
    "The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n"
    "Hello world, hello model. Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14.\n"
    "Ünïcödé and emoji \u2603 stay whole.\n"
) * 20
FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3")
# Each new family's tiny model exercises its options on the tests' short texts (~15-30 tokens):
# sliding windows of 8 tokens (Phi-3's: test_families, as llama.cpp runs Phi-3 without one),
# soft caps that bite, LongRoPE's long factors past 8 tokens, linear scaling on Gemma 3's
# global layers, a NoPE layer; and stays what llama.cpp runs.
NEW_FAMILY_CONFIGS = {
    "gemma2": {
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "attn_logit_softcapping": 2.0,
        "final_logit_softcapping": 3.0,
    },
    "gemma3": {
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "num_hidden_layers": 6,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    },
    "phi3": {
        "sliding_window": None,
        "original_max_position_embeddings": 8,
        "partial_rotary_factor": 0.75,
        "rope_scaling": {
            "rope_type": "longrope",
            "short_factor": [1.0, 1.3, 2.1],
            "long_factor": [1.1, 2.5, 5.0],
        },
    },
    "smollm3": {"num_hidden_layers": 4},  # layer 3 without RoPE
}
# The MoE families' tiny models: few experts, top-k over 1, dense and sparse layers mixed
# (Qwen3-MoE's mlp_only_layers), norm_topk_prob both ways, OLMoE's clip_qkv biting.
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "qwen3_5_moe")
MOE_CONFIGS = {
    "qwen3_moe": {
        "num_hidden_layers": 3,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "norm_topk_prob": True,
        "mlp_only_layers": [1],
        "head_dim": 16,
    },
    "qwen2_moe": {
        "num_hidden_layers": 3,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
        "decoder_sparse_step": 2,
        "norm_topk_prob": False,
    },
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    "olmoe": {
        "num_experts": 5,
        "num_experts_per_tok": 3,
        "intermediate_size": 16,
        "norm_topk_prob": False,
        "clip_qkv": 2.0,
        "pad_token_id": None,
    },
}
# Gemma 4's tiny models: sliding (window 8) and full layers with a head size, kv heads and
# proportional RoPE of their own, per-layer inputs, the last two layers reusing keys and
# values (with double-wide MLPs), soft-capped logits; the MoE form (26B-A4B's) adds k_eq_v
# and experts beside the dense MLP.
GEMMA4_LAYERS = ["sliding_attention"] * 3 + [
    "full_attention",
    "sliding_attention",
    "full_attention",
]
GEMMA4_CONFIGS = {
    "gemma4": {
        "num_hidden_layers": 6,
        "layer_types": GEMMA4_LAYERS,
        "head_dim": 16,
        "global_head_dim": 32,
        "sliding_window": 8,
        "hidden_size_per_layer_input": 8,
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "final_logit_softcapping": 30.0,
    },
    "gemma4_moe": {
        "num_hidden_layers": 6,
        "layer_types": GEMMA4_LAYERS,
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "sliding_window": 8,
        "hidden_size_per_layer_input": 8,
        "num_kv_shared_layers": 2,
        "enable_moe_block": True,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 16,
    },
}
# The hybrid families' tiny models (Qwen3.5): three DeltaNet layers and one attention layer,
# grouped value heads (4 v heads on 2 k heads), a quarter of each head rotary, room for 80+
# tokens (past a chunk of 64); the MoE one with a shared expert.
HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe")
HYBRID = {
    "initializer_range": 0.05,  # 0.3 makes the delta rule's solve amplify fp32 rounding
    "num_hidden_layers": 4,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
}
HYBRID_CONFIGS = {
    "qwen3_5": HYBRID,
    "qwen3_5_moe": {
        **HYBRID,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
    },
}
# gpt-oss's tiny model: 4 layers, sliding (window 4) and full alternating, 4 experts top-2,
# gpt-oss-20b's YaRN, head_dim 8 apart from the width; an init wide enough that the clamped
# SwiGLU clamps.
GPT_OSS_CONFIG = {
    "num_hidden_layers": 4,
    "intermediate_size": 32,  # MXFP4 packs rows of 32
    "head_dim": 8,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 4,
    "swiglu_limit": 1.5,
    "rope_parameters": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
        "rope_theta": 150000.0,
    },
}


def mxfp4_pack(x):
    """x (*prefix, C), C a multiple of 32 -> MXFP4 (blocks (*prefix, C/32, 16) uint8, scales
    (*prefix, C/32) uint8), packed by hand as gpt-oss's checkpoints hold it (transformers'
    own quantizer needs its kernels hub): each block of 32 scaled by a power of two so its
    largest value fits e2m1's 6, each value rounded to the nearest e2m1 value, two a byte."""
    from core.weights.mxfp4 import BIAS, FP4_VALUES

    e2m1 = torch.tensor(FP4_VALUES)
    *prefix, c = x.shape
    groups = x.reshape(*prefix, c // 32, 32)
    top = groups.abs().amax(-1).clamp(min=2.0**-100)
    exp = torch.ceil(torch.log2(top / 6.0)).to(torch.int32)
    scaled = groups / torch.exp2(exp.float())[..., None]
    index = (scaled.abs()[..., None] - e2m1).abs().argmin(-1)
    codes = (index + 8 * (scaled < 0)).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exp + BIAS).to(torch.uint8)


# Qwen2.5-1.5B's config.json: the estimate and the hub tests read only the shape.
QWEN_1_5B = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}


def make_spm_tokenizer(folder: Path):
    """A SentencePiece-style BPE as Llama 2 and Mistral 7B v0.1 ship it in tokenizer.json:
    spaces as U+2581 with one prepended, byte fallback to <0xXX> tokens, <unk> <s> </s>."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import LlamaTokenizerFast

    hf = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    hf.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens], show_progress=False
    )
    hf.train_from_iterator([TEXT], trainer)
    hf.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    hf.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok = LlamaTokenizerFast(
        tokenizer_object=hf,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=CHATML,
    )
    tok.save_pretrained(folder)
    return tok


def make_tokenizer(folder: Path, family: str):
    """A byte-level BPE with special tokens; the llama one adds BOS, as Llama 3's does;
    "llama2" is a Llama with a SentencePiece-style tokenizer."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    if family == "llama2":
        return make_spm_tokenizer(folder)

    from core.data.tokenizer import train_bpe

    hf = train_bpe([TEXT], 512).hf
    if family in ("llama", "mistral"):
        specials = ["<|begin|>", "<|end|>", "<|start|>", "<|sep|>", "<|eot|>"]
        hf.add_special_tokens(specials)
        bos = hf.token_to_id("<|begin|>")
        hf.post_processor = processors.TemplateProcessing(
            single="<|begin|> $A",
            pair="<|begin|> $A <|begin|> $B",
            special_tokens=[("<|begin|>", bos)],
        )
        kw = {"bos_token": "<|begin|>", "eos_token": "<|end|>", "chat_template": LLAMA_CHAT}
    else:
        hf.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        eos = "<|im_end|>" if family.startswith("qwen") else "<|endoftext|>"
        kw = {"eos_token": eos, "chat_template": CHATML}
        if family == "gpt2":
            kw = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    tok = PreTrainedTokenizerFast(tokenizer_object=hf, **kw)
    tok.save_pretrained(folder)
    return tok


def make_config(family: str, vocab: int, **extra):
    import transformers as t

    common = {"vocab_size": vocab, "initializer_range": extra.pop("initializer_range", 0.3)}
    if family == "gpt2":
        return t.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=4, **common, **extra)
    shape = {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    }
    if family in NEW_FAMILY_CONFIGS:
        extra = {**NEW_FAMILY_CONFIGS[family], **extra}
    if family in MOE_CONFIGS:
        extra = {**MOE_CONFIGS[family], **extra}
    if family == "gpt_oss":
        extra = {**GPT_OSS_CONFIG, **extra}
    if family in GEMMA4_CONFIGS:
        extra = {**GEMMA4_CONFIGS[family], **extra}
    if family in HYBRID_CONFIGS:
        extra = {**HYBRID_CONFIGS[family], **extra}
    shape = {**shape, **{k: extra.pop(k) for k in list(extra) if k in shape}}
    if family == "llama2":
        return t.LlamaConfig(**shape, **common, **extra)
    if family == "llama":
        scaling = {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
            "rope_theta": 500000.0,
        }
        return t.LlamaConfig(**shape, rope_scaling=scaling, rope_theta=500000.0, **common, **extra)
    if family == "mistral":
        return t.MistralConfig(**shape, sliding_window=None, **common, **extra)
    if family == "qwen2":
        return t.Qwen2Config(**shape, tie_word_embeddings=True, **common, **extra)
    if family == "gpt_oss":
        return t.GptOssConfig(**shape, **common, **extra)
    if family in GEMMA4_CONFIGS:
        vocab = {"vocab_size_per_layer_input": common["vocab_size"], "bos_token_id": None}
        extra.setdefault("pad_token_id", extra.get("eos_token_id"))
        return t.Gemma4TextConfig(**shape, **common, **vocab, **extra)
    if family in HYBRID_CONFIGS:
        if family == "qwen3_5_moe":  # its class has no intermediate_size, nor its releases
            shape.pop("intermediate_size")
            return t.Qwen3_5MoeTextConfig(**shape, **{**common, **extra})
        return t.Qwen3_5TextConfig(**shape, **{**common, **extra})
    if family in MOE_CONFIGS:
        kind = {
            "qwen3_moe": t.Qwen3MoeConfig,
            "qwen2_moe": t.Qwen2MoeConfig,
            "mixtral": t.MixtralConfig,
            "olmoe": t.OlmoeConfig,
        }[family]
        return kind(**shape, **common, **extra)
    if family in NEW_FAMILY_CONFIGS:
        options = dict(extra)
        kind = {
            "gemma2": t.Gemma2Config,
            "gemma3": t.Gemma3TextConfig,
            "phi3": t.Phi3Config,
            "smollm3": t.SmolLM3Config,
        }[family]
        options.setdefault("pad_token_id", options.get("eos_token_id"))
        options.setdefault("bos_token_id", None)
        return kind(**shape, **common, **options)
    if family == "qwen3_vl":  # Qwen3-VL's language model (its composite: vision_models.py)
        return t.Qwen3VLTextConfig(**shape, head_dim=16, **common, **extra)
    return t.Qwen3Config(**shape, head_dim=16, **common, **extra)  # head_dim != 32 / 4


def make_model(folder: Path, family: str, seed: int = 0, **extra):
    """Save a tiny random model of the family (and its tokenizer) in folder; return the
    transformers model (eval, fp32) and tokenizer."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder, family)
    ids = {"eos_token_id": tok.eos_token_id}
    if tok.bos_token_id is not None:
        ids["bos_token_id"] = tok.bos_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(family, len(tok) + 5, **ids, **extra))
    model = model.float().eval()
    stops = [tok.eos_token_id]
    if family in ("llama", "mistral"):
        stops.append(tok.convert_tokens_to_ids("<|eot|>"))
    model.generation_config = GenerationConfig(
        eos_token_id=stops, **{k: v for k, v in ids.items() if k == "bos_token_id"}
    )
    save_released(model, folder)
    return model, tok


# What config.json keeps beside the model's settings (transformers writes them)
META = ("architectures", "dtype", "torch_dtype", "transformers_version")
# What a config class's to_dict holds that is no setting of the model
NOT_SETTINGS = (*META, "_name_or_path")


def _settings(d: dict) -> dict:
    return {
        k: _settings(v) if isinstance(v, dict) else v for k, v in d.items() if k not in NOT_SETTINGS
    }


def released_config(config) -> dict:
    """config.json as released checkpoints hold it: only the keys that differ from what the
    config class fills in (transformers 4's to_diff_dict; transformers 5's keeps every key
    its class declares). A key is left out when the class, given the rest, fills it back in
    as it was; a sub-config's keys (a composite's text_config) the same way."""
    import transformers

    cls, full = type(config), _settings(config.to_dict())
    paths = [(k,) for k in full if k != "model_type"] + [
        (k, sub)
        for k, v in full.items()
        if isinstance(v, dict)
        and isinstance(getattr(config, k, None), transformers.PretrainedConfig)
        for sub in v
        if sub != "model_type"
    ]
    out = copy.deepcopy(full)
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the trials' warnings about what is left out
    try:
        for path in paths:
            trial = copy.deepcopy(out)
            parent = trial[path[0]] if len(path) == 2 else trial
            if not isinstance(parent, dict) or path[-1] not in parent:
                continue
            del parent[path[-1]]
            try:
                same = _settings(cls(**trial).to_dict()) == full
            except Exception:  # the class refuses it without the key (a validator)
                same = False
            if same:
                out = trial
    finally:
        transformers.logging.set_verbosity(level)
    return out


def save_released(model, folder) -> None:
    """save_pretrained, then config.json in the released form (released_config)."""
    model.save_pretrained(folder)
    path = Path(folder) / "config.json"
    written = json.loads(path.read_text(encoding="utf-8"))
    meta = {k: written[k] for k in META if k in written}
    path.write_text(json.dumps({**released_config(model.config), **meta}, indent=2), "utf-8")


def make_gemma3_multimodal(folder):
    """A tiny Gemma3ForConditionalGeneration (model_type gemma3, as 4B/12B/27B ship): a
    SigLIP tower of 4x4 patches pooled into 4 image tokens."""
    import transformers as t

    tok = make_tokenizer(folder, "gemma3")
    config = gemma3_multimodal_config(len(tok), tok.eos_token_id)
    return _save_composite(folder, t.Gemma3ForConditionalGeneration(config), tok, 56, 4)


def gemma3_multimodal_config(n: int, eos: int):
    """Its config: n tokens in the tokenizer, eos its end."""
    import transformers as t

    text = t.Gemma3TextConfig(
        vocab_size=n + 5,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        max_position_embeddings=64,
        initializer_range=0.3,
        pad_token_id=eos,
        eos_token_id=eos,
        bos_token_id=None,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    )
    vision = t.SiglipVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=56,
        patch_size=14,
    )
    return t.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_id=n + 1,
        boi_token_index=n + 2,
        eoi_token_index=n + 3,
    )


def make_qwen3_5_multimodal(folder):
    """A tiny Qwen3_5ForConditionalGeneration: hybrid text layers and a 1-block vision tower
    whose merger folds 2x2 patches into one token."""
    import transformers as t

    tok = make_tokenizer(folder, "qwen3_5")
    config = qwen3_5_multimodal_config(len(tok), tok.eos_token_id)
    return _save_composite(folder, t.Qwen3_5ForConditionalGeneration(config), tok, 56, 4)


def qwen3_5_multimodal_config(n: int, eos: int, moe: bool = False):
    """Its config; moe: Qwen3_5MoeForConditionalGeneration's (Qwen3.5-35B-A3B's class)."""
    import transformers as t

    kind = t.Qwen3_5MoeTextConfig if moe else t.Qwen3_5TextConfig
    experts = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
    experts += ("shared_expert_intermediate_size",)
    mlp = {k: HYBRID_CONFIGS["qwen3_5_moe"][k] for k in experts} if moe else None
    text = kind(
        vocab_size=n + 5,
        hidden_size=32,
        **(mlp or {"intermediate_size": 48}),
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=64,
        eos_token_id=eos,
    )
    vision = (t.Qwen3_5MoeVisionConfig if moe else t.Qwen3_5VisionConfig)(
        depth=2,
        hidden_size=16,
        intermediate_size=32,
        num_heads=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=32,
        num_position_embeddings=16,
    )
    return (t.Qwen3_5MoeConfig if moe else t.Qwen3_5Config)(
        text_config=text,
        vision_config=vision,
        image_token_id=n + 1,
        tie_word_embeddings=False,
    )


def make_gemma4_multimodal(folder):
    """A tiny Gemma4ForConditionalGeneration with a vision and an audio tower."""
    import transformers as t

    tok = make_tokenizer(folder, "gemma4")
    config = gemma4_multimodal_config(len(tok), tok.eos_token_id)
    return _save_composite(folder, t.Gemma4ForConditionalGeneration(config), tok, 56, 4)


def gemma4_multimodal_config(n: int, eos: int):
    """Its config: n tokens in the tokenizer, eos its end."""
    import transformers as t

    text = t.Gemma4TextConfig(
        vocab_size=n + 8,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        max_position_embeddings=64,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=n + 8,
        pad_token_id=eos,
        eos_token_id=eos,
        bos_token_id=None,
    )
    vision = t.Gemma4VisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        patch_size=14,
        pooling_kernel_size=3,
        position_embedding_size=64,
    )
    audio = t.Gemma4AudioConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        subsampling_conv_channels=[128, 32],
        output_proj_dims=16,
    )
    return t.Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        image_token_id=n + 1,
        boi_token_id=n + 2,
        eoi_token_id=n + 3,
        audio_token_id=n + 4,
        boa_token_id=n + 5,
        eoa_token_index=n + 6,
        video_token_id=n + 7,
    )


def _save_composite(folder, model, tok, image_size: int, image_tokens: int):
    """Save a composite with random weights (fixed seed) and the preprocessor_config.json its
    image processor and llama.cpp's converter read."""
    torch.manual_seed(0)
    for p in model.parameters():  # the towers' init leaves some zero: every tensor differs
        p.data.normal_(0, 0.3)
    model = model.float().eval()
    save_released(model, folder)
    _towers_in_bf16(Path(folder) / "model.safetensors")
    pre = {
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": image_tokens,
        "size": {"height": image_size, "width": image_size},
    }
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(pre), encoding="utf-8")
    return model, tok


def _towers_in_bf16(path: Path) -> None:
    """The towers' tensors in bf16, as released checkpoints hold them (the text model stays
    fp32, so logits compare in fp32): an export must keep each tensor's own dtype."""
    from safetensors.torch import load_file, save_file

    from core.weights import composite

    state = load_file(str(path))
    for name, tensor in state.items():
        if composite.text_name(name) is None:
            state[name] = tensor.bfloat16()
    save_file(state, str(path), {"format": "pt"})


# The composites' configs (n tokens, eos) by the family of their language model: Qwen3.5-MoE's
# (Qwen3.5-35B-A3B's class) is read as a config here, and its model is not built
COMPOSITE_CONFIGS = {
    "gemma3": gemma3_multimodal_config,
    "qwen3_5": qwen3_5_multimodal_config,
    "qwen3_5_moe": lambda n, eos: qwen3_5_multimodal_config(n, eos, moe=True),
    "gemma4": gemma4_multimodal_config,
}
# The composites' builders by the family of their language model.
COMPOSITES = {
    "gemma3": make_gemma3_multimodal,
    "qwen3_5": make_qwen3_5_multimodal,
    "gemma4": make_gemma4_multimodal,
}
