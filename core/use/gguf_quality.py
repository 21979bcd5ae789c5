"""What a quantized GGUF costs in quality: the file is read back with the gguf package, every
tensor dequantized by gguf's own code and put back into the model, and the perplexity of that
model on the run's validation text is set beside the unquantized model's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from core.data.windows import TokenData
from core.errors import UserError
from core.models import lora
from core.use.gguf_export import fp32_model, gguf_back, gguf_origins, unpermute
from core.weights import families
from core.weights.loader import Loaded

TOKENS = 8192  # at most this many validation tokens: a measure, not a benchmark
MAX_PARAMS = 500_000_000  # above this the check (two fp32 copies on the CPU) is left out


def validation_windows(loaded: Loaded, tokens_wanted: int = TOKENS):
    """(x, y, mask, segments) batches of the run's held-out windows, read from its data cache
    as training reads them; None when the model is not a run or its cache is gone."""
    run = loaded.checkpoint.parent.parent
    try:
        cache = Path(json.loads((run / "data.json").read_text(encoding="utf-8"))["cache"])
        manifest = json.loads((cache / "manifest.json").read_text(encoding="utf-8"))
        data = TokenData(cache, manifest, loaded.model.config.seq_len, 0)
    except (OSError, KeyError, ValueError, UserError):
        return None
    return list(data.val_batches(max(1, tokens_wanted // (data.seq_len + 1)), 1)) or None


@torch.no_grad()
def perplexity(model, windows) -> float:
    model.eval()
    total = weight = 0.0
    for x, y, mask, segments in windows:
        _, loss = model(x, y, mask, segments)
        w = float(mask.sum()) if mask is not None else float(y.numel())
        total, weight = total + float(loss) * w, weight + w
    return math.exp(total / max(weight, 1e-9))


def dequantized_model(loaded: Loaded, path: Path):
    """A copy of the model whose weights are the GGUF file's, as gguf dequantizes them."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    origins = gguf_origins(loaded)
    c, family = loaded.model.config, loaded.family
    ours, hf, experts = {}, {}, {}
    for t in reader.tensors:
        if t.name not in origins:  # derived tensors (zero biases, rope factors)
            continue
        kind, name, detail = origins[t.name]
        shape = tuple(int(d) for d in reversed(t.shape))
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        tensor = torch.from_numpy(np.array(values, dtype=np.float32))
        if kind == "expert":  # detail: its half of our gate/up (None: the whole tensor)
            experts.setdefault(name, {})[detail] = gguf_back(loaded, t.name, tensor)
            continue
        tensor = gguf_back(loaded, t.name, unpermute(tensor, detail))
        (ours if kind == "ours" else hf)[name] = tensor
    for name, parts in experts.items():
        ours[name] = parts[None] if None in parts else torch.cat((parts[0], parts[1]), dim=1)
    model = fp32_model(loaded.model)
    lora.merge(model)  # the file's weights have the adapters in them
    if hf:
        wanted = set(model.state_dict()) - set(ours)
        ours.update(families.import_weights(family, c, hf, wanted))
    model.load_state_dict(ours, strict=False)
    return model


def quality_line(loaded: Loaded, path: Path, quant: str) -> str:
    """'q4_k_m: 1.1 MB; perplexity 12.41 on the run's validation text (f32 12.30, +0.9%)'."""
    size = f"{quant}: {path.stat().st_size / 1e6:,.2f} MB"
    windows = validation_windows(loaded)
    if windows is None:
        return f"{size} (no validation text: perplexity is measured for runs)"
    n = loaded.model.num_params()
    if n > MAX_PARAMS:
        return f"{size} (perplexity not measured: {n:,} parameters, over {MAX_PARAMS:,})"
    plain = perplexity(fp32_model(loaded.model), windows)
    quantized = perplexity(dequantized_model(loaded, path), windows)
    change = 100 * (quantized / plain - 1)
    return (
        f"{size}; perplexity {quantized:.3f} on the run's validation text "
        f"(unquantized {plain:.3f}, {change:+.2f}%)"
    )


def model_shape(target: str | Path, which: str = "best"):
    """The GPTConfig of a run, checkpoint or model folder without reading its weights."""
    from core.models.model import GPTConfig
    from core.runs import checkpoint as ckpt
    from core.weights.loader import checkpoint_path, pretrained_shape

    path = Path(target)
    if path.is_dir() and (path / "config.json").is_file() and not (path / "checkpoints").is_dir():
        return pretrained_shape(path)
    state = ckpt.load(checkpoint_path(path, which), mmap=True)
    return GPTConfig.from_dict(state["model_config"])


def predicted_bytes(shape, quant: str) -> int:
    """About the size of a GGUF of this model at quant: each matrix in the mix's main type,
    vectors in f32 (the mix's few Q6_K tensors make the real file a little larger)."""
    import gguf

    from core.models.params import meta_model
    from core.use import gguf_quants as gq

    main = gq.DEFAULT_TYPE[quant]
    total = 0
    for p in meta_model(shape).parameters():
        dims = tuple(p.shape)
        if len(dims) < 2:  # vectors; matrices and stacked experts ([E, rows, cols]) below
            total += 4 * p.numel()
            continue
        first = gq.EXPERT_TYPE.get(quant, main) if len(dims) == 3 else main
        for qtype in (first, gq.FALLBACK.get(first, first), gguf.GGMLQuantizationType.F16):
            if dims[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0:
                total += gq.expected_bytes(dims, qtype)
                break
    return total
