"""The trainer in a child process (what the window uses): events, Stop, Save, a lost parent."""

from __future__ import annotations

import multiprocessing as mp

from helpers import tiny_config

from core.checkpoint import load
from core.child_process import FAILED, RESULT, ChildRun, PipeEvents, child_control
from core.events import TrainControl
from core.runs import RunFolder


def test_child_run_sends_every_event_then_the_result(tmp_path):
    cfg = tiny_config(max_steps=12, eval_every=6, ckpt_every=6)
    child = ChildRun(cfg, tmp_path / "run", None, child_control(), threads=1)
    child.start()
    messages = list(child.messages())
    names = [name for name, _ in messages]
    assert names[0] == "on_prepare" or names[0] == "on_train_start"
    assert names.count("on_train_batch_end") == 12 and names.count("on_eval") == 2
    assert names[-2:] == ["on_train_end", RESULT]
    result = messages[-1][1][0]
    assert result["status"] == "finished" and result["step"] == 12
    assert child.process.exitcode == 0
    assert load(RunFolder(tmp_path / "run").latest)["step"] == 12


def test_stop_and_save_requests_reach_the_child(tmp_path):
    cfg = tiny_config(max_steps=10_000, ckpt_every=10_000)
    control = child_control()
    child = ChildRun(cfg, tmp_path / "run", None, control, threads=1)
    child.start()
    saved, result = [], None
    for name, args in child.messages():
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
    events.on_train_batch_end({"step": 1})
    assert recv.recv() == ("on_train_batch_end", ({"step": 1},))
    recv.close()  # the parent is gone
    events.on_train_batch_end({"step": 2})
    assert control.stop_requested and events.parent_gone
    events.on_log("still quiet")  # no second error once the parent is known gone
