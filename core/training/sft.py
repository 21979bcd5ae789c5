"""Supervised fine-tuning and pretraining: the mean next-token loss over the scored tokens
(all of plain text, the answers of chat data), evaluated as validation loss and bits per byte."""

from __future__ import annotations

from core.config.methods import sft as declared
from core.config.spec import TrainConfig
from core.training import evaluation, steps
from core.training.objectives import Objective
from core.training.state import RunState
from core.training.steps import BatchAhead, autocast, media, on_device


class SFT(Objective):
    name = declared.METHOD.name  # fields, checks, plots: core/config/methods/sft.py
    prefetches = True

    def __init__(self, cfg: TrainConfig):
        self.ahead: BatchAhead | None = None  # on a GPU: the next micro-batch, on its way
        self.chunks: tuple = ()  # this step's micro-batches

    def micro_batches(self, run: RunState, cfg: TrainConfig, starts, step: int):
        self.chunks = starts.split(cfg.batch_size)
        return self.chunks

    def micro_loss(self, run: RunState, cfg: TrainConfig, starts):
        batch = self._batch(run, starts)
        x, y, mask, seg = batch
        with autocast(run.device, run.precision):
            _, loss = run.train_model(x, y, mask, seg, **media(batch))
        following = [i + 1 for i, c in enumerate(self.chunks) if c is starts]
        if following and following[0] < len(self.chunks) and steps.ahead_on(run.device):
            self._fetch(run, self.chunks[following[0]])  # while this forward runs
        return loss, None

    def prefetch(self, run: RunState, cfg: TrainConfig, starts) -> None:
        self._fetch(run, starts.split(cfg.batch_size)[0])

    def _fetch(self, run: RunState, chunk) -> None:
        self.ahead = self.ahead or BatchAhead(run.device)
        self.ahead.put(chunk, run.data.train_batch(chunk))

    def _batch(self, run: RunState, chunk) -> tuple:
        batch = self.ahead.take(chunk) if self.ahead is not None else None
        if batch is None:
            batch = on_device(run.data.train_batch(chunk), run.device)
        return batch

    def evaluate(self, run: RunState, cfg: TrainConfig) -> tuple[float, dict, str]:
        # As many windows as eval_batches optimizer steps hold, so neither an out-of-memory
        # split of the micro-batch nor the number of processes changes what is measured.
        windows = cfg.eval_batches * cfg.batch_size * cfg.grad_accum * run.world.size
        val = evaluation.validation_loss(
            run.model, run.train_model, run.data, windows, cfg.batch_size, run.device, run.precision
        )
        bpb = evaluation.bits_per_byte(val, run.data)
        return val, {"val_loss": val, "val_bpb": bpb}, f"val_loss {val:.4f}, {bpb:.4f} bits/byte"
