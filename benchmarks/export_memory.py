"""Peak memory of a GGUF export against the model's size:

    python benchmarks/export_memory.py [MODEL_OR_RUN] [--quant q4_k_m]

Without a model it saves a random Qwen2-shaped model of 100M parameters in bf16 (transformers'
own config class; needs the test extras). The export runs in this process while a thread
samples /proc/self/status (Linux): peak anonymous memory (what the export allocates) and peak
file-backed memory (the memory-mapped weights, pages the system can drop), next to the
runtime's own (an export of a tiny model) and the model's largest tensor in fp32.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PEAK = {"RssAnon": 0, "RssFile": 0}


def watch() -> None:
    while True:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in PEAK:
                    PEAK[key] = max(PEAK[key], int(line.split()[1]) * 1024)
        time.sleep(0.01)


def make_model(folder: Path) -> Path:
    import torch
    import transformers as t
    from hf_models import make_tokenizer

    tok = make_tokenizer(folder, "qwen2")
    cfg = t.Qwen2Config(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
    )
    t.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(folder)
    return folder


def export_peak(target: Path, quant: str, out: Path) -> tuple[int, int]:
    from core.use.export import export

    PEAK.update(RssAnon=0, RssFile=0)
    export(target, "gguf", out, quant=quant, log=lambda line: None)
    time.sleep(0.05)
    return PEAK["RssAnon"], PEAK["RssFile"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", nargs="?", help="a model folder or run (default: make one)")
    p.add_argument("--quant", default="q4_k_m")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="export-memory-"))
    target = Path(args.target) if args.target else make_model(tmp / "model")
    threading.Thread(target=watch, daemon=True).start()
    from hf_models import make_model as tiny

    tiny(tmp / "tiny", "qwen2")
    runtime, _ = export_peak(tmp / "tiny", args.quant, tmp / "tiny-out")
    anon, mapped = export_peak(target, args.quant, tmp / "out")
    from core.weights.loader import open_pretrained, read_weights

    weights = read_weights(open_pretrained(str(target)).folder, mapped=True)
    size = sum(w.numel() * w.element_size() for w in weights.values())
    largest = max(w.numel() for w in weights.values()) * 4
    mb = 1e6
    print(f"model files {size / mb:,.0f} MB; largest tensor in fp32 {largest / mb:,.0f} MB")
    print(f"runtime (a tiny model's export): {runtime / mb:,.0f} MB anonymous")
    print(
        f"export: {anon / mb:,.0f} MB anonymous peak ({(anon - runtime) / mb:,.0f} MB over "
        f"the runtime, {(anon - runtime) / largest:.2f} x the largest tensor); "
        f"{mapped / mb:,.0f} MB file-backed peak"
    )


if __name__ == "__main__":
    main()
