"""Writing a run's checkpoints without stalling training: the state is copied to CPU memory
(the only pause), then a background thread writes latest.pt atomically, links best.pt and the
kept step-NNNNNN.pt files, and updates status.json. A full disk becomes one line saying what
is safe and how to go on."""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import torch

from core.models import lora
from core.platform.atomic import free_bytes, fsync_dir, is_disk_full
from core.runs import checkpoint as ckpt
from core.runs.folder import RunFolder
from core.training.inputs import data_info


class Checkpointer:
    def __init__(self, folder: RunFolder, writes: bool, keep: int):
        self.folder = folder
        self.writes = writes  # every rank holds the same weights; one writes them
        self.keep = keep
        self.saved_step = -1  # the newest step a save was started for
        self.written_step = -1  # the newest checkpoint known to be whole on disk
        self._writer = ckpt.BackgroundWriter()

    def start_at(self, step: int) -> None:
        """A session's start: the step's checkpoint exists when this resumes from it."""
        self.saved_step = step if self.folder.latest.exists() else -1
        self.written_step = self.saved_step
        root = self.folder.ckpt_dir / ckpt.SHARDS_DIR
        if self.writes and root.is_dir():  # what a killed sharded save left half-written
            for tmp in root.glob(".tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)

    def save(
        self, make_state, step: int, best: bool, max_steps: int, on_written, shards=None
    ) -> Path:
        """Start writing make_state()'s checkpoint of step; on_written(path, step) when done.
        shards(folder) (FSDP2): every rank writes its shards of the model and optimizer
        there first; the checkpoint file, written last, names the folder."""
        self.saved_step = step
        where = self._write_shards(shards, step) if shards is not None else None
        if not self.writes:
            return self.folder.latest
        state, folder, keep = ckpt.snapshot(make_state()), self.folder, self.keep
        if where is not None:
            state["shards"] = where

        def write():
            ckpt.save(state, folder.latest)
            if best:
                ckpt.link(folder.latest, folder.best)
            if keep:
                ckpt.link(folder.latest, folder.ckpt_dir / f"step-{step:06d}.pt")
                for old in sorted(folder.ckpt_dir.glob("step-*.pt"))[:-keep]:
                    old.unlink(missing_ok=True)
            if where is not None:
                drop_unused_shards(folder.ckpt_dir)
            folder.write_status("running", step, max_steps)
            self.written_step = step
            on_written(str(folder.latest), step)

        self._writer.submit(write)
        return folder.latest

    def _write_shards(self, shards, step: int) -> str:
        """Every rank writes into a temporary folder; the main one renames it whole into
        place. A kill before the checkpoint file names it leaves the last one intact."""
        self._writer.wait()  # the last write's clean-up is done before a new folder appears
        root = self.folder.ckpt_dir / ckpt.SHARDS_DIR
        tmp = root / f".tmp-{step:06d}"
        shards(tmp)  # a collective: it returns once every rank's shard is on disk
        name = f"step-{step:06d}"
        if self.writes:
            n = 1
            while (root / name).exists():  # saved again at this step: a new name
                name, n = f"step-{step:06d}-{n}", n + 1
            os.replace(tmp, root / name)
            fsync_dir(root)
        return f"{ckpt.SHARDS_DIR}/{name}"

    def wait(self) -> None:
        self._writer.wait()

    def settle(self, err: Exception) -> Exception:
        """Let an in-flight write finish; a full disk there explains a later error."""
        try:
            self._writer.wait()
        except Exception as write_error:
            if is_disk_full(write_error):
                return write_error
        return err

    def disk_full_message(self, err: OSError) -> str:
        """One line: the disk is full, where, how much is free, what is safe, how to go on."""
        where = Path(err.filename) if getattr(err, "filename", None) else self.folder.path
        free = free_bytes(where)
        space = f" ({free / 1e6:,.0f} MB free)" if free is not None else ""
        return f"disk full: no space left on the device holding {where}{space}; " + (
            self.last_good("free some space, then ")
            if self.written_step >= 0
            else "no checkpoint was saved yet; free some space and start again"
        )

    def last_good(self, first: str = "") -> str:
        """Where the run can go on from: the last whole checkpoint and the command."""
        step = self.written_step
        if step < 0 and not self.writes and self.folder.latest.is_file():
            try:  # another rank writes the checkpoints: what is on disk
                step = int(ckpt.load(self.folder.latest)["step"])
            except Exception:
                step = -1
        if step < 0 or not self.folder.latest.is_file():
            return "no checkpoint was saved yet"
        return (
            f"the last good checkpoint is step {step} ({self.folder.latest}); "
            f"{first}resume with: python -m core.train --resume {self.folder.path}"
        )


def checkpoint_state(
    run,
    cfg,
    step: int,
    best_val: float,
    last_loss,
    plan,
    clock,
    adapters_only: bool,
    model_config: dict,
    limit: list,
    sharded: bool = False,
) -> dict:
    """Everything exact continuation needs (format: core.runs.checkpoint): the run's state
    (core.training.state.RunState), its config, and its progress (step, best evaluation,
    last loss, schedule plan, clock). sharded: the model and optimizer are in the shards
    (core.training.sharding), not here."""
    tensors = {}
    if not sharded:
        model = lora.adapter_state(run.model) if adapters_only else run.model.state_dict()
        if not adapters_only and not cfg.train_vision:
            # a frozen vision tower is the base's (core.models.vision): not kept
            model = {k: v for k, v in model.items() if not k.startswith("vision.")}
        tensors = {"model": model, "optimizer": run.optimizer.state_dict()}
    return {
        "format_version": ckpt.FORMAT_VERSION,
        "step": step,
        "best_val": best_val,
        **tensors,
        "adapters_only": adapters_only,
        "scaler": run.scaler.state_dict() if run.scaler.is_enabled() else {},
        "data": run.data.state_dict(),
        "data_info": data_info(run.data),
        "rng": ckpt.rng_state(),
        "config": cfg.to_dict(),
        "model_config": model_config,
        "base": run.base,
        "schedule": plan.to_dict(),
        "meta": {
            "limit": limit,
            "saved_at": time.time(),
            "loss": last_loss,
            **run.objective.best_meta(None if math.isinf(best_val) else best_val),
            "max_steps": plan.max_steps,
            "torch": str(torch.__version__),
            "elapsed_s": clock.elapsed(),
            "paused_s": clock.paused_total,
            "processes": run.world.size,  # a resume on another number keeps the batch
        },
    }


def drop_unused_shards(ckpt_dir: Path) -> None:
    """Remove the shard folders no checkpoint file names any longer, once the newest
    checkpoint is whole (temporary ones: another rank may be writing; start_at clears a
    killed save's)."""
    root = ckpt_dir / ckpt.SHARDS_DIR
    used = set()
    for path in ckpt_dir.glob("*.pt"):
        try:
            name = ckpt.load(path).get("shards")
        except Exception:  # a damaged file names nothing it can be resumed from
            continue
        if name:
            used.add(Path(name).name)
    for folder in root.iterdir() if root.is_dir() else ():
        if folder.name not in used and not folder.name.startswith(".tmp"):
            shutil.rmtree(folder, ignore_errors=True)
