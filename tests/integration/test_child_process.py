"""The trainer in a child process (what the window uses): events, Stop, Save, a lost parent."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from helpers import tiny_config

from core.errors import TrainingError
from core.runs.checkpoint import load
from core.runs.events import TrainControl
from core.runs.folder import RunFolder
from core.training import child_process
from core.training.child_process import (
    BATCH,
    FAILED,
    RESULT,
    ChildRun,
    PipeEvents,
    child_control,
    child_main,
)


def test_child_run_sends_every_event_then_the_result(tmp_path):
    cfg = tiny_config(max_steps=12, eval_every=6, ckpt_every=6)
    child = ChildRun(cfg, tmp_path / "run", None, child_control(), threads=1)
    child.start()
    messages = list(child.events())
    names = [name for name, _ in messages]
    first = next(n for n in names if n != "on_log")  # data notes may come first
    assert first in ("on_prepare", "on_train_start")
    assert names.count("on_train_batch_end") == 12 and names.count("on_eval") == 2
    assert names[-2:] == ["on_train_end", RESULT]
    result, stats = messages[-1][1]
    assert result["status"] == "finished" and result["step"] == 12
    assert stats["messages"] < stats["events"] and stats["torch_threads"] == 1
    assert child.process.exitcode == 0
    assert load(RunFolder(tmp_path / "run").latest)["step"] == 12


def test_stop_and_save_requests_reach_the_child(tmp_path):
    cfg = tiny_config(max_steps=10_000, ckpt_every=10_000)
    control = child_control()
    child = ChildRun(cfg, tmp_path / "run", None, control, threads=1)
    child.start()
    saved, result = [], None
    for name, args in child.events():
        if name == "on_train_batch_end" and args[0]["step"] == 3:
            control.request_save()
        if name == "on_checkpoint" and not saved:
            saved.append(args[1])
            control.request_stop()
        if name == RESULT:
            result = args[0]
    assert saved and 3 <= saved[0] < 100
    assert result["status"] == "stopped" and result["step"] < 200
    ckpt = load(RunFolder(tmp_path / "run").latest)
    assert ckpt["step"] == result["step"]  # Stop saved where it stopped


def test_a_refused_config_comes_back_as_a_failure_with_core_message(tmp_path):
    cfg = tiny_config(data=str(tmp_path / "missing.txt"))
    child = ChildRun(cfg, tmp_path / "run", None, child_control(), threads=1)
    child.start()
    failures = [args for name, args in child.messages() if name == FAILED]
    assert len(failures) == 1
    kind, message = failures[0]
    assert kind == "input" and message.startswith("data:") and "missing.txt" in message


def test_a_closed_window_makes_the_child_stop_instead_of_training_blind():
    recv, send = mp.Pipe(duplex=False)
    control = TrainControl()
    events = PipeEvents(send, control)
    events.on_train_batch_end({"step": 1})  # the first records go out at once
    assert recv.recv() == (BATCH, ([{"step": 1}],))
    recv.close()  # the parent is gone
    events.on_train_batch_end({"step": 2})  # held (a batch just went)
    events.on_log("seen at the next send")
    assert control.stop_requested and events.parent_gone
    events.on_log("still quiet")  # no second error once the parent is known gone


class ListConn:
    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)


def unpacked(sent):
    """(name, args) per event, each batch's records as on_train_batch_end messages."""
    for name, args in sent:
        if name == BATCH:
            yield from (("on_train_batch_end", (record,)) for record in args[0])
        else:
            yield name, args


