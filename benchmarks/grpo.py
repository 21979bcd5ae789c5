"""GRPO side by side on the CPU: TRL's GRPOTrainer and TrainDeck on the same task, model and
settings, over several seeds. Prints the mean reward per step, seconds per step, seconds per
generated token, and where a step's time goes (generation, scoring, the loss's forward and
backward with the optimizer step).

The task: the arithmetic prompts that ship with the tests (tests/fixtures/arithmetic.jsonl),
rewarded when the completion starts with a number (a verifiable format a tiny random model
can learn in a few steps). The model: a tiny random Qwen2 built with transformers' own
config class (tests/hf_models.py). Pinned on both sides: beta 0, G, the completion length,
the loss type (dapo), the reward scaling (group), temperature 1, top-p 1, lr, AdamW betas,
no weight decay, grad clip 1, a cosine schedule to 0 without warmup, full fine-tuning, fp32.
TRL's batch counts completions: its per_device_train_batch_size is TrainDeck's batch_size x G.

    pip install -e .[benchmark]
    python benchmarks/grpo.py [--steps 20] [--seeds 3] [--generations 8] [--batch 4]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
DATA = ROOT / "tests" / "fixtures" / "arithmetic.jsonl"
PATTERN = r"^\s*\d"


def starts_with_a_number(completions, **kwargs):
    """The reward, as a TRL reward function (TrainDeck calls it the same way)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if re.search(PATTERN, t) else 0.0 for t in texts]


class Timer:
    """Seconds spent inside wrapped functions, by label."""

    def __init__(self):
        self.seconds = defaultdict(float)

    def wrap(self, owner, name: str, label: str):
        real = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, real)


def run_trl(model_dir: Path, args, seed: int, out: Path) -> dict:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    dataset = datasets.Dataset.from_list(rows)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype="float32")
    config = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        seed=seed,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch * args.generations,
        num_generations=args.generations,
        max_completion_length=args.completion,
        gradient_accumulation_steps=1,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        temperature=1.0,
        top_p=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=starts_with_a_number,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
    )
    timer = Timer()
    undo = [
        timer.wrap(trainer, "training_step", "step"),  # sampling, scoring, loss, backward
        timer.wrap(trainer, "_generate", "generation"),
        timer.wrap(trainer, "_calculate_rewards", "scoring"),
    ]
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    for u in undo:
        u()
    logs = [r for r in trainer.state.log_history if "reward" in r]
    tokens = sum(r["completions/mean_length"] * args.batch * args.generations for r in logs)
    return {"rewards": [r["reward"] for r in logs], "wall": wall, "tokens": tokens, **timer.seconds}


def run_traindeck(model_dir: Path, args, seed: int, out: Path) -> dict:
    from helpers import tiny_config

    from core.training import grpo, rewards
    from core.training.trainer import Trainer

    reward_file = out.parent / "bench_rewards.py"
    reward_file.write_text(
        "import re\n"
        f"def starts_with_a_number(completions, **kwargs):\n"
        f"    texts = [c[0]['content'] if isinstance(c, list) else c for c in completions]\n"
        f"    return [1.0 if re.search({PATTERN!r}, t) else 0.0 for t in texts]\n"
    )
    cfg = tiny_config(
        init_from=str(model_dir),
        tokenizer="model",
        data=str(DATA),
        method="grpo",
        reward=[f"{reward_file}:starts_with_a_number"],
        num_generations=args.generations,
        max_completion_tokens=args.completion,
        seq_len=64,
        batch_size=args.batch,
        grad_accum=1,
        lr=args.lr,
        schedule="cosine",
        min_lr_ratio=0.0,
        warmup_steps=0,
        weight_decay=0.0,
        beta1=0.9,
        beta2=0.999,
        grad_clip=1.0,
        grpo_beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        temperature=1.0,
        top_p=1.0,
        dropout=0.0,
        seed=seed,
        max_steps=args.steps,
        eval_every=10**6,
        ckpt_every=10**6,
        sample_tokens=0,
        log_every=1,
        optimizer="adamw",
    )
    timer = Timer()
    trainer = Trainer(cfg, out)
    undo = [
        timer.wrap(grpo, "sample", "generation"),
        timer.wrap(rewards.Rewards, "score", "scoring"),
        timer.wrap(trainer, "_step_with_oom_recovery", "step"),
    ]
    start = time.perf_counter()
    trainer.run()
    wall = time.perf_counter() - start
    for u in undo:
        u()
    from core.runs.folder import read_metrics

    train, evals = read_metrics(out / "metrics.jsonl")
    tokens = sum(r["completions/mean_length"] * args.batch * args.generations for r in train)
    return {
        "rewards": [r["reward"] for r in train],
        "wall": wall,
        "tokens": tokens,
        **timer.seconds,
    }


