"""gpt-oss (gpt-oss-20b, gpt-oss-120b): a mixture of experts in every layer, routed by softmax
over the top-k logits, with router and expert biases and a clamped SwiGLU ((up + 1) * gate *
sigmoid(alpha * gate), both clamped at swiglu_limit); attention with q/k/v/o biases and a
learned sink logit per head, sliding-window and full layers alternating, YaRN positions.

Its experts are held as [E, H, 2I] with gate and up interleaved (gate_up_proj[..., ::2] the
gate) and [E, I, H]: convert turns them into the MoE block's [E, 2I, H] (gate rows first) and
[E, H, I] and back. Released checkpoints ship them in MXFP4 (*_blocks, *_scales), which the
loader dequantizes (core.weights.mxfp4)."""

from __future__ import annotations

import torch

from core.models.model import GPTConfig
from core.weights.families.base import (
    Family,
    UnsupportedModel,
    check_window_pattern,
    gguf_experts,
    layer_types,
    llama_options,
    llama_table,
    moe_options,
    sparse_layers,
)

# The harmony format: an answer ends in <|return|>, or <|call|> for a tool call.
STOPS = ("<|return|>", "<|call|>")


def config(hf: dict, source: str) -> GPTConfig:
    quant = (hf.get("quantization_config") or {}).get("quant_method")
    if quant not in (None, "mxfp4"):
        raise UnsupportedModel(
            f"{source}: quantization_config.quant_method {quant!r} is not supported for "
            "gpt-oss (MXFP4 checkpoints are dequantized at load; others: export them to "
            "16 bits first)"
        )
    n = hf.get("num_local_experts", hf.get("num_experts", 32))
    moe = moe_options(
        hf,
        source,
        n,
        list(range(hf["num_hidden_layers"])),
        expert_dim=hf["intermediate_size"],
        router="topk_softmax",
        norm_topk=False,
        router_bias=True,
        expert_bias=True,
        swiglu_limit=float(hf.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
    )
    bias = bool(hf.get("attention_bias", True))
    window = hf.get("sliding_window")
    return llama_options(
        hf,
        source,
        moe=moe,
        qkv_bias=bias,
        out_bias=bias,
        attn_sinks=True,
        sliding_window=window,
        layer_types=layer_types(hf, 2) if window else None,
        norm_eps=hf.get("rms_norm_eps", 1e-5),
    )


def table(c: GPTConfig):
    rows = [row for row in llama_table(c) if ".mlp." not in row[0]]  # no dense MLP
    for i in range(c.n_layers):
        a, b = f"model.layers.{i}.self_attn.", f"blocks.{i}."
        rows.append((b + "attn.sinks", [a + "sinks"], False))
    for i in sparse_layers(c):
        m, b = f"model.layers.{i}.mlp.", f"blocks.{i}.mlp."
        rows += [
            (b + "router.weight", [m + "router.weight"], False),
            (b + "router.bias", [m + "router.bias"], False),
            (b + "gate_up", [m + "experts.gate_up_proj"], False),
            (b + "gate_up_bias", [m + "experts.gate_up_proj_bias"], False),
            (b + "down", [m + "experts.down_proj"], False),
            (b + "down_bias", [m + "experts.down_proj_bias"], False),
        ]
    return rows


def convert(name: str, tensor: torch.Tensor, to_hf: bool) -> torch.Tensor:
    """An expert tensor between gpt-oss's layout and the MoE block's (to_hf: ours -> its)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "down":  # [E, I, H] <-> [E, H, I]
        return tensor.transpose(1, 2).contiguous()
    if leaf not in ("gate_up", "gate_up_bias"):
        return tensor
    if leaf == "gate_up" and not to_hf:
        tensor = tensor.transpose(1, 2)  # [E, H, 2I] -> [E, 2I, H], rows interleaved
    if to_hf:  # gate rows first, then up -> gate, up, gate, up...
        gate, up = tensor.chunk(2, dim=1)
        tensor = torch.stack((gate, up), dim=2).flatten(1, 2)
        return (tensor.transpose(1, 2) if leaf == "gate_up" else tensor).contiguous()
    return torch.cat((tensor[:, 0::2], tensor[:, 1::2]), dim=1).contiguous()


def notes(hf: dict) -> list[str]:
    if (hf.get("quantization_config") or {}).get("quant_method") != "mxfp4":
        return []
    return [
        "gpt-oss: its MXFP4 experts are dequantized as they load (held in 16 or 32 bits, "
        "not 4); exports write them so"
    ]


def export_config(base: dict) -> dict:
    """The export holds the experts dequantized: no MXFP4 quantization_config."""
    return {k: v for k, v in base.items() if k != "quantization_config"}


# llama.cpp's gpt-oss clamps its SwiGLU with these, whatever the file says
LLAMA_CPP_SWIGLU = {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}


def gguf_check(c: GPTConfig) -> str | None:
    reason = gguf_experts("gpt-oss", norm_topk=None)(c)
    if reason is None and c.sliding_window:
        reason = check_window_pattern(c, 2, "gpt-oss")
    for key, value in LLAMA_CPP_SWIGLU.items():
        if reason is None and c.moe[key] != value:
            reason = f"llama.cpp's gpt-oss fixes {key} at {value}; this model's is {c.moe[key]}"
    return reason


def gguf_hparams(writer, c: GPTConfig) -> None:
    if c.sliding_window:
        writer.add_sliding_window(c.sliding_window)


# GptOssConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "vocab_size": 201_088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-05,
    "num_experts_per_tok": 4,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "router_aux_loss_coef": 0.001,
    "output_router_logits": False,
    "attention_bias": True,
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
# Other names GptOssConfig takes for these settings (its attribute_map)
ALIASES = {"num_experts": "num_local_experts"}


FAMILY = Family(
    defaults=DEFAULTS,
    aliases=ALIASES,
    name="gpt_oss",
    display="gpt-oss",
    hf_arch="GptOssForCausalLM",
    config=config,
    table=table,
    convert=convert,
    export_config=export_config,
    notes=notes,
    gguf_arch="gpt-oss",
    chat_format="harmony",
    stops=STOPS,
    gguf_check=gguf_check,
    gguf_hparams=gguf_hparams,
)
