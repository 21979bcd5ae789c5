"""No host stalls in a step: nothing inside an optimizer step waits for the device (no
.item(), .cpu(), .tolist(), data-dependent shapes or NVML reads); the losses are read once
every log_every steps, NVML on its own thread, and on a GPU the next micro-batch is read and
sent while the step before runs. Counted on the CPU, where the same code runs: a Python-level
read is patched, and every aten op that makes the host wait on a GPU (an .item(), a nonzero, a
comparison read back) is caught as it dispatches."""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core.data.windows import TokenData
from core.platform import hardware
from core.runs.folder import read_metrics
from core.training import steps
from core.training.trainer import Trainer
from tests.helpers import tiny_config

# aten ops whose result the host must wait for on a GPU: a scalar read back, or a shape that
# depends on the values
WAITING_OPS = {
    "_local_scalar_dense",
    "is_nonzero",
    "equal",
    "nonzero",
    "masked_select",
    "_unique2",
    "unique_consecutive",
    "unique_dim",
}


def masked_index(name: str, args) -> bool:
    """x[mask] and x[mask] = v: a boolean index is a nonzero inside the kernel."""
    if name not in ("index", "index_put", "index_put_") or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])


class WaitCounter(TorchDispatchMode):
    """Counts waiting ops and patched reads; `paused` while the data is read (host tensors
    from numpy by construction, moved to the device afterwards)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.paused and (name in WAITING_OPS or masked_index(name, args)):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))

    def note(self, name: str) -> None:
        if not self.paused:
            self.calls.append(name)


def counted_run(tmp_path, monkeypatch, ahead: bool, **overrides):
    """A short run with each step's waits counted: {step: [waits]}, and the reads at logs."""
    counter, per_step, at_logs = WaitCounter(), {}, []
    for name in ("item", "tolist", "cpu"):  # a read a Python call makes, by name
        original = getattr(torch.Tensor, name)

        def patched(self, *a, _original=original, _name=name, **k):
            counter.note(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, patched)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: counter.note("synchronize"))
    nvml_threads = []
    monkeypatch.setattr(
        hardware, "nvml_stats", lambda i: nvml_threads.append(threading.current_thread()) or {}
    )
    read = TokenData.train_batch

    def data_read(self, starts):
        counter.paused, was = True, counter.paused
        try:
            return read(self, starts)
        finally:
            counter.paused = was

    monkeypatch.setattr(TokenData, "train_batch", data_read)
    monkeypatch.setattr(steps, "ahead_on", lambda device: ahead)
    step_fn, emit = Trainer._step_with_oom_recovery, Trainer._emit_metrics

    def counted_step(self, factor):
        counter.calls = []
        with counter:
            loss = step_fn(self, factor)
        per_step[self.step + 1] = counter.calls
        return loss

    def counted_emit(self):
        counter.calls = []
        with counter:
            emit(self)
        at_logs.append(list(counter.calls))

    monkeypatch.setattr(Trainer, "_step_with_oom_recovery", counted_step)
    monkeypatch.setattr(Trainer, "_emit_metrics", counted_emit)
    values = dict(max_steps=4, log_every=2, eval_every=100, ckpt_every=100, dropout=0.0)
    trainer = Trainer(tiny_config(**{**values, **overrides}), run_dir=tmp_path / "run")
    assert trainer.run()["status"] == "finished"
    assert not [t for t in nvml_threads if t is threading.current_thread()]
    return trainer, per_step, at_logs


def test_no_step_waits_for_the_device_and_the_logs_read_the_losses(tmp_path, monkeypatch):
    trainer, per_step, at_logs = counted_run(tmp_path, monkeypatch, ahead=True, grad_accum=2)
    assert sorted(per_step) == [1, 2, 3, 4]
    assert per_step == {step: [] for step in per_step}, per_step
    # the counter sees reads: the records' one read of the pending losses, every 2 steps
    assert [calls.count("tolist") for calls in at_logs if calls] == [1, 1]


def test_the_batch_read_ahead_trains_exactly_as_the_batch_read_in_step(tmp_path, monkeypatch):
    runs = {}
    for ahead in (False, True):
        reads = []
        read = TokenData.train_batch

        def logged(self, starts, _read=read, _reads=reads):
            _reads.append(starts.clone())
            return _read(self, starts)

        monkeypatch.setattr(TokenData, "train_batch", logged)
        monkeypatch.setattr(steps, "ahead_on", lambda device, _a=ahead: _a)
        trainer = Trainer(
            tiny_config(max_steps=3, grad_accum=2, eval_every=100, ckpt_every=3, log_every=1),
            run_dir=tmp_path / str(ahead),
        )
        trainer.run()
        losses = [r["loss"] for r in read_metrics(trainer.folder.metrics_file)[0]]
        runs[ahead] = losses, reads, trainer.data.state_dict()["generator"]
        monkeypatch.undo()
    (plain, plain_reads, plain_state), (ahead, ahead_reads, ahead_state) = runs[False], runs[True]
    assert ahead == plain  # the same process and kernels: equal bit for bit
    assert torch.equal(ahead_state, plain_state)  # the data position a checkpoint saves
    # each micro-batch read once, in order, and none past the last step
    assert len(ahead_reads) == len(plain_reads) == 6
    assert all(torch.equal(a, b) for a, b in zip(ahead_reads, plain_reads, strict=True))


def test_nvml_is_read_on_its_own_thread_and_a_record_takes_the_latest(monkeypatch):
    threads, readings = [], iter(range(10**6))

    def read(index):
        threads.append(threading.current_thread())
        return {"gpu_util": float(next(readings))}

    watch = hardware.NvmlWatch(0, interval_s=0.01, read=read).start()
    try:
        while len(threads) < 3:
            threading.Event().wait(0.01)
        for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
            monkeypatch.setattr(torch.cuda, name, lambda index: 2 * hardware.MB)
        record = hardware.memory_stats(torch.device("cuda"), watch)
    finally:
        watch.stop()
    assert record["mem_allocated_mb"] == 2.0 and record["gpu_util"] >= 2.0
    assert threading.current_thread() not in threads and not watch._thread.is_alive()
