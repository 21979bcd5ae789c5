"""One prepared GPU check: what only a GPU shows, measured in a few minutes.

    python3 -m benchmarks.gpu_check --out DIR [--budget 360] [--only SECTIONS] [--smoke]
        [--device cuda|cpu]

Sections, most important first (--only takes letters or names, comma separated):
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

Each section predicts its GPU time from its FLOPs and bytes before it runs and is skipped,
with a line, when that would not leave the later sections their predicted time. It writes
as it goes, three files at most: DIR/gpu_check.json (every figure, the device, driver, torch
and CUDA versions), DIR/gpu_check.md (the tables for docs/gpu.md) and DIR/gpu_check.png
(loss and VRAM curves; only where matplotlib imports). --smoke runs every section at toy size
(the CPU: about 15 s); CUDA-only parts are skipped with a line saying so. docs/gpu.md says
how to run it and what each figure means.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
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

SECTIONS = {
    "a": ("memory", "Memory estimate vs measured peak"),
    "b": ("throughput", "Throughput and MFU (bf16)"),
    "c": ("vs_peft", "Fine-tuning vs transformers + peft (LoRA, 8 x 1024)"),
    "d": ("oom", "Out-of-memory recovery on a real card"),
    "e": ("precision", "Precision and exact resume"),
    "f": ("nvml", "NVML signals in metrics.jsonl"),
    "g": ("torchrun", "torchrun --nproc_per_node 1 with NCCL"),
    "h": ("tiers", "Each tier preset under a memory fraction equal to its tier"),
    "i": ("long", "Long context"),
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
# kind -> (model_type, architecture, transformers config class, full shape, toy shape, label)
STARTS = {
    "qwen": ("qwen2", "Qwen2ForCausalLM", "Qwen2Config", HALF_B, TOY_B, ""),
    "moe": ("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", MOE_HALF_B, MOE_TOY, "MoE"),
    "hybrid": (
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


# H100 80GB SXM: 989 TFLOP/s dense bf16 (datasheet; 798 measured in a product on this
# workplace's machine), 3.0 TB/s copy measured there. MFU and the fixed costs are guesses that
# the first GPU run replaces (docs/gpu.md, "Sizing").
H100 = Rates("H100 (predicted)", 989e12, 0.35, 3.0e12, 3.0, 45.0, 15.0)


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


@dataclass
class Job:
    """A unit of a section's work, for its prediction."""

    label: str
    cfg: object = None  # TrainConfig of a training run; None for fixed work
    steps: int | None = None  # None: the config's max_steps
    compile: bool = False
    process: bool = False  # in a fresh process (torchrun)
    fixed_s: float = 0.0  # other fixed work (building a model, an OOM retry)