def test_step_records_are_batched_and_other_events_send_them_first(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(child_process.time, "perf_counter", lambda: clock[0])
    conn = ListConn()
    events = PipeEvents(conn, TrainControl(), batch_s=0.25, log_every=5)
    sent = []  # what a plain (unbatched) pipe would have carried, in order
    for step in range(1, 31):
        clock[0] += 0.01  # 100 steps a second
        events.on_train_batch_end({"step": step})
        sent.append(("on_train_batch_end", ({"step": step},)))
        if step == 12:
            events.on_log("a log line mid-window")
            sent.append(("on_log", ("a log line mid-window",)))
        if step == 20:
            events.on_eval({"step": 20, "val_loss": 1.0})
            sent.append(("on_eval", ({"step": 20, "val_loss": 1.0},)))
            # the eval goes out at once, after every record before it
            assert conn.sent[-1] == sent[-1] and list(unpacked(conn.sent)) == sent
    # steps 21-30 are held: their windows ended under 0.25 s after the eval's batch...
    assert list(unpacked(conn.sent)) == sent[:-10]
    events.on_train_end({"status": "finished", "step": 30})
    sent.append(("on_train_end", ({"status": "finished", "step": 30},)))
    assert list(unpacked(conn.sent)) == sent  # ...and nothing is left behind at the end
    batches = [args[0] for name, args in conn.sent if name == BATCH]
    assert len(batches) < 10 and events.messages == len(conn.sent)
    # a batch ends at a log window's end (or just before another event), never inside one
    ends = [records[-1]["step"] for records in batches]
    assert all(step % 5 == 0 or step in (12, 20, 30) for step in ends)


def test_unbatched_sends_one_message_per_step():
    conn = ListConn()
    events = PipeEvents(conn, TrainControl(), batch_s=0)
    for step in (1, 2, 3):
        events.on_train_batch_end({"step": step})
    assert conn.sent == [("on_train_batch_end", ({"step": s},)) for s in (1, 2, 3)]


def test_eval_comes_in_order_with_the_steps_not_at_the_end(tmp_path):
    cfg = tiny_config(max_steps=30, log_every=3, eval_every=10, ckpt_every=1000)
    child = ChildRun(cfg, tmp_path / "run", None, child_control(), threads=1, batch_s=10.0)
    child.start()
    order = []
    for name, args in child.events():
        if name == "on_train_batch_end":
            order.append(("step", args[0]["step"]))
        elif name == "on_eval":
            order.append(("eval", args[0]["step"]))
    steps = [n for kind, n in order if kind == "step"]
    assert steps == list(range(1, 31))  # every step's record, once, in order
    for at in (10, 20):  # each evaluation right after its step's record, not at the end
        i = order.index(("eval", at))
        assert order[i - 1] == ("step", at) and order[i + 1] == ("step", at + 1)


def test_a_failure_after_some_steps_still_delivers_the_steps_before_it(monkeypatch):
    class FailingTrainer:
        def __init__(self, cfg, run_dir, resume_from=None):
            pass

        def run(self, events, control):
            events.on_train_start({"max_steps": 100})
            for step in range(1, 8):
                events.on_train_batch_end({"step": step})
            events.on_log("about to diverge")
            for step in range(8, 11):  # held: no log window has ended since
                events.on_train_batch_end({"step": step})
            raise TrainingError("loss became nan at step 11")

    monkeypatch.setattr("core.training.trainer.Trainer", FailingTrainer)
    monkeypatch.setattr(child_process.signal, "signal", lambda *args: None)
    recv, send = mp.Pipe(duplex=False)
    control = TrainControl()
    cfg = tiny_config(log_every=100)
    events = (control.stop_event, control.save_event, control.finish_event)
    child_main(cfg, "unused", None, send, events, None, 10.0)
    received = []
    while True:
        try:
            received.append(recv.recv())
        except EOFError:  # child_main closed its end
            break
    events = list(unpacked(received))
    steps = [args[0]["step"] for name, args in events if name == "on_train_batch_end"]
    assert steps == list(range(1, 11))
    names = [name for name, _ in events]
    assert names.index("on_log") == names.index("on_train_batch_end") + 7
    assert names[-1] == FAILED and events[-1][1][0] == "training"


@pytest.mark.parametrize("batch_s", [0.0, 0.25])
def test_receiver_sees_the_same_events_either_way(tmp_path, batch_s):
    cfg = tiny_config(max_steps=9, log_every=3, eval_every=9, ckpt_every=9)
    child = ChildRun(cfg, tmp_path / "run", None, child_control(), threads=1, batch_s=batch_s)
    child.start()
    names = [name for name, _ in child.events()]
    assert names.count("on_train_batch_end") == 9 and names[-1] == RESULT
