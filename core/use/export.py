"""Take a trained model to other tools (`python -m core.export`, in core.cli.export):

hf: a folder that transformers loads with no custom code (config.json, model.safetensors,
tokenizer files, a model card). gguf: a GGUF file with the tokenizer inside, for llama.cpp and
the apps built on it. Both are in the model's family: a fine-tune's base's, a new model's from
its shape (GPT-2, or Llama / Qwen3 for arch llama without / with q/k norms). safetensors: the
weights under TrainDeck's own names plus the config as JSON. The folder is written beside
--out and renamed into place when complete.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import torch

from core.config import recipe
from core.errors import UserError
from core.models import lora
from core.weights import families
from core.weights.loader import Loaded, load

FORMATS = ("hf", "gguf", "safetensors", "peft")
FAMILY_NAMES = {"gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2",
                "qwen3": "Qwen3"}  # fmt: skip


class ExportError(UserError):
    pass


def _need(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise ExportError(
            f"export: this format needs the '{module}' package: pip install -e .[export]"
        ) from None


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}


# -- Hugging Face --------------------------------------------------------------------------


def hf_state_dict(loaded: Loaded) -> dict[str, torch.Tensor]:
    """The weights under the model family's Hugging Face names."""
    return families.export_weights(loaded.family, loaded.model.config, loaded.model.state_dict())


def hf_config(loaded: Loaded) -> dict:
    """A fine-tune keeps its base model's config.json; a new model gets its family's."""
    if loaded.base is None:
        return families.new_model_hf_config(loaded.model.config)
    config = dict(loaded.base["hf_config"])
    config["architectures"] = [families.HF_ARCH[loaded.family]]
    config.pop("dtype", None)
    config["torch_dtype"] = "float32"
    return config


def model_card(loaded: Loaded) -> str:
    cfg, c, tok = loaded.config, loaded.model.config, loaded.tokenizer
    val = f"{loaded.val_loss:.4f}" if loaded.val_loss is not None else "not measured"
    arch = f"{FAMILY_NAMES[loaded.family]} ({families.HF_ARCH[loaded.family]})"
    origin = (
        f"fine-tuned from {loaded.base['init_from']}" if loaded.base else "trained from scratch"
    )
    if cfg is None:
        return f"# {arch} model\n\nWritten by TrainDeck from {loaded.checkpoint}.\n"
    return f"""# TrainDeck model

A {arch} language model {origin} with TrainDeck.

- Data: {cfg.data or "embedded corpus (Python standard library sources)"}
- Tokenizer: {tok.kind} ({tok.vocab_size} tokens; model vocab {c.vocab_size})
- Size: {loaded.model.num_params():,} parameters; {c.n_layers} layers, {c.n_heads} heads
  ({c.n_kv_heads} key/value), width {c.hidden_dim}, context {c.seq_len}
- Trained: {loaded.step} optimizer steps, batch {cfg.batch_size} x {cfg.grad_accum} x
  {cfg.seq_len} tokens, {recipe.optimizer_line(cfg)}, precision {cfg.precision}
- Validation loss at export: {val} (nats per token)
- Checkpoint: {loaded.checkpoint.name}

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained("THIS_FOLDER")
model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER")
print(tok.decode(model.generate(**tok("def ", return_tensors="pt"), max_new_tokens=50)[0]))
```
"""


def write_tokenizer_files(loaded: Loaded, folder: Path) -> None:
    tok = loaded.tokenizer
    (folder / "tokenizer.json").write_text(tok.hf_json(), encoding="utf-8")
    if loaded.base is not None:  # the base model's own tokenizer settings and chat template
        for name, text in loaded.base["files"].items():
            if name != "config.json":
                (folder / name).write_text(text, encoding="utf-8")
    else:
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": loaded.model.config.seq_len,
            "clean_up_tokenization_spaces": False,
        }
        path = folder / "tokenizer_config.json"
        path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    if tok.chat_template:  # the template it was trained with (transformers reads this file)
        (folder / "chat_template.jinja").write_text(tok.chat_template, encoding="utf-8")


