"""GGUF for llama.cpp and the apps built on it (Ollama, LM Studio): llama.cpp's tensor names
and layouts per family, the tokenizer and chat template in the file's metadata."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from core.use import gguf_quants as gq
from core.use.common import ExportError, hf_state_dict, weights
from core.weights import families
from core.weights.loader import Loaded

# The pre-tokenizer split regexes llama.cpp knows, by the name it gives them.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
GGUF_ARCH_ENUM = {"gpt2": "GPT2", "llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3"}


def _gpt2_tensors(loaded: Loaded) -> dict[str, torch.Tensor]:
    """llama.cpp's GPT-2 tensor names; its weights keep torch.nn.Linear's (out, in) layout."""
    import gguf

    t, name, c = gguf.MODEL_TENSOR, gguf.TENSOR_NAMES, loaded.model.config
    w = weights(loaded.model)
    out = {
        name[t.TOKEN_EMBD] + ".weight": w["tok_emb.weight"],
        name[t.POS_EMBD] + ".weight": w["pos_emb.weight"],
        name[t.OUTPUT_NORM] + ".weight": w["ln_f.weight"],
        name[t.OUTPUT_NORM] + ".bias": w.get("ln_f.bias", torch.zeros_like(w["ln_f.weight"])),
        name[t.OUTPUT] + ".weight": w["head.weight"],
    }
    parts = [
        (t.ATTN_NORM, "ln1"), (t.ATTN_QKV, "attn.qkv"), (t.ATTN_OUT, "attn.proj"),
        (t.FFN_NORM, "ln2"), (t.FFN_UP, "mlp.fc"), (t.FFN_DOWN, "mlp.proj"),
    ]  # fmt: skip
    for i in range(c.n_layers):
        for kind, ours in parts:
            base = name[kind].format(bid=i)
            weight = w[f"blocks.{i}.{ours}.weight"]
            out[base + ".weight"] = weight
            out[base + ".bias"] = w.get(f"blocks.{i}.{ours}.bias", torch.zeros(weight.shape[0]))
    return out


def _permute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's llama architecture rotates interleaved pairs, Hugging Face half-split
    halves: reorder q/k rows as convert_hf_to_gguf.py does."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _llama_tensors(loaded: Loaded, arch: str) -> dict[str, torch.Tensor]:
    """The Llama family's tensors under llama.cpp's names, through gguf's own name map."""
    import gguf

    c = loaded.model.config
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, GGUF_ARCH_ENUM[arch]), c.n_layers)
    out = {}
    for hf_name, tensor in hf_state_dict(loaded).items():
        if arch == "llama" and ".q_proj." in hf_name:
            tensor = _permute_rope(tensor, c.n_heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            tensor = _permute_rope(tensor, c.n_kv_heads)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(f"gguf: no llama.cpp name for {hf_name}")
        out[name] = tensor
    scaling = c.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        from core.models.model import GPTConfig, rope_frequencies

        plain = rope_frequencies(GPTConfig(**{**c.to_dict(), "rope_scaling": None}))
        out[gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"] = (
            plain / rope_frequencies(c)
        ).float()  # llama.cpp divides each frequency by its factor
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


def gguf_vocab(loaded: Loaded) -> tuple[list[str], list[int], list[str]]:
    """Tokens (GPT-2 byte-level strings) padded to the model's vocab, their types, merges."""
    import gguf

    spec = json.loads(loaded.tokenizer.hf_json())
    model = spec["model"]
    if model.get("type") not in (None, "BPE") or "ByteLevel" not in json.dumps(spec.get("decoder")):
        raise ExportError(
            "gguf: this model's tokenizer is SentencePiece-style, which TrainDeck does not write "
            "to GGUF yet; export --format hf and convert it with llama.cpp's convert_hf_to_gguf.py"
        )
    by_id = {i: tok for tok, i in loaded.tokenizer.hf.get_vocab(with_added_tokens=True).items()}
    added = {t["id"]: t.get("special", False) for t in spec.get("added_tokens") or []}
    n = loaded.model.config.vocab_size
    T = gguf.TokenType
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    types = [
        T.UNUSED if i not in by_id
        else (T.CONTROL if added[i] else T.USER_DEFINED) if i in added
        else T.NORMAL
        for i in range(n)
    ]  # fmt: skip
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return tokens, [int(x) for x in types], merges


def _gguf_tokenizer(writer, loaded: Loaded) -> None:
    tok = loaded.tokenizer
    tokens, types, merges = gguf_vocab(loaded)
    if not merges:
        # A byte tokenizer has no merges, but llama.cpp's BPE loader needs the key: one
        # merge of two bytes whose result is not a token never applies.
        merges = [f"{tokens[ord('a')]} {tokens[ord('a')]}"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_gguf_pre(json.loads(tok.hf_json())))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_add_bos_token(tok.add_bos)
    if tok.bos_id is not None:
        writer.add_bos_token_id(tok.bos_id)
    if tok.eos_id is not None:
        writer.add_eos_token_id(tok.eos_id)
    turn_ends = [i for i in tok.stop_ids if i != tok.eos_id]
    if turn_ends:
        writer.add_eot_token_id(turn_ends[0])
    if tok.chat_template:
        writer.add_chat_template(tok.chat_template)


def _hyperparameters(writer, loaded: Loaded, arch: str) -> None:
    import gguf

    c = loaded.model.config
    writer.add_name("TrainDeck model")
    writer.add_context_length(c.seq_len)
    writer.add_embedding_length(c.hidden_dim)
    writer.add_feed_forward_length(c.ffn_dim)
    writer.add_block_count(c.n_layers)
    writer.add_head_count(c.n_heads)
    if arch == "gpt2":
        writer.add_layer_norm_eps(c.norm_eps)
        return
    writer.add_head_count_kv(c.n_kv_heads)
    writer.add_layer_norm_rms_eps(c.norm_eps)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_vocab_size(c.vocab_size)
    scaling = c.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])


