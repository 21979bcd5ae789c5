"""GGUF for llama.cpp and the apps built on it (Ollama, LM Studio): llama.cpp's tensor names
and layouts per family, the tokenizer and chat template in the file's metadata."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from core.use import gguf_quants as gq
from core.use.common import ExportError, weights
from core.weights import families
from core.weights.loader import Loaded

# The pre-tokenizer split regexes llama.cpp knows, by the name it gives them.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
# llama.cpp's tensor name endings; a name gguf's map gives without one is written as a weight
SUFFIXES = (".weight", ".bias", ".scale")


def _tensor_map(family, n_layers: int):
    """gguf's own Hugging Face -> llama.cpp name map for the family's architecture, and the
    family's own names for what that map lacks (Family.gguf_rename)."""
    import gguf

    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[family.gguf_arch]
    return _Names(gguf.get_tensor_name_map(arch, n_layers), family.gguf_rename)


class _Names:
    def __init__(self, names, rename):
        self.names, self.rename = names, rename

    def get_name(self, key: str, try_suffixes=()) -> str | None:
        name = self.names.get_name(key, try_suffixes=try_suffixes)
        if name is None and self.rename is not None:
            return self.rename(key)
        return name


BARE = (".ssm_a",)  # llama.cpp's tensors without a suffix (Qwen3.5's A)


class Lazy:
    """A tensor of the export made only when written: merged, converted and reordered then,
    so an export holds one converted tensor at a time beside the model."""

    def __init__(self, shape, make):
        self.shape = tuple(shape)
        self.make = make  # () -> fp32 tensor in llama.cpp's layout


def sources(model) -> dict[str, object]:
    """Our state-dict names (adapters left out) -> () -> that weight in fp32, a LoRA layer's
    adapters merged in (W + scale B A; each expert's own for stacked experts) without
    touching the model. A memory-mapped model's
    joined weights (model.weight_sources) are joined here, one at a time."""
    from core.models.lora import LoRALinear, is_adapter

    lazy = getattr(model, "weight_sources", {})
    modules = dict(model.named_modules())
    out = {}
    for name, p in model.state_dict(keep_vars=True).items():
        if is_adapter(name):
            continue
        if name in lazy:
            base = lambda fn=lazy[name]: fn().float()  # noqa: E731
        else:
            base = lambda p=p: p.detach().float()  # noqa: E731
        prefix, _, leaf = name.rpartition(".")
        m = modules.get(prefix)
        adapter = getattr(m, f"{leaf}_lora", None)  # an MoE's experts (--lora-experts)
        if leaf == "weight" and isinstance(m, LoRALinear):
            out[name] = lambda m=m, base=base: (
                base() + m.scale * (m.lora_B.detach().float() @ m.lora_A.detach().float())
            )
        elif adapter is not None:
            out[name] = lambda a=adapter, base=base: base() + a.delta().detach()
        else:
            out[name] = base
    return out


def fp32_model(model):
    """A copy of the model in fp32 with every weight present (a memory-mapped model's joined
    weights made): for measuring, not for large models."""
    import copy

    import torch.nn as nn

    twin = copy.deepcopy(model)
    for name, make in getattr(model, "weight_sources", {}).items():
        owner, _, leaf = name.rpartition(".")
        setattr(twin.get_submodule(owner), leaf, nn.Parameter(make(), requires_grad=False))
    if hasattr(twin, "weight_sources"):
        del twin.weight_sources
    if twin.config.tie_embeddings:
        twin.head.weight = twin.tok_emb.weight
    return twin.float()


def _own_tensors(loaded: Loaded, names: dict[str, str]) -> dict[str, Lazy]:
    """A family that names llama.cpp's tensors itself (GPT-2); its weights keep
    torch.nn.Linear's (out, in) layout. Bias-free layers get zero biases, which llama.cpp's
    GPT-2 expects."""
    src, shapes = sources(loaded.model), loaded.model.state_dict(keep_vars=True)
    out = {}
    for gguf_name, ours in names.items():
        if ours in src:
            out[gguf_name] = Lazy(shapes[ours].shape, src[ours])
        else:
            rows = shapes[ours[: -len("bias")] + "weight"].shape[0]
            out[gguf_name] = Lazy((rows,), lambda rows=rows: torch.zeros(rows))
    return out


