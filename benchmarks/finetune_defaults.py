"""Which learning rate should a fine-tune use when the user sets none? Measured here:

    python benchmarks/finetune_defaults.py [--steps N] [--base-steps N]

Trains a small Llama-shaped model (hidden 256, 4 layers, BPE 2048) on the embedded corpus
(Python code), exports it as a Hugging Face folder, then fine-tunes it with --init-from on
another text (Python's own documentation prose, pydoc_data/topics.py, which the embedded
corpus leaves out) at several learning rates, full and LoRA (rank 16). For each it prints the
new text's validation loss before and after (what the fine-tune is for) and the first text's
loss before and after (how much it forgot).
"""

from __future__ import annotations

import argparse
import math
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.config.spec import TrainConfig, validate  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.gguf_quality import perplexity, validation_windows  # noqa: E402
from core.weights.loader import load  # noqa: E402

LRS = {
    "full": [1e-5, 2e-5, 5e-5, 1e-4, 3e-4, 1e-3],
    "lora": [5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 3e-3],
}
COMMON = dict(
    seq_len=128,
    batch_size=8,
    grad_accum=1,
    device="cpu",
    precision="fp32",
    sample_tokens=0,
    dropout=0.0,
)


def base_model(tmp: Path, steps: int) -> tuple[Path, Path]:
    cfg = validate(
        TrainConfig(
            hidden_dim=256,
            n_layers=4,
            n_heads=4,
            tokenizer="bpe",
            vocab_size=2048,
            max_steps=steps,
            eval_every=steps,
            ckpt_every=steps,
            corpus_max_bytes=2_000_000,
            **COMMON,
        )
    )
    Trainer(cfg, tmp / "base-run").run()
    return tmp / "base-run", export(tmp / "base-run", "hf", tmp / "base-hf", log=lambda m: None)


def fine_tune(tmp: Path, hf: Path, data: Path, mode: str, lr: float, steps: int) -> Path:
    run = tmp / f"{mode}-{lr:g}"
    cfg = validate(
        TrainConfig(
            init_from=str(hf),
            tokenizer="model",
            data=str(data),
            lr=lr,
            lora_rank=16 if mode == "lora" else 0,
            max_steps=steps,
            warmup_steps=max(1, steps // 10),
            eval_every=steps,
            ckpt_every=steps,
            **COMMON,
        )
    )
    Trainer(cfg, run).run()
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="fine-tuning steps")
    p.add_argument("--base-steps", type=int, default=600)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="finetune-defaults-"))
    data = tmp / "docs.txt"
    topics = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    data.write_text(topics.read_text(encoding="utf-8"), encoding="utf-8")
    base_run, hf = base_model(tmp, args.base_steps)
    old = validation_windows(load(base_run))
    old_before = math.log(perplexity(load(hf).model, old))
    print(f"base: {args.base_steps} steps on code; its code loss {old_before:.4f}")
    print("| mode | lr | docs loss before | docs loss after | code loss after | code rise |")
    print("|---|---|---|---|---|---|")
    for mode, lrs in LRS.items():
        for lr in lrs:
            run = fine_tune(tmp, hf, data, mode, lr, args.steps)
            evals = read_metrics(run / "metrics.jsonl")[1]
            old_after = math.log(perplexity(load(run).model, old))
            print(
                f"| {mode} | {lr:g} | {evals[0]['val_loss']:.4f} | {evals[-1]['val_loss']:.4f} "
                f"| {old_after:.4f} | {old_after - old_before:+.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
