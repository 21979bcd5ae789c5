"""Long context on the CPU: peak memory of a LoRA fine-tune with checkpointing as the sequence
grows, and where a step's memory goes:

    python benchmarks/long_context.py [--seqs 2048,4096] [--alone 8192,16384] [--steps 3]
        [--alone-steps 2] [--threads 2] [--no-profile] [--model FOLDER]

A SmolLM2-135M-shaped model built from a LlamaConfig (hidden 576, 30 layers, 9 heads, 3 kv
heads, ffn 1536, vocabulary 49152, tied head; random weights and a 4k BPE tokenizer whose ids
it reads), LoRA r16 (alpha 32) on all seven projections, batch 1, fp32, activation
checkpointing. At each of --seqs, TrainDeck against transformers + peft with
gradient_checkpointing_enable(use_reentrant=False) (the settings and sides of
benchmarks/finetune.py --vs-peft), --steps steps each, each side in its own process; at each
of --alone, TrainDeck alone. Peak memory is the process's VmHWM from /proc (its resident
peak), measured over the plain steps. Then (unless --no-profile) one more TrainDeck step runs
under torch's profiler and the peak is split by component (core.training.memory_profile).

Each TrainDeck line names the C heap it ran on (core.platform.heap: TRAINDECK_HEAP=lean|fast,
auto by default, which picks by the estimate against the memory the process may use) and, at
the end, what the estimate (lean) and the heap a run takes on this machine hold. Peak memory
differs by heap: run once with TRAINDECK_HEAP=lean and once with fast for both figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import finetune  # noqa: E402

SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=16384,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
VOCAB = 49152
MB = 1024**2


def side_args(side: str, model: str, seq: int, tokens: str, steps: int, threads: int):
    return argparse.Namespace(
        side=side,
        mode="lora",
        model=model,
        rank=16,
        alpha=32.0,
        batch=1,
        seq=seq,
        tokens=tokens,
        steps=steps,
        threads=threads,
        checkpointing=True,
    )


def one_side(a, profile: bool) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    if a.side == "peft":
        import peft  # noqa: F401
        import transformers  # noqa: F401
    else:
        import core.training.trainer  # noqa: F401
    baseline = finetune.rss_mb() * MB
    if a.side == "peft":
        step, _, _ = finetune.peft_side(a)
    else:
        model, opt, cfg = finetune.traindeck_model(a)
        step = traindeck_step(model, opt)
    loaded = finetune.rss_mb() * MB
    data = finetune.batches(a.tokens, a.steps + (1 if profile else 0), 1, a.seq)
    times = []
    for x, y in data[: a.steps]:
        t0 = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t0)
    out = {
        "side": a.side,
        "seq": a.seq,
        "baseline_mb": baseline / MB,
        "loaded_mb": loaded / MB,
        "peak_mb": finetune.rss_mb("VmHWM"),
        "tokens_per_s": a.seq / sorted(times)[len(times) // 2],
    }
    if a.side != "peft":
        from core.platform import heap
        from core.training.estimate import estimate
        from core.training.planner import heap_line

        out["estimate"] = dict(estimate(cfg, on_gpu=False).components())
        out["heap"], out["heap_line"] = heap.in_use(), heap_line(cfg)
    if profile and a.side != "peft":
        out["profile"] = profile_parts(model, opt, step, data[-1], baseline, out["peak_mb"] * MB)
    return out


def traindeck_step(model, opt):
    import torch

    scaler = torch.amp.GradScaler("cuda", enabled=False)

    def step(x, y, phase=None):
        phase = phase or (lambda name: torch.autograd.profiler.record_function(name))
        opt.zero_grad(set_to_none=True)
        with phase("forward"):
            _, loss = model(x, y)
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            opt.step(scaler)
        return loss.item()

    return step


def profile_parts(model, opt, step, batch, baseline: float, peak: float) -> dict:
    """The measured peak by component: baseline and the static tensors before the step, the
    tensors live at the profiled step's peak, and the rest (allocator slack)."""
    from core.training import memory_profile as mp

    opt.zero_grad(set_to_none=True)
    parts = {mp.BASELINE: baseline, **mp.static_bytes(model, opt)}
    live, counted = mp.profile_step(model, lambda phase: step(*batch, phase))
    for name, size in live.items():
        parts[name] = parts.get(name, 0) + size
    parts[mp.SLACK] = peak - sum(parts.values())
    return {"parts": parts, "counted": counted}


