"""A reward function is the user's code. Whatever it does (raises anything, SystemExit and
KeyboardInterrupt included, returns junk, takes too long, never returns) the run either ends
with one line naming the reward and the data row, or stays stoppable: Stop, Save now and
Ctrl+C end it promptly with its checkpoint saved."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers import tiny_config
from hf_models import make_model

from core.config.spec import TrainConfig
from core.errors import StepStopped
from core.runs import checkpoint as ckpt
from core.runs.events import TrainControl
from core.runs.folder import read_metrics
from core.train import main as train_main
from core.training.rewards import RewardError, Rewards
from core.training.trainer import Trainer

pytest.importorskip("transformers")

ARITHMETIC = Path(__file__).parent.parent / "fixtures" / "arithmetic.jsonl"


def rewards_from(tmp_path, body: str, limit_s: float = 60.0) -> Rewards:
    """The Rewards of a file holding `def reward(completions, **kwargs):` + body."""
    file = tmp_path / "mine.py"
    head = "import math, os, sys, time\n\ndef reward(completions, **kwargs):\n"
    file.write_text(head + body, encoding="utf-8")
    cfg = dataclasses.replace(TrainConfig(), reward=[f"{file}:reward"], reward_timeout=limit_s)
    return Rewards(cfg)


def score(rewards: Rewards, interrupt=None):
    texts = ["1", "22", "333"]
    return rewards.score(texts, texts, [[1], [2], [3]], {}, [7, 8, 9], None, interrupt)


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        ("    sys.exit(0)\n", ("SystemExit", "data row 7")),
        ("    raise KeyboardInterrupt\n", ("KeyboardInterrupt", "data row 7")),
        (  # only the third completion fails: its row is the one named
            "    if '333' in completions: raise ValueError('no\\nthree')\n    return [1.0]\n",
            ("ValueError: no", "data row 9, completion 2"),
        ),
        ("    return [1.0, 2.0]\n", ("returned 2 values for 3 completions", "data rows 7..9")),
        ("    return 5\n", ("returned 5 for 3 completions",)),
        ("    return [1.0, 'high', 0.0]\n", ("returned 'high' for completion 1", "data row 8")),
        ("    return [1.0, 1.0, math.nan]\n", ("returned nan for completion 2", "data row 9")),
        ("    return [object(), 1.0, 1.0]\n", ("returned <object", "data row 7")),
    ],
)
def test_a_reward_that_raises_or_returns_junk_is_one_line_naming_it_and_the_row(
    tmp_path, body, needles
):
    with pytest.raises(RewardError) as err:
        score(rewards_from(tmp_path, body))
    message = str(err.value)
    assert message.startswith("reward reward ") and "\n" not in message, message
    for needle in needles:
        assert needle in message, message


def test_a_reward_file_that_exits_while_it_is_imported_is_one_line(tmp_path):
    file = tmp_path / "bye.py"
    file.write_text("import sys\nsys.exit(3)\n\ndef reward(completions, **kwargs):\n    pass\n")
    cfg = dataclasses.replace(TrainConfig(), reward=[f"{file}:reward"])
    with pytest.raises(RewardError, match=r"bye.py failed to import: SystemExit: 3$"):
        Rewards(cfg)


def test_a_reward_that_prints_scores_as_usual(tmp_path, capsys):
    got = score(rewards_from(tmp_path, "    print('scoring', completions)\n    return [1, 2, 3]\n"))
    assert got[:, 0].tolist() == [1.0, 2.0, 3.0]
    assert "scoring" in capsys.readouterr().out


def test_a_reward_past_its_time_limit_ends_naming_it_the_rows_and_the_setting(tmp_path):
    rewards = rewards_from(tmp_path, "    time.sleep(3)\n", limit_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(RewardError) as err:
        score(rewards)
    assert time.monotonic() - t0 < 5
    assert "reward reward took longer than 0.3 s on data rows 7..9 (reward_timeout)" in str(
        err.value
    )


def test_a_reward_that_never_returns_is_left_at_once_when_a_stop_comes(tmp_path):
    stop, release = threading.Event(), tmp_path / "release"
    # It spins holding the interpreter as much as it can, until the test lets it go.
    spin = f"    while not os.path.exists({str(release)!r}):\n        pass\n"
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(StepStopped):
            score(rewards_from(tmp_path, spin), stop.is_set)
        assert time.monotonic() - t0 < 5
    finally:
        release.touch()


def test_a_second_ctrl_c_while_a_reward_runs_aborts_and_is_not_blamed_on_the_reward(tmp_path):
    release = tmp_path / "release"

    def second_ctrl_c():  # what the default SIGINT handler raises in the waiting thread
        raise KeyboardInterrupt

    wait = f"    while not os.path.exists({str(release)!r}):\n        time.sleep(0.01)\n"
    try:
        with pytest.raises(KeyboardInterrupt):
            score(rewards_from(tmp_path, wait), second_ctrl_c)
    finally:
        release.touch()


# -- whole runs ---------------------------------------------------------------------------------

HANGS_AT_CALL = """
import pathlib, time

calls = 0


def reward(completions, **kwargs):
    global calls
    calls += 1
    if calls == {call} and pathlib.Path({armed!r}).exists():  # hangs: says so, waits
        pathlib.Path({marker!r}).write_text("in")
        while pathlib.Path({armed!r}).exists():  # until the test lets it go
            time.sleep(0.01)
    return [float(len(c) % 2) for c in completions]
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo-rewards")
    make_model(root / "model", "qwen2")
    return root / "model"