def _permute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's llama architecture rotates interleaved pairs, Hugging Face half-split
    halves: reorder q/k rows as convert_hf_to_gguf.py does."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def unpermute(w: torch.Tensor, heads: int | None) -> torch.Tensor:
    """The inverse of _permute_rope (None: nothing to undo)."""
    if heads is None:
        return w
    return (
        w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _rope_heads(hf_name: str, c, family) -> int | None:
    if not family.gguf_permute:
        return None
    return c.n_heads if ".q_proj." in hf_name else c.n_kv_heads if ".k_proj." in hf_name else None


def _llama_name(names, hf_name: str, family) -> str:
    name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise ExportError(f"gguf: no llama.cpp name for {hf_name}")
    return name


def _llama_part(make, ours: str, c, n: int, k: int, heads: int | None, name: str, hook):
    def part():
        piece = families.split_rows(ours, c, make(), n)[k]
        piece = piece.contiguous() if heads is None else _permute_rope(piece, heads)
        return piece if hook is None else hook(name, piece, c)

    return part


def expert_names(ours: str, family) -> list[tuple[str, slice | None]]:
    """llama.cpp's names for one of our stacked expert tensors, each with the rows of our
    [E, 2I, ...] it takes (None: all): gate and up apart (ffn_gate_exps, ffn_up_exps), or
    together where the family's architecture reads them fused (ffn_gate_up_exps)."""
    import gguf

    T = gguf.MODEL_TENSOR
    layer, leaf = int(ours.split(".")[1]), ours.rsplit(".", 1)[-1]
    kind = "bias" if leaf.endswith("_bias") else "weight"

    def name(tensor):
        return gguf.TENSOR_NAMES[tensor].format(bid=layer) + "." + kind

    if leaf.startswith("down"):
        return [(name(T.FFN_DOWN_EXP), None)]
    if family.gguf_fused_gate_up:
        return [(name(T.FFN_GATE_UP_EXP), None)]
    return [(name(T.FFN_GATE_EXP), slice(0, 1)), (name(T.FFN_UP_EXP), slice(1, 2))]


def _expert_part(make, half: slice | None, name: str, hook, c):
    def part():
        tensor = make()
        if half is not None:  # gate rows first, then up: one half of dim 1
            tensor = tensor.chunk(2, dim=1)[half.start].contiguous()
        return tensor if hook is None else hook(name, tensor, c)

    return part


def _expert_tensors(ours: str, make, shape: tuple, family, c) -> dict[str, Lazy]:
    out = {}
    for name, half in expert_names(ours, family):
        part = shape if half is None else (shape[0], shape[1] // 2, *shape[2:])
        out[name] = Lazy(part, _expert_part(make, half, name, family.gguf_tensor, c))
    return out


def _gguf_name(names, hf_name: str, family) -> str:
    return _suffixed(_llama_name(names, hf_name, family))


def _suffixed(name: str) -> str:
    """A name gguf's map gives without a suffix (gpt-oss's attention sinks) is written as a
    weight, as convert_hf_to_gguf.py does; but for the tensors llama.cpp reads bare (A)."""
    return name if name.endswith((*SUFFIXES, *BARE)) else name + ".weight"


def _table_tensors(loaded: Loaded) -> dict[str, Lazy]:
    """The family's tensors under llama.cpp's names, through gguf's own name map: our
    fused q/k/v and gate/up split by rows where llama.cpp keeps them apart, q and k in
    llama.cpp's rotary row order where it rotates pairs, stacked experts as llama.cpp's
    3-D expert tensors, and the family's tensor hook."""
    import gguf

    c, model, family = loaded.model.config, loaded.model, families.get(loaded.family)
    names = _tensor_map(family, c.n_layers)
    src, shapes = sources(model), model.state_dict(keep_vars=True)
    out = {}
    for ours, hf_names, _ in families.table(loaded.family, c):
        if ours not in src:
            continue
        if families.is_expert(ours):  # our [E, ...] layout, whatever the checkpoint's
            out.update(_expert_tensors(ours, src[ours], tuple(shapes[ours].shape), family, c))
            continue
        meta = torch.empty(shapes[ours].shape, device="meta")
        parts = families.split_rows(ours, c, meta, len(hf_names))
        for k, (hf_name, piece) in enumerate(zip(hf_names, parts, strict=True)):
            heads = _rope_heads(hf_name, c, family)
            name = _gguf_name(names, hf_name, family)
            make = _llama_part(
                src[ours], ours, c, len(hf_names), k, heads, name, family.gguf_tensor
            )
            if family.gguf_tensor is not None:  # a hook may reshape (Qwen3.5's conv kernel)
                piece = family.gguf_tensor(name, piece, c)
            out[name] = Lazy(piece.shape, make)
    scaling = c.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        from core.models.model import GPTConfig, rope_frequencies

        plain = rope_frequencies(GPTConfig(**{**c.to_dict(), "rope_scaling": None}))
        factors = (plain / rope_frequencies(c)).float()  # llama.cpp divides each by its factor
        out[gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"] = Lazy(
            factors.shape, lambda: factors
        )
    for name, tensor in (family.gguf_extra(c) if family.gguf_extra else {}).items():
        out[name] = Lazy(tensor.shape, lambda t=tensor: t.float())
    return out


def _gguf_pre(spec: dict) -> str:
    """llama.cpp's name for the tokenizer's pre-tokenizer split."""
    text = json.dumps(spec.get("pre_tokenizer"))
    regexes = set()
    for part in (spec.get("pre_tokenizer") or {}).get("pretokenizers", []) + [
        spec.get("pre_tokenizer") or {}
    ]:
        pattern = (part or {}).get("pattern") or {}
        if "Regex" in pattern:
            regexes.add(pattern["Regex"])
    if LLAMA3_SPLIT in regexes:
        return "llama-bpe"
    if QWEN2_SPLIT in regexes:
        return "qwen2"
    if '"Digits"' in text and '"ByteLevel"' in text:
        return "smollm"
    if '"ByteLevel"' in text:
        return "gpt-2"
    raise ExportError("gguf: this tokenizer's pre-tokenizer is not one llama.cpp knows")


def is_sentencepiece(spec: dict) -> bool:
    """A SentencePiece-style tokenizer.json (Llama 2, Mistral 7B v0.x): BPE over U+2581-spaced
    text with byte fallback, as opposed to GPT-2's byte-level BPE."""
    model = spec["model"]
    return (
        model.get("type") in (None, "BPE")
        and bool(model.get("byte_fallback"))
        and ("ByteLevel" not in json.dumps(spec.get("decoder")))
    )


def _types(loaded: Loaded, spec: dict, by_id: dict, n: int) -> list[int]:
    import gguf

    T = gguf.TokenType
    added = {t["id"]: t.get("special", False) for t in spec.get("added_tokens") or []}
    unk = spec["model"].get("unk_token")
    sentencepiece = is_sentencepiece(spec)

    def kind(i):
        if i not in by_id:
            return T.UNUSED
        if by_id[i] == unk:
            return T.UNKNOWN
        if sentencepiece and re.fullmatch(r"<0x[0-9A-F]{2}>", by_id[i]):
            return T.BYTE  # byte fallback needs them typed so, added tokens or not
        if i in added:
            return T.CONTROL if added[i] else T.USER_DEFINED
        return T.NORMAL

    return [int(kind(i)) for i in range(n)]


def gguf_vocab(loaded: Loaded) -> tuple[list[str], list[int], list[str]]:
    """Tokens padded to the model's vocab, their types, merges (a SentencePiece-style
    tokenizer's merges are given as scores instead: see spm_scores)."""
    spec = json.loads(loaded.tokenizer.hf_json())
    model = spec["model"]
    sentencepiece = is_sentencepiece(spec)
    if model.get("type") not in (None, "BPE") or not (
        sentencepiece or "ByteLevel" in json.dumps(spec.get("decoder"))
    ):
        raise ExportError(
            f"gguf: a {model.get('type')} tokenizer is not one TrainDeck writes to GGUF; export "
            "--format hf and convert it with llama.cpp's convert_hf_to_gguf.py"
        )
    by_id = {i: tok for tok, i in loaded.tokenizer.hf.get_vocab(with_added_tokens=True).items()}
    n = loaded.model.config.vocab_size
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return tokens, _types(loaded, spec, by_id, n), merges


def spm_scores(tokens: list[str], merges: list[str]) -> list[float]:
    """llama.cpp's SentencePiece tokenizer merges the adjacent pair whose joined piece scores
    highest: a piece made by the r-th BPE merge scores -r, so merges apply in BPE's order."""
    rank = {}
    for r, merge in enumerate(merges):
        rank.setdefault(merge.replace(" ", "", 1), r)
    return [-float(rank[t]) if t in rank else 0.0 for t in tokens]


def _spm_prefix(spec: dict) -> bool:
    """Whether the tokenizer puts a U+2581 before the text (llama.cpp: add_space_prefix)."""
    text = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")])
    return '"Prepend"' in text or ('"Metaspace"' in text and '"never"' not in text)


def chat_bos(tok) -> bool:
    """Whether the model's chat prompts start with BOS. A chat template that writes none
    (Phi-3.5's, with a tokenizer that puts BOS before plain text) is prompted without it by
    transformers, so TrainDeck chat-trains without it; llama.cpp and Ollama put the GGUF's BOS
    before every templated prompt."""
    from core.data.chat import TemplateError, render, special_tokens

    if not tok.add_bos or not tok.chat_template:
        return tok.add_bos
    bos = tok.meta.get("bos_token") or ""
    try:
        text = render(
            tok.chat_template, [{"role": "user", "content": "a"}], True, **special_tokens(tok)
        )
    except TemplateError:
        return tok.add_bos
    return bool(bos) and text.startswith(bos)


def _gguf_tokenizer(writer, loaded: Loaded, add_bos: bool) -> None:
    tok = loaded.tokenizer
    spec = json.loads(tok.hf_json())
    tokens, types, merges = gguf_vocab(loaded)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if is_sentencepiece(spec):  # llama.cpp's "llama" (SentencePiece) tokenizer
        writer.add_tokenizer_model("llama")
        writer.add_token_scores(spm_scores(tokens, merges))
        writer.add_add_space_prefix(_spm_prefix(spec))
        unk = spec["model"].get("unk_token")
        if unk is not None and tok.hf.token_to_id(unk) is not None:
            writer.add_unk_token_id(tok.hf.token_to_id(unk))
    else:
        if not merges:
            # A byte tokenizer has no merges, but llama.cpp's BPE loader needs the key: one
            # merge of two bytes whose result is not a token never applies.
            merges = [f"{tokens[ord('a')]} {tokens[ord('a')]}"]
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(_gguf_pre(spec))
        writer.add_token_merges(merges)
    writer.add_add_bos_token(add_bos)
    if tok.bos_id is not None:
        writer.add_bos_token_id(tok.bos_id)
    if tok.eos_id is not None:
        writer.add_eos_token_id(tok.eos_id)
    # Every end of turn the model stops at: llama.cpp, LM Studio and Ollama read eos, eot
    # and eom as end-of-generation tokens (Llama 3.1: <|end_of_text|>, <|eot_id|>, <|eom_id|>).
    turn_ends = [i for i in tok.stop_ids if i != tok.eos_id]
    if turn_ends:
        writer.add_eot_token_id(turn_ends[0])
    if len(turn_ends) > 1:  # more are marked CONTROL, which llama.cpp also stops at
        writer.add_eom_token_id(turn_ends[1])
    if tok.chat_template:
        writer.add_chat_template(tok.chat_template)


def _hyperparameters(writer, loaded: Loaded) -> None:
    import gguf

    c, family = loaded.model.config, families.get(loaded.family)
    writer.add_name("TrainDeck model")
    writer.add_context_length(c.seq_len)
    writer.add_embedding_length(c.hidden_dim)
    writer.add_feed_forward_length(c.ffn_dim)
    writer.add_block_count(c.n_layers)
    writer.add_head_count(c.n_heads)
    if c.norm == "layernorm":
        writer.add_layer_norm_eps(c.norm_eps)
        return
    writer.add_head_count_kv(c.n_kv_heads)
    writer.add_layer_norm_rms_eps(c.norm_eps)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_rope_dimension_count(c.rope_dim or c.head_dim)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_vocab_size(c.vocab_size)
    scaling = c.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    if scaling.get("rope_type", scaling.get("type")) == "yarn":  # as convert_hf_to_gguf.py
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    if c.moe:
        _expert_hparams(writer, c)
    if family.gguf_hparams is not None:
        family.gguf_hparams(writer, c)
    if family.gguf_composite is not None:
        family.gguf_composite(writer, c, loaded.base.get("hf_config") or {})


def _expert_hparams(writer, c) -> None:
    """The expert keys convert_hf_to_gguf.py writes for every MoE architecture. How the
    top-k weights are normalized is each architecture's own rule in llama.cpp (no key): the
    family's gguf_check refuses a model that differs from it."""
    writer.add_expert_count(c.moe["n_experts"])
    writer.add_expert_used_count(c.moe["top_k"])
    writer.add_expert_feed_forward_length(c.moe["expert_dim"])
    if c.moe.get("shared_expert_dim"):
        writer.add_expert_shared_feed_forward_length(c.moe["shared_expert_dim"])


def gguf_origins(loaded: Loaded) -> dict[str, tuple[str, str, int | None]]:
    """GGUF tensor name -> ("ours" or "hf", the name it came from, heads of its rope row
    order or None), or ("expert", our stacked name, which half of gate/up or None): how to
    put a GGUF file's tensors back into the model (the family's tensor hook undone with
    gguf_back)."""
    c, family = loaded.model.config, families.get(loaded.family)
    if family.gguf_names is not None:
        return {g: ("ours", ours, None) for g, ours in family.gguf_names(c).items()}
    names = _tensor_map(family, c.n_layers)
    origins = {}
    for ours, hf_names, _ in families.table(loaded.family, c):
        if families.is_expert(ours):  # ("expert", ours, 0 gate / 1 up / None whole)
            for name, half in expert_names(ours, family):
                origins[name] = ("expert", ours, None if half is None else half.start)
            continue
        for hf in hf_names:  # the table may name tensors this model does not have
            name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
            if name is not None:
                name = _suffixed(name)
                origins[name] = ("hf", hf, _rope_heads(hf, c, family))
    return origins


def gguf_back(loaded: Loaded, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A GGUF file's tensor as the model holds it (the family's tensor hook undone)."""
    hook = families.get(loaded.family).gguf_tensor
    return tensor if hook is None else hook(name, tensor, loaded.model.config, back=True)


def gguf_tensors(loaded: Loaded) -> dict[str, Lazy]:
    """The model's tensors under llama.cpp's names and layouts, each made when written."""
    family = families.get(loaded.family)
    if family.gguf_names is not None:
        return _own_tensors(loaded, family.gguf_names(loaded.model.config))
    return _table_tensors(loaded)


def check_llama_cpp(loaded: Loaded) -> None:
    """Refuse, naming the difference, a model llama.cpp would run otherwise than TrainDeck
    (a family's assumptions about layer patterns and scales, RoPE kinds it reads otherwise)."""
    family, c = families.get(loaded.family), loaded.model.config
    reason = family.gguf_check(c) if family.gguf_check else None
    scaling = c.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if reason is None and kind == "longrope" and family.gguf_extra is None:
        reason = f"llama.cpp's {family.gguf_arch} has no LongRoPE factors"
    if reason:
        raise ExportError(f"gguf: {reason}; export --format hf and convert that instead")


def _tensor_info(writer, name: str, shape: tuple, qtype) -> None:
    import gguf
    import numpy as np

    T = gguf.GGMLQuantizationType
    if qtype in (T.F32, T.F16):
        dtype = np.float32 if qtype == T.F32 else np.float16
        writer.add_tensor_info(name, shape, np.dtype(dtype), gq.expected_bytes(shape, qtype))
        return
    nbytes = gq.expected_bytes(shape, qtype)
    rows = int(np.prod(shape[:-1]))
    byte_shape = (*shape[:-1], nbytes // rows)
    writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)


def _file_types() -> dict:
    import gguf

    F = gguf.LlamaFileType
    return {
        "f32": F.ALL_F32,
        "f16": F.MOSTLY_F16,
        "bf16": F.MOSTLY_BF16,
        "q8_0": F.MOSTLY_Q8_0,
        "q6_k": F.MOSTLY_Q6_K,
        "q5_k_m": F.MOSTLY_Q5_K_M,
        "q4_k_m": F.MOSTLY_Q4_K_M,
        "q4_0": F.MOSTLY_Q4_0,
        "mxfp4": F.MOSTLY_MXFP4_MOE,
    }


def export_gguf(
    loaded: Loaded,
    folder: Path,
    quant: str = "f16",
    log=print,
    progress=None,
    name: str = "model.gguf",
    chat: bool = False,
) -> dict:
    """The family's llama.cpp architecture (gpt2, llama, qwen2, gemma3, ...), each tensor
    in the type the quant's mix gives it (as llama-quantize would). Tensors are converted,
    quantized and written one at a time; chat: a file for chat only (Ollama), whose BOS is
    the chat template's. Returns {"path", "bytes", "types": {name: type}}."""
    import gguf
    import numpy as np

    check_llama_cpp(loaded)
    if quant in gq.EXPERT_TYPE and not loaded.model.config.moe:
        raise ExportError(f"quant: {quant} is for mixture-of-experts models; this one has none")
    family = families.get(loaded.family)
    for note in family.gguf_notes(loaded.model.config) if family.gguf_notes else ():
        log(f"gguf: {note}")  # where llama.cpp runs the model otherwise, and when
    if (loaded.model.config.rope_scaling or {}).get("truncate") is False:  # gpt-oss's
        log(
            "gguf: llama.cpp's YaRN rounds the ends of its frequency ramp, which this model's "
            "rope_scaling (truncate: false) does not: positions are encoded slightly otherwise"
        )
    path = folder / name
    writer = gguf.GGUFWriter(str(path), families.get(loaded.family).gguf_arch)
    _hyperparameters(writer, loaded)
    writer.add_file_type(_file_types()[quant])
    if quant not in ("f32", "f16", "bf16"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok = loaded.tokenizer
    add_bos = chat_bos(tok) if chat else tok.add_bos
    _gguf_tokenizer(writer, loaded, add_bos)
    if tok.add_bos and not chat_bos(tok):
        log(
            "gguf: add_bos_token false: the chat template writes no BOS, so chat prompts start "
            "as in transformers"
            if chat
            else "gguf: llama.cpp's chat puts BOS before the "
            "template's text, which transformers (and TrainDeck's chat) does not; the "
            "ollama export writes its GGUF without it"
        )
    tensors = gguf_tensors(loaded)
    types, counters, layers = {}, {}, loaded.model.config.n_layers
    tied = "output.weight" not in tensors  # the embedding is also the output
    experts = (loaded.model.config.moe or {}).get("n_experts", 0)
    for tensor_name, data in tensors.items():
        shape = tuple(data.shape)
        qtype, note = gq.tensor_type(
            tensor_name, shape, quant, layers, counters, tied=tied, n_experts=experts
        )
        if note:
            log(f"gguf: {note}")
        types[tensor_name] = qtype
        _tensor_info(writer, tensor_name, shape, qtype)
    mix = ", ".join(f"{n} {k}" for k, n in sorted(counters.items()) if k.isupper())
    log(f"gguf {quant}: {len(types)} tensors ({mix})")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, tensor_name in enumerate(list(tensors)):
        data = tensors.pop(tensor_name).make().float().contiguous().numpy()
        writer.write_tensor_data(np.ascontiguousarray(gq.quantize(data, types[tensor_name])))
        if progress is not None:
            progress(i + 1, len(types))
    writer.close()
    return {
        "path": path,
        "bytes": path.stat().st_size,
        "types": {k: v.name for k, v in types.items()},
    }


# -- LoRA adapters for llama.cpp --------------------------------------------------------------


def _adapter_tensors(loaded: Loaded) -> dict[str, torch.Tensor]:
    """{GGUF name + '.lora_a' / '.lora_b': tensor}: A (rank, in) and B (out, rank) per base
    tensor, as llama.cpp reads them. A fused layer of ours (q/k/v, gate/up) is several
    llama.cpp tensors: each gets the same A and its own rows of B (in llama.cpp's rotary row
    order for q and k)."""

    c, family = loaded.model.config, families.get(loaded.family)
    state = weights(loaded.model)
    out = {}
    if family.gguf_names is not None:
        for gguf_name, ours in family.gguf_names(c).items():
            prefix = ours.removesuffix(".weight")
            if ours.endswith(".weight") and f"{prefix}.lora_A" in state:
                out[gguf_name + ".lora_a"] = state[f"{prefix}.lora_A"]
                out[gguf_name + ".lora_b"] = state[f"{prefix}.lora_B"]
        return out
    names = _tensor_map(family, c.n_layers)
    for ours, hf_names, _ in families.table(loaded.family, c):
        prefix = ours.removesuffix(".weight")
        if not ours.endswith(".weight") or f"{prefix}.lora_A" not in state:
            continue
        parts = families.split_rows(ours, c, state[f"{prefix}.lora_B"], len(hf_names))
        for hf_name, b in zip(hf_names, parts, strict=True):
            heads = _rope_heads(hf_name, c, family)
            name = _llama_name(names, hf_name, family)
            a = state[f"{prefix}.lora_A"]
            b = b if heads is None else _permute_rope(b, heads)
            if family.gguf_adapter is not None:  # rows or columns in llama.cpp's order
                a, b = family.gguf_adapter(name, a, b, c)
            out[name + ".lora_a"], out[name + ".lora_b"] = a, b
    return out


def export_gguf_lora(loaded: Loaded, folder: Path, log=print) -> dict:
    """The LoRA adapters alone as a GGUF adapter (llama.cpp --lora, Ollama ADAPTER), for the
    base model exported with --format gguf (or converted by llama.cpp)."""
    import gguf

    cfg = loaded.config
    if cfg is None or not cfg.lora_rank:
        raise ExportError("format: gguf-lora needs a LoRA run (trained with --lora-rank R)")
    if any(".lora_A" in k and "_lora." in k for k in loaded.model.state_dict()):
        raise ExportError(
            "gguf-lora: adapters on the experts (--lora-experts) are not written as a GGUF "
            "adapter; export --format gguf, which merges them"
        )
    tensors = _adapter_tensors(loaded)
    path = folder / "adapter.gguf"
    writer = gguf.GGUFWriter(str(path), families.get(loaded.family).gguf_arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(cfg.lora_scale_alpha))
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor.float().contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log(
        f"gguf-lora: {len(tensors) // 2} adapted tensors, rank {cfg.lora_rank}, alpha "
        f"{cfg.lora_scale_alpha:g}"
    )
    return {"path": path, "bytes": path.stat().st_size}
