"""The training loop: reports through TrainEvents, obeys TrainControl, resumes exactly."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import random
import shutil
import time
import traceback
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint as ckpt
from . import lora, optim, recipe
from .atomic import is_disk_full
from .config import TrainConfig, compare_for_resume, from_dict, parse_duration, validate
from .data import PrepareCancelled, TokenData, data_changes, data_spec, describe, prepare
from .device import is_oom, resolve_device, resolve_precision
from .distributed import SilentFolder, World
from .errors import CheckpointError, DiskFullError, TrainingError, UserError
from .events import TrainControl, TrainEvents
from .hardware import memory_stats
from .loader import Pretrained, apply_pretrained, fingerprint, load_weights, open_pretrained
from .model import GPT, GPTConfig
from .runlock import RunLock
from .runs import RunFolder
from .schedule import Plan, finish_plan, lr_factor, plan_for
from .tokenizer import Tokenizer

UNTIMED = 10**9  # a time budget's step count before any step was timed
FINISH_FILE = "FINISH"  # in the run folder: ask the trainer to finish (cooldown, then stop)
OOM_ADVICE = (
    "lower batch_size first, then hidden_dim, then n_layers, or train on the CPU (--device cpu)"
)


def lr_at(step: int, cfg: TrainConfig, max_steps: int) -> float:
    """AdamW's lr at step (0-based) of a run planned for max_steps from the start."""
    return recipe.adamw_lr(cfg) * lr_factor(step, cfg, plan_for(cfg, max_steps))


def max_steps_for(cfg: TrainConfig, train_tokens: int) -> int:
    if cfg.max_epochs is not None:
        return max(1, math.ceil(cfg.max_epochs * train_tokens / cfg.tokens_per_step))
    return cfg.max_steps


