"""One prepared GPU check: what only a GPU shows, measured in a few minutes.

    python3 -m benchmarks.gpu_check --out DIR [--budget 480] [--only SECTIONS] [--smoke]
        [--device cuda|cpu]
    python3 -m benchmarks.gpu_check --record DIR/gpu_check.json   (keeps it in docs/gpu/)

Sections, most important first (--only takes letters or names, comma separated):
  s speed       within 240 s: LoRA r16 on the 0.5B model at 8 x 1024, bf16, TrainDeck against
                transformers + peft and + Liger Kernel, without and with checkpointing; full
                fine-tuning against transformers; a warm second process; the tier presets
                compiled (tokens/s, peak memory, MFU, the first step); raw figures in the JSON
  a memory      estimate vs measured peak (max_memory_allocated, reserved, NVML used): every
                tier preset 20 steps; a ~0.5B Qwen2-shaped start built from a config: full,
                LoRA, LoRA + checkpointing
  b throughput  tokens/s and MFU (against the card's dense bf16 peak), bf16 eager and compiled
  c vs_peft     LoRA on the 0.5B model, batch 8 x 1024: TrainDeck against transformers + peft
  d oom         a real out-of-memory error (torch.cuda.set_per_process_memory_fraction), the
                run recovers with the same effective batch
  e precision   fp16 + GradScaler and bf16 train; exact resume in deterministic mode
  f nvml        utilization, temperature, power and memory land in metrics.jsonl
  g torchrun    torchrun --nproc_per_node 1 with NCCL trains
  h tiers       each tier preset trains under a memory fraction equal to its tier
  i long        long context: the estimate's longest context for a 0.5B and a 1.5B model in
                16 and 24 GB, with and without offloaded checkpoints; two of them trained
  j multi_gpu   only where two or more GPUs are visible: a model that fits neither card alone
                (full AdamW, its layers grown until the estimate says so), predicted per card,
                then trained sharded (torchrun --shard) and split (--devices): tokens/s and
                each card's NVML peak

Each section predicts its GPU time from its FLOPs and bytes before it runs and is skipped,
with a line, when that would not leave the later sections their predicted time. It writes
as it goes, three files at most: DIR/gpu_check.json (every figure, the device, driver, torch
and CUDA versions), DIR/gpu_check.md (the tables for docs/gpu.md) and DIR/gpu_check.png
(loss and VRAM curves; only where matplotlib imports). --smoke runs every section at toy size
(the CPU: about 20 s); CUDA-only parts are skipped with a line saying so. docs/gpu.md says
how to run it and what each figure means.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import gc
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Deterministic cuBLAS for the resume check: read when CUDA first makes a handle, so before
# anything touches the GPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GiB, MiB = 1024**3, 1024**2

SECTIONS = {  # in the order they run
    "s": ("speed", "Speed: TrainDeck against transformers + peft (+ Liger), the presets"),
    "a": ("memory", "Memory estimate vs measured peak"),
    "b": ("throughput", "Throughput and MFU (bf16)"),
    "c": ("vs_peft", "Fine-tuning vs transformers + peft (LoRA, 8 x 1024)"),
    "d": ("oom", "Out-of-memory recovery on a real card"),
    "e": ("precision", "Precision and exact resume"),
    "f": ("nvml", "NVML signals in metrics.jsonl"),
    "g": ("torchrun", "torchrun --nproc_per_node 1 with NCCL"),
    "h": ("tiers", "Each tier preset under a memory fraction equal to its tier"),
    "i": ("long", "Long context"),
    "j": ("multi_gpu", "Several GPUs: sharded and split runs of a model too large for one"),
}
TIER_PRESETS = ("gpu-8gb", "gpu-12gb", "gpu-16gb", "gpu-24gb", "gpu-48gb", "gpu-80gb")
# Compiled rows cost a compilation each: the largest tiers first, while the budget allows.
COMPILE_ORDER = ("gpu-80gb", "gpu-24gb", "gpu-8gb", "gpu-48gb", "gpu-16gb", "gpu-12gb")

# Qwen2.5-0.5B's shape (494M parameters with its 151,936-token vocabulary), random weights.
HALF_B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    vocab_size=151936,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
TOY_B = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    vocab_size=512,
    tie_word_embeddings=True,
)
# A mixture of experts of about the same total size (Qwen3-MoE-shaped: 476M parameters, 178M
# active a token): 32 experts, 4 a token, in every layer.
MOE_HALF_B = dict(
    hidden_size=768,
    intermediate_size=2048,
    moe_intermediate_size=384,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    head_dim=64,
    num_experts=32,
    num_experts_per_tok=4,
    norm_topk_prob=True,
    max_position_embeddings=32768,
    vocab_size=151936,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
MOE_TOY = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    max_position_embeddings=256,
    vocab_size=512,
    tie_word_embeddings=True,
)
# A Qwen3.5-shaped hybrid, about 0.45B: three Gated DeltaNet layers before each attention layer
HYBRID_HALF_B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=20,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    linear_num_key_heads=8,
    linear_num_value_heads=16,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    max_position_embeddings=32768,
    vocab_size=151936,
    tie_word_embeddings=True,
)
HYBRID_TOY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    max_position_embeddings=256,
    vocab_size=512,
    tie_word_embeddings=True,
)


@dataclass(frozen=True)
class Start:
    """A model the check builds from a transformers config class (random weights)."""

    model_type: str
    architecture: str
    config_class: str
    shape: dict  # full size
    toy: dict  # --smoke
    name: str  # the rows' prefix ("MoE 0.5B lora"); "" for the dense 0.5B


STARTS = {
    "qwen": Start("qwen2", "Qwen2ForCausalLM", "Qwen2Config", HALF_B, TOY_B, ""),
    "moe": Start("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", MOE_HALF_B, MOE_TOY, "MoE"),
    "hybrid": Start(
        "qwen3_5_text",
        "Qwen3_5ForCausalLM",
        "Qwen3_5TextConfig",
        HYBRID_HALF_B,
        HYBRID_TOY,
        "Hybrid",
    ),
}
EXTRA_STARTS = ("moe", "hybrid")  # the memory section's rows beyond the dense 0.5B
LORA = dict(lora_rank=16, lora_alpha=32.0, lora_dropout=0.0, lora_targets="all")


# -- how fast a device is: what the predictions use --------------------------------------------


@dataclass
class Rates:
    """A device's speeds and fixed costs; a job's time = fixed + FLOPs / (peak x MFU) + bytes
    / bandwidth."""

    name: str
    peak_flops: float  # dense bf16 (GPU) or fp32 (CPU) matrix products, FLOP/s
    mfu: float  # the share of it a training step reaches
    bandwidth: float  # bytes/s, read + written
    setup_s: float  # one in-process run: model, optimizer, data, first step
    compile_s: float  # torch.compile's first step of a new shape
    process_s: float  # a fresh python3 + torch (+ CUDA and NCCL) process
    gpu: bool = False  # the estimate's figures for a GPU


# H100 80GB SXM: 989 TFLOP/s dense bf16 (datasheet; 798 measured in a product on this
# workplace's machine), 3.0 TB/s copy measured there. MFU and the fixed costs are guesses that
# the first GPU run replaces (docs/gpu.md, "Sizing").
H100 = Rates("H100 (predicted)", 989e12, 0.35, 3.0e12, 3.0, 45.0, 15.0, gpu=True)


def cpu_rates() -> Rates:
    """This CPU, measured now (0.1 s): an fp32 product and a copy; the fixed costs are what
    a smoke run took on the 2-core CI machine (0.1 s a toy run, 3 s a fresh process)."""
    n = 384
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t = time.perf_counter()
    for _ in range(8):
        a @ b
    flops = 8 * 2 * n**3 / (time.perf_counter() - t)
    x = torch.empty(16 * MiB // 4)
    y = torch.empty_like(x)
    t = time.perf_counter()
    for _ in range(4):
        y.copy_(x)
    bw = 4 * 2 * x.numel() * 4 / (time.perf_counter() - t)
    return Rates(f"{platform.machine()} CPU ({os.cpu_count()} cores)", flops, 0.3, bw, 0.1, 0, 3)


class Work(enum.Enum):
    """What a job does."""

    TRAIN = "train"  # a TrainDeck run of the job's config
    BUILD = "build"  # build a start model (STARTS[job.start])
    FIXED = "fixed"  # fixed work: CUDA's first start
    PROFILE = "profile"  # a TrainDeck run under torch's profiler
    BASELINE = "baseline"  # the same training in transformers (+ peft), job.side
    RESUME = "resume"  # the stop-and-resume runs of the precision section
    PROCESS = "process"  # a run in a fresh process (torchrun, a warm start)


@dataclass
class Job:
    """A unit of a section's work: what it runs, and what its prediction needs."""

    label: str  # for the lines and tables only; never parsed
    cfg: object = None  # TrainConfig of a training run; None for fixed work
    kind: Work = Work.TRAIN
    start: str = "qwen"  # the STARTS model a fine-tune or a build uses
    mode: str | None = None  # a fine-tune's: "full", "lora" or "lora+ckpt"; None: a preset
    preset: str | None = None  # the tier preset it trains
    side: str = "traindeck"  # traindeck | peft | peft_liger | transformers
    steps: int | None = None  # None: the config's max_steps
    compile: bool = False  # the first step compiles (its prediction adds the compile time)
    optional: bool = False  # left out first when time runs short; not in the essential share
    process: bool = False  # in a fresh process (torchrun, a warm start)
    fixed_s: float = 0.0  # other fixed work (building a model, an OOM retry)


def job_seconds(job: Job, rates: Rates) -> float:
    from core.training.estimate import estimate, flops_per_token

    s = job.fixed_s + (rates.process_s if job.process else 0.0)
    if job.cfg is None:
        return s
    cfg = job.cfg
    est = estimate(cfg, on_gpu=rates.gpu)
    step_flops = cfg.tokens_per_step * flops_per_token(cfg)
    if cfg.grad_checkpointing:  # the forward again in the backward
        step_flops *= 4 / 3
    # Every live byte is written once and read once a step (a floor; activations dominate)
    step_bytes = 2 * est.allocator_peak
    per_step = step_flops / (rates.peak_flops * rates.mfu) + step_bytes / rates.bandwidth
    steps = cfg.max_steps if job.steps is None else job.steps
    return s + rates.setup_s + (rates.compile_s if job.compile else 0.0) + steps * per_step


