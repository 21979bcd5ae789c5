"""Fine-tuning throughput on a small Llama-shaped model:

    python benchmarks/finetune.py [--steps N] [--modes full] [--threads T]

Builds a random Llama (transformers' LlamaConfig: GQA, SwiGLU, RoPE; about 16M parameters
with a 4096-token BPE) in a temporary folder, then fine-tunes it with --init-from on the
embedded corpus, one mode at a time in a fresh process so each peak RSS is its own. Prints
tokens/s (training time only), ms per optimizer step, peak RSS and the estimate's figures.
Needs the test extras (transformers).

Against transformers + peft (the same model folder, token batches, rank, targets, alpha,
dropout 0, batch, sequence, fp32 and threads; each side in a fresh process, alternating rounds,
medians; only the training step is timed, warm-up steps excluded):

    python benchmarks/finetune.py --vs-peft [--shape small|100m] [--model FOLDER]
        [--modes full,lora,lora-eq,qlora,lora16] [--rounds 3] [--steps 6] [--losses]

Modes: full; lora (32-bit base, the same rank: TrainDeck's adapters on the fused q/k/v and
gate/up layers hold fewer parameters than peft's separate ones); lora-eq (TrainDeck's rank
raised to about peft's trainable parameter count); qlora (a 4-bit NF4 base through
bitsandbytes on both sides); lora16 (a 16-bit base: memory after loading only, since 16-bit
matrix products are a few hundred times slower than fp32 on a CPU without AMX). TrainDeck runs
each with its chunked loss (td) and with plain cross-entropy over the whole logits (td-plain).
After the table: each side's rate of matrix-product work (GFLOP/s from the model's shape) as a
share of this CPU's own fp32 product rate, the ceiling any step could reach.
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
    hidden_size=384,
    intermediate_size=1024,
    num_hidden_layers=6,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)
# About 115M parameters, two thirds of them in the 50k-vocabulary embedding and head: the
# weights and the logits dominate memory, as in a small real model.
SHAPE_100M = dict(
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=6,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)
SHAPES = {"small": (SHAPE, None), "100m": (SHAPE_100M, 50304)}


def build_model(folder: Path, shape: dict = SHAPE, vocab: int | None = None) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from core.data.build_text import read_blocks as _read_blocks
    from core.data.sources import _stdlib_files
    from core.data.tokenizer import train_bpe

    text = b"".join(_read_blocks(_stdlib_files(), 2_000_000))
    hf = train_bpe([text], 4096).hf
    hf.add_special_tokens(["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token="<|endoftext|>")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab or len(tok), eos_token_id=tok.eos_token_id, **shape)
    LlamaForCausalLM(cfg).save_pretrained(folder)


def one(mode: str, model: str, steps: int, threads: int) -> dict:
    import torch

    from core.config.spec import TrainConfig, validate
    from core.runs.events import TrainEvents
    from core.training.estimate import estimate
    from core.training.trainer import Trainer

    torch.set_num_threads(threads)
    cfg = TrainConfig(
        init_from=model,
        batch_size=4,
        grad_accum=1,
        seq_len=256,
        max_steps=steps,
        log_every=1,
        eval_every=10**9,
        ckpt_every=10**9,
        keep_checkpoints=0,
        device="cpu",
        precision="fp32",
        sample_tokens=0,
        warmup_steps=2,
        lr=3e-4,
        dropout=0.0,
        corpus_max_bytes=2_000_000,
        tokenizer="model",
    )
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
        "peak_rss_mb": rss_mb("VmHWM"),
        "estimate_mb": est.allocator_peak / 2**20,
    }


# ---- against transformers + peft -------------------------------------------------------------

PEFT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory now (VmRSS) or at its peak (VmHWM). Not ru_maxrss:
    Linux carries that over exec from the parent, whose own RSS would floor every figure."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def batches(tokens_file: str, n: int, batch: int, seq: int):
    """n (inputs, targets) batches of windows at seeded positions: the same on both sides."""
    import numpy as np
    import torch

    ids = np.load(tokens_file)
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        starts = rng.integers(0, len(ids) - seq - 1, size=batch)
        w = torch.from_numpy(np.stack([ids[s : s + seq + 1] for s in starts]).astype(np.int64))
        out.append((w[:, :-1].contiguous(), w[:, 1:].contiguous()))
    return out


def traindeck_model(a) -> tuple:
    """TrainDeck's (model, optimizer, config) as a run builds them. a.checkpointing (where
    set): activation checkpointing."""
    import torch

    from core.config.spec import TrainConfig, validate
    from core.training import inputs, optim, planner
    from core.weights.loader import apply_pretrained, open_pretrained

    lora = a.mode != "full"
    extra = (
        {"lora_rank": a.rank, "lora_alpha": a.alpha, "lora_dropout": 0.0, "lora_targets": "all"}
        if lora
        else {}
    )
    bits = {"qlora": "4", "lora16": "16"}.get(a.mode, "32" if lora else "auto")
    cfg = TrainConfig(
        init_from=a.model,
        batch_size=a.batch,
        grad_accum=1,
        seq_len=a.seq,
        device="cpu",
        precision="fp32",
        lr=1e-4,
        dropout=0.0,
        tokenizer="model",
        base_bits=bits,
        grad_checkpointing=getattr(a, "checkpointing", False),
        **extra,
    )
    pre = open_pretrained(a.model)
    cfg = validate(apply_pretrained(validate(cfg), pre))
    # the heap, as a run's setup sets it
    inputs.set_switches(cfg, torch.device("cpu"), planner.heap_choice(cfg).lean)
    torch.manual_seed(0)
    model = inputs.build_model(cfg, pre, torch.device("cpu"), "fp32", lambda m: None)
    model.train()
    return model, optim.make(model, cfg), cfg


def traindeck_side(a) -> tuple:
    """TrainDeck's model and optimizer as a run builds them; step(x, y) -> loss."""
    import torch
    import torch.nn.functional as F

    from core.models.lora import trainable_params

    model, opt, cfg = traindeck_model(a)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    plain = a.side == "td-plain"

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        if plain:
            logits, _ = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        else:
            _, loss = model(x, y)
        loss.backward()
        opt.step(scaler)
        return loss.item()

    return step, trainable_params(model), cfg.weight_decay


