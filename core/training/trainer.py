"""The training loop: reports through TrainEvents, obeys TrainControl, resumes exactly.

Read `_loop` first: one optimizer step a turn, then metrics, evaluation and checkpoints when
they are due. What it is built from lives beside it: inputs (data and model), steps (mixed
precision, DDP sync, OOM retry sizes), resume, checkpointing, evaluation, clock, time_budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from core.config import recipe
from core.config.spec import TrainConfig, parse_duration, validate
from core.data.chat import set_thinking
from core.data.prepare import PrepareCancelled
from core.errors import DiskFullError, StepStopped, TrainingError, UserError
from core.models import lora
from core.models.model import GPTConfig
from core.platform.atomic import is_disk_full
from core.platform.compiling import is_compiled
from core.platform.device import is_oom
from core.platform.distributed import World
from core.platform.hardware import NvmlWatch, card_stats, memory_stats, nvml
from core.runs import checkpoint as ckpt
from core.runs.events import TrainControl, TrainEvents
from core.runs.folder import RunFolder, SilentFolder
from core.runs.lock import RunLock
from core.training import evaluation, metrics, resume, setup, sharding, split, steps
from core.training.checkpointing import Checkpointer, checkpoint_state
from core.training.clock import Clock
from core.training.objectives import StepSignals
from core.training.schedule import Plan, finish_plan, lr_factor
from core.training.spill import SpillWatch
from core.training.state import Progress, RunInputs, RunState
from core.training.steps import OOM_ADVICE, grad_sync, smaller_micro_batch
from core.training.time_budget import (
    FINISH_FILE,
    RequestWatch,
    TimeBudget,
    describe_plan,
)
from core.weights.loader import Pretrained, apply_pretrained, open_pretrained

__all__ = ["FINISH_FILE", "Trainer", "smaller_micro_batch"]


@dataclass
class PendingStep:
    """A step done but not yet read from the device (metrics are read every log_every)."""

    step: int
    loss: torch.Tensor
    lr: float
    signals: StepSignals


class Trainer:
    """One run. Build with a validated config and a run folder; call run()."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: str | Path,
        resume_from=None,
        fault=None,
        data_cache=None,
        allow_data_change: bool = False,
    ):
        # A pretrained start: the model's shape and tokenizer fill the config in.
        self.pretrained: Pretrained | None = None
        if cfg.init_from:
            self.pretrained = open_pretrained(cfg.init_from)
            cfg = apply_pretrained(cfg, self.pretrained)
            set_thinking(self.pretrained.tokenizer, cfg.thinking)  # saved with data and run
        self.cfg = validate(cfg)
        self.spill = SpillWatch(self.cfg)  # dedicated VRAM overflowing into shared memory
        self.world = World.from_env()
        self.folder = (RunFolder if self.world.main else SilentFolder)(Path(run_dir))
        self.resume_from = Path(resume_from) if resume_from else None
        self.fault = fault  # tests: fault(step, micro_index) may raise, e.g. an OOM
        self.data_cache = Path(data_cache) if data_cache else None
        self.allow_data_change = allow_data_change
        self.events, self.control = TrainEvents(), TrainControl()
        self.lock = RunLock(self.folder.path)
        self.saver = Checkpointer(self.folder, self.world.main, self.cfg.keep_checkpoints)
        self.clock = Clock()
        self.requests = RequestWatch(self.folder.path)
        budget = parse_duration(self.cfg.max_time) if self.cfg.max_time else None
        self.budget = TimeBudget(budget, 0) if budget else None
        self.step, self.best_val, self.last_loss = 0, float("inf"), None
        self._pending: list[PendingStep] = []  # steps not yet read from the device
        self._step_signals = StepSignals()
        self._before_step = None  # (data state, RNG state) while a step runs
        self._compiling: float | None = None  # when a compiled run's first step began
        self._nvml: NvmlWatch | None = None  # a GPU's NVML, read on its own thread
        self._cards: dict = {}  # a layer split's cards: {device: its NvmlWatch or None}
        self.plan: Plan | None = None
        # What the run is built from (model, data, optimizer, objective): made by setup once
        # the input is known good; None until then.
        self.run_state: RunState | None = None

    # The built run's parts, by name (tests and front ends read them).
    device = property(lambda self: self.run_state and self.run_state.device)
    precision = property(lambda self: self.run_state and self.run_state.precision)
    data = property(lambda self: self.run_state and self.run_state.data)
    model = property(lambda self: self.run_state and self.run_state.model)
    train_model = property(lambda self: self.run_state and self.run_state.train_model)
    optimizer = property(lambda self: self.run_state and self.run_state.optimizer)
    scaler = property(lambda self: self.run_state and self.run_state.scaler)
    objective = property(lambda self: self.run_state and self.run_state.objective)
    base = property(lambda self: self.run_state.base if self.run_state else None)
    second_val = property(lambda self: self.run_state.second_val if self.run_state else None)

    @property
    def reference(self):
        """DPO: the reference model's log-probs (core.training.dpo); None otherwise."""
        return getattr(self.objective, "reference", None)

    @property
    def max_steps(self) -> int | None:
        return None if self.plan is None else self.plan.max_steps

    @property
    def adapters_only(self) -> bool:
        """A LoRA fine-tune's checkpoints hold only what trains: the base is on disk already."""
        return bool(self.cfg.lora_rank) and self.pretrained is not None

    def log(self, message: str) -> None:
        self.folder.log(message)
        self.events.on_log(message)

    # -- the run -------------------------------------------------------------------------

    def run(self, events: TrainEvents | None = None, control: TrainControl | None = None):
        """Train until max_steps, a stop request, or an error. Returns the end result."""
        self.events = events or TrainEvents()
        self.control = control or TrainControl()
        status, error = "failed", None
        try:
            self._setup()
            self._loop()
            self.saver.wait()  # the last checkpoint is on disk before the run reports its end
            status = "stopped" if self.step < self.max_steps else "finished"
            return self._end(status)
        except PrepareCancelled:
            status = "cancelled"  # stopped before the first step: nothing to save
            return self._end(status)
        except (UserError, TrainingError) as e:
            self.saver.settle(e)
            error = str(e)
            raise
        except Exception as e:
            e = self.saver.settle(e)
            if is_disk_full(e):
                error = self.saver.disk_full_message(e)
                raise DiskFullError(error) from None
            if (lost := self.world.failure_line(e)) is not None:  # a peer died or hangs
                error = f"{lost}; {self.saver.last_good()}"
                raise TrainingError(error) from None
            error = f"{type(e).__name__}: {e}"
            if self.folder.path.is_dir():
                self.folder.log(traceback.format_exc())
            raise
        finally:
            if self._nvml is not None:
                self._nvml.stop()
            for watch in self._cards.values():
                if watch is not None and watch is not self._nvml:
                    watch.stop()
            if status == "failed":
                self._end("failed", error)

    def _loop(self) -> None:
        self._announce()
        peak_lr = recipe.adamw_lr(self.cfg)
        while self.step < self.max_steps:
            # first: a STOP or SAVE file it finds is a request of this turn
            finish = self.world.main and self.requests.asked(self.control)
            stop, save, finish = self.world.flags_from_main(
                self.control.stop_requested, self.control.take_save_request(), finish
            )
            if stop:
                break
            if finish:
                self._finish()
            if self.plan.provisional:
                self._plan_for_time()
            if save and self.saver.saved_step != self.step:  # the state after the last step
                self.save_checkpoint()
            factor = lr_factor(self.step, self.cfg, self.plan)
            try:
                loss = self._step_with_oom_recovery(factor)
            except StepStopped:  # the step is dropped: the state after the last one is saved
                break
            self.step += 1
            self._say_compiled()
            self._pending.append(PendingStep(self.step, loss, peak_lr * factor, self._step_signals))
            if self.step % self.cfg.log_every == 0:
                self._emit_metrics()
            if self.step % self.cfg.eval_every == 0 or self.step == self.max_steps:
                try:
                    self._eval_and_sample()
                except StepStopped:  # this step's evaluation is left out
                    break
            if self.step % self.cfg.ckpt_every == 0 and self.saver.saved_step != self.step:
                self.save_checkpoint()
        self._emit_metrics()
        if self.saver.saved_step != self.step:
            self.save_checkpoint()
        if self.plan.finishing and self.step == self.max_steps:
            self.log(f"finished early at step {self.step}, at the end of the cooldown")

    # -- one optimizer step --------------------------------------------------------------

    def _train_step(self, starts: torch.Tensor, factor: float) -> torch.Tensor:
        """Forward/backward over the step's micro-batches, then one optimizer step."""
        if not self.model.training:  # evaluation switches back; this is a guard
            self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        run, cfg, objective = self.run_state, self.cfg, self.objective
        chunks = objective.micro_batches(run, cfg, starts, self.step)
        signal_sums = None
        self.model.moe_step()  # an MoE model's routing counts from this step's forwards only
        for i, chunk in enumerate(chunks):
            if self.fault is not None:
                self.fault(self.step + 1, i)
            ddp = self.world.enabled and not self.cfg.shard  # FSDP2 reduces every micro-batch
            with grad_sync(self.train_model, ddp, last=i == len(chunks) - 1):
                loss, sums = objective.micro_loss(run, cfg, chunk)
                if sums is not None:
                    signal_sums = sums if signal_sums is None else signal_sums + sums
                loss = loss / self.cfg.grad_accum
                self.scaler.scale(loss).backward()
            total += loss.detach()
        if self.cfg.grad_clip > 0:
            self.optimizer.unscale(self.scaler)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.set_lr(factor)
        self.optimizer.step(self.scaler)
        self.scaler.update()
        self._step_signals = objective.step_signals(signal_sums)  # GRPO: its sampling's too
        self._step_signals.moe = self.model.moe_step()
        return total

    def _step_with_oom_recovery(self, factor: float) -> torch.Tensor:
        data_state, rng = self.data.state_dict(), ckpt.step_rng_state()
        starts = self._draw_starts()
        while True:
            self._before_step = (data_state, rng)
            try:
                loss = self._train_step(starts, factor)
                self._fetch_next_step()
                return loss
            except StepStopped:  # before the model changed: as if the step never began
                self.optimizer.zero_grad(set_to_none=True)
                self.data.load_state_dict(data_state)
                ckpt.set_step_rng_state(rng)
                raise
            except Exception as e:
                if not is_oom(e) or self.world.enabled:  # ranks cannot shrink in step
                    raise
            finally:
                self._before_step = None
            # Free what the failed step held, then redo it with the same data and RNG.
            self.optimizer.zero_grad(set_to_none=True)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            ckpt.set_step_rng_state(rng)
            self._shrink_micro_batch(data_state)

    def _draw_starts(self) -> torch.Tensor:
        """This process's windows of the next step. Every process draws the whole step's
        windows from the same generator and trains on its own slice, so the data stream does
        not depend on the number of processes."""
        per_rank = self.cfg.batch_size * self.cfg.grad_accum
        starts = self.data.sample_starts(per_rank * self.world.size)
        return starts[self.world.rank * per_rank : (self.world.rank + 1) * per_rank]

    def _fetch_next_step(self) -> None:
        """On a GPU, the next step's first micro-batch is read and sent now, while this
        step's kernels run: its windows drawn as that step will draw them, then the data's
        state put back, so checkpoints and resumes see no difference."""
        ahead = self.objective.prefetches and steps.ahead_on(self.device)
        if not ahead or self.step + 1 >= self.max_steps:
            return
        state = self.data.state_dict()
        starts = self._draw_starts()
        self.data.load_state_dict(state)
        self.objective.prefetch(self.run_state, self.cfg, starts)

    def _shrink_micro_batch(self, data_state: dict) -> None:
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
        self.log(
            f"out of memory at step {self.step + 1}: batch_size x grad_accum "
            f"{old[0]}x{old[1]} -> {smaller[0]}x{smaller[1]} (same effective batch); "
            "redoing the step"
        )
        self.events.on_oom(
            {"step": self.step + 1, "batch_size": smaller[0], "grad_accum": smaller[1]}
        )

    # -- setup ---------------------------------------------------------------------------

    def _setup(self) -> None:
        """Check the input, prepare the data, make the run folder, build (or restore) the
        model, optimizer and schedule: see core.training.setup."""
        given = RunInputs(
            self.cfg,
            self.folder,
            self.world,
            self.lock,
            self.pretrained,
            self.resume_from,
            self.data_cache,
            self.allow_data_change,
            timed=self.budget is not None,
        )
        progress = Progress()
        try:
            self.run_state = setup.setup(given, progress, self.events, self.control.stop_set)
            self.run_state.interrupt = self._while_user_code_runs
        finally:  # a failed setup still ends with its plan: status.json says how far it got
            self.step, self.plan, self.best_val = progress.step, progress.plan, progress.best_val
            self.clock.before, self.clock.paused_total = progress.elapsed_s, progress.paused_s

    def _split_cards(self) -> dict:
        """A layer split over CUDA cards: each card's NVML watch (the first's is _nvml),
        so the records carry the memory of every card ({}: one device)."""
        cards = [d for d in split.placed_devices(self.model) if d.type == "cuda"]
        if len(cards) < 2:
            return {}
        on = nvml() is not None
        return {
            d: self._nvml if d == self.device else (NvmlWatch(d.index).start() if on else None)
            for d in cards
        }

    def _announce(self) -> None:
        """The start of this session's steps: the start event, the log lines, and the base
        model's own validation loss when a fine-tune starts."""
        cfg, trainable = self.cfg, lora.trainable_params(self.model)
        if self.device.type == "cuda" and nvml() is not None:
            self._nvml = NvmlWatch(self.device.index or 0).start()
        self._cards = self._split_cards()
        self.clock.start()
        resumed = self.resume_from is not None
        start = metrics.start_record(self.run_state, cfg, self.step, self.max_steps, resumed)
        self.events.on_train_start(start)
        if cfg.lora_rank:
            total = self.model.num_params()
            self.log(
                f"LoRA rank {cfg.lora_rank} on {cfg.lora_targets}: {trainable:,} of "
                f"{total:,} parameters train"
            )
        self.log(
            f"training {trainable:,} parameters on {self.device} ({self.precision}), "
            f"data {self.data.source}, {self._data_size()} ({self.data.tokenizer.kind}), "
            f"steps {self.step}->{self.max_steps}"
        )
        self.saver.start_at(self.step)
        if self.pretrained is not None and self.step == 0:
            # A stop while a reward scores the base model: the loop saves step 0.
            with self.clock.not_training(), contextlib.suppress(StepStopped):
                self._record_eval("base model")
        if self.budget:
            self.budget.first_step = self.step
        plan = describe_plan(cfg, self.plan)
        self.log(f"optimizer: {recipe.optimizer_line(cfg)}; schedule: {plan}")
        if self.run_state.compiled:
            self.log("compiling (first step)…")
            self._compiling = time.perf_counter()

    def _say_compiled(self) -> None:
        """A compiled run's first step compiles it: its time, said once. The host's time, so
        no sync: compiling is host work, and the step's kernels are queued when it ends."""
        if self._compiling is None:
            return
        seconds = time.perf_counter() - self._compiling
        self._compiling = None
        compiled = is_compiled(self.train_model)  # False: it failed and said why
        if compiled:
            self.log(f"compiled in {seconds:.1f} s (the first step)")
        self.events.on_compiled(
            {"step": self.step, "seconds": round(seconds, 1), "compiled": compiled}
        )

    def _while_user_code_runs(self) -> bool:
        """Polled while a step or an evaluation waits on the user's code (a reward): Save now
        saves the state before the step (the model has not changed yet); true when Stop or
        Ctrl+C asked to stop. Under torchrun the processes agree on requests only between
        steps, so there a running reward is bounded by its time limit alone."""
        if self.world.enabled:
            return False
        if self.control.take_save_request() and self.saver.saved_step != self.step:
            self._save_before_step()
        return self.control.stop_requested

    def _save_before_step(self) -> None:
        """A checkpoint of self.step taken inside the next step: its data position and RNG
        as they were before it began, so a resume from it redoes that step exactly."""
        if self._before_step is None:  # an evaluation: the step is whole
            self.save_checkpoint()
            return
        now = self.data.state_dict(), ckpt.step_rng_state()
        self.data.load_state_dict(self._before_step[0])
        ckpt.set_step_rng_state(self._before_step[1])
        try:
            self.save_checkpoint()
        finally:
            self.data.load_state_dict(now[0])
            ckpt.set_step_rng_state(now[1])

    def _data_size(self) -> str:
        """The log line's training data: tokens, or (GRPO) prompts."""
        size = getattr(self.data, "size_text", None)  # windows, mixes: their tokens
        return size() if size else f"{self.data.train_tokens:,} train tokens"

    def _end(self, status: str, error: str | None = None) -> dict:
        return setup.end(
            status,
            error,
            self.step,
            self.max_steps,
            self.folder,
            self.lock,
            self.events,
            self.log,
            self.world.owns_group,
        )

    # -- checkpoints, metrics, evaluation ------------------------------------------------

    def save_checkpoint(self, best: bool = False) -> Path:
        self._emit_metrics()
        shards = None
        if self.cfg.shard:  # every rank writes its own part (core.training.sharding)

            def shards(folder):
                sharding.save_shards(self.model, self.optimizer, folder, self.adapters_only)

        with self.clock.not_training():
            return self.saver.save(
                self._state, self.step, best, self.max_steps, self.events.on_checkpoint, shards
            )

    def _state(self) -> dict:
        base_shape = self.pretrained.config if self.pretrained else None
        shape = GPTConfig.from_train(self.cfg, training=False, base=base_shape)
        shape = dataclasses.replace(shape, fused=self.model.config.fused)  # as it trains
        return checkpoint_state(
            self.run_state,
            self.cfg,
            self.step,
            self.best_val,
            self.last_loss,
            self.plan,
            self.clock,
            self.adapters_only,
            shape.to_dict(),
            resume.limit_of(self.cfg),
            sharded=self.cfg.shard,
        )

    def _emit_metrics(self) -> None:
        """Read the pending step losses in one host-device sync and emit their records."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        losses = self.world.mean(torch.stack([p.loss for p in pending])).tolist()
        tokens = sum(self.objective.step_tokens(p.signals, self.cfg) for p in pending)
        tokens *= self.world.size
        # Training time only: evaluation, sampling and checkpoint writes are not throughput.
        common = {
            "max_steps": self.max_steps,
            "elapsed_s": self.clock.elapsed(),
            "tokens_per_s": round(tokens / self.clock.training_seconds(), 1),
            "memory": memory_stats(self.device, self._nvml),
        }
        if self._cards:  # a layer split: every card's memory too
            common["memory"].update(card_stats(list(self._cards), self._cards))
        elif self.cfg.shard and self.world.enabled and self.device.type == "cuda":
            common["memory"].update(sharding.card_memory(self.world, self.device, common["memory"]))
        if warning := self.spill.check(common["memory"]):
            self.log(warning)
        steps = [(p.step, p.lr) for p in pending]
        extras = self.objective.records([p.signals for p in pending], self.cfg, self.world)
        moe = [self.model.moe_records(p.signals.moe) for p in pending]
        if any(moe):  # an MoE model's routing: expert load, router entropy, aux loss
            extras = [{**e, **m} for e, m in zip(extras or [{}] * len(moe), moe, strict=True)]
        for record in metrics.train_records(
            steps, losses, self.cfg, self.data.train_tokens, common, extras
        ):
            self.folder.append_metric(record)
            self.events.on_train_batch_end(record)
        self.last_loss = losses[-1]

    def evaluate(self) -> float:
        """The objective's evaluation value (lower is better: a validation loss)."""
        return self.objective.evaluate(self.run_state, self.cfg)[0]

    def _record_eval(self, what: str) -> float:
        """Evaluate, then write the record, report it and log it as `what`."""
        train_s = round(self.clock.elapsed() - self.clock.paused_total, 3)  # eval excluded
        val, fields, text = self.objective.evaluate(self.run_state, self.cfg)
        record = {"step": self.step, **fields, "train_s": train_s}
        line = f"{what}: {text}"
        by_source = getattr(self.data, "val_losses", {})  # a mix: each source's own
        if by_source:
            record.update({f"val_loss/{name}": v for name, v in by_source.items()})
            line += " (" + ", ".join(f"{n} {v:.4f}" for n, v in by_source.items()) + ")"
        if self.second_val is not None:
            record.update(evaluation.second_scores(self.run_state, self.cfg.batch_size))
            line += f"; second validation set {record['eval_data_loss']:.4f}"
        self.folder.append_metric(record)
        self.events.on_eval(record)
        self.log(line)
        return val

    def _eval_and_sample(self) -> None:
        self._emit_metrics()
        with self.clock.not_training():
            val = self._record_eval(f"step {self.step}")
            text = ""
            if self.world.main or self.cfg.shard:  # sharded: every rank holds a part
                text = evaluation.sample_text(
                    self.model,
                    self.data,
                    self.cfg.sample_tokens,
                    self.cfg.seed + self.step,
                    self.device,
                    self.precision,
                )
            if text and self.world.main:
                self.folder.append_sample(self.step, text)
                self.events.on_sample(self.step, text)
            if val < self.best_val:
                self.best_val = val
                self.save_checkpoint(best=True)

    # -- Finish and time budgets ---------------------------------------------------------

    def _finish(self) -> None:
        """Start the cooldown now: the lr decays from where it is to the floor, then the
        run saves and stops as finished."""
        plan = finish_plan(self.cfg, self.plan, self.step)
        if plan is None:
            self.log(f"finish: the run already ends at step {self.max_steps}")
            return
        self.plan = plan
        left = plan.max_steps - self.step
        self.log(f"finishing: {left} cooldown steps, {describe_plan(self.cfg, plan)}")

    def _plan_for_time(self) -> None:
        self.plan = self.budget.replan(self.cfg, self.plan, self.step, self.clock.elapsed())
        if not self.plan.provisional:
            self.log(
                f"time budget {self.cfg.max_time}: {self.plan.max_steps} steps in all "
                f"({self.budget.per_step * 1000:.0f} ms a step); "
                f"{describe_plan(self.cfg, self.plan)}"
            )