def gguf_tensors(loaded: Loaded) -> dict[str, torch.Tensor]:
    """The model's tensors under llama.cpp's names and layouts, fp32."""
    arch = families.GGUF_ARCH[loaded.family]
    return _gpt2_tensors(loaded) if arch == "gpt2" else _llama_tensors(loaded, arch)


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
    return {"f32": F.ALL_F32, "f16": F.MOSTLY_F16, "bf16": F.MOSTLY_BF16,
            "q8_0": F.MOSTLY_Q8_0, "q6_k": F.MOSTLY_Q6_K, "q5_k_m": F.MOSTLY_Q5_K_M,
            "q4_k_m": F.MOSTLY_Q4_K_M, "q4_0": F.MOSTLY_Q4_0}  # fmt: skip


def export_gguf(loaded: Loaded, folder: Path, quant: str = "f16", log=print,
                name: str = "model.gguf") -> dict:  # fmt: skip
    """llama.cpp's gpt2, llama (Llama and Mistral), qwen2 or qwen3 architecture, each tensor
    in the type the quant's mix gives it (as llama-quantize would). Tensors are converted,
    quantized and written one at a time. Returns {"path", "bytes", "types": {name: type}}."""
    import gguf
    import numpy as np

    arch = families.GGUF_ARCH[loaded.family]
    path = folder / name
    writer = gguf.GGUFWriter(str(path), arch)
    _hyperparameters(writer, loaded, arch)
    writer.add_file_type(_file_types()[quant])
    if quant not in ("f32", "f16", "bf16"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _gguf_tokenizer(writer, loaded)
    tensors = gguf_tensors(loaded)
    types, counters, layers = {}, {}, loaded.model.config.n_layers
    tied = "output.weight" not in tensors  # the embedding is also the output
    for tensor_name, data in tensors.items():
        shape = tuple(data.shape)
        qtype, note = gq.tensor_type(tensor_name, shape, quant, layers, counters, tied=tied)
        if note:
            log(f"gguf: {note}")
        types[tensor_name] = qtype
        _tensor_info(writer, tensor_name, shape, qtype)
    mix = ", ".join(f"{n} {k}" for k, n in sorted(counters.items()) if k.isupper())
    log(f"gguf {quant}: {len(types)} tensors ({mix})")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor_name in list(tensors):
        data = tensors.pop(tensor_name).float().contiguous().numpy()
        writer.write_tensor_data(np.ascontiguousarray(gq.quantize(data, types[tensor_name])))
    writer.close()
    return {"path": path, "bytes": path.stat().st_size,
            "types": {k: v.name for k, v in types.items()}}  # fmt: skip