def predict(jobs: list[Job], rates: Rates) -> float:
    return sum(job_seconds(j, rates) for j in jobs)


# -- the report: written whole after every row ------------------------------------------------


@dataclass
class Section:
    key: str
    name: str
    title: str
    predicted_gpu_s: float = 0.0  # the full-size plan on an H100
    predicted_here_s: float = 0.0  # this plan on this device
    wall_s: float | None = None
    status: str = "pending"
    essential_s: float = 0.0  # predicted here without the optional rows (compiled ones)
    essential_gpu_s: float = 0.0
    lines: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    extra_tables: list[tuple[str, list[dict]]] = field(default_factory=list)  # (title, rows)
    limit_s: float | None = None  # the section's own share of the budget, where it has one
    data: dict = field(default_factory=dict)  # raw figures, at the top of its JSON entry

    def allows(self, ck, *jobs: Job) -> bool:
        """Whether the jobs' predicted time fits what is left after the later sections'
        essential share (and within this section's own limit, where it has one); if not, a
        line says what was skipped."""
        need = predict(list(jobs), ck.rates)
        spare = ck.left() - ck.reserve_after(self.key)
        if self.limit_s is not None:
            spare = min(spare, self.limit_s - (time.perf_counter() - ck.section_t0))
        if need <= spare:
            return True
        names = ", ".join(j.label for j in jobs)
        optional = all(j.optional for j in jobs)
        kind = "optional " if optional else ""
        self.lines.append(f"skipped {kind}{names}: predicted {need:.0f} s, {spare:.0f} s to spare")
        if not optional:
            self.status = "partial"
        return False


class Report:
    def __init__(self, out: Path, info: dict):
        self.out = out
        self.info = info
        self.sections: dict[str, Section] = {}
        self.curves: list[dict] = []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, sec: Section) -> None:
        self.sections[sec.key] = sec

    def save(self) -> None:
        data = {
            **self.info,
            "sections": {s.name: section_json(s) for s in self.sections.values()},
            "curves": self.curves,
        }
        _write(self.out / "gpu_check.json", json.dumps(data, indent=1, default=str))
        _write(self.out / "gpu_check.md", self.markdown())

    def markdown(self) -> str:
        i = self.info
        out = [
            f"# GPU check: {i['device_name']}",
            "",
            f"torch {i['torch']}, CUDA {i['cuda'] or '-'}, driver {i['driver'] or '-'}, "
            + ", ".join(f"{k} {v or '-'}" for k, v in i.get("packages", {}).items())
            + "; "
            f"{'smoke (toy sizes)' if i['smoke'] else 'full size'}, budget {i['budget_s']} s, "
            f"elapsed {i.get('elapsed_s', 0):.1f} s; PNG: {i.get('png', '-')}",
            "",
            f"Predicted on an H100 at full size: {i.get('predicted_gpu_total_s', 0):.0f} s in "
            f"all, {i.get('predicted_gpu_essential_s', 0):.0f} s without the optional compiled "
            "rows, which are left out first when the budget runs short.",
            "",
            "| section | status | predicted on an H100 (full size) | predicted here "
            "| measured here |",
            "|---|---|---:|---:|---:|",
        ]
        for s in self.sections.values():
            wall = f"{s.wall_s:.1f} s" if s.wall_s is not None else "-"
            out.append(
                f"| {s.key} {s.name} | {s.status} | {s.predicted_gpu_s:.0f} s "
                f"| {s.predicted_here_s:.1f} s | {wall} |"
            )
        for s in self.sections.values():
            out += ["", f"## ({s.key}) {s.title}", ""]
            lines = s.lines + (speed_lines(s.data) if s.key == SPEED else [])
            out += [f"- {line}" for line in lines]
            if s.rows:
                out += ["", *table(s.rows)]
            for name, value in s.data.items():
                rows = [value] if isinstance(value, dict) else value
                if isinstance(rows, list) and rows:
                    out += ["", f"{name}:", "", *table(rows)]
            for title, rows in s.extra_tables:
                out += ["", f"{title}:", "", *table(rows)]
        return "\n".join(out) + "\n"

    def plot(self) -> str | None:
        """The loss and VRAM curves; None, or why not."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return "no PNG: matplotlib is not installed"
        if not self.curves:
            return None
        fig, (loss, vram) = plt.subplots(1, 2, figsize=(12, 4.5))
        for c in self.curves:
            loss.plot(c["step"], c["loss"], label=c["label"])
            if c.get("vram_mb"):
                vram.plot(c["step"], c["vram_mb"], label=c["label"])
        loss.set(xlabel="step", ylabel="loss (nats/token)", title="loss")
        vram.set(xlabel="step", ylabel="MiB", title="VRAM (NVML used, else allocator peak)")
        for ax in (loss, vram):
            ax.legend(fontsize=6)
        fig.tight_layout()
        tmp = self.out / ".gpu_check.png.tmp"
        fig.savefig(tmp, dpi=90, format="png")
        plt.close(fig)
        os.replace(tmp, self.out / "gpu_check.png")
        return None


def section_json(sec: Section) -> dict:
    out = dataclasses.asdict(sec)
    return {**out.pop("data"), **out}


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _cell(key: str, v) -> str:
    if isinstance(v, bool):
        return "yes" if v else ("no" if key in ("checkpointing", "compiled") else "NO")
    if isinstance(v, float):
        if key.startswith(("error", "MFU", "mfu", "of the", "share")):
            return f"{v:+.1%}" if key.startswith("error") else f"{v:.1%}"
        return f"{v:,.4g}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return "-" if v is None else str(v)


def table(rows: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(k, r.get(k)) for k in keys) + " |" for r in rows]
    return lines


# -- training runs in this process -------------------------------------------------------------


class Collect:
    """Events of one run: train records, out-of-memory recoveries and log lines."""

    def __init__(self, stop_after: int | None = None):
        self.records, self.ooms, self.logs, self.stop_after = [], [], [], stop_after

    def __getattr__(self, name):  # every other event: ignored
        if name.startswith("on_"):
            return lambda *a: None
        raise AttributeError(name)

    def on_train_batch_end(self, record):
        self.records.append(record)

    def on_oom(self, info):
        self.ooms.append(info)

    def on_log(self, message):
        self.logs.append(message)


def dynamo_graphs() -> int:
    """Graphs torch.compile has captured in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class StepTimer:
    """Times a run's steps from inside the trainer, synchronizing the device only at the bounds
    it measures (the logs' own syncs stay as a user's run has them): the first step, its
    compilation included, and the steady steps after `warm` up to the last. profile: the last
    step runs under torch's profiler instead, untimed."""

    def __init__(self, cuda: bool, warm: int = 3, profile: bool = False):
        self.cuda, self.warm, self.profile = cuda, warm, profile
        self.first_step_s: float | None = None
        self.first_step_at: float | None = None  # the wall clock when the first step ended
        self.steady_s: float | None = None
        self.steady_steps = 0
        self.graphs = 0  # graphs torch.compile captured during the steps
        self.prof = None
        self._graphs0, self._t0, self._tw, self._closed = 0, 0.0, 0.0, False

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def step(self, trainer, call):
        done, last = trainer.step + 1, trainer.max_steps
        timed_last = last - 1 if self.profile else last
        warm = max(1, min(self.warm, timed_last - 1))
        if done == 1:
            self._graphs0, self._t0 = dynamo_graphs(), self._now()
        if self.profile and done == last:
            from torch.profiler import ProfilerActivity, profile

            kinds = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self._now()
            self.prof = profile(activities=kinds)
            self.prof.__enter__()
        out = call()
        if done == 1:
            self.first_step_s = self._now() - self._t0
            self.first_step_at = time.time()
        if done == warm:
            self._tw = self._now()
        if done == timed_last and timed_last > warm:
            self.steady_s, self.steady_steps = self._now() - self._tw, timed_last - warm
        if self.prof is not None and done == last:
            self._now()
            self.close()
        self.graphs = dynamo_graphs() - self._graphs0
        return out

    def close(self) -> None:
        """Stop the profiler if it runs (also after a failed step); its table stays."""
        if self.prof is not None and not self._closed:
            self._closed = True
            self.prof.__exit__(None, None, None)

    def tokens_per_s(self, tokens_per_step: int) -> float | None:
        return tokens_per_step * self.steady_steps / self.steady_s if self.steady_s else None