def smaller_micro_batch(batch_size: int, grad_accum: int) -> tuple[int, int] | None:
    """Halve the micro-batch keeping batch_size * grad_accum exact; None at 1."""
    total = batch_size * grad_accum
    for micro in range(batch_size // 2, 0, -1):
        if total % micro == 0:
            return micro, total // micro
    return None


class Trainer:
    """One run. Build with a validated config and a run folder; call run()."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: str | Path,
        resume_from: str | Path | None = None,
        fault=None,
        data_cache: str | Path | None = None,
        allow_data_change: bool = False,
    ):
        # A pretrained start: the model's shape and tokenizer fill the config in.
        self.pretrained: Pretrained | None = None
        if cfg.init_from:
            self.pretrained = open_pretrained(cfg.init_from)
            cfg = apply_pretrained(cfg, self.pretrained)
        self.cfg = validate(cfg)
        self.base: dict | None = None  # the pretrained base a checkpoint names
        self.world = World.from_env()
        folder_kind = RunFolder if self.world.main else SilentFolder
        self.folder = folder_kind(Path(run_dir))
        self.resume_from = Path(resume_from) if resume_from else None
        self.fault = fault  # tests: fault(step, micro_index) may raise, e.g. an OOM
        self.data_cache = Path(data_cache) if data_cache else None
        self.allow_data_change = allow_data_change
        self.events = TrainEvents()
        self.control = TrainControl()
        self._early_logs: list[str] = []
        self.lock = RunLock(self.folder.path)
        self.step = 0
        self.best_val = float("inf")
        self.last_loss = None
        self._saved_step = -1
        self._elapsed_before = 0.0
        self._pending: list[tuple[int, torch.Tensor, float]] = []
        self._paused_s = 0.0  # time in eval/sample/checkpoint since the last metrics read
        self._paused_total = 0.0  # the same over the whole run (elapsed_before: included)
        self._writer = ckpt.BackgroundWriter()
        self._written_step = -1  # the newest checkpoint known to be whole on disk
        self._pause_depth = 0
        # Made by _setup once the input is known good; None until then.
        self.device: torch.device | None = None
        self.precision: str | None = None
        self.data: TokenData | None = None
        self.plan: Plan | None = None
        self.model: GPT | None = None
        self.train_model = None  # the model as trained: compiled and/or DDP-wrapped
        self.optimizer: optim.Optimizers | None = None
        self.budget_s = parse_duration(self.cfg.max_time) if self.cfg.max_time else None
        self._session_step0 = 0  # the step this session started at (time plans read speed)
        self.scaler: torch.amp.GradScaler | None = None
        self._owns_group = False  # this trainer created the process group
        self._t0: float | None = None  # perf_counter at the start of this session's steps
        self._window_start = 0.0  # start of the current metrics window
        self._finish_file_checked = 0.0
        self._speed_marks: collections.deque = collections.deque()  # (step, elapsed_s)

    @property
    def max_steps(self) -> int | None:
        return None if self.plan is None else self.plan.max_steps

    # -- setup ---------------------------------------------------------------------------

    def _log(self, message: str) -> None:
        self.folder.log(message)
        self.events.on_log(message)

    def _load_resume_state(self) -> dict:
        state = ckpt.load(self.resume_from)
        saved = validate(from_dict(state["config"], source=str(self.resume_from)))
        refused, allowed = compare_for_resume(saved, self.cfg)
        if refused:
            raise CheckpointError(
                f"resume: {self.resume_from} was trained with different settings: "
                f"{'; '.join(refused)}. Resume without changing these, or start a new run"
            )
        for change in allowed:
            self._log(f"resume: allowed change {change}")
        self._check_base(state)
        return state

    def _check_base(self, state: dict) -> None:
        """A fine-tune resumes only on the base model it started from."""
        saved = state.get("base")
        if self.pretrained is None or saved is None:
            return
        now = fingerprint(self.pretrained.folder)
        if saved["fingerprint"] != now:
            raise CheckpointError(
                f"resume: {self.resume_from} was fine-tuned from {saved['init_from']} (weights "
                f"{saved['fingerprint']}), but {self.pretrained.name} now holds other weights "
                f"({now}); point init_from at the original base model"
            )

    def _setup(self) -> None:
        cfg = self.cfg
        if self.resume_from and self.world.main:  # before reading: another may be writing
            self.lock.acquire()
        resume_state = self._load_resume_state() if self.resume_from else None
        self.device = resolve_device(self.world.device_name(cfg.device))
        self._owns_group = self.world.init(self.device)
        self.precision = resolve_precision(cfg.precision, self.device)
        self.data = self._prepare_data(resume_state)
        # Only now, with the input known good, does a new run get its folder.
        self.folder.create(resuming=resume_state is not None)
        if self.world.main and not self.lock.held:
            self.lock.acquire()
        self.folder.write_data_info(self.data.summary(), self.data.tokenizer)
        for message in self._early_logs:
            self.folder.log(message)

        if cfg.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.cuda.reset_peak_memory_stats(self.device)

        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        torch.manual_seed(cfg.seed)

        if self.budget_s is None:
            self.plan = plan_for(cfg, max_steps_for(cfg, self.data.train_tokens))
        else:  # laid out once the first steps have been timed
            self.plan = Plan(UNTIMED, UNTIMED, cosine_steps=UNTIMED, provisional=True)

        self.model = self._build_model().to(self.device)
        self.optimizer = self._make_optimizer()
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        self.train_model = torch.compile(self.model) if cfg.compile else self.model
        if self.world.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = DistributedDataParallel(self.train_model, device_ids=ids)

        if resume_state is not None:
            self._restore(resume_state)
        else:
            self.folder.write_config(cfg)
        self.folder.write_status("running", self.step, self.max_steps)

    def _build_model(self) -> GPT:
        cfg = self.cfg
        if self.pretrained is None:
            model = GPT(GPTConfig.from_train(cfg))
        else:
            self.base = self.pretrained.base_record()
            shape = GPTConfig.from_train(cfg, base=self.pretrained.config)
            model = self.pretrained.load_model(shape)
            self._log(f"starting from {self.pretrained.name} ({self.pretrained.family})")
        lora.apply_config(model, cfg)
        on_gpu_16 = self.precision in ("bf16", "fp16") and self.device.type == "cuda"
        if cfg.lora_rank and on_gpu_16:  # the frozen base in 16 bits: half its memory
            lora.freeze_to(model, torch.bfloat16 if self.precision == "bf16" else torch.float16)
        return model

    @property
    def adapters_only(self) -> bool:
        """A LoRA fine-tune's checkpoints hold only what trains: the base is on disk already."""
        return bool(self.cfg.lora_rank) and self.pretrained is not None

    def _model_state(self) -> dict:
        if self.adapters_only:
            return lora.adapter_state(self.model)
        return self.model.state_dict()

    def _inference_shape(self) -> dict:
        base = self.pretrained.config if self.pretrained else None
        return GPTConfig.from_train(self.cfg, training=False, base=base).to_dict()

    def _prepare_data(self, resume_state: dict | None) -> TokenData:
        """Prepare (or reuse) the cached token file; on resume, check the data is the same."""
        cfg = self.cfg
        spec = data_spec(cfg)
        sources = spec.sources
        saved = (resume_state or {}).get("data_info")
        if saved:
            tokenizer = Tokenizer.from_json(saved["tokenizer_json"], saved.get("tokenizer_meta"))
        else:
            tokenizer = self.pretrained.tokenizer if self.pretrained else None
        changes = data_changes(saved["files"], sources.listing()) if saved else []

        def progress(phase, done, total):
            self.events.on_prepare(phase, done, total)

        folder, manifest = prepare(
            spec,
            self.data_cache,
            tokenizer,
            progress,
            self.control.stop_set,
            self._log_early,
        )
        data = TokenData(folder, manifest, cfg.seq_len, cfg.seed)
        if saved and manifest["fingerprint"] != saved["fingerprint"]:
            what = "; ".join(changes[:5]) or "the content"
            if len(changes) > 5:
                what += f"; and {len(changes) - 5} more"
            if not self.allow_data_change:
                raise CheckpointError(
                    f"resume: the data changed since the checkpoint ({what}); restore it, or "
                    "pass --allow-data-change to go on with the new data"
                )
            self._log_early(f"resume: data changed ({what}); going on as allowed")
        used, total = manifest["source_bytes"], manifest["total_bytes"]
        if used < total:
            self._log_early(f"data: using {used:,} of {total:,} bytes")
        if manifest["empty_files"]:
            self._log_early(f"data: skipped {manifest['empty_files']} empty file(s)")
        if data.is_chat:
            self._log_early(f"chat data: {describe(manifest)}")
        return data

    def _log_early(self, message: str) -> None:
        """Before the run folder exists, messages go to the events and wait for the log."""
        self._early_logs.append(message)
        self.events.on_log(message)

    def _data_info(self) -> dict:
        m = self.data.manifest
        return {
            "fingerprint": m["fingerprint"],
            "files": m["files"],
            "source": m["source"],
            "tokenizer": m["tokenizer"],
            "tokenizer_json": self.data.tokenizer.hf_json(),
            "tokenizer_meta": self.data.tokenizer.meta or None,
        }

    def _make_optimizer(self) -> optim.Optimizers:
        return optim.make(self.model, self.cfg)

    def _restore(self, state: dict) -> None:
        try:
            load_weights(self.model, state)
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(
                f"resume: {self.resume_from} does not fit this model ({e})"
            ) from None
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.data.load_state_dict(state["data"])
        ckpt.set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.plan = self._resumed_plan(state)
        self.best_val = float(state.get("best_val", float("inf")))
        self._elapsed_before = float(state["meta"].get("elapsed_s") or 0.0)
        self._paused_total = float(state["meta"].get("paused_s") or 0.0)
        self.folder.write_config(self.cfg)
        dropped = self.folder.truncate_metrics(self.step)
        self._log(
            f"resumed from {self.resume_from} at step {self.step}"
            + (f"; dropped {dropped} metric records past it" if dropped else "")
        )

    def _resumed_plan(self, state: dict) -> Plan:
        """The saved plan while it still runs (exact resume, a cooldown under way); a new
        length for a run stopped mid-way keeps its curve's start. A run that had ended gets
        a new plan from this step: a warmup back to the peak, then a stable phase and a
        decay (wsd), or a new cosine."""
        saved = state.get("schedule")
        plan = Plan.from_dict(saved) if saved else None
        end = plan.max_steps if plan else state["meta"].get("max_steps") or 0
        if self.step < end:
            if plan and (plan.finishing or state["meta"].get("limit") == self._limit()):
                return plan
            new = plan_for(self.cfg, self.plan.max_steps, warm_from=plan.warm_from if plan else 0)
        elif self.budget_s is None and self.plan.max_steps <= self.step:
            return self.plan  # nothing left to train
        else:
            new = plan_for(self.cfg, max(self.plan.max_steps, self.step + 1), warm_from=self.step)
            self._log(f"extending the run from step {self.step}: {self._describe(new)}")
        new.provisional = self.budget_s is not None
        return new

    def _limit(self) -> list:
        """What the run's length was asked as: a change means a new plan on resume."""
        c = self.cfg
        return [c.max_steps, c.max_epochs, c.max_time, c.schedule, c.decay_fraction]

    def _describe(self, plan: Plan) -> str:
        if self.cfg.schedule == "cosine" and not plan.finishing:
            return f"cosine to step {plan.max_steps}"
        return f"decay from step {plan.decay_start} to {plan.max_steps}"

    # -- checkpoints ---------------------------------------------------------------------

    def _state(self) -> dict:
        return {
            "format_version": ckpt.FORMAT_VERSION,
            "step": self.step,
            "best_val": self.best_val,
            "model": self._model_state(),
            "adapters_only": self.adapters_only,
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {},
            "data": self.data.state_dict(),
            "data_info": self._data_info(),
            "rng": ckpt.rng_state(),
            "config": self.cfg.to_dict(),
            "model_config": self._inference_shape(),
            "base": self.base,
            "schedule": self.plan.to_dict(),
            "meta": {
                "limit": self._limit(),
                "saved_at": time.time(),
                "loss": self.last_loss,
                "val_loss": None if math.isinf(self.best_val) else self.best_val,
                "max_steps": self.max_steps,
                "torch": str(torch.__version__),
                "elapsed_s": self._elapsed(),
                "paused_s": self._paused_total,
            },
        }

    @contextlib.contextmanager
    def _not_training(self):
        """Time spent inside is left out of tokens_per_s (nested uses count once)."""
        self._pause_depth += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._pause_depth -= 1
            if self._pause_depth == 0:
                paused = time.perf_counter() - t0
                self._paused_s += paused
                self._paused_total += paused

    def save_checkpoint(self, best: bool = False) -> Path:
        self._emit_metrics()
        with self._not_training():
            return self._save_checkpoint(best)

    def _save_checkpoint(self, best: bool) -> Path:
        if not self.world.main:  # every rank holds the same weights; one writes them
            self._saved_step = self.step
            return self.folder.latest
        # The only stall: copying the state to CPU memory. The writer thread does the rest.
        state, step, keep = ckpt.snapshot(self._state()), self.step, self.cfg.keep_checkpoints
        folder = self.folder

        def write():
            ckpt.save(state, folder.latest)
            if best:
                ckpt.link(folder.latest, folder.best)
            if keep:
                ckpt.link(folder.latest, folder.ckpt_dir / f"step-{step:06d}.pt")
                for old in sorted(folder.ckpt_dir.glob("step-*.pt"))[:-keep]:
                    old.unlink(missing_ok=True)
            folder.write_status("running", step, self.max_steps)
            self._written_step = step
            self.events.on_checkpoint(str(folder.latest), step)

        self._writer.submit(write)
        self._saved_step = step
        return self.folder.latest

    # -- one optimizer step --------------------------------------------------------------

    def _autocast(self):
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def _to_device(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:  # plain text has no loss weights
            return None
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _grad_sync(self, last: bool):
        """DDP averages gradients across processes once a step, after the last micro-batch."""
        if self.world.enabled and not last:
            return self.train_model.no_sync()
        return contextlib.nullcontext()

    def _train_step(self, starts: torch.Tensor, factor: float) -> torch.Tensor:
        """Forward/backward over the step's micro-batches, then one optimizer step."""
        if not self.model.training:  # evaluate() and sample() switch back; this is a guard
            self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        chunks = starts.split(self.cfg.batch_size)
        for i, chunk in enumerate(chunks):
            x, y, mask = (self._to_device(t) for t in self.data.train_batch(chunk))
            if self.fault is not None:
                self.fault(self.step + 1, i)
            with self._grad_sync(last=i == len(chunks) - 1):
                with self._autocast():
                    _, loss = self.train_model(x, y, mask)
                loss = loss / self.cfg.grad_accum
                self.scaler.scale(loss).backward()
            total += loss.detach()
        if self.cfg.grad_clip > 0:
            self.optimizer.unscale(self.scaler)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.set_lr(factor)
        self.optimizer.step(self.scaler)
        self.scaler.update()
        return total

    def _step_with_oom_recovery(self, factor: float) -> torch.Tensor:
        data_state = self.data.state_dict()
        rng = ckpt.step_rng_state()
        # Every process draws the whole step's windows from the same generator and trains on
        # its own slice, so the data stream does not depend on the number of processes.
        per_rank = self.cfg.batch_size * self.cfg.grad_accum
        starts = self.data.sample_starts(per_rank * self.world.size)
        starts = starts[self.world.rank * per_rank : (self.world.rank + 1) * per_rank]
        while True:
            try:
                return self._train_step(starts, factor)
            except Exception as e:
                if not is_oom(e) or self.world.enabled:  # ranks cannot shrink in step
                    raise
            # Free what the failed step held, then redo it with the same data and RNG.
            self.optimizer.zero_grad(set_to_none=True)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            ckpt.set_step_rng_state(rng)
            smaller = smaller_micro_batch(self.cfg.batch_size, self.cfg.grad_accum)
            if smaller is None:
                self.data.load_state_dict(data_state)
                self.save_checkpoint()
                raise TrainingError(
                    f"out of memory at step {self.step + 1} even with batch_size 1; "
                    f"checkpoint saved at step {self.step}. Next: {OOM_ADVICE}"
                )
            old = (self.cfg.batch_size, self.cfg.grad_accum)
            self.cfg = dataclasses.replace(self.cfg, batch_size=smaller[0], grad_accum=smaller[1])
            self.folder.write_config(self.cfg)
            self._log(
                f"out of memory at step {self.step + 1}: batch_size x grad_accum "
                f"{old[0]}x{old[1]} -> {smaller[0]}x{smaller[1]} (same effective batch); "
                "redoing the step"
            )
            self.events.on_oom(
                {"step": self.step + 1, "batch_size": smaller[0], "grad_accum": smaller[1]}
            )

    # -- metrics, eval, samples ----------------------------------------------------------

    def _emit_metrics(self) -> None:
        """Read the pending step losses in one host-device sync and emit their records.
        Raises TrainingError when a loss is not finite: this is where divergence is seen."""
        if not self._pending:
            return
        losses = self.world.mean(torch.stack([loss for _, loss, _ in self._pending])).tolist()
        now = time.perf_counter()
        n = len(self._pending)
        tokens = n * self.cfg.tokens_per_step * self.world.size
        # Training time only: evaluation, sampling and checkpoint writes are not throughput.
        training_s = now - self._window_start - self._paused_s
        tokens_per_s = tokens / max(training_s, 1e-9)
        self._window_start, self._paused_s = now, 0.0
        memory = memory_stats(self.device)
        elapsed = self._elapsed()
        for (step, _, lr), loss in zip(self._pending, losses, strict=True):
            if not math.isfinite(loss):
                self._pending = []
                raise TrainingError(
                    f"loss became {loss} at step {step}: lower lr (now "
                    f"{recipe.adamw_lr(self.cfg):.3g}) "
                    "or use precision bf16/fp32"
                )
            record = {
                "step": step,
                "loss": loss,
                "lr": lr,
                "max_steps": self.max_steps,
                "tokens_per_s": round(tokens_per_s, 1),
                "epoch": round(step * self.cfg.tokens_per_step / self.data.train_tokens, 4),
                "elapsed_s": elapsed,
                "batch_size": self.cfg.batch_size,
                "grad_accum": self.cfg.grad_accum,
                **memory,
            }
            self.folder.append_metric(record)
            self.events.on_train_batch_end(record)
        self.last_loss = losses[-1]
        self._pending = []

    def _elapsed(self) -> float:
        t0 = self._t0
        return round(self._elapsed_before + (time.perf_counter() - t0 if t0 else 0.0), 3)

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        losses = []
        # As many windows as eval_batches optimizer steps hold, so neither an out-of-memory
        # split of the micro-batch nor the number of processes changes what is measured.
        cfg = self.cfg
        windows = cfg.eval_batches * cfg.batch_size * cfg.grad_accum * self.world.size
        weights = []
        for x, y, mask in self.data.val_batches(windows, cfg.batch_size):
            with self._autocast():
                _, loss = self.train_model(*(self._to_device(t) for t in (x, y, mask)))
            losses.append(loss.float())
            # chat: a mean over the scored tokens of all windows, not of per-batch means
            weights.append(float(mask.sum()) if mask is not None else 1.0)
        w = torch.tensor(weights, device=losses[0].device)
        val = (torch.stack(losses) * w).sum().item() / max(float(w.sum()), 1e-9)
        self.model.train()
        return val

    def bits_per_byte(self, val_loss: float) -> float:
        """Nats per token -> bits per byte of the held-out text: comparable across tokenizers."""
        return val_loss / math.log(2) / self.data.val_bytes_per_token

    @torch.inference_mode()
    def sample(self) -> str:
        """Generate text with its own generator: sampling never moves the training RNG."""
        if self.cfg.sample_tokens == 0:
            return ""
        self.model.eval()
        gen = torch.Generator(device=self.device).manual_seed(self.cfg.seed + self.step)
        prompt = self.data.prompt()[None].to(self.device)
        with self._autocast():
            out = self.model.generate(prompt, self.cfg.sample_tokens, gen)
        self.model.train()
        return self.data.tokenizer.decode(out[0].tolist())

    def _eval_and_sample(self) -> None:
        self._emit_metrics()
        with self._not_training():
            self._evaluate_and_record()

    def _record_eval(self, what: str) -> float:
        """Evaluate, then write the record, report it and log it as `what`."""
        val = self.evaluate()
        train_s = round(self._elapsed() - self._paused_total, 3)  # the eval itself excluded
        bpb = self.bits_per_byte(val)
        record = {"step": self.step, "val_loss": val, "val_bpb": bpb, "train_s": train_s}
        self.folder.append_metric(record)
        self.events.on_eval(record)
        self._log(f"{what}: val_loss {val:.4f}, {record['val_bpb']:.4f} bits/byte")
        return val

    def _base_eval(self) -> None:
        """The pretrained model's own validation loss at step 0: where a fine-tune starts."""
        with self._not_training():
            self._record_eval("base model")

    def _evaluate_and_record(self) -> None:
        val = self._record_eval(f"step {self.step}")
        text = self.sample() if self.world.main else ""
        if text:
            self.folder.append_sample(self.step, text)
            self.events.on_sample(self.step, text)
        if val < self.best_val:
            self.best_val = val
            self.save_checkpoint(best=True)

    # -- the loop ------------------------------------------------------------------------

    def run(self, events: TrainEvents | None = None, control: TrainControl | None = None):
        """Train until max_steps, a stop request, or an error. Returns the end result."""
        self.events = events or TrainEvents()
        self.control = control or TrainControl()
        status, error = "failed", None
        try:
            self._setup()
            self._loop()
            self._writer.wait()  # the last checkpoint is on disk before the run reports its end
            status = "stopped" if self.step < self.max_steps else "finished"
            return self._end(status)
        except PrepareCancelled:
            status = "cancelled"  # stopped before the first step: nothing to save
            return self._end(status)
        except (UserError, TrainingError) as e:
            self._settle_writer(e)
            error = str(e)
            raise
        except Exception as e:
            e = self._settle_writer(e)
            if is_disk_full(e):
                error = self._disk_full_message(e)
                raise DiskFullError(error) from None
            error = f"{type(e).__name__}: {e}"
            if self.folder.path.is_dir():
                self.folder.log(traceback.format_exc())
            raise
        finally:
            if status == "failed":
                self._end("failed", error)

    def _settle_writer(self, err: Exception) -> Exception:
        """Let an in-flight checkpoint write finish; a full disk there explains a later error."""
        try:
            self._writer.wait()
        except Exception as write_error:
            if is_disk_full(write_error):
                return write_error
        return err

    def _disk_full_message(self, err: OSError) -> str:
        """One line: the disk is full, where, how much is free, what is safe, how to go on."""
        where = Path(err.filename) if getattr(err, "filename", None) else self.folder.path
        probe = where if where.is_dir() else where.parent
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if self._written_step >= 0 and self.folder.latest.is_file():
            good = (
                f"the last good checkpoint is step {self._written_step} ({self.folder.latest}); "
                f"free some space, then resume with: python -m core.train --resume "
                f"{self.folder.path}"
            )
        else:
            good = "no checkpoint was saved yet; free some space and start again"
        where = f"the device holding {where} ({free / 1e6:,.0f} MB free)"
        return f"disk full: no space left on {where}; {good}"

    def _end(self, status: str, error: str | None = None) -> dict:
        step = self.step
        max_steps = self.max_steps
        result = {"status": status, "step": step, "run_dir": str(self.folder.path)}
        if error:
            result["error"] = error
        try:
            if self.folder.path.is_dir() and max_steps is not None:
                extra = {"error": error} if error else {}
                self.folder.write_status(status, step, max_steps, **extra)
                self._log(f"{status} at step {step}" + (f": {error}" if error else ""))
            self.folder.close()
        except OSError as e:  # a full disk must not hide the error that ended the run
            if not is_disk_full(e):
                raise
        self.lock.release()
        if self._owns_group:
            torch.distributed.destroy_process_group()
        self.events.on_train_end(result)
        return result

    def _loop(self) -> None:
        cfg = self.cfg
        trainable = lora.trainable_params(self.model)
        self._t0 = self._window_start = time.perf_counter()
        self.events.on_train_start(
            {
                "run_dir": str(self.folder.path),
                "start_step": self.step,
                "max_steps": self.max_steps,
                "n_params": self.model.num_params(),
                "n_trainable": trainable,
                "device": str(self.device),
                "precision": self.precision,
                "tokens_per_step": cfg.tokens_per_step,
                "train_tokens": self.data.train_tokens,
                "data_source": self.data.source,
                "data": self.data.summary(),
                "config": cfg.to_dict(),
                "resumed": self.resume_from is not None,
            }
        )
        if cfg.lora_rank:
            self._log(
                f"LoRA rank {cfg.lora_rank} on {cfg.lora_targets}: {trainable:,} of "
                f"{self.model.num_params():,} parameters train"
            )
        self._log(
            f"training {trainable:,} parameters on {self.device} ({self.precision}), "
            f"data {self.data.source}, {self.data.train_tokens:,} train tokens "
            f"({self.data.tokenizer.kind}), "
            f"steps {self.step}->{self.max_steps}"
        )
        self._saved_step = self.step if self.folder.latest.exists() else -1
        self._written_step = self._saved_step
        if self.pretrained is not None and self.step == 0:
            self._base_eval()
        self._session_step0 = self.step
        adamw_peak = recipe.adamw_lr(cfg)
        self._log(f"optimizer: {recipe.describe(cfg)}; schedule: {self._describe(self.plan)}")
        while self.step < self.max_steps:
            stop, save, finish = self.world.flags_from_main(
                self.control.stop_requested,
                self.control.take_save_request(),
                self.world.main and self._finish_asked(),
            )
            if stop:
                break
            if finish:
                self._finish()
            if self.plan.provisional:
                self._plan_for_time()
            if save and self._saved_step != self.step:  # the state after the last step
                self.save_checkpoint()
            factor = lr_factor(self.step, self.cfg, self.plan)
            loss = self._step_with_oom_recovery(factor)
            self.step += 1
            self._pending.append((self.step, loss, adamw_peak * factor))
            if self.step % self.cfg.log_every == 0:
                self._emit_metrics()
            if self.step % self.cfg.eval_every == 0 or self.step == self.max_steps:
                self._eval_and_sample()
            if self.step % self.cfg.ckpt_every == 0 and self._saved_step != self.step:
                self.save_checkpoint()
        self._emit_metrics()
        if self._saved_step != self.step:
            self.save_checkpoint()
        if self.plan.finishing and self.step == self.max_steps:
            self._log(f"finished early at step {self.step}, at the end of the cooldown")

    # -- Finish and time budgets ---------------------------------------------------------

    def _finish_asked(self) -> bool:
        """A Finish request: from the window or a signal (control), or a FINISH file in the
        run folder, which works on every system (python -m core.train --finish RUN)."""
        if self.control.take_finish_request():
            return True
        now = time.monotonic()
        if now - self._finish_file_checked < 1.0:  # a stat a second, not one a step
            return False
        self._finish_file_checked = now
        request = self.folder.path / FINISH_FILE
        if request.exists():
            request.unlink(missing_ok=True)
            return True
        return False

    def _finish(self) -> None:
        """Start the cooldown now: the lr decays from where it is to the floor, then the
        run saves and stops as finished."""
        plan = finish_plan(self.cfg, self.plan, self.step)
        if plan is None:
            self._log(f"finish: the run already ends at step {self.max_steps}")
            return
        self.plan = plan
        self._log(f"finishing: {plan.max_steps - self.step} cooldown steps, {self._describe(plan)}")

    def _plan_for_time(self) -> None:
        """Lay the steps out from the measured speed (seconds a step, evaluation included)
        so the run ends at the budget; wsd's decay starts, and its length is fixed, when
        the time left is the decay fraction of the budget."""
        elapsed, marks = self._elapsed(), self._speed_marks
        marks.append((self.step, elapsed))
        # The speed over the last half of this session: start-up costs fall out of it.
        while (marks[0][0] - self._session_step0) * 2 < self.step - self._session_step0 - 2:
            marks.popleft()
        if self.step - marks[0][0] < 2:
            return
        per_step = (elapsed - marks[0][1]) / (self.step - marks[0][0])
        left = self.budget_s - elapsed
        total = self.step + max(1, round(left / per_step))
        cfg, old = self.cfg, self.plan
        decay_s = cfg.decay_fraction * self.budget_s
        if cfg.schedule == "wsd" and left <= decay_s:
            top = lr_factor(self.step, cfg, old)  # below 1 only if still warming up
            self.plan = Plan(total, self.step, decay_top=top, warm_from=old.warm_from)
        elif cfg.schedule == "wsd":
            decay = max(1, round(decay_s / per_step))
            self.plan = Plan(max(total, self.step + 2), max(total - decay, self.step + 1),
                             warm_from=old.warm_from, provisional=True)  # fmt: skip
            return
        else:  # cosine: its curve needs the length early; fixed after a tenth of the budget
            self.plan = plan_for(cfg, max(total, self.step + 1), warm_from=old.warm_from)
            self.plan.provisional = elapsed < 0.1 * self.budget_s
            if self.plan.provisional:
                return
        self._log(
            f"time budget {cfg.max_time}: {self.plan.max_steps} steps in all "
            f"({per_step * 1000:.0f} ms a step); {self._describe(self.plan)}"
        )