def summary(name: str, runs: list[dict], steps: int, completions: int) -> dict:
    per_step = [statistics.mean(r["rewards"][i] for r in runs) for i in range(steps)]
    spread = [statistics.pstdev(r["rewards"][i] for r in runs) for i in range(steps)]
    # Time in the steps: both sides' setup and TrainDeck's evaluation of the base model are
    # left out; TRL's optimizer step runs outside its training_step (for this tiny model a
    # negligible share), TrainDeck's inside its step.
    wall = statistics.mean(r.get("step", r["wall"]) for r in runs)
    gen = statistics.mean(r.get("generation", 0.0) for r in runs)
    score = statistics.mean(r.get("scoring", 0.0) for r in runs)
    tokens = statistics.mean(r["tokens"] for r in runs)
    return {
        "name": name,
        "reward": per_step,
        "spread": spread,
        "s_step": wall / steps,
        "s_token": wall / max(tokens, 1),
        "gen": gen / steps,
        "score": score / steps,
        "rest": (wall - gen - score) / steps,
        "completions": completions,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--batch", type=int, default=4, help="prompts a step")
    p.add_argument("--completion", type=int, default=6, help="max completion tokens")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--only", choices=("trl", "traindeck"))
    args = p.parse_args()
    import torch
    from hf_models import make_model

    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_model(tmp / "model", "qwen2")
        sides = [
            (n, f)
            for n, f in (("TRL", run_trl), ("TrainDeck", run_traindeck))
            if not args.only or args.only == n.lower()
        ]
        runs = defaultdict(list)
        for seed in range(args.seeds):  # interleaved: a shared machine's load hits both alike
            for name, run in sides:
                runs[name].append(run(tmp / "model", args, seed, tmp / f"{name}-{seed}"))
        completions = args.batch * args.generations
        results = {n: summary(n, runs[n], args.steps, completions) for n, _ in sides}
    print(
        f"GRPO on the CPU: {args.batch} prompts x G {args.generations} = "
        f"{args.batch * args.generations} completions a step, up to {args.completion} tokens, "
        f"{args.steps} steps, mean of {args.seeds} seeds"
    )
    names = list(results)
    print("step  " + "  ".join(f"{n + ' reward':>22}" for n in names))
    for i in range(args.steps):
        cells = [
            f"{results[n]['reward'][i]:>12.3f} ± {results[n]['spread'][i]:<7.3f}" for n in names
        ]
        print(f"{i + 1:>4}  " + "  ".join(f"{c:>22}" for c in cells))
    print()
    print(
        f"{'':<10} {'s/step':>8} {'ms/token':>9} {'generation':>11} {'scoring':>8} "
        f"{'loss+backward+step':>19}"
    )
    for n in names:
        r = results[n]
        print(
            f"{n:<10} {r['s_step']:>8.3f} {r['s_token'] * 1000:>9.2f} {r['gen']:>10.3f}s "
            f"{r['score']:>7.3f}s {r['rest']:>18.3f}s"
        )
    if len(names) == 2:
        a, b = results["TRL"], results["TrainDeck"]
        last = max(1, args.steps // 4)
        print(f"\nTrainDeck / TRL time per step: {b['s_step'] / a['s_step']:.2f}x")
        print(
            f"mean reward over the last {last} steps: TRL "
            f"{statistics.mean(a['reward'][-last:]):.3f}, TrainDeck "
            f"{statistics.mean(b['reward'][-last:]):.3f}"
        )


if __name__ == "__main__":
    main()
