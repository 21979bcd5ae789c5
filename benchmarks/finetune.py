"""Fine-tuning throughput on a small Llama-shaped model:

    python benchmarks/finetune.py [--steps N] [--modes full] [--threads T]

Builds a random Llama (transformers' LlamaConfig: GQA, SwiGLU, RoPE; about 16M parameters
with a 4096-token BPE) in a temporary folder, then fine-tunes it with --init-from on the
embedded corpus, one mode at a time in a fresh process so each peak RSS is its own. Prints
tokens/s (training time only), ms per optimizer step, peak RSS and the estimate's figures.
Needs the test extras (transformers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE = dict(
    hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
    num_key_value_heads=2, max_position_embeddings=1024,
)  # fmt: skip


def build_model(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from core.data.prepare import _read_blocks
    from core.data.sources import _stdlib_files
    from core.data.tokenizer import train_bpe

    text = b"".join(_read_blocks(_stdlib_files(), 2_000_000))
    hf = train_bpe([text], 4096).hf
    hf.add_special_tokens(["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token="<|endoftext|>")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), eos_token_id=tok.eos_token_id, **SHAPE)
    LlamaForCausalLM(cfg).save_pretrained(folder)


def one(mode: str, model: str, steps: int, threads: int) -> dict:
    import torch

    from core.config.spec import TrainConfig, validate
    from core.runs.events import TrainEvents
    from core.training.estimate import estimate
    from core.training.trainer import Trainer

    torch.set_num_threads(threads)
    cfg = TrainConfig(
        init_from=model, batch_size=4, grad_accum=1, seq_len=256, max_steps=steps,
        log_every=1, eval_every=10**9, ckpt_every=10**9, keep_checkpoints=0, device="cpu",
        precision="fp32", sample_tokens=0, warmup_steps=2, lr=3e-4, dropout=0.0,
        corpus_max_bytes=2_000_000, tokenizer="model",
    )  # fmt: skip
    extra = {} if mode == "full" else {"lora_rank": int(mode.removeprefix("lora"))}
    cfg = validate(dataclasses.replace(cfg, **extra))
    est = estimate(cfg, on_gpu=False)  # the shape comes from the model's config.json

    class Collect(TrainEvents):
        def __init__(self):
            self.records = []

        def on_train_batch_end(self, record):
            self.records.append(record)

    events = Collect()
    with tempfile.TemporaryDirectory() as tmp:
        Trainer(cfg, f"{tmp}/run").run(events)
    steady = events.records[len(events.records) // 2 :]
    tok_s = sorted(r["tokens_per_s"] for r in steady)[len(steady) // 2]
    return {
        "mode": mode,
        "params": est.n_params,
        "tokens_per_s": tok_s,
        "ms_per_step": cfg.tokens_per_step / tok_s * 1000,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "estimate_mb": est.allocator_peak / 2**20,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--modes", default="full", help="comma separated: full, lora8, ...")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.model, args.steps, args.threads)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        t0 = time.perf_counter()
        build_model(folder)
        print(f"model: Llama {SHAPE} built in {time.perf_counter() - t0:.1f} s")
        print(
            f"{'mode':<8} {'params':>12} {'tok/s':>9} {'ms/step':>9} {'peak RSS':>10} "
            f"{'estimate':>10}"
        )
        for mode in args.modes.split(","):
            out = subprocess.run(
                [sys.executable, __file__, "--one", mode, "--model", str(folder),
                 "--steps", str(args.steps), "--threads", str(args.threads)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{r['mode']:<8} {r['params']:>12,} {r['tokens_per_s']:>9,.0f} "
                f"{r['ms_per_step']:>9.1f} {r['peak_rss_mb']:>7,.0f} MB "
                f"{r['estimate_mb']:>7,.0f} MB"
            )


if __name__ == "__main__":
    main()