@pytest.fixture
def hanging_reward(tmp_path):
    """make(call): a reward whose call number `call` never returns while the file `armed`
    exists (the base model's held-out scoring is call 1, step 1's is call 2), and the file it
    writes when it begins to hang. The test's end lets any such call go."""
    marker, armed = tmp_path / "hanging", tmp_path / "armed"

    def make(call: int) -> tuple[str, Path, Path]:
        armed.touch()
        file = tmp_path / "hangs.py"
        text = HANGS_AT_CALL.format(call=call, marker=str(marker), armed=str(armed))
        file.write_text(text, encoding="utf-8")
        return f"{file}:reward", marker, armed

    yield make
    armed.unlink(missing_ok=True)


def when_hanging(marker: Path, then) -> threading.Thread:
    def watch():
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if marker.exists():  # never a late Ctrl+C into another test
            then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def grpo_config(model_dir, reward: str, **kw):
    values = dict(
        init_from=str(model_dir),
        tokenizer="model",
        data=str(ARITHMETIC),
        method="grpo",
        reward=[reward],
        num_generations=2,
        max_completion_tokens=3,
        seq_len=64,
        batch_size=2,
        max_steps=3,
        eval_every=100,
        ckpt_every=100,
        sample_tokens=0,
        log_every=1,
        warmup_steps=0,
        dropout=0.0,
    )
    return tiny_config(**{**values, **kw})


def test_stop_and_save_now_while_a_reward_hangs_save_the_step_before_and_resume_redoes_it(
    model_dir, tmp_path, hanging_reward
):
    reward, marker, armed = hanging_reward(call=3)  # step 2's scoring
    cfg = grpo_config(model_dir, reward)
    control = TrainControl()

    saved = []

    def save_then_stop():
        control.request_save()
        latest = tmp_path / "run" / "checkpoints" / "latest.pt"
        deadline = time.monotonic() + 60
        while not latest.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        saved.append(latest.exists())  # written while the reward still hangs
        control.request_stop()

    when_hanging(marker, save_then_stop)
    t0 = time.monotonic()
    result = Trainer(cfg, tmp_path / "run").run(None, control)
    assert time.monotonic() - t0 < 60
    assert saved == [True]
    assert result["status"] == "stopped" and result["step"] == 1
    assert ckpt.load(tmp_path / "run" / "checkpoints" / "latest.pt")["step"] == 1

    # Resumed (the reward no longer hangs), it trains step 2 as a straight run does.
    armed.unlink()
    Trainer(cfg, tmp_path / "run", resume_from=tmp_path / "run" / "checkpoints" / "latest.pt").run()
    Trainer(cfg, tmp_path / "straight").run()
    resumed, _ = read_metrics(tmp_path / "run" / "metrics.jsonl")
    straight, _ = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    keys = ("step", "loss", "reward")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in straight]


def cli_args(model_dir, reward: str, out: Path, *more: str) -> list[str]:
    return [
        "--init-from",
        str(model_dir),
        "--data",
        str(ARITHMETIC),
        "--method",
        "grpo",
        "--reward",
        reward,
        "--num-generations",
        "2",
        "--max-completion-tokens",
        "3",
        "--seq-len",
        "64",
        "--batch-size",
        "2",
        "--max-steps",
        "2",
        "--sample-tokens",
        "0",
        "--device",
        "cpu",
        "--out",
        str(out),
        *more,
    ]


def test_ctrl_c_while_a_reward_hangs_stops_the_run_with_its_checkpoint(
    model_dir, tmp_path, capsys, hanging_reward
):
    handler = signal.getsignal(signal.SIGINT)
    reward, marker, _ = hanging_reward(call=3)  # step 2's scoring
    when_hanging(marker, lambda: os.kill(os.getpid(), signal.SIGINT))
    try:
        t0 = time.monotonic()
        code = train_main(cli_args(model_dir, reward, tmp_path / "run"))
    finally:
        signal.signal(signal.SIGINT, handler)
    assert time.monotonic() - t0 < 60
    out = capsys.readouterr().out
    assert code == 130 and "Stopped at step 1" in out, out
    assert ckpt.load(tmp_path / "run" / "checkpoints" / "latest.pt")["step"] == 1


def test_a_reward_that_calls_sys_exit_ends_the_run_with_one_line_and_exit_2(
    model_dir, tmp_path, capsys
):
    file = tmp_path / "quits.py"
    file.write_text("import sys\n\ndef quits(completions, **kw):\n    sys.exit(0)\n")
    code = train_main(cli_args(model_dir, f"{file}:quits", tmp_path / "run"))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    last = err.splitlines()[-1]  # after the step bar: one line, no traceback
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert last.startswith("error: reward quits raised SystemExit: 0 (data row "), err


@pytest.mark.parametrize("prompt", ['""', '"   \\n"', '[{"role": "user", "content": " "}]'])
def test_an_empty_prompt_is_refused_naming_the_file_and_row_before_the_model_loads(
    model_dir, tmp_path, capsys, prompt
):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1 + 1 ="}\n' * 3 + f'{{"prompt": {prompt}}}\n')
    args = cli_args(model_dir, "regex", tmp_path / "run", "--reward-regex", "1")
    args[args.index(str(ARITHMETIC))] = str(data)
    code = train_main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.splitlines() == [err] and f"{data} row 4" in err and "empty" in err, err