def peft_side(a) -> tuple:
    """transformers' model (+ peft adapters on every projection), fused AdamW, plain loss."""
    import torch
    from transformers import AutoModelForCausalLM

    kw = {"torch_dtype": torch.bfloat16 if a.mode == "lora16" else torch.float32}
    if a.mode == "qlora":
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32,
        )
        kw["device_map"] = "cpu"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, **kw)
    if a.mode != "full":
        from peft import LoraConfig, get_peft_model

        lc = LoraConfig(
            r=a.rank,
            lora_alpha=a.alpha,
            lora_dropout=0.0,
            bias="none",
            target_modules=PEFT_TARGETS,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lc)
    if getattr(a, "checkpointing", False):
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=1e-4, fused=True)

    return hf_step(model, opt), sum(p.numel() for p in params), 0.1


def hf_step(model, opt):
    """One optimizer step of a transformers model on (x, y), loss in fp32: the peers' side
    here and in moe.py."""
    import torch.nn.functional as F

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return step


def start_side(traindeck: bool, threads: int) -> None:
    """A side's process before its model: TrainDeck's flushes denormals first, as its CLI
    does; each imports what it runs with (counted on its side, as a user's script has them)."""
    import torch

    if traindeck:
        from core.platform.device import flush_denormals

        flush_denormals()
    torch.set_num_threads(threads)
    if traindeck:
        import core.training.trainer  # noqa: F401
    else:
        import peft  # noqa: F401
        import transformers  # noqa: F401