@dataclass
class Run:
    cfg: object  # as the trainer resolved it (a pretrained start's shape filled in)
    records: list
    ooms: list
    result: dict
    wall_s: float
    peak: int = 0  # torch.cuda.max_memory_allocated (CPU: 0)
    reserved: int = 0
    nvml_used: int = 0  # the largest NVML used of the run's records
    compiled: bool = False  # torch.compile made its steps' graphs and did not fall back

    def tokens_per_s(self) -> float:
        steady = self.records[len(self.records) // 2 :] or self.records
        return sorted(r["tokens_per_s"] for r in steady)[len(steady) // 2] if steady else 0.0


def fresh_memory(cuda: bool) -> None:
    if cuda:  # the last run's tensors, then its cached blocks (on the CPU: 0.4 s a collect)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def train(
    ck,
    cfg,
    label: str,
    save: bool = False,
    stop_after=None,
    resume_from=None,
    fault=None,
    timer: StepTimer | None = None,
):
    """One run of the real Trainer; save=False leaves checkpoints out (they time the disk);
    timer: times its steps."""
    from core.platform.compiling import fallback_line
    from core.runs.events import TrainControl
    from core.training.trainer import Trainer

    class Quiet(Trainer):
        def save_checkpoint(self, best=False):
            return None if not save else super().save_checkpoint(best)

        def _step_with_oom_recovery(self, factor):
            step = super()._step_with_oom_recovery
            return step(factor) if timer is None else timer.step(self, lambda: step(factor))

    class StopAfter(TrainControl):
        @property
        def stop_requested(self):
            return stop_after is not None and trainer.step >= stop_after

    fresh_memory(ck.cuda)
    run_dir = ck.work / label
    trainer = Quiet(cfg, run_dir, resume_from=resume_from, fault=fault)
    events = Collect()
    t = time.perf_counter()
    try:
        result = trainer.run(events, StopAfter())
    finally:
        if timer is not None:
            timer.close()
    run = Run(trainer.cfg, events.records, events.ooms, result, time.perf_counter() - t)
    fell_back = fallback_line("")[:30]  # "torch.compile is off for this run"
    run.compiled = bool(timer and timer.graphs) and not any(fell_back in m for m in events.logs)
    if ck.cuda:
        run.peak = torch.cuda.max_memory_allocated()
        run.reserved = torch.cuda.max_memory_reserved()
        run.nvml_used = int(max((r.get("nvml_used_mb", 0) for r in run.records), default=0) * MiB)
    return run


def curve(ck, label: str, run: Run) -> None:
    recs = run.records
    vram = [r.get("nvml_used_mb") or r.get("mem_peak_mb") or r.get("rss_mb") for r in recs]
    ck.report.curves.append(
        {
            "label": label,
            "step": [r["step"] for r in recs],
            "loss": [round(r["loss"], 4) for r in recs],
            "vram_mb": vram if all(v is not None for v in vram) else [],
        }
    )


class Check:
    """What the sections share: the device, the budget, the report, a scratch folder."""

    def __init__(self, args):
        self.args, self.smoke = args, args.smoke
        self.cuda = args.device == "cuda"
        self.t0 = time.perf_counter()
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
        os.environ.setdefault("TRAINDECK_CACHE", str(self.work / "data-cache"))
        if self.smoke and not self.cuda:
            torch.set_num_threads(1)  # toy shapes: threads only wait on each other
        self.rates = H100 if self.cuda else cpu_rates()
        self.report = Report(Path(args.out), device_info(args))
        self.models: dict[str, Path] = {}
        self.plans: dict[str, list[Job]] = {}
        self.tail = False  # the compiled rows' pass, after every other section
        self.first = ""  # the first section to run (it pays CUDA's start)
        self.section_t0 = self.t0  # when the running section started
        self.compiled_presets: set[str] = set()  # measured compiled by the speed section

    def reserve_after(self, key: str) -> float:
        """The essential predicted time of the selected sections after this one."""
        keys = list(self.report.sections)
        later = [self.report.sections[k] for k in keys[keys.index(key) + 1 :]]
        return sum(s.essential_s for s in later if s.status == "pending")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.args.budget - self.elapsed()

    def base(self, cfg, steps: int, **extra):
        """A config for a measured run: no evaluation, samples or step checkpoints."""
        values = dict(
            data=str(self.data_file()),
            max_steps=steps,
            max_epochs=None,
            max_time=None,
            log_every=1,
            eval_every=10**9,
            eval_batches=1,
            ckpt_every=10**9,
            keep_checkpoints=1,
            sample_tokens=0,
            warmup_steps=min(cfg.warmup_steps, max(1, steps // 2)),
            device=self.args.device,
            compile=False,  # measured eager unless a row asks (a GPU run compiles by default)
        )
        values.update(extra)
        if self.smoke:
            values.update(toy_shape(cfg))
            if not self.cuda and values.get("precision", cfg.precision) == "auto":
                values["precision"] = "fp32"
        return dataclasses.replace(cfg, **values)

    def data_file(self) -> Path:
        """The embedded corpus's text in one file (8 MB): every run reads it without listing
        the standard library again (2 s a run on the CI machine); --smoke: 40 kB of ours."""
        path = self.work / "corpus.txt"
        if path.exists():
            return path
        if self.smoke:
            files = sorted((ROOT / "core").rglob("*.py"))
            path.write_bytes(b"".join(f.read_bytes() for f in files[:40])[:40_000])
        else:
            from core.data.build_text import read_blocks
            from core.data.sources import _stdlib_files

            path.write_bytes(b"".join(read_blocks(_stdlib_files(), 8_000_000)))
        return path

    def steps(self, n: int) -> int:
        """A measured run's steps; --smoke: a few."""
        return max(4, n // 5) if self.smoke else n

    def preset(self, name: str, steps: int, **extra):
        from core.config import presets

        cfg = presets.to_config(presets.load_preset(name))
        return self.base(cfg, self.steps(steps), **extra)

    def full_preset(self, name: str, steps: int, **extra):
        """The full-size config, for the GPU prediction (also in a smoke run)."""
        from core.config import presets

        cfg = presets.to_config(presets.load_preset(name))
        extra = {"compile": False, **extra}  # eager unless a row asks, as base()
        return dataclasses.replace(cfg, max_steps=steps, device="cuda", **extra)


def toy_shape(cfg) -> dict:
    if cfg.init_from:  # the toy model's own shape; only the window and batch shrink
        return dict(seq_len=64, batch_size=2, grad_accum=1, corpus_max_bytes=30_000)
    return dict(
        hidden_dim=32,
        n_layers=1,
        n_heads=2,
        seq_len=32,
        batch_size=2,
        grad_accum=2 if cfg.grad_accum > 1 else 1,
        corpus_max_bytes=30_000,
    )


def package_versions() -> dict:
    """What the sections lean on, read without importing it."""
    from importlib import metadata

    out = {}
    names = ("transformers", "peft", "liger-kernel", "triton", "nvidia-ml-py", "matplotlib")
    for name in (*names, "platformdirs", "gguf"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_info(args) -> dict:
    from core.platform import hardware

    info = {
        "device_name": "CPU",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": None,
        "smoke": args.smoke,
        "budget_s": args.budget,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "packages": package_versions(),
    }
    if args.device == "cuda":
        g = hardware.gpus()[0]
        info.update(
            device_name=g["name"],
            driver=g["driver"],
            capability=g["capability"],
            total_gib=round(g["total_bytes"] / GiB, 2),
            free_gib=round((g["free_bytes"] or 0) / GiB, 2),
        )
    else:
        info["device_name"] = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    return info


# -- the 0.5B start, built from a config (no hub on the device) --------------------------------


def qwen_config_json(shape: dict, kind: str = "qwen") -> dict:
    start = STARTS[kind]
    return {
        "model_type": start.model_type,
        "architectures": [start.architecture],
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
        **shape,
    }


def config_folder(ck, kind: str = "qwen") -> Path:
    """The 0.5B model's config.json alone: enough for its estimates and predictions."""
    folder = ck.work / f"{kind}-0.5b-config"
    if not folder.exists():
        folder.mkdir(parents=True)
        _write(folder / "config.json", json.dumps(qwen_config_json(STARTS[kind].shape, kind)))
    return folder


def has_config_class(kind: str) -> bool:
    """Whether this machine's transformers builds that start (an older one lacks Qwen3-MoE)."""
    import transformers

    return hasattr(transformers, STARTS[kind].config_class)


def model_folder(ck, kind: str = "qwen") -> Path:
    """A random Qwen2 or Qwen3-MoE (0.5B; --smoke: a toy) saved with a small BPE tokenizer,
    as --init-from reads it; built on the GPU when there is one."""
    if kind in ck.models:
        return ck.models[kind]
    from benchmarks.sides import build_start

    start = STARTS[kind]
    folder = ck.work / (f"{kind}-toy" if ck.smoke else f"{kind}-0.5b")
    text = ck.data_file().read_bytes()[: 30_000 if ck.smoke else 300_000]
    build_start(
        folder,
        start.config_class,
        start.toy if ck.smoke else start.shape,
        text,
        512 if ck.smoke else 2048,
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        dtype=torch.bfloat16,
        device="cuda" if ck.cuda else "cpu",
    )
    ck.models[kind] = folder
    return folder


def finetune_cfg(ck, folder: Path, mode: str, steps: int, full: bool, **extra):
    """full, lora or lora+ckpt at batch 8 x 1024 (--smoke: 2 x 64) on the folder's model."""
    from benchmarks.sides import pretrained_config

    lora = dict(LORA) if mode.startswith("lora") else {}
    cfg = pretrained_config(
        folder,
        seq_len=1024,
        batch_size=8,
        grad_accum=1,
        max_data_bytes=2_000_000,  # the 8 MB corpus through a BPE: its first 2 MB will do
        grad_checkpointing=mode.endswith("ckpt"),
        max_steps=steps,
        **lora,
    )
    if full:
        return dataclasses.replace(cfg, device="cuda", **extra)
    return ck.base(cfg, ck.steps(steps), **extra)


def build_s(ck, full: bool) -> float:
    """Building the 0.5B model (on the GPU) or the toy, and importing transformers."""
    return 10.0 if full else (3.0 if ck.smoke else 10.0)


# -- (s) speed: TrainDeck against transformers + peft (+ Liger), the presets compiled --------

SPEED = "s"
SPEED_LIMIT_S = 240.0  # the section's share of the budget
SPEED_STEPS = 12  # each fine-tune's; the presets run 20
SIDE_NAMES = {
    "traindeck": "TrainDeck",
    "peft": "transformers + peft",
    "peft_liger": "transformers + peft + Liger",
    "transformers": "transformers",
}
# Liger's Triton kernels compile at their first call (a guess until a GPU measures it)
LIGER_FIRST_CALL_S = 5.0


def speed_cfg(ck, folder: Path | None, mode: str, full: bool, steps: int = SPEED_STEPS):
    """The 0.5B model at 8 x 1024 (--smoke: the toy at 2 x 64), logging at the default
    interval, compiled on a GPU: set explicitly, whatever the default is."""
    from core.config.spec import TrainConfig

    if folder is None:
        return None
    extra = dict(log_every=TrainConfig().log_every, compile=full or ck.cuda)
    return finetune_cfg(ck, folder, mode, steps, full, **extra)


def baseline_missing(ck, side: str, full: bool) -> str | None:
    """Why a transformers side does not run here (None: it runs)."""
    if full:
        return None
    if side != "transformers" and ck.smoke:
        return "left out of a smoke run (importing peft alone takes ~8 s on the CI machine)"
    if side == "peft_liger" and not ck.cuda:
        return "CUDA only (Liger's kernels are Triton's)"
    if side == "peft_liger" and importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (benchmarks/gpu_wheels.sh carries its wheel)"
    return None


def plan_speed(ck, full: bool) -> list[Job]:
    jobs = cuda_start(ck, SPEED, full)
    jobs.append(Job("build the 0.5B model", kind=Work.BUILD, fixed_s=build_s(ck, full)))
    folder = config_folder(ck) if full or not ck.smoke else None
    fixed = 0.0 if folder else ck.rates.setup_s  # smoke: planned without a config
    compile = full or ck.cuda
    for mode in ("lora", "lora+ckpt", "full"):
        cfg = speed_cfg(ck, folder, mode, full)
        label = f"TrainDeck {mode}"
        jobs.append(Job(label, cfg, mode=mode, compile=compile, fixed_s=fixed))
        for side in ("transformers",) if mode == "full" else ("peft", "peft_liger"):
            if baseline_missing(ck, side, full) is None:
                first = LIGER_FIRST_CALL_S if side == "peft_liger" else 0.0
                label = f"{SIDE_NAMES[side]} {mode}"
                job = Job(label, cfg, Work.BASELINE, mode=mode, side=side, fixed_s=fixed + first)
                jobs.append(job)
    if full or not ck.smoke:  # a warm start: tracing, and the compiled code from the cache
        cfg = speed_cfg(ck, folder, "lora", full, steps=3)
        warm = 5.0 if compile else 0.0
        jobs.append(
            Job(
                "TrainDeck lora, a second process",
                cfg,
                Work.PROCESS,
                mode="lora",
                process=True,
                fixed_s=warm,
            )
        )
    from core.config import presets

    pick = ck.full_preset if full else ck.preset
    for p in COMPILE_ORDER:  # the largest first: the budget may end the list
        own = presets.to_config(presets.load_preset(p)).log_every  # its defaults
        cfg = pick(p, 20, log_every=own, compile=compile)
        label = f"{p} {'compiled' if compile else 'eager'}"
        jobs.append(Job(label, cfg, preset=p, compile=compile, optional=True))
    return jobs


def run_speed(ck, sec: Section) -> None:
    peak = card_peak() if ck.cuda else None
    sec.data.update(device=ck.report.info["device_name"], lora=[], full=[], presets=[])
    sec.lines.append(
        "raw figures in gpu_check.json's speed section; tokens/s of TrainDeck's runs over the "
        "steps after the first few (the device synchronized at the bounds only), of the "
        "transformers sides the median step of the second half"
    )
    if not ck.cuda:
        sec.lines.append("CPU: TrainDeck uncompiled (compiling is measured on a GPU); no MFU")
    for job in ck.plans[sec.key]:
        if job.kind is Work.FIXED or not sec.allows(ck, job):
            continue
        if job.kind is Work.BUILD:
            model_folder(ck)  # without it no row runs: a failure ends the section
            continue
        try:
            speed_row(ck, sec, job, peak)
        except Exception as e:  # one side's failure must not cost the other rows
            sec.status = "failed"
            sec.lines.append(f"{job.label} failed: {type(e).__name__}: {str(e)[:300]}")
            fresh_memory(ck.cuda)
        ck.report.save()
    for side in ("peft", "peft_liger"):
        if why := baseline_missing(ck, side, False):
            sec.lines.append(f"{SIDE_NAMES[side]}: {why}")
    if ck.smoke:
        sec.lines.append("smoke: the second process is left out (the tests run its child)")


def speed_row(ck, sec: Section, job: Job, peak: float | None) -> None:
    if job.kind is Work.PROCESS:
        sec.data["warm_start"] = warm_start(ck, job)
    elif job.preset:
        sec.data["presets"].append(speed_preset(ck, job, peak))
        if sec.data["presets"][-1]["compiled"]:
            ck.compiled_presets.add(job.preset)
    else:
        table = sec.data["full" if job.mode == "full" else "lora"]
        table.append(speed_side(ck, sec, job))


def speed_side(ck, sec: Section, job: Job) -> dict:
    """One row of the lora or full table: a side's tokens/s and peak allocated memory."""
    cfg = speed_cfg(ck, model_folder(ck), job.mode, False)
    row = {"side": job.side, "checkpointing": cfg.grad_checkpointing}
    if job.kind is Work.BASELINE:
        size = (cfg.batch_size, cfg.seq_len, cfg.max_steps)
        ckpt = cfg.grad_checkpointing
        out = hf_side(model_folder(ck), job.side, *size, ck.args.device, checkpointing=ckpt)
        return {**row, "tokens_per_s": out["tokens/s"], "peak_mib": out["peak MiB"]}
    profiled = job.mode == "lora"  # TrainDeck's LoRA step: where its time goes
    timer = StepTimer(ck.cuda, warm=3, profile=profiled)
    run = train(ck, cfg, f"speed-{job.mode}", timer=timer)
    if profiled and timer.prof is not None:
        sec.data["profile"], busy = top_ops(timer.prof, ck.cuda)
        sec.lines.append(f"TrainDeck lora's last step under the profiler: busy {busy:.3f} s")
    if run.compiled and timer.first_step_s:  # the compile time measured replaces the guess
        ck.rates = dataclasses.replace(ck.rates, compile_s=timer.first_step_s)
    return {
        **row,
        "tokens_per_s": timer.tokens_per_s(run.cfg.tokens_per_step),
        "peak_mib": run.peak / MiB if ck.cuda else None,
        "compiled": run.compiled,
        "first_step_s": timer.first_step_s,
    }


def speed_preset(ck, job: Job, peak: float | None) -> dict:
    """A tier preset at its defaults (compiled on a GPU): tokens/s, MFU, the first step."""
    from core.training.estimate import flops_per_token

    timer = StepTimer(ck.cuda, warm=5)
    run = train(ck, job.cfg, f"speed-{job.preset}", timer=timer)
    tok_s = timer.tokens_per_s(run.cfg.tokens_per_step)
    return {
        "preset": job.preset,
        "compiled": run.compiled,
        "tokens_per_s": tok_s,
        "mfu": tok_s * flops_per_token(run.cfg) / peak if peak and tok_s else None,
        "first_step_s": timer.first_step_s,
        "peak_mib": run.peak / MiB if ck.cuda else None,
    }


def warm_command(cfg_file: Path, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.gpu_check",
        "--warm-start-child",
        str(cfg_file),
        str(run_dir),
    ]


def warm_start(ck, job: Job) -> dict:
    """TrainDeck's LoRA run again in a fresh process, the same shapes: the compiled code comes
    from the cache. start_to_first_step_s: from the process's start (Python, torch, CUDA,
    the model) to the end of its first step."""
    cfg = speed_cfg(ck, model_folder(ck), "lora", False, steps=3)
    cfg_file = ck.work / "warm-start.json"
    _write(cfg_file, json.dumps(cfg.to_dict(), default=str))
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    fresh_memory(ck.cuda)  # this process's cached blocks back to the card for the other
    t = time.time()
    proc = subprocess.run(
        warm_command(cfg_file, ck.work / "warm-start"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=max(60, ck.left()),
    )
    if proc.returncode != 0:
        raise RuntimeError("the second process failed: " + proc.stderr.strip()[-300:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "run": "TrainDeck lora, a second process",
        "compiled": out["compiled"],
        "first_step_s": out["first_step_s"],
        "start_to_first_step_s": out["first_step_at"] - t,
        "status": out["status"],
    }


def warm_start_child(argv: list[str]) -> int:
    """The second process: the config from the first (a JSON file), 3 steps, timed; prints
    one JSON line."""
    import types

    from core.config.spec import from_dict

    cfg = from_dict(json.loads(Path(argv[0]).read_text()))
    cuda = cfg.device.startswith("cuda")
    timer = StepTimer(cuda, warm=1)
    run = train(types.SimpleNamespace(cuda=cuda, work=Path(argv[1])), cfg, "run", timer=timer)
    out = {
        "first_step_s": timer.first_step_s,
        "first_step_at": timer.first_step_at,
        "compiled": run.compiled,
        "status": run.result["status"],
    }
    print(json.dumps(out), flush=True)
    return 0 if run.result["status"] == "finished" else 1


def speed_lines(data: dict) -> list[str]:
    """The ratios the issue's bars read, for gpu_check.md (the JSON keeps raw figures)."""
    lines = []
    for table, theirs in (("lora", ("peft", "peft_liger")), ("full", ("transformers",))):
        rows = data.get(table, [])
        ours = {r["checkpointing"]: r for r in rows if r["side"] == "traindeck"}
        for r in rows:
            td = ours.get(r["checkpointing"])
            if r["side"] not in theirs or not td or not (td["tokens_per_s"] and r["tokens_per_s"]):
                continue
            speed = td["tokens_per_s"] / r["tokens_per_s"]
            mem = f", {td['peak_mib'] / r['peak_mib']:.2f}x its memory" if r["peak_mib"] else ""
            ckpt = "with" if r["checkpointing"] else "without"
            lines.append(
                f"{table}, {ckpt} checkpointing: TrainDeck {speed:.2f}x {SIDE_NAMES[r['side']]}'s "
                f"tokens/s{mem}"
            )
    return lines


# -- (a) memory --------------------------------------------------------------------------------

FT_MODES = ("full", "lora", "lora+ckpt")


def plan_memory(ck, full: bool) -> list[Job]:
    pick = ck.full_preset if full else ck.preset
    jobs = cuda_start(ck, "a", full)
    jobs += [Job(p, pick(p, 20), preset=p) for p in TIER_PRESETS]
    for kind in ["qwen", *filter(has_config_class, EXTRA_STARTS)]:
        name = STARTS[kind].name
        prefix = f"{name} 0.5B" if name else "0.5B"
        jobs.append(
            Job(f"build the {prefix} model", kind=Work.BUILD, start=kind, fixed_s=build_s(ck, full))
        )
        folder = config_folder(ck, kind) if full or not ck.smoke else None
        for mode in FT_MODES if kind == "qwen" else ("lora",):
            cfg = finetune_cfg(ck, folder, mode, 20, full) if folder else None
            fixed = 0.0 if cfg else ck.rates.setup_s  # smoke: planned without a config
            jobs.append(Job(f"{prefix} {mode}", cfg, start=kind, mode=mode, fixed_s=fixed))
    return jobs


def cuda_start(ck, key: str, full: bool) -> list[Job]:
    """CUDA's context, cuBLAS and the first kernels: once, in the first section (smoke on the
    CPU: nothing)."""
    first = key == ck.first
    return [Job("CUDA start", kind=Work.FIXED, fixed_s=8.0 if first and (full or ck.cuda) else 0.0)]


def measured_row(ck, run: Run) -> dict:
    """The estimate against what the run measured, in MiB: the allocator's peak (error =
    estimate / measured - 1) and the device's whole use by NVML (the largest reading of the
    run's records); the CPU has no per-run peak, so only the estimate."""
    from core.training.estimate import estimate

    est = estimate(run.cfg, on_gpu=ck.cuda)
    row = {"estimate alloc MiB": est.allocator_peak / MiB}
    if not ck.cuda:
        return {**row, "estimate device MiB": est.device_total / MiB}
    return {
        **row,
        "max_allocated MiB": run.peak / MiB,
        "error alloc": est.allocator_peak / run.peak - 1,
        "estimate device MiB": est.device_total / MiB,
        "reserved MiB": run.reserved / MiB,
        "NVML used MiB": run.nvml_used / MiB,
        "error device": est.device_total / run.nvml_used - 1 if run.nvml_used else None,
    }


@contextlib.contextmanager
def card_limited(ck, fraction: float | None):
    """The card shrunk to a fraction of its memory for the block (None, or the CPU: as is)."""
    if fraction and ck.cuda:
        torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        yield
    finally:
        if fraction and ck.cuda:
            torch.cuda.set_per_process_memory_fraction(1.0)


def run_memory(ck, sec: Section) -> None:
    from core.training.estimate import estimate

    if not ck.cuda:
        sec.lines.append("CPU: no allocator peak per run; the estimates run, not compared")
    for job in ck.plans[sec.key]:
        if not sec.allows(ck, job) or job.kind is Work.FIXED:
            continue
        if job.kind is Work.BUILD:
            model_folder(ck, job.start)
            continue
        cfg = job.cfg
        if job.mode:  # planned on its config.json; now on its weights
            cfg = finetune_cfg(ck, model_folder(ck, job.start), job.mode, 20, False)
        run = train(ck, cfg, f"memory-{job.label.replace(' ', '-')}")
        head = {
            "run": job.label,
            "params": estimate(run.cfg, on_gpu=ck.cuda).n_params,
            "micro x seq": f"{run.cfg.batch_size} x {run.cfg.seq_len}",
        }
        sec.rows.append({**head, **measured_row(ck, run)})
        curve(ck, job.label, run)
        ck.report.save()
    for kind in EXTRA_STARTS:
        if not has_config_class(kind):
            start = STARTS[kind]
            sec.lines.append(
                f"{start.name} row: skipped, this transformers has no {start.config_class}"
            )


# -- (b) throughput ----------------------------------------------------------------------------


def plan_throughput(ck, full: bool) -> list[Job]:
    pick = ck.full_preset if full else ck.preset
    # a record every 5 steps: each record's sync and NVML read, not every step's (the first
    # GPU run logged every step, and its small presets' MFU was 3-7%)
    jobs = [Job(f"{p} eager", pick(p, 20, log_every=5), preset=p) for p in TIER_PRESETS]
    small = TIER_PRESETS[0]
    jobs.append(Job(f"{small} profiled", pick(small, 6, log_every=5), Work.PROFILE, preset=small))
    if full or ck.cuda:
        jobs += [
            Job(
                f"{p} compiled",
                pick(p, 20, log_every=5, compile=True),
                preset=p,
                compile=True,
                optional=True,
            )
            for p in COMPILE_ORDER
        ]
    return jobs


def profile_rows(ck, cfg, label: str, top: int = 12) -> tuple[list[dict], str]:
    """One short run under torch's profiler: the operators with the most device time (CUDA;
    the CPU's own time on a CPU), and how busy the device was over the profiled wall time."""
    from torch.profiler import ProfilerActivity, profile

    kinds = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ck.cuda else [])
    t0 = time.perf_counter()
    with profile(activities=kinds) as prof:
        train(ck, cfg, label)
    wall = time.perf_counter() - t0
    rows, busy = top_ops(prof, ck.cuda, top)
    where = "the GPU" if ck.cuda else "the CPU (self time)"
    return rows, f"{label}: {where} busy {busy:.2f} s of {wall:.2f} s profiled wall time"


def top_ops(prof, cuda: bool, top: int = 12) -> tuple[list[dict], float]:
    """The profiled operators with the most time on the device (CUDA: self device time; the
    CPU: self CPU time), and the device's busy seconds in all."""
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    busy = sum(getattr(e, attr, 0) for e in events) / 1e6
    events.sort(key=lambda e: -getattr(e, attr, 0))
    rows = [
        {
            "operator": e.key[:60],
            "calls": e.count,
            "ms": getattr(e, attr, 0) / 1e3,
            "share": getattr(e, attr, 0) / 1e6 / busy if busy else None,
        }
        for e in events[:top]
    ]
    return rows, busy


def card_peak() -> float | None:
    from benchmarks.throughput import PEAKS

    name = torch.cuda.get_device_name(0)
    return next((v * 1e12 for k, v in PEAKS.items() if k in name), None)


def run_throughput(ck, sec: Section) -> None:
    from core.training.estimate import flops_per_token

    peak = card_peak() if ck.cuda else None
    if ck.tail:
        sec.lines.append("compiled rows: run last, in the time the other sections left")
    elif not ck.cuda:
        sec.lines.append("CPU: compiled rows skipped (CUDA only here); no MFU without a GPU peak")
    elif peak is None:
        sec.lines.append(f"MFU: no dense bf16 peak known for {torch.cuda.get_device_name(0)}")
    else:
        sec.lines.append(f"MFU against {peak / 1e12:.0f} TFLOP/s dense bf16")
    for job in ck.plans[sec.key]:
        if job.optional != ck.tail:
            continue
        if job.optional and job.preset in ck.compiled_presets:
            sec.lines.append(f"{job.label}: measured in the speed section")
            continue
        if not sec.allows(ck, job):
            continue
        if job.kind is Work.PROFILE:
            rows, line = profile_rows(ck, job.cfg, f"throughput-{job.preset}-profiled")
            sec.lines.append(line)
            sec.extra_tables.append((f"where {job.preset}'s step goes", rows))
            ck.report.save()
            continue
        run = train(ck, job.cfg, f"throughput-{job.label.replace(' ', '-')}")
        tok_s = run.tokens_per_s()
        sec.rows.append(
            {
                "preset": job.label,
                "tokens/s": tok_s,
                "ms/step": job.cfg.tokens_per_step / tok_s * 1000 if tok_s else None,
                "MFU": tok_s * flops_per_token(run.cfg) / peak if peak else None,
                "peak MiB": run.peak / MiB if ck.cuda else None,
                "wall s": run.wall_s,
            }
        )
        ck.report.save()


# -- (c) against transformers + peft -------------------------------------------------------


def plan_vs_peft(ck, full: bool) -> list[Job]:
    folder = config_folder(ck) if full or not ck.smoke else None
    cfg = finetune_cfg(ck, folder, "lora", 12, full) if folder else None
    fixed = 0.0 if cfg else ck.rates.setup_s
    jobs = [Job("TrainDeck LoRA", cfg, mode="lora", fixed_s=fixed)]
    if full or not ck.smoke:
        jobs.append(Job("transformers + peft LoRA", cfg, Work.BASELINE, mode="lora", side="peft"))
    return jobs


def hf_side(
    folder: Path,
    side: str,
    batch: int,
    seq: int,
    steps: int,
    device: str = "cuda",
    checkpointing: bool = False,
) -> dict:
    """The baseline, a user's transformers script (benchmarks/sides.py), one side:
    - peft: bf16 weights, fp32 adapters on every projection (the same rank and alpha as ours);
    - peft_liger: the same with Liger Kernel's Qwen2 kernels (apply_liger_kernel_to_qwen2:
      RoPE, RMSNorm, SwiGLU and its fused linear cross-entropy, which never makes the logits);
    - transformers: full fine-tuning, fp32 weights;
    each with autocast to bf16, fused AdamW and (but Liger) one cross-entropy in fp32 over the
    logits, the same batch every step; optionally gradient checkpointing. (The CPU, for the
    tests: fp32, no autocast.) tokens/s: the median step of the second half."""
    from benchmarks.sides import hf_model, hf_optimizer, hf_step, liger_patched, trainable

    cuda = device == "cuda"
    fresh_memory(cuda)
    lora = None if side == "transformers" else {"r": LORA["lora_rank"], "alpha": LORA["lora_alpha"]}
    dtype = torch.bfloat16 if cuda and lora else torch.float32
    liger = side == "peft_liger"
    with liger_patched() if liger else contextlib.nullcontext():
        model = hf_model(folder, dtype, lora, checkpointing, liger, device)
        opt = hf_optimizer(model)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else None
        step = hf_step(model, opt, autocast, model_loss=liger)
        g = torch.Generator().manual_seed(0)
        vocab = min(2000, model.config.vocab_size)
        x = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
        times, losses = [], []
        for _ in range(steps):
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            losses.append(step(x[:, :-1], x[:, 1:]))  # .item(): syncs, as a script's logging does
            times.append(time.perf_counter() - t)
        count = trainable(model)
    steady = sorted(times[steps // 2 :])
    return {
        "tokens/s": batch * seq / steady[len(steady) // 2],
        "peak MiB": torch.cuda.max_memory_allocated() / MiB if cuda else None,
        "trainable": count,
        "loss first, last": f"{losses[0]:.3f}, {losses[-1]:.3f}",
    }


def run_vs_peft(ck, sec: Section) -> None:
    jobs = ck.plans[sec.key]
    if ck.smoke:
        sec.lines.append(
            "smoke: the transformers + peft side is left out (importing peft alone takes ~8 s "
            "on the CI machine); it runs on a GPU"
        )
    folder = model_folder(ck)
    for job in jobs:
        if not sec.allows(ck, job):
            continue
        cfg = finetune_cfg(ck, folder, job.mode, 12, False)
        if job.kind is Work.TRAIN:
            run = train(ck, cfg, "vs-peft-traindeck")
            row = {"side": job.label, "tokens/s": run.tokens_per_s()}
            row["peak MiB"] = run.peak / MiB if ck.cuda else None
        else:
            size = (cfg.batch_size, cfg.seq_len, cfg.max_steps)
            row = {"side": job.label, **hf_side(folder, job.side, *size, device=ck.args.device)}
        sec.rows.append({**row, "micro x seq": f"{cfg.batch_size} x {cfg.seq_len}"})
        ck.report.save()
    if ck.cuda and len(sec.rows) == 2 and sec.rows[1]["tokens/s"]:
        ratio = sec.rows[0]["tokens/s"] / sec.rows[1]["tokens/s"]
        mem = sec.rows[0]["peak MiB"] / sec.rows[1]["peak MiB"]
        sec.lines.append(f"TrainDeck / peft: {ratio:.2f}x the tokens/s, {mem:.2f}x the memory")


# -- (d) out of memory -------------------------------------------------------------------------

OOM_PRESET = "gpu-24gb"


def plan_oom(ck, full: bool) -> list[Job]:
    cfg = (ck.full_preset if full else ck.preset)(OOM_PRESET, 4, grad_accum=1)
    cfg = dataclasses.replace(cfg, batch_size=cfg.batch_size * 2)  # 152 x 1: halves to 76 x 2
    return [Job("shrunk card", cfg, steps=cfg.max_steps + 1)]  # + the step that ran out


def oom_fraction(cfg) -> float:
    """A card on which the micro-batch does not fit and half of it does."""
    from core.training.estimate import estimate

    half = dataclasses.replace(cfg, batch_size=cfg.batch_size // 2)
    allowed = estimate(half).allocator_peak * 1.3
    assert allowed < estimate(cfg).allocator_peak, "the shrunk card would hold the full batch"
    return allowed / torch.cuda.get_device_properties(0).total_memory


def run_oom(ck, sec: Section) -> None:
    job = ck.plans[sec.key][0]
    if not sec.allows(ck, job):
        return
    cfg, fault, fraction = job.cfg, None, None
    if ck.cuda:
        fraction = oom_fraction(cfg)
    else:
        sec.lines.append(
            "CPU: the out-of-memory error is injected at step 2 (a real one needs CUDA)"
        )
        fired = []

        def fault(step, micro):
            if step == 2 and not fired:
                fired.append(step)
                raise torch.OutOfMemoryError("injected: CUDA out of memory")

    with card_limited(ck, fraction):
        run = train(ck, cfg, "oom", fault=fault)
    after = run.cfg.batch_size * run.cfg.grad_accum
    sec.rows.append(
        {
            "preset": f"{OOM_PRESET} at {cfg.batch_size} x {cfg.grad_accum}",
            "memory fraction": fraction,
            "OOM recoveries": len(run.ooms),
            "now batch x accum": f"{run.cfg.batch_size} x {run.cfg.grad_accum}",
            "same effective batch": after == cfg.batch_size * cfg.grad_accum,
            "status": run.result["status"],
            "steps": run.result["step"],
        }
    )
    ok = run.ooms and after == cfg.batch_size * cfg.grad_accum
    ok = ok and run.result["step"] == cfg.max_steps
    sec.lines.append("recovered with the same effective batch" if ok else "NOT recovered")


# -- (e) precision and resume ------------------------------------------------------------------

RESUME_PRESET, RESUME_STEPS = "gpu-8gb", 12


def plan_precision(ck, full: bool) -> list[Job]:
    pick = ck.full_preset if full else ck.preset
    jobs = []
    if full or ck.cuda:
        jobs.append(Job("fp16 + GradScaler", pick(RESUME_PRESET, 10, precision="fp16")))
    jobs.append(Job("bf16", pick(RESUME_PRESET, 10, precision="bf16")))
    det = pick(RESUME_PRESET, RESUME_STEPS, deterministic=True)
    half = det.max_steps // 2
    jobs += [
        Job("straight", det, Work.RESUME),
        Job("stopped", det, Work.RESUME, steps=half),
        Job("resumed", det, Work.RESUME, steps=det.max_steps - half),
    ]
    return jobs


def losses_of(run_dir: Path) -> list[tuple[int, float]]:
    from core.runs.folder import read_metrics

    train_records, _ = read_metrics(run_dir / "metrics.jsonl")
    return [(r["step"], r["loss"]) for r in train_records]


def run_precision(ck, sec: Section) -> None:
    jobs = ck.plans[sec.key]
    if not ck.cuda:
        sec.lines.append("CPU: fp16 with the GradScaler skipped (CUDA only); bf16 at toy size")
    resume = [j for j in jobs if j.kind is Work.RESUME]
    for job in (j for j in jobs if j.kind is Work.TRAIN):
        if not sec.allows(ck, job):
            continue
        run = train(ck, job.cfg, f"precision-{job.cfg.precision}")
        losses = [r["loss"] for r in run.records]
        sec.rows.append(
            {
                "run": job.label,
                "steps": run.result["step"],
                "first loss": losses[0] if losses else None,
                "last loss": losses[-1] if losses else None,
                "status": run.result["status"],
            }
        )
        curve(ck, job.label, run)
        ck.report.save()
    if sec.allows(ck, *resume):
        resume_rows(ck, sec, resume[0].cfg)
    torch.use_deterministic_algorithms(False)


def resume_rows(ck, sec: Section, cfg) -> None:
    straight = train(ck, cfg, "resume-straight", save=True)
    stopped = train(ck, cfg, "resume-split", save=True, stop_after=cfg.max_steps // 2)
    latest = ck.work / "resume-split" / "checkpoints" / "latest.pt"
    train(ck, cfg, "resume-split", save=True, resume_from=latest)
    a, b = losses_of(ck.work / "resume-straight"), losses_of(ck.work / "resume-split")
    differ = [s for (s, x), (_, y) in zip(a, b, strict=False) if x != y]
    sec.rows.append(
        {
            "run": f"stop at {stopped.result['step']}, resume to {cfg.max_steps} (deterministic)",
            "steps": len(b),
            "first loss": b[0][1] if b else None,
            "last loss": b[-1][1] if b else None,
            "status": straight.result["status"],
        }
    )
    same = len(a) == len(b) == cfg.max_steps and not differ
    sec.lines.append(
        "exact resume: every step's loss equal to the uninterrupted run's"
        if same
        else f"resume NOT exact: {len(a)} vs {len(b)} steps, first difference at {differ[:1]}"
    )


# -- (f) NVML signals --------------------------------------------------------------------------

NVML_FIELDS = ("gpu_util", "gpu_temp_c", "gpu_power_w", "nvml_used_mb")


def plan_nvml(ck, full: bool) -> list[Job]:
    return [Job("signals", (ck.full_preset if full else ck.preset)("gpu-24gb", 10))]


def run_nvml(ck, sec: Section) -> None:
    from core.runs.folder import read_metrics

    job = ck.plans[sec.key][0]
    if not sec.allows(ck, job):
        return
    train(ck, job.cfg, "nvml")
    records, _ = read_metrics(ck.work / "nvml" / "metrics.jsonl")
    fields = NVML_FIELDS if ck.cuda else ("rss_mb",)
    if not ck.cuda:
        sec.lines.append("CPU: no NVML; the records' memory field (rss_mb) is checked instead")
    for name in fields:
        values = [r[name] for r in records if name in r]
        sec.rows.append(
            {
                "field": name,
                "records with it": f"{len(values)} of {len(records)}",
                "min": min(values) if values else None,
                "max": max(values) if values else None,
            }
        )
    missing = [n for n in fields if not all(n in r for r in records)]
    sec.lines.append(f"missing in some records: {missing}" if missing else "every record has them")


# -- (g) torchrun ------------------------------------------------------------------------------


def torchrun_command(out: Path, data: Path, steps: int) -> list[str]:
    """torchrun starting this module's child: an NCCL all_reduce, then `python -m core.train`
    with the rest of the arguments (with one process TrainDeck itself starts no process group,
    so NCCL is proven by the all_reduce and the launch by the run)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        "-m",
        "benchmarks.gpu_check",
        "--torchrun-child",
        "--preset",
        "gpu-8gb",
        "--data",
        str(data),
        "--max-steps",
        str(steps),
        "--device",
        "cuda",
        "--out",
        str(out),
        "--log-every",
        "1",
        "--eval-every",
        "1000000",
        "--sample-tokens",
        "0",
    ]


def torchrun_child(argv: list[str]) -> int:
    import torch.distributed as dist

    from core.cli.train import main as train_main

    cuda = argv[argv.index("--device") + 1] == "cuda"  # the CPU (tests): gloo
    dist.init_process_group("nccl" if cuda else "gloo")
    t = torch.ones(4, device="cuda" if cuda else "cpu")
    dist.all_reduce(t)
    ok = t.tolist() == [float(dist.get_world_size())] * 4
    print(f"NCCL all_reduce {'ok' if ok else 'WRONG'}: backend {dist.get_backend()}", flush=True)
    dist.destroy_process_group()
    return train_main(argv) if ok else 1


def plan_torchrun(ck, full: bool) -> list[Job]:
    if not (full or ck.cuda):
        return []
    return [Job("torchrun", ck.full_preset("gpu-8gb", 10), Work.PROCESS, process=True)]


def run_torchrun(ck, sec: Section) -> None:
    out = ck.work / "torchrun"
    cmd = torchrun_command(out, ck.data_file(), 10)
    sec.lines.append("command: `" + " ".join(["python3", *cmd[1:]]) + "`")
    if not ck.cuda:
        sec.lines.append("CPU: skipped, NCCL needs CUDA")
        return
    job = ck.plans[sec.key][0]
    if not sec.allows(ck, job):
        return
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    t = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(30, ck.left())
        )
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        rc, text = "timeout", ""
    steps = len(losses_of(out)) if (out / "metrics.jsonl").exists() else 0
    sec.rows.append(
        {
            "exit code": rc,
            "NCCL all_reduce": "NCCL all_reduce ok: backend nccl" in text,
            "steps logged": steps,
            "wall s": time.perf_counter() - t,
        }
    )
    if rc != 0:
        sec.lines.append("last lines: " + " / ".join(text.strip().splitlines()[-3:]))


def _pythonpath() -> str:
    parts = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(parts))


# -- (h) tiers under their own memory ----------------------------------------------------------


def plan_tiers(ck, full: bool) -> list[Job]:
    pick = ck.full_preset if full else ck.preset
    return [Job(p, pick(p, 5), preset=p) for p in TIER_PRESETS]


def run_tiers(ck, sec: Section) -> None:
    from core.config import presets

    total = torch.cuda.get_device_properties(0).total_memory if ck.cuda else 0
    if not ck.cuda:
        sec.lines.append("CPU: no memory fraction; each preset trains at toy size")
    for job in ck.plans[sec.key]:
        if not sec.allows(ck, job):
            continue
        tier = presets.load_preset(job.preset).tier_gb
        fraction = min(1.0, tier * GiB / total) if ck.cuda else None
        with card_limited(ck, fraction):
            run = train(ck, job.cfg, f"tiers-{job.preset}")
        sec.rows.append(
            {
                "preset": job.preset,
                "memory fraction": fraction,
                "micro x accum": f"{run.cfg.batch_size} x {run.cfg.grad_accum}",
                **measured_row(ck, run),
                "of the tier": run.nvml_used / (tier * GiB) if ck.cuda else None,
                "OOM recoveries": len(run.ooms),
                "status": run.result["status"],
            }
        )
        ck.report.save()


# -- (i) long context --------------------------------------------------------------------------

# Qwen2.5-1.5B's shape (1.54B parameters), for the long-context predictions only.
ONE_HALF_B = dict(
    HALF_B,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
)
# Their own context is lifted to the field's limit (65,536), so the card decides.
LONG_MODELS = {
    "0.5B": dict(HALF_B, max_position_embeddings=65536),
    "1.5B": dict(ONE_HALF_B, max_position_embeddings=65536),
}
LONG_CARDS = (16, 24)  # GB, as Unsloth's context-per-VRAM table


# The two points trained: the 1.5B model at its longest predicted context in 16 GB, without
# and with the checkpoints offloaded to RAM (a memory fraction makes the card 16 GB); the
# 0.5B model reaches the field's limit there either way.
@dataclass(frozen=True)
class Point:
    model: str  # a LONG_MODELS key
    card_gb: int
    offload: bool

    @property
    def label(self) -> str:
        return f"{self.model} {self.card_gb} GB offload={self.offload}"


LONG_VERIFIED = (Point("1.5B", 16, False), Point("1.5B", 16, True))
STARTS["long"] = Start("qwen2", "Qwen2ForCausalLM", "Qwen2Config", LONG_MODELS["1.5B"], TOY_B, "")


def long_folder(ck, name: str) -> Path:
    folder = ck.work / f"long-{name}-config"
    if not folder.exists():
        folder.mkdir(parents=True)
        _write(folder / "config.json", json.dumps(qwen_config_json(LONG_MODELS[name])))
    return folder


def long_cfg(ck, folder: Path, seq: int, offload: bool, steps: int = 2):
    """LoRA r16 with activation checkpointing at batch 1 (bf16 on a GPU)."""
    from benchmarks.sides import pretrained_config

    return pretrained_config(
        folder,
        seq_len=seq,
        batch_size=1,
        grad_accum=1,
        max_data_bytes=2_000_000,
        # ~680k tokens: a 15% share holds a 65,536-token window (5% did not hold 40,448)
        val_fraction=0.15,
        grad_checkpointing=True,
        offload_checkpoints=offload,
        max_steps=steps,
        **LORA,
    )


def long_predictions(ck) -> dict[Point, int]:
    """The longest context the estimate gives each model, card and offload setting."""
    from core.training.estimate import usable_bytes
    from core.training.planner import longest_context

    out = {}
    for name in LONG_MODELS:
        for gb in LONG_CARDS:
            for offload in (False, True):
                cfg = long_cfg(ck, long_folder(ck, name), 2048, offload)
                out[Point(name, gb, offload)] = longest_context(
                    cfg, usable_bytes(gb * GiB), on_gpu=True
                )
    return out


def plan_long(ck, full: bool) -> list[Job]:
    jobs = [Job("build the 1.5B model", kind=Work.BUILD, start="long", fixed_s=build_s(ck, full))]
    if not (full or ck.cuda):  # the CPU trains the toy at a short context
        return jobs + [Job(p.label, fixed_s=ck.rates.setup_s) for p in LONG_VERIFIED]
    longest = long_predictions(ck)
    for p in LONG_VERIFIED:
        cfg = long_cfg(ck, long_folder(ck, p.model), longest[p] or 1024, p.offload)
        jobs.append(Job(p.label, cfg))
    return jobs


def run_long(ck, sec: Section) -> None:
    longest = long_predictions(ck)
    sec.lines.append(
        "predicted longest context, LoRA r16 + checkpointing, batch 1: "
        + "; ".join(
            f"{p.model} {p.card_gb} GB{' offloaded' if p.offload else ''} {n:,}"
            for p, n in longest.items()
        )
    )
    total = torch.cuda.get_device_properties(0).total_memory if ck.cuda else 0
    if not ck.cuda:
        sec.lines.append("CPU: the two points train at 256 tokens, no memory fraction")
    for p in LONG_VERIFIED:
        if not sec.allows(ck, Job(p.label, fixed_s=build_s(ck, False))):
            continue
        # the predicted point on a GPU; the toy at 256 tokens in a smoke run or on the CPU
        seq = longest[p] if ck.cuda and not ck.smoke else 256
        cfg = ck.base(long_cfg(ck, model_folder(ck, "long"), seq, p.offload), ck.steps(2))
        cfg = dataclasses.replace(cfg, seq_len=seq, batch_size=1)
        fraction = min(1.0, p.card_gb * GiB / total) if ck.cuda else None
        with card_limited(ck, fraction):
            run = train(ck, cfg, f"long-{p.model}-{p.card_gb}-{p.offload}")
        sec.rows.append(
            {
                "point": p.label,
                "seq": run.cfg.seq_len,
                "status": run.result["status"],
                "OOM recoveries": len(run.ooms),
                **measured_row(ck, run),
                "tokens/s": run.tokens_per_s(),
            }
        )
        ck.report.save()


# -- (j) several GPUs --------------------------------------------------------------------------

MULTI_STEPS = 10
MULTI_SHAPE = dict(hidden_dim=2048, n_heads=16, ffn_dim=None, seq_len=1024, batch_size=8)


def cuda_count(ck) -> int:
    return torch.cuda.device_count() if ck.cuda else 0


def card_bytes(ck) -> int:
    """The smallest visible card's total memory (the model must fit neither alone)."""
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(cuda_count(ck)))


def multi_model(ck, card: int, cards: int = 2):
    """Full AdamW on a width-2048 model whose layers grow until the estimate says the whole
    run needs more than one card (card bytes each) but a sharded process's share and each
    card's part of a layer split fit: (config, prediction) or (None, why not)."""
    from core.training.estimate import estimate, usable_bytes
    from core.training.planner import need
    from core.training.split import card_rows

    base = ck.base(ck.full_preset("gpu-8gb", MULTI_STEPS), MULTI_STEPS, device="cuda")
    base = dataclasses.replace(base, **MULTI_SHAPE, lora_rank=0, grad_checkpointing=False)
    usable = usable_bytes(card)
    devices = ",".join(f"cuda:{i}" for i in range(cards))
    for layers in range(2, 257, 2):
        cfg = dataclasses.replace(base, n_layers=layers, devices=None)
        whole = need(cfg)
        if whole <= usable:
            continue
        each = dataclasses.replace(cfg, shard=True, batch_size=cfg.batch_size // cards)
        sharded = need(each, cards)  # a process's share of the same global batch
        split = dataclasses.replace(cfg, devices=devices)
        rows = card_rows(split, estimate(split), [card] * cards)
        if sharded > usable or not all(r.fits for r in rows):
            return None, f"at {layers} layers one card is too small but so is each share"
        prediction = {
            "n_layers": layers,
            "params": estimate(cfg).n_params,
            "card_GiB": card / GiB,
            "whole_GiB": whole / GiB,
            "sharded_GiB_per_card": sharded / GiB,
            "split_GiB_per_card": [r.total / GiB for r in rows],
            "split_layers": [r.layers for r in rows],
        }
        return cfg, prediction
    return None, "no width-2048 model up to 256 layers outgrows one card"


def multi_flags(cfg, out: Path, batch: int) -> list[str]:
    """core.train's flags for cfg (a new model, this check's shape and data), batch rows a
    process."""
    return [
        *("--preset", "gpu-8gb", "--data", str(cfg.data), "--out", str(out)),
        *("--hidden-dim", str(cfg.hidden_dim), "--n-heads", str(cfg.n_heads)),
        *("--n-layers", str(cfg.n_layers), "--seq-len", str(cfg.seq_len)),
        *("--batch-size", str(batch), "--grad-accum", "1"),
        *("--max-steps", str(cfg.max_steps), "--log-every", "1", "--eval-every", "1000000"),
        *("--ckpt-every", "1000000", "--sample-tokens", "0", "--no-compile"),
    ]


def multi_commands(cfg, work: Path, cards: int = 2) -> dict[str, list[str]]:
    """The sharded run (torchrun, one process a card, --shard, each its share of the batch)
    and the split one (one process, --devices over every card, the whole batch), each its
    own run folder: the same global batch."""
    devices = ",".join(f"cuda:{i}" for i in range(cards))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return {
        "sharded": [
            *(*torchrun, "--nproc_per_node", str(cards), "-m", "core.train"),
            *multi_flags(cfg, work / "sharded", cfg.batch_size // cards),
            "--shard",
        ],
        "split": [
            *(sys.executable, "-m", "core.train"),
            *multi_flags(cfg, work / "split", cfg.batch_size),
            *("--devices", devices),
        ],
    }


class CardPeaks:
    """Each card's largest NVML 'used' reading above what it held before, read on its own
    thread every 0.2 s while a run goes on (the same measure for both runs)."""

    def __init__(self, cards: int):
        import threading

        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(cards)]
        self.before = self.read()
        self.peaks = list(self.before)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def read(self) -> list[int]:
        return [self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles]

    def poll(self) -> None:
        while not self.done.wait(0.2):
            self.peaks = [max(a, b) for a, b in zip(self.peaks, self.read(), strict=True)]

    def stop(self) -> list[float]:
        self.done.set()
        self.thread.join()
        return [(p - b) / MiB for p, b in zip(self.peaks, self.before, strict=True)]


def plan_multi(ck, full: bool) -> list[Job]:
    """Nothing where fewer than two GPUs are visible (the H100 plan included): the section
    then says so in a line."""
    cards = cuda_count(ck)
    if full or cards < 2:
        return []
    cfg, _ = multi_model(ck, card_bytes(ck), cards)
    if cfg is None:
        return []
    return [
        Job(f"{mode} over {cards} GPUs", cfg, Work.PROCESS, process=True, fixed_s=30.0)
        for mode in ("sharded", "split")
    ]


def run_multi(ck, sec: Section) -> None:
    cards = cuda_count(ck)
    if cards < 2:
        sec.lines.append(f"skipped: {cards} CUDA GPU(s) visible; this section needs 2 or more")
        return
    cfg, prediction = multi_model(ck, card_bytes(ck), cards)
    if cfg is None:
        sec.lines.append(f"skipped: {prediction}")
        return
    sec.data["predicted"] = prediction
    sec.lines.append(
        "predicted: {params:,} parameters, {n_layers} layers; the whole run {whole_GiB:.1f} GiB "
        "against {card_GiB:.1f} GiB a card; sharded {sharded_GiB_per_card:.1f} GiB a card; "
        "split {split}".format(
            **prediction,
            split=", ".join(
                f"{g:.1f} GiB ({layers})"
                for g, layers in zip(
                    prediction["split_GiB_per_card"], prediction["split_layers"], strict=True
                )
            ),
        )
    )
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    for (mode, cmd), job in zip(
        multi_commands(cfg, ck.work, cards).items(), ck.plans[sec.key], strict=True
    ):
        if not sec.allows(ck, job):
            continue
        fresh_memory(ck.cuda)
        peaks, t = CardPeaks(cards), time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(60, ck.left())
            )
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            rc, text = "timeout", ""
        used = peaks.stop()
        sec.rows.append(multi_row(mode, rc, ck.work / mode, used, time.perf_counter() - t))
        if rc != 0:
            sec.lines.append(f"{mode}: last lines: " + " / ".join(text.strip().splitlines()[-3:]))
        ck.report.save()


def multi_row(mode: str, rc, run_dir: Path, used: list[float], wall: float) -> dict:
    """A run's row: its median tokens/s after the first two steps, each card's NVML peak."""
    from core.runs.folder import read_metrics

    rates = []
    if (run_dir / "metrics.jsonl").exists():
        records, _ = read_metrics(run_dir / "metrics.jsonl")
        rates = sorted(r["tokens_per_s"] for r in records[2:] if r.get("tokens_per_s"))
    row = {"run": mode, "exit code": rc, "tokens/s": rates[len(rates) // 2] if rates else None}
    row.update({f"cuda:{i} NVML peak MiB": mib for i, mib in enumerate(used)})
    return {**row, "wall s": wall}


PLANS = {
    SPEED: (plan_speed, run_speed),
    "a": (plan_memory, run_memory),
    "b": (plan_throughput, run_throughput),
    "c": (plan_vs_peft, run_vs_peft),
    "d": (plan_oom, run_oom),
    "e": (plan_precision, run_precision),
    "f": (plan_nvml, run_nvml),
    "g": (plan_torchrun, run_torchrun),
    "h": (plan_tiers, run_tiers),
    "i": (plan_long, run_long),
    "j": (plan_multi, run_multi),
}


# -- the whole check ---------------------------------------------------------------------------


BUDGET_S = 480  # the speed section's 240 s, then the others' essential rows (about 200 s)
SPEED_FIELDS = {
    "lora": {"side": str, "checkpointing": bool, "tokens_per_s": float, "peak_mib": float},
    "full": {"side": str, "checkpointing": bool, "tokens_per_s": float, "peak_mib": float},
    "presets": {
        "preset": str,
        "compiled": bool,
        "tokens_per_s": float,
        "mfu": float,
        "first_step_s": float,
    },
}


def speed_problems(data: dict) -> list[str]:
    """What a device's gpu_check.json lacks for docs/gpu/ (the speed section's raw rows)."""
    speed = data.get("sections", {}).get("speed")
    if data.get("smoke") or not data.get("capability"):
        return ["a smoke run or a CPU's: only a GPU's full-size run is kept"]
    if speed is None:
        return ["no speed section (run it: --only speed)"]
    problems = [] if speed.get("device") else ["speed.device: missing"]
    for table, fields in SPEED_FIELDS.items():
        rows = speed.get(table) or []
        if not rows and table != "presets":  # the budget may leave the presets out
            problems.append(f"speed.{table}: no rows")
        for i, row in enumerate(rows):
            for name, kind in fields.items():
                value = row.get(name)
                ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
                if not ok and not (name == "mfu" and value is None):  # a card of no known peak
                    problems.append(
                        f"speed.{table}[{i}].{name}: {value!r} is not a {kind.__name__}"
                    )
    return problems


def record_name(data: dict) -> str:
    """docs/gpu/<device>-<date>.json: the device's name in lower case, words joined by '-'."""
    device = "-".join(
        "".join(c if c.isalnum() else " " for c in data["device_name"]).lower().split()
    )
    return f"{device}-{data['date']}.json"


def record(argv: list[str]) -> int:
    """--record FILE [FOLDER]: keep a device's gpu_check.json as FOLDER/<device>-<date>.json
    (default docs/gpu), after checking its speed section; the figures in the docs are read
    from it."""
    if not argv or len(argv) > 2:
        print("error: --record FILE [FOLDER]: one gpu_check.json", file=sys.stderr)
        return 2
    source = Path(argv[0])
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"error: --record {source}: not a readable gpu_check.json ({e})", file=sys.stderr)
        return 2
    problems = speed_problems(data)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        print(f"error: --record {source}: {problems[0]}{more}", file=sys.stderr)
        return 2
    folder = Path(argv[1]) if len(argv) > 1 else ROOT / "docs" / "gpu"
    target = folder / record_name(data)
    if target.exists():
        print(f"error: --record: {target} exists; it is not overwritten", file=sys.stderr)
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    _write(target, json.dumps(data, indent=1))
    print(target)
    return 0


def selected(only: str | None) -> list[str]:
    if not only:
        return list(SECTIONS)
    by_name = {name: k for k, (name, _) in SECTIONS.items()}
    keys = []
    for part in only.split(","):
        part = part.strip()
        key = part if part in SECTIONS else by_name.get(part)
        if key is None:
            allowed = ", ".join(f"{k} {n}" for k, (n, _) in SECTIONS.items())
            raise ValueError(f"--only: unknown section {part!r}; allowed: {allowed}")
        keys.append(key)
    return [k for k in SECTIONS if k in keys]


def run_section(ck, sec: Section) -> None:
    t, curves = time.perf_counter(), len(ck.report.curves)
    ck.section_t0 = t
    before = sec.wall_s or 0.0
    sec.status = "running" if sec.status == "pending" else sec.status
    print(f"[{ck.elapsed():6.1f} s] ({sec.key}) {sec.title}", file=sys.stderr, flush=True)
    try:
        PLANS[sec.key][1](ck, sec)
        sec.status = "ok" if sec.status == "running" else sec.status
    except Exception as e:  # one section's failure must not cost the others their minutes
        import traceback

        sec.status = "failed"
        where = traceback.extract_tb(e.__traceback__)[-1]
        sec.lines.append(
            f"failed: {type(e).__name__}: {e} ({Path(where.filename).name}:{where.lineno})"
        )
        if ck.cuda:
            torch.cuda.set_per_process_memory_fraction(1.0)
        torch.use_deterministic_algorithms(False)
    sec.wall_s = before + time.perf_counter() - t
    ck.report.info["elapsed_s"] = ck.elapsed()
    if len(ck.report.curves) > curves:  # a killed run keeps the curves drawn so far
        ck.report.info["png"] = ck.report.plot() or "gpu_check.png"
    ck.report.save()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--torchrun-child"]:
        return torchrun_child(argv[1:])
    if argv[:1] == ["--warm-start-child"]:
        return warm_start_child(argv[1:])
    if argv[:1] == ["--record"]:
        return record(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for gpu_check.json, .md and .png")
    p.add_argument(
        "--record",
        metavar="FILE [FOLDER]",
        help="instead of a check: keep a device's gpu_check.json as FOLDER/<device>-<date>.json "
        "(default FOLDER: docs/gpu); given first, with no other flag",
    )
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all sections")
    p.add_argument("--only", help="sections, letters or names, comma separated (a,b or memory)")
    p.add_argument("--smoke", action="store_true", help="every section at toy size")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when present")
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA GPU is visible to torch", file=sys.stderr)
        return 2
    try:
        keys = selected(args.only)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    ck = Check(args)
    try:
        return check(ck, keys)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(ck.work, ignore_errors=True)


def check(ck, keys: list[str]) -> int:
    ck.first = keys[0]
    for key in keys:
        sec = Section(key, *SECTIONS[key], limit_s=SPEED_LIMIT_S if key == SPEED else None)
        plan = PLANS[key][0]
        ck.plans[key] = plan(ck, False)
        full = plan(ck, True)
        limit = sec.limit_s or float("inf")
        sec.predicted_here_s = min(limit, predict(ck.plans[key], ck.rates))
        sec.essential_s = min(
            limit, predict([j for j in ck.plans[key] if not j.optional], ck.rates)
        )
        sec.predicted_gpu_s = min(limit, predict(full, H100))
        sec.essential_gpu_s = min(limit, predict([j for j in full if not j.optional], H100))
        ck.report.add(sec)
    secs = ck.report.sections.values()
    ck.report.info["predicted_gpu_total_s"] = sum(s.predicted_gpu_s for s in secs)
    ck.report.info["predicted_gpu_essential_s"] = sum(s.essential_gpu_s for s in secs)
    ck.report.save()
    for key in keys:
        run_section(ck, ck.report.sections[key])
    if "b" in keys and ck.cuda:  # compiled rows: optional, so after everything else
        ck.tail = True
        run_section(ck, ck.report.sections["b"])
    why = ck.report.plot()
    ck.report.info["png"] = why or ("gpu_check.png" if ck.report.curves else "no curves")
    ck.report.info["elapsed_s"] = ck.elapsed()
    ck.report.save()
    print(ck.report.markdown())
    return 1 if any(s.status == "failed" for s in ck.report.sections.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