def job_seconds(job: Job, rates: Rates) -> float:
    from core.training.estimate import estimate, flops_per_token

    s = job.fixed_s + (rates.process_s if job.process else 0.0)
    if job.cfg is None:
        return s
    cfg = job.cfg
    est = estimate(cfg, on_gpu=rates is H100)
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

    def allows(self, ck, *jobs: Job, optional: bool = False) -> bool:
        """Whether the jobs' predicted time fits what is left after the later sections'
        essential share; if not, a line says what was skipped."""
        need = predict(list(jobs), ck.rates)
        spare = ck.left() - ck.reserve_after(self.key)
        if need <= spare:
            return True
        names = ", ".join(j.label for j in jobs)
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
            "sections": {s.name: dataclasses.asdict(s) for s in self.sections.values()},
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
            out += [f"- {line}" for line in s.lines]
            if s.rows:
                out += ["", *table(s.rows)]
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


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _cell(key: str, v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        if key.startswith(("error", "MFU", "of the", "share")):
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
    """Events of one run: train records and out-of-memory recoveries."""

    def __init__(self, stop_after: int | None = None):
        self.records, self.ooms, self.stop_after = [], [], stop_after

    def __getattr__(self, name):  # every other event: ignored
        if name.startswith("on_"):
            return lambda *a: None
        raise AttributeError(name)

    def on_train_batch_end(self, record):
        self.records.append(record)

    def on_oom(self, info):
        self.ooms.append(info)


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

    def tokens_per_s(self) -> float:
        steady = self.records[len(self.records) // 2 :] or self.records
        return sorted(r["tokens_per_s"] for r in steady)[len(steady) // 2] if steady else 0.0


def fresh_memory(cuda: bool) -> None:
    if cuda:  # the last run's tensors, then its cached blocks (on the CPU: 0.4 s a collect)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def train(ck, cfg, label: str, save: bool = False, stop_after=None, resume_from=None, fault=None):
    """One run of the real Trainer; save=False leaves checkpoints out (they time the disk)."""
    from core.runs.events import TrainControl
    from core.training.trainer import Trainer

    class Quiet(Trainer):
        def save_checkpoint(self, best=False):
            return None if not save else super().save_checkpoint(best)

    class StopAfter(TrainControl):
        @property
        def stop_requested(self):
            return stop_after is not None and trainer.step >= stop_after

    fresh_memory(ck.cuda)
    run_dir = ck.work / label
    trainer = Quiet(cfg, run_dir, resume_from=resume_from, fault=fault)
    events = Collect()
    t = time.perf_counter()
    result = trainer.run(events, StopAfter())
    run = Run(trainer.cfg, events.records, events.ooms, result, time.perf_counter() - t)
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

    def reserve_after(self, key: str) -> float:
        """The essential predicted time of the selected sections after this one."""
        later = [s for k, s in self.report.sections.items() if k > key]
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
    for name in ("transformers", "peft", "nvidia-ml-py", "matplotlib", "platformdirs", "gguf"):
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
    model_type, arch = STARTS[kind][:2]
    return {
        "model_type": model_type,
        "architectures": [arch],
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
        **shape,
    }


def config_folder(ck, kind: str = "qwen") -> Path:
    """The 0.5B model's config.json alone: enough for its estimates and predictions."""
    folder = ck.work / f"{kind}-0.5b-config"
    if not folder.exists():
        folder.mkdir(parents=True)
        _write(folder / "config.json", json.dumps(qwen_config_json(STARTS[kind][3], kind)))
    return folder


def has_config_class(kind: str) -> bool:
    """Whether this machine's transformers builds that start (an older one lacks Qwen3-MoE)."""
    import transformers

    return hasattr(transformers, STARTS[kind][2])


def model_folder(ck, kind: str = "qwen") -> Path:
    """A random Qwen2 or Qwen3-MoE (0.5B; --smoke: a toy) saved with a small BPE tokenizer,
    as --init-from reads it; built on the GPU when there is one."""
    if kind in ck.models:
        return ck.models[kind]
    import transformers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from core.data.tokenizer import train_bpe

    shape = STARTS[kind][4] if ck.smoke else STARTS[kind][3]
    folder = ck.work / (f"{kind}-toy" if ck.smoke else f"{kind}-0.5b")
    text = ck.data_file().read_bytes()[: 30_000 if ck.smoke else 300_000]
    hf = train_bpe([text], 512 if ck.smoke else 2048).hf
    hf.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token="<|endoftext|>")
    tok.save_pretrained(folder)
    shape = {**shape, "vocab_size": max(shape["vocab_size"], len(tok))}
    config = getattr(transformers, STARTS[kind][2])(**shape, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if ck.cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    ck.models[kind] = folder
    return folder


def finetune_cfg(ck, folder: Path, mode: str, steps: int, full: bool):
    """full, lora or lora+ckpt at batch 8 x 1024 (--smoke: 2 x 64) on the folder's model."""
    from core.config.spec import TrainConfig, validate
    from core.weights.loader import apply_pretrained, config_only

    extra = dict(LORA) if mode.startswith("lora") else {}
    cfg = TrainConfig(
        init_from=str(folder),
        seq_len=1024,
        batch_size=8,
        grad_accum=1,
        tokenizer="model",
        max_data_bytes=2_000_000,  # the 8 MB corpus through a BPE: its first 2 MB will do
        grad_checkpointing=mode.endswith("ckpt"),
        max_steps=steps,
        **extra,
    )
    cfg = validate(apply_pretrained(validate(cfg), config_only(folder)))
    if full:
        return dataclasses.replace(cfg, device="cuda")
    return ck.base(cfg, ck.steps(steps))


def build_s(ck, full: bool) -> float:
    """Building the 0.5B model (on the GPU) or the toy, and importing transformers."""
    return 10.0 if full else (3.0 if ck.smoke else 10.0)


# -- (a) memory --------------------------------------------------------------------------------

FT_MODES = ("full", "lora", "lora+ckpt")


def plan_memory(ck, full: bool) -> list[Job]:
    pick = ck.full_preset if full else ck.preset
    # CUDA's context, cuBLAS and the first kernels, once (in smoke: nothing)
    jobs = [Job("CUDA start", fixed_s=8.0 if full or ck.cuda else 0.0)]
    jobs += [Job(p, pick(p, 20)) for p in TIER_PRESETS]
    folder = config_folder(ck) if full or not ck.smoke else None
    jobs.append(Job("build the 0.5B model", fixed_s=build_s(ck, full)))
    for mode in FT_MODES:
        cfg = finetune_cfg(ck, folder, mode, 20, full) if folder else None
        jobs.append(Job(f"0.5B {mode}", cfg, fixed_s=0.0 if cfg else ck.rates.setup_s))
    for kind in filter(has_config_class, EXTRA_STARTS):
        name = STARTS[kind][5]
        extra = config_folder(ck, kind) if full or not ck.smoke else None
        jobs.append(Job(f"build the {name} 0.5B model", fixed_s=build_s(ck, full)))
        cfg = finetune_cfg(ck, extra, "lora", 20, full) if extra else None
        jobs.append(Job(f"{name} 0.5B lora", cfg, fixed_s=0.0 if cfg else ck.rates.setup_s))
    return jobs


def start_kind(label: str) -> str:
    """Which STARTS model a memory job's label names."""
    for kind in EXTRA_STARTS:
        if label.startswith((STARTS[kind][5], f"build the {STARTS[kind][5]}")):
            return kind
    return "qwen"


def memory_row(ck, label: str, run: Run) -> dict:
    from core.training.estimate import estimate

    est = estimate(run.cfg, on_gpu=ck.cuda)
    row = {
        "run": label,
        "params": est.n_params,
        "micro x seq": f"{run.cfg.batch_size} x {run.cfg.seq_len}",
        "estimate alloc MiB": est.allocator_peak / MiB,
    }
    if not ck.cuda:  # the CPU's RSS is the whole process's: no per-run peak to compare
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


def run_memory(ck, sec: Section) -> None:
    if not ck.cuda:
        sec.lines.append("CPU: no allocator peak per run; the estimates run, not compared")
    for job in ck.plans[sec.key]:
        if not sec.allows(ck, job):
            continue
        if job.label == "CUDA start":
            continue
        kind = start_kind(job.label)
        if job.cfg is None and job.label.startswith("build"):
            model_folder(ck, kind)
            continue
        cfg = job.cfg
        if "0.5B" in job.label:  # planned on its config.json; now on its weights
            cfg = finetune_cfg(ck, model_folder(ck, kind), job.label.split()[-1], 20, False)
        run = train(ck, cfg, f"memory-{job.label.replace(' ', '-')}")
        sec.rows.append(memory_row(ck, job.label, run))
        curve(ck, job.label, run)
        ck.report.save()
    for kind in EXTRA_STARTS:
        if not has_config_class(kind):
            name, config_class = STARTS[kind][5], STARTS[kind][2]
            sec.lines.append(f"{name} row: skipped, this transformers has no {config_class}")


# -- (b) throughput ----------------------------------------------------------------------------


def plan_throughput(ck, full: bool) -> list[Job]:
    pick = ck.full_preset if full else ck.preset
    # a record every 5 steps: each record's sync and NVML read, not every step's (the first
    # GPU run logged every step, and its small presets' MFU was 3-7%)
    jobs = [Job(f"{p} eager", pick(p, 20, log_every=5)) for p in TIER_PRESETS]
    jobs.append(Job(PROFILED, pick(TIER_PRESETS[0], 6, log_every=5)))
    if full or ck.cuda:
        jobs += [
            Job(f"{p} compiled", pick(p, 20, log_every=5, compile=True), compile=True)
            for p in COMPILE_ORDER
        ]
    return jobs


PROFILED = f"{TIER_PRESETS[0]} profiled"


def profile_rows(ck, cfg, label: str, top: int = 12) -> tuple[list[dict], str]:
    """One short run under torch's profiler: the operators with the most device time (CUDA;
    the CPU's own time on a CPU), and how busy the device was over the profiled wall time."""
    from torch.profiler import ProfilerActivity, profile

    kinds = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ck.cuda else [])
    t0 = time.perf_counter()
    with profile(activities=kinds) as prof:
        train(ck, cfg, label)
    wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    attr = "self_device_time_total" if ck.cuda else "self_cpu_time_total"
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
    where = "the GPU" if ck.cuda else "the CPU (self time)"
    return rows, f"{label}: {where} busy {busy:.2f} s of {wall:.2f} s profiled wall time"


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
        if job.compile != ck.tail or not sec.allows(ck, job, optional=job.compile):
            continue
        if job.label == PROFILED:
            rows, line = profile_rows(ck, job.cfg, f"throughput-{TIER_PRESETS[0]}-profiled")
            sec.lines.append(line)
            sec.extra_tables.append((f"where {TIER_PRESETS[0]}'s step goes", rows))
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
    side = dict(fixed_s=0.0 if cfg else ck.rates.setup_s)
    jobs = [Job("TrainDeck LoRA", cfg, **side)]
    if full or not ck.smoke:
        jobs.append(Job("transformers + peft LoRA", cfg))
    return jobs


def peft_side(folder: Path, batch: int, seq: int, steps: int, device: str = "cuda") -> dict:
    """A user's transformers + peft script: bf16 weights, fp32 adapters on every projection,
    autocast, fused AdamW, plain cross-entropy; the same rank, alpha and batch as ours. (The
    CPU, for the tests: fp32, no autocast.)"""
    import contextlib

    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from benchmarks.finetune import PEFT_TARGETS

    cuda = device == "cuda"
    fresh_memory(cuda)
    dtype = torch.bfloat16 if cuda else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device)
    lc = LoraConfig(
        r=LORA["lora_rank"],
        lora_alpha=LORA["lora_alpha"],
        lora_dropout=0.0,
        bias="none",
        target_modules=PEFT_TARGETS,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lc)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=cuda)
    g = torch.Generator().manual_seed(0)
    vocab = min(2000, model.config.vocab_size)
    x = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    times, losses = [], []
    for _ in range(steps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        with autocast:
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # syncs, as a script's logging does
        times.append(time.perf_counter() - t)
    steady = sorted(times[steps // 2 :])
    return {
        "tokens/s": batch * seq / steady[len(steady) // 2],
        "peak MiB": torch.cuda.max_memory_allocated() / MiB if cuda else None,
        "trainable": sum(p.numel() for p in params),
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
        cfg = finetune_cfg(ck, folder, "lora", 12, False)
        if job.label.startswith("TrainDeck"):
            run = train(ck, cfg, "vs-peft-traindeck")
            row = {"side": job.label, "tokens/s": run.tokens_per_s()}
            row["peak MiB"] = run.peak / MiB if ck.cuda else None
        else:
            steps = cfg.max_steps
            row = {"side": job.label, **peft_side(folder, cfg.batch_size, cfg.seq_len, steps)}
        sec.rows.append({**row, "micro x seq": f"{cfg.batch_size} x {cfg.seq_len}"})
        ck.report.save()
    if len(sec.rows) == 2 and sec.rows[1]["tokens/s"]:
        ratio = sec.rows[0]["tokens/s"] / sec.rows[1]["tokens/s"]
        mem = sec.rows[0]["peak MiB"] / sec.rows[1]["peak MiB"]
        sec.lines.append(f"TrainDeck / peft: {ratio:.2f}x the tokens/s, {mem:.2f}x the memory")


# -- (d) out of memory -------------------------------------------------------------------------

OOM_PRESET = "gpu-24gb"


def plan_oom(ck, full: bool) -> list[Job]:
    cfg = (ck.full_preset if full else ck.preset)(OOM_PRESET, 4, grad_accum=1)
    cfg = dataclasses.replace(cfg, batch_size=cfg.batch_size * 2)  # 152 x 1: halves to 76 x 2
    return [Job("shrunk card", cfg, cfg.max_steps + 1)]  # + the step that ran out


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
        torch.cuda.set_per_process_memory_fraction(fraction)
    else:
        sec.lines.append(
            "CPU: the out-of-memory error is injected at step 2 (a real one needs CUDA)"
        )
        fired = []

        def fault(step, micro):
            if step == 2 and not fired:
                fired.append(step)
                raise torch.OutOfMemoryError("injected: CUDA out of memory")

    try:
        run = train(ck, cfg, "oom", fault=fault)
    finally:
        if ck.cuda:
            torch.cuda.set_per_process_memory_fraction(1.0)
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
        Job("straight", det),
        Job("stopped", det, half),
        Job("resumed", det, det.max_steps - half),
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
    for job in jobs[:-3]:
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
    if sec.allows(ck, *jobs[-3:]):
        resume_rows(ck, sec, jobs[-3].cfg)
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
    return [Job("torchrun", ck.full_preset("gpu-8gb", 10), process=True)]


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
    return [Job(p, pick(p, 5)) for p in TIER_PRESETS]


def run_tiers(ck, sec: Section) -> None:
    from core.config import presets
    from core.training.estimate import estimate

    total = torch.cuda.get_device_properties(0).total_memory if ck.cuda else 0
    if not ck.cuda:
        sec.lines.append("CPU: no memory fraction; each preset trains at toy size")
    for job in ck.plans[sec.key]:
        if not sec.allows(ck, job):
            continue
        tier = presets.load_preset(job.label).tier_gb
        fraction = min(1.0, tier * GiB / total) if ck.cuda else None
        if fraction:
            torch.cuda.set_per_process_memory_fraction(fraction)
        try:
            run = train(ck, job.cfg, f"tiers-{job.label}")
        finally:
            if fraction:
                torch.cuda.set_per_process_memory_fraction(1.0)
        est = estimate(run.cfg, on_gpu=ck.cuda)
        sec.rows.append(
            {
                "preset": job.label,
                "memory fraction": fraction,
                "micro x accum": f"{run.cfg.batch_size} x {run.cfg.grad_accum}",
                "estimate device GiB": est.device_total / GiB,
                "max_allocated GiB": run.peak / GiB if ck.cuda else None,
                "error alloc": est.allocator_peak / run.peak - 1 if ck.cuda else None,
                "reserved GiB": run.reserved / GiB if ck.cuda else None,
                "NVML used GiB": run.nvml_used / GiB if ck.cuda else None,
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
LONG_VERIFIED = (("1.5B", 16, False), ("1.5B", 16, True))
STARTS["long"] = ("qwen2", "Qwen2ForCausalLM", "Qwen2Config", LONG_MODELS["1.5B"], TOY_B, "")


def long_folder(ck, name: str) -> Path:
    folder = ck.work / f"long-{name}-config"
    if not folder.exists():
        folder.mkdir(parents=True)
        _write(folder / "config.json", json.dumps(qwen_config_json(LONG_MODELS[name])))
    return folder


def long_cfg(ck, folder: Path, seq: int, offload: bool, steps: int = 2):
    """LoRA r16 with activation checkpointing at batch 1 (bf16 on a GPU)."""
    from core.config.spec import TrainConfig, validate
    from core.weights.loader import apply_pretrained, config_only

    cfg = TrainConfig(
        init_from=str(folder),
        seq_len=seq,
        batch_size=1,
        grad_accum=1,
        tokenizer="model",
        max_data_bytes=2_000_000,
        # ~680k tokens: a 15% share holds a 65,536-token window (5% did not hold 40,448)
        val_fraction=0.15,
        grad_checkpointing=True,
        offload_checkpoints=offload,
        max_steps=steps,
        **LORA,
    )
    return validate(apply_pretrained(validate(cfg), config_only(folder)))


def long_predictions(ck) -> list[dict]:
    """The longest context the estimate gives each model, card and offload setting."""
    from core.training.estimate import usable_bytes
    from core.training.planner import longest_context

    rows = []
    for name in LONG_MODELS:
        for gb in LONG_CARDS:
            for offload in (False, True):
                cfg = long_cfg(ck, long_folder(ck, name), 2048, offload)
                longest = longest_context(cfg, usable_bytes(gb * GiB), on_gpu=True)
                rows.append({"model": name, "card GB": gb, "offload": offload, "longest": longest})
    return rows


def plan_long(ck, full: bool) -> list[Job]:
    jobs = [Job("build the 1.5B model", fixed_s=build_s(ck, full))]
    if not (full or ck.cuda):  # the CPU trains the toy at a short context
        return jobs + [Job(f"point {i}", fixed_s=ck.rates.setup_s) for i in (1, 2)]
    preds = {(r["model"], r["card GB"], r["offload"]): r["longest"] for r in long_predictions(ck)}
    for point in LONG_VERIFIED:
        cfg = long_cfg(ck, long_folder(ck, point[0]), preds[point] or 1024, point[2])
        jobs.append(Job(f"{point[0]} {point[1]} GB offload={point[2]}", cfg))
    return jobs


def run_long(ck, sec: Section) -> None:
    from core.training.estimate import estimate

    preds = long_predictions(ck)
    sec.lines.append(
        "predicted longest context, LoRA r16 + checkpointing, batch 1: "
        + "; ".join(
            f"{r['model']} {r['card GB']} GB{' offloaded' if r['offload'] else ''} {r['longest']:,}"
            for r in preds
        )
    )
    longest = {(r["model"], r["card GB"], r["offload"]): r["longest"] for r in preds}
    total = torch.cuda.get_device_properties(0).total_memory if ck.cuda else 0
    if not ck.cuda:
        sec.lines.append("CPU: the two points train at 256 tokens, no memory fraction")
    for name, gb, offload in LONG_VERIFIED:
        label = f"{name} {gb} GB offload={offload}"
        job = Job(label, fixed_s=build_s(ck, False))
        if not sec.allows(ck, job):
            continue
        # the predicted point on a GPU; the toy at 256 tokens in a smoke run or on the CPU
        seq = longest[(name, gb, offload)] if ck.cuda and not ck.smoke else 256
        cfg = ck.base(long_cfg(ck, model_folder(ck, "long"), seq, offload), ck.steps(2))
        cfg = dataclasses.replace(cfg, seq_len=seq, batch_size=1)
        fraction = min(1.0, gb * GiB / total) if ck.cuda else None
        if fraction:
            torch.cuda.set_per_process_memory_fraction(fraction)
        try:
            run = train(ck, cfg, f"long-{name}-{gb}-{offload}")
        finally:
            if fraction:
                torch.cuda.set_per_process_memory_fraction(1.0)
        est = estimate(run.cfg, on_gpu=ck.cuda)
        row = {
            "point": label,
            "seq": run.cfg.seq_len,
            "status": run.result["status"],
            "OOM recoveries": len(run.ooms),
            "estimate device GiB": est.device_total / GiB,
            "tokens/s": run.tokens_per_s(),
        }
        if ck.cuda:
            row |= {
                "max_allocated GiB": run.peak / GiB,
                "error alloc": est.allocator_peak / run.peak - 1,
                "reserved GiB": run.reserved / GiB,
            }
        sec.rows.append(row)
        ck.report.save()


PLANS = {
    "a": (plan_memory, run_memory),
    "b": (plan_throughput, run_throughput),
    "c": (plan_vs_peft, run_vs_peft),
    "d": (plan_oom, run_oom),
    "e": (plan_precision, run_precision),
    "f": (plan_nvml, run_nvml),
    "g": (plan_torchrun, run_torchrun),
    "h": (plan_tiers, run_tiers),
    "i": (plan_long, run_long),
}


# -- the whole check ---------------------------------------------------------------------------


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
    return sorted(set(keys))


def run_section(ck, sec: Section) -> None:
    t, curves = time.perf_counter(), len(ck.report.curves)
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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for gpu_check.json, .md and .png")
    p.add_argument("--budget", type=float, default=360, help="seconds for all sections")
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
    for key in keys:
        sec = Section(key, *SECTIONS[key])
        plan = PLANS[key][0]
        ck.plans[key] = plan(ck, False)
        sec.predicted_here_s = predict(ck.plans[key], ck.rates)
        sec.essential_s = predict([j for j in ck.plans[key] if not j.compile], ck.rates)
        full = plan(ck, True)
        sec.predicted_gpu_s = predict(full, H100)
        sec.essential_gpu_s = predict([j for j in full if not j.compile], H100)
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
