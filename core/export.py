"""Take a trained model to other tools:

    python -m core.export RUN_DIR|CHECKPOINT --format hf|gguf|safetensors --out DIR

hf: a GPT-2 folder that transformers loads with no custom code (config.json, model.safetensors,
tokenizer files, a model card). gguf: a GPT-2 GGUF file with the tokenizer inside, for
llama.cpp and the apps built on it. safetensors: the weights under TrainDeck's own names plus
the config as JSON. The folder is written beside --out and renamed into place when complete.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import uuid
from pathlib import Path

import numpy as np
import torch

from . import families
from .errors import UserError
from .loader import Loaded, load

FORMATS = ("hf", "gguf", "safetensors")
EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which the model uses


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
    """The weights under the source family's Hugging Face names (GPT-2 for new models)."""
    return families.export_weights(loaded.family, loaded.model.config, loaded.model.state_dict())


def hf_config(loaded: Loaded) -> dict:
    """A fine-tune keeps its base model's config.json; a new model gets GPT-2's."""
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
    arch = families.HF_ARCH[loaded.family]
    origin = f"fine-tuned from {loaded.base['init_from']}" if loaded.base else "trained from scratch"
    if cfg is None:
        return f"# {arch} model\n\nWritten by TrainDeck from {loaded.checkpoint}.\n"
    return f"""# TrainDeck model

A {arch} language model {origin} with TrainDeck.

- Data: {cfg.data or "embedded corpus (Python standard library sources)"}
- Tokenizer: {tok.kind} ({tok.vocab_size} tokens; model vocab {c.vocab_size})
- Size: {loaded.model.num_params():,} parameters; {c.n_layers} layers, {c.n_heads} heads,
  width {c.hidden_dim}, context {c.seq_len}
- Trained: {loaded.step} optimizer steps, batch {cfg.batch_size} x {cfg.grad_accum} x
  {cfg.seq_len} tokens, AdamW, peak lr {cfg.lr}, precision {cfg.precision}
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
    (folder / "tokenizer.json").write_text(loaded.tokenizer.hf_json(), encoding="utf-8")
    if loaded.base is not None:  # the base model's own tokenizer settings and chat template
        for name, text in loaded.base["files"].items():
            if name != "config.json":
                (folder / name).write_text(text, encoding="utf-8")
        return
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": loaded.model.config.seq_len,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


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


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """llama.cpp's GPT-2 tensor names; its weights keep torch.nn.Linear's (out, in) layout."""
    import gguf

    t = gguf.MODEL_TENSOR
    name = gguf.TENSOR_NAMES
    w = _weights(model)
    out = {
        name[t.TOKEN_EMBD] + ".weight": w["tok_emb.weight"],
        name[t.POS_EMBD] + ".weight": w["pos_emb.weight"],
        name[t.OUTPUT_NORM] + ".weight": w["ln_f.weight"],
        name[t.OUTPUT_NORM] + ".bias": w.get("ln_f.bias", torch.zeros_like(w["ln_f.weight"])),
        name[t.OUTPUT] + ".weight": w["tok_emb.weight"],  # tied head, written out
    }
    parts = [
        (t.ATTN_NORM, "ln1"), (t.ATTN_QKV, "attn.qkv"), (t.ATTN_OUT, "attn.proj"),
        (t.FFN_NORM, "ln2"), (t.FFN_UP, "mlp.fc"), (t.FFN_DOWN, "mlp.proj"),
    ]  # fmt: skip
    for i in range(model.config.n_layers):
        for kind, ours in parts:
            base = name[kind].format(bid=i)
            weight = w[f"blocks.{i}.{ours}.weight"]
            out[base + ".weight"] = weight
            out[base + ".bias"] = w.get(f"blocks.{i}.{ours}.bias", torch.zeros(weight.shape[0]))
    return {k: v.numpy() for k, v in out.items()}


def gguf_vocab(loaded: Loaded) -> tuple[list[str], list[int], list[str]]:
    """Tokens (GPT-2 byte-level strings) padded to the model's vocab, their types, merges."""
    import gguf

    model = json.loads(loaded.tokenizer.hf_json())["model"]
    by_id = {i: tok for tok, i in model["vocab"].items()}
    n = loaded.model.config.vocab_size
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    types = [gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return tokens, [int(x) for x in types], merges


def export_gguf(loaded: Loaded, folder: Path) -> None:
    import gguf

    c = loaded.model.config
    writer = gguf.GGUFWriter(str(folder / "model.gguf"), "gpt2")
    writer.add_name("TrainDeck model")
    writer.add_context_length(c.seq_len)
    writer.add_embedding_length(c.hidden_dim)
    writer.add_feed_forward_length(4 * c.hidden_dim)
    writer.add_block_count(c.n_layers)
    writer.add_head_count(c.n_heads)
    writer.add_layer_norm_eps(LAYER_NORM_EPS)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, types, merges = gguf_vocab(loaded)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if merges:
        writer.add_token_merges(merges)
    writer.add_add_bos_token(False)
    for tensor_name, data in gguf_tensors(loaded.model).items():
        writer.add_tensor(tensor_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


WRITERS = {"hf": export_hf, "gguf": export_gguf, "safetensors": export_safetensors}
NEEDS = {"hf": ["safetensors"], "gguf": ["gguf"], "safetensors": ["safetensors"]}


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


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ExportError(message)


def main(argv=None) -> int:
    p = Parser(prog="python -m core.export", description="Export a trained run.")
    p.add_argument("target", help="a run folder or a checkpoint file")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--out", required=True, help="a new (or empty) folder")
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    try:
        args = p.parse_args(argv)
        out = export(args.target, args.format, args.out, args.checkpoint)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAIL
    print(f"Exported {args.format} to {out}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