def export_hf(loaded: Loaded, folder: Path) -> None:
    from safetensors.torch import save_file

    save_file(hf_state_dict(loaded), str(folder / "model.safetensors"), {"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(loaded), indent=1), encoding="utf-8")
    write_tokenizer_files(loaded, folder)
    (folder / "README.md").write_text(model_card(loaded), encoding="utf-8")


# -- safetensors -----------------------------------------------------------------------------


def export_safetensors(loaded: Loaded, folder: Path) -> None:
    from safetensors.torch import save_file

    weights = _weights(loaded.model)
    weights.pop("head.weight")  # tied to tok_emb.weight
    save_file(weights, str(folder / "model.safetensors"), {"format": "traindeck"})
    config = {
        "format": "traindeck",
        "note": "head.weight is tied to tok_emb.weight",
        "vocab_size": loaded.model.config.vocab_size,
        "tokenizer": loaded.tokenizer.kind,
        "step": loaded.step,
        "train_config": loaded.config.to_dict(),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (folder / "tokenizer.json").write_text(loaded.tokenizer.hf_json(), encoding="utf-8")


# -- GGUF -----------------------------------------------------------------------------------

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
    w = _weights(loaded.model)
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


def export_gguf(loaded: Loaded, folder: Path) -> None:
    """llama.cpp's gpt2, llama (Llama and Mistral), qwen2 or qwen3 architecture, fp32."""
    import gguf

    c = loaded.model.config
    arch = families.GGUF_ARCH[loaded.family]
    writer = gguf.GGUFWriter(str(folder / "model.gguf"), arch)
    writer.add_name("TrainDeck model")
    writer.add_context_length(c.seq_len)
    writer.add_embedding_length(c.hidden_dim)
    writer.add_feed_forward_length(c.ffn_dim)
    writer.add_block_count(c.n_layers)
    writer.add_head_count(c.n_heads)
    if arch == "gpt2":
        writer.add_layer_norm_eps(c.norm_eps)
        tensors = _gpt2_tensors(loaded)
    else:
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
        tensors = _llama_tensors(loaded, arch)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _gguf_tokenizer(writer, loaded)
    for tensor_name, data in tensors.items():
        writer.add_tensor(tensor_name, data.float().contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# -- PEFT ----------------------------------------------------------------------------------


def peft_weights(loaded: Loaded) -> tuple[dict[str, torch.Tensor], list[str]]:
    """LoRA A/B under PEFT's key names for the source family, and the adapted module names.
    A fused layer of ours (q/k/v, gate/up) is several Hugging Face modules: each gets the same
    A and its own rows of B, which gives each exactly its rows of B A."""
    c, family = loaded.model.config, loaded.family
    state = _weights(loaded.model)
    out, modules = {}, []
    for ours, hf_names, _ in families.table(family, c):
        prefix = ours.removesuffix(".weight")
        if not ours.endswith(".weight") or f"{prefix}.lora_A" not in state:
            continue
        a, b = state[f"{prefix}.lora_A"], state[f"{prefix}.lora_B"]
        parts = families.split_rows(ours, c, b, len(hf_names))
        for hf_name, part in zip(hf_names, parts, strict=True):
            module = hf_name.removesuffix(".weight")
            out[f"base_model.model.{module}.lora_A.weight"] = a.clone().contiguous()
            out[f"base_model.model.{module}.lora_B.weight"] = part.clone().contiguous()
            modules.append(module)
    return out, modules


def export_peft(loaded: Loaded, folder: Path) -> None:
    from safetensors.torch import save_file

    cfg = loaded.config
    if cfg is None or not cfg.lora_rank:
        raise ExportError("format: peft needs a LoRA run (trained with --lora-rank R)")
    weights, modules = peft_weights(loaded)
    save_file(weights, str(folder / "adapter_model.safetensors"), {"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": loaded.base["init_from"] if loaded.base else None,
        "r": cfg.lora_rank,
        "lora_alpha": cfg.lora_scale_alpha,
        "lora_dropout": cfg.lora_dropout,
        "target_modules": modules,  # full names: exactly these modules, no others
        "bias": "none",
        "fan_in_fan_out": loaded.family == "gpt2",  # GPT-2's Conv1D keeps weights transposed
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "modules_to_save": None,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    write_tokenizer_files(loaded, folder)


WRITERS = {
    "hf": export_hf, "gguf": export_gguf, "safetensors": export_safetensors, "peft": export_peft,
}  # fmt: skip
NEEDS = {"hf": ["safetensors"], "gguf": ["gguf"], "safetensors": ["safetensors"], "peft": []}


def export(target: str | Path, fmt: str, out: str | Path, which: str = "best") -> Path:
    """Write the export into out (a new or empty folder); nothing is left on failure."""
    if fmt not in FORMATS:
        raise ExportError(f"format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"out: {out} exists and is not an empty folder; choose a new one")
    for module in NEEDS[fmt]:
        _need(module)
    loaded = load(target, which)
    if fmt != "peft":  # one full model: the adapters folded into the weights
        lora.merge(loaded.model)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    try:
        WRITERS[fmt](loaded, tmp)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