def run_side(folder, tokens, side, seq, steps, threads, profile) -> dict:
    cmd = [sys.executable, __file__, "--one-side", side, "--model", str(folder)]
    cmd += ["--tokens", str(tokens), "--seq", str(seq), "--steps", str(steps)]
    cmd += ["--threads", str(threads)] + ([] if profile else ["--no-profile"])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"side": side, "seq": seq, "error": f"exit {out.returncode}: {tail}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_profile(r: dict) -> None:
    """The measured peak by component beside the estimate's (core.training.estimate)."""
    from core.training.memory_profile import Profile

    p = Profile(parts=r["profile"]["parts"], peak_rss=r["peak_mb"] * MB)
    est = r.get("estimate", {})
    print(f"TrainDeck at {r['seq']:,} tokens, peak {r['peak_mb']:,.0f} MB by component:")
    print(f"  {'':<22} {'measured':>12} {'':>6} {'estimate':>9}")
    for line in p.lines():
        name = line[2:24].strip()
        guess = sum(est.values()) if name == "total" else est.get(name, 0)
        print(f"{line} {guess / MB:9,.0f} MB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="2048,4096", help="against peft at these lengths")
    p.add_argument("--alone", default="8192,16384", help="TrainDeck alone at these lengths")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--alone-steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", help="a model folder of your own (with its tokenizer)")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled step")
    p.add_argument("--json", help="write every run's figures to this file")
    p.add_argument("--one-side", help=argparse.SUPPRESS)
    p.add_argument("--tokens", help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one_side:
        args = side_args(a.one_side, a.model, a.seq, a.tokens, a.steps, a.threads)
        print(json.dumps(one_side(args, not a.no_profile)))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.model) if a.model else Path(tmp) / "smollm2"
        if not a.model:
            finetune.build_model(folder, SMOLLM2_135M, VOCAB)
        tokens = Path(tmp) / "tokens.npy"
        finetune.tokenize_corpus(folder, tokens)
        print("peak = the process's VmHWM (resident peak), each side in its own process")
        runs = [(s, side, a.steps) for s in _ints(a.seqs) for side in ("td", "peft")]
        runs += [(s, "td", a.alone_steps) for s in _ints(a.alone)]
        for seq, side, steps in runs:
            r = run_side(folder, tokens, side, seq, steps, a.threads, not a.no_profile)
            results.append(r)
            print(_line(r, results), flush=True)
    for r in results:
        if "heap_line" in r:
            print(f"At {r['seq']:,} tokens: {r['heap_line']}")
    for r in results:
        if "profile" in r:
            print_profile(r)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _line(r: dict, results: list[dict]) -> str:
    name = "TrainDeck" if r["side"] == "td" else "peft"
    if "error" in r:
        return f"{name:<10} {r['seq']:>6,} tokens: failed: {r['error']}"
    line = f"{name:<10} {r['seq']:>6,} tokens: {r['tokens_per_s']:6.1f} tok/s, "
    line += f"peak {r['peak_mb']:7,.0f} MB"
    if "heap" in r:
        line += f" ({r['heap']} heap)"
    td = next((x for x in results if x["side"] == "td" and x["seq"] == r["seq"]), None)
    if r["side"] == "peft" and td and "error" not in td:
        line += f" (TrainDeck/peft: {td['peak_mb'] / r['peak_mb']:.2f}x memory, "
        line += f"{td['tokens_per_s'] / r['tokens_per_s']:.2f}x speed)"
    return line


if __name__ == "__main__":
    main()