def one_side(a) -> dict:
    start_side(a.side != "peft", a.threads)
    imports_mb = rss_mb()
    step, trainable, wd = (peft_side if a.side == "peft" else traindeck_side)(a)
    loaded_mb = rss_mb()
    out = {
        "side": a.side,
        "mode": a.mode,
        "rank": a.rank,
        "trainable": trainable,
        "imports_mb": imports_mb,
        "loaded_mb": loaded_mb,
        "weight_decay": wd,
    }
    if a.mode == "lora16":  # 16-bit products on this CPU: far too slow to time
        out["peak_rss_mb"] = rss_mb("VmHWM")
        return out
    times, cpu, losses = [], [], []
    for i, (x, y) in enumerate(batches(a.tokens, a.warmup + a.steps, a.batch, a.seq)):
        if a.profile and i == a.warmup:
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU]).__enter__()
        t0, c0 = time.perf_counter(), time.process_time()
        losses.append(step(x, y))
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    if a.profile:
        prof.__exit__(None, None, None)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.profile)
        print(table, file=sys.stderr)
    ms = sorted(times)[len(times) // 2] * 1000
    # CPU seconds of the process: less moved than wall time by other jobs on a shared machine
    cpu_ms = sorted(cpu)[len(cpu) // 2] * 1000
    out.update(tokens_per_cpu_s=a.batch * a.seq / cpu_ms * 1000)
    out.update(
        tokens_per_s=a.batch * a.seq / ms * 1000,
        ms_per_step=ms,
        losses=losses,
        peak_rss_mb=rss_mb("VmHWM"),
    )
    return out


def adapter_counts(folder: Path) -> tuple[int, int]:
    """Trainable parameters per unit of rank: (TrainDeck's fused targets, peft's separate)."""
    c = json.loads((folder / "config.json").read_text())
    h, f, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c.get("num_key_value_heads", 1) * hd
    fused = (h + q + 2 * kv) + (q + h) + (h + 2 * f) + (f + h)
    separate = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + f) + (f + h)
    return n * fused, n * separate


def tokenize_corpus(folder: Path, out: Path) -> None:
    import numpy as np
    from transformers import AutoTokenizer

    from core.data.build_text import read_blocks as _read_blocks
    from core.data.sources import _stdlib_files

    text = b"".join(_read_blocks(_stdlib_files(), 1_000_000)).decode("utf-8", "replace")
    ids = AutoTokenizer.from_pretrained(folder)(text)["input_ids"]
    np.save(out, np.asarray(ids, dtype=np.int64))


def side_run(a, folder: Path, tokens: Path, side: str, mode: str, rank: int) -> dict:
    script = __file__
    if side.endswith("-before"):  # the same benchmark on another checkout's code
        script, side = str(Path(a.before) / "benchmarks" / "finetune.py"), side[: -len("-before")]
    cmd = [
        sys.executable,
        script,
        "--one-side",
        side,
        "--mode",
        mode,
        "--model",
        str(folder),
        "--tokens",
        str(tokens),
        "--rank",
        str(rank),
        "--alpha",
        str(a.alpha),
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
        "--threads",
        str(a.threads),
        "--batch",
        str(a.batch),
        "--seq",
        str(a.seq),
    ]
    if a.profile:
        cmd += ["--profile", str(a.profile)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if a.profile:
        print(f"profile of {side} {mode} (rank {rank}):\n{out.stderr}")
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"side": side, "mode": mode, "rank": rank, "error": tail}
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    values = sorted(values)
    return (
        values[len(values) // 2] if len(values) % 2 else sum(values[len(values) // 2 - 1 :][:2]) / 2
    )


def vs_peft(a) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if a.model:
            folder = Path(a.model)
        else:
            folder = Path(tmp) / "llama"
            shape, vocab = SHAPES[a.shape]
            build_model(folder, shape, vocab)
        tokens = Path(tmp) / "tokens.npy"
        tokenize_corpus(folder, tokens)
        fused, separate = adapter_counts(folder)
        rank_eq = max(1, round(a.rank * separate / fused))
        print(
            f"model: {folder if a.model else a.shape}; batch {a.batch} x seq {a.seq}, fp32, "
            f"{a.threads} threads; {a.steps} timed steps after {a.warmup}, {a.rounds} "
            f"rounds; LoRA rank {a.rank} alpha {a.alpha} on all projections; lora-eq: "
            f"TrainDeck rank {rank_eq} ({fused * rank_eq:,} vs peft's {separate * a.rank:,} "
            f"trainable)"
        )
        plan = []
        for mode in a.modes.split(","):
            sides = ["td", "td-plain"] if mode == "lora-eq" else ["td", "td-plain", "peft"]
            if a.before and mode != "lora-eq":
                sides.insert(1, "td-before")
            if mode == "lora16":
                sides = ["td", "peft"]
            plan += [(mode, s) for s in sides]
        results: dict = {key: [] for key in plan}
        for r in range(a.rounds):
            for mode, side in plan if r % 2 == 0 else plan[::-1]:
                run_mode = "lora" if mode == "lora-eq" else mode
                rank = rank_eq if mode == "lora-eq" else a.rank
                res = side_run(a, folder, tokens, side, run_mode, rank)
                results[(mode, side)].append(res)
                print(
                    f"  round {r + 1} {mode:<8} {side:<8} "
                    + (
                        res.get("error")
                        or f"{res.get('tokens_per_s', 0):7.0f} tok/s {res['peak_rss_mb']:6.0f} MB"
                    ),
                    flush=True,
                )
        print_table(results, a)
        print_rates(results, a, folder)


def summary(runs: list[dict]) -> dict | None:
    good = [r for r in runs if "error" not in r]
    if not good:
        return None
    out = {
        "trainable": good[0]["trainable"],
        "rank": good[0]["rank"],
        "rss": median([r["peak_rss_mb"] for r in good]),
        "loaded": median([r["loaded_mb"] for r in good]),
    }
    if "tokens_per_s" in good[0]:
        speeds = [r["tokens_per_s"] for r in good]
        out.update(tps=median(speeds), lo=min(speeds), hi=max(speeds), losses=good[0]["losses"])
        out["cpu"] = median([r["tokens_per_cpu_s"] for r in good])
    return out


def matmul_peak(threads: int) -> float:
    """This CPU's fp32 matrix-product rate in GFLOP/s at threads (2048-square products, the
    best of 5 timings of 4): what a step made of products could reach at most."""
    import torch

    torch.set_num_threads(threads)
    x, y = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(4):
            x @ y
        best = min(best, time.perf_counter() - t0)
    return 4 * 2 * 2048**3 / best / 1e9


def step_flops_per_token(folder: Path, mode: str, seq: int) -> float:
    """Matrix-product FLOPs a training token costs: the blocks' linears, the head, attention
    (causal: half the T x T products). The backward of a frozen weight makes only its input's
    gradient (one product, LoRA and QLoRA), a trained one two (full); adapters are ignored.
    Not core's flops_per_token: that is the MFU convention (6N over all weights, embedding
    included, whole T x T attention), which counts work a frozen or gathered weight never does."""
    c = json.loads((folder / "config.json").read_text())
    h, f, n, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c.get("num_key_value_heads", 1) * hd
    linears = n * (h * (q + 2 * kv) + q * h + 3 * h * f) + h * v
    attention = n * 2 * seq * q  # QK^T and AV over half the window, 2 FLOPs a multiply-add
    backward = 2 if mode == "full" else 1
    return 2 * linears * (1 + backward) + 3 * attention


def print_rates(results: dict, a, folder: Path) -> None:
    """Each side's matrix-product rate against the CPU's: how far a faster step could go."""
    peak = matmul_peak(a.threads)
    print(f"\nthis CPU's fp32 matrix products at {a.threads} threads: {peak:,.0f} GFLOP/s")
    for (mode, side), runs in results.items():
        s = summary(runs)
        if s is None or "tps" not in s or mode == "lora-eq":
            continue
        rate = step_flops_per_token(folder, mode, a.seq) * s["tps"] / 1e9
        print(
            f"{mode:<8} {side:<9} {rate:7,.0f} GFLOP/s of products = {rate / peak:4.0%} "
            f"of the CPU's"
        )


def print_table(results: dict, a) -> None:
    print(
        f"\n{'mode':<8} {'side':<9} {'rank':>4} {'trainable':>11} {'tok/s (min-max)':>20} "
        f"{'peak RSS':>9} {'x peft tok/s':>12} {'x peft RSS':>10} {'tok/CPU-s':>9} "
        f"{'x peft':>6}"
    )
    for (mode, side), runs in results.items():
        s = summary(runs)
        if s is None:
            print(f"{mode:<8} {side:<9} failed: {runs[0]['error']}")
            continue
        ref = summary(results.get(("lora" if mode == "lora-eq" else mode, "peft"), []))
        speed = f"{s['tps']:6.0f} ({s['lo']:.0f}-{s['hi']:.0f})" if "tps" in s else "not timed"
        ratio = f"{s['tps'] / ref['tps']:.2f}" if ref and "tps" in s and "tps" in ref else "-"
        mem = f"{s['rss'] / ref['rss']:.2f}" if ref else "-"
        timed = ref and "cpu" in s and "cpu" in ref
        cpu = f"{s['cpu']:9.0f} {s['cpu'] / ref['cpu']:6.2f}" if timed else ""
        print(
            f"{mode:<8} {side:<9} {s['rank']:>4} {s['trainable']:>11,} {speed:>20} "
            f"{s['rss']:>6,.0f} MB {ratio:>12} {mem:>10} {cpu}"
        )
    if a.losses:
        print("\nlosses of round 1 (same seed and batches):")
        for (mode, side), runs in results.items():
            s = summary(runs)
            if s and "losses" in s:
                print(f"{mode:<8} {side:<9} " + " ".join(f"{v:.4f}" for v in s["losses"]))
    if a.json:
        Path(a.json).write_text(json.dumps({f"{m}/{s}": r for (m, s), r in results.items()}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--modes", default="full", help="comma separated: full, lora8, ...")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--model", help="--vs-peft: a model folder of your own instead of --shape")
    p.add_argument("--vs-peft", action="store_true", help="against transformers + peft")
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--losses", action="store_true", help="print each side's loss per step")
    p.add_argument("--profile", type=int, default=0, help="print each side's top N ops")
    p.add_argument("--before", help="a checkout of older TrainDeck code to run as td-before")
    p.add_argument("--json", help="write every run's figures to this file")
    p.add_argument("--one-side", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--tokens", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_side:
        args.side = args.one_side
        print(json.dumps(one_side(args)))
        return
    if args.vs_peft:
        if args.modes == "full" and "--modes" not in sys.argv:
            args.modes = "full,lora,lora-eq,qlora"
        vs_peft(args)
        return
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
                [
                    sys.executable,
                    __file__,
                    "--one",
                    mode,
                    "--model",
                    str(folder),
                    "--steps",
                    str(args.steps),
                    "--threads",
                    str(args.threads),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{r['mode']:<8} {r['params']:>12,} {r['tokens_per_s']:>9,.0f} "
                f"{r['ms_per_step']:>9.1f} {r['peak_rss_mb']:>7,.0f} MB "
                f"{r['estimate_mb']:>7,.0f} MB"
            )


if __name__ == "__main__":
    main()
