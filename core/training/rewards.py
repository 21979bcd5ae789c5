"""GRPO's reward functions: the built-ins (no code needed) and a user's own, from a Python
file, called exactly as TRL's GRPOTrainer calls them: by keyword, prompts=, completions=,
completion_ids=, every other data column by its name (one value per completion), and
trainer_state=, log_extra=, log_metric=; returning one float (or None: does not apply) per
completion. A user's file is their own code and runs as such, with this process's rights."""

from __future__ import annotations

import importlib.util
import math
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from core.config.spec import TrainConfig, reward_weights, split_reward
from core.errors import StepStopped, UserError


class RewardError(UserError):
    """A reward that cannot be loaded or that misbehaves: exit 2, naming it (and the row)."""


def text_of(completion) -> str:
    """A completion's text: plain, or TRL's conversational [{"role": "assistant", ...}]."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion)
    return completion


# -- the built-ins ----------------------------------------------------------------------------

NUMBER = re.compile(r"-?\d[\d,]*\.?\d*|-?\.\d+")


def final_answer(text: str) -> str:
    """The answer a text gives: after GSM8K's ####, inside the last \\boxed{}, inside
    <answer></answer>, else its last number, else the whole text."""
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    if boxed:
        return boxed[-1].strip()
    tagged = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    if tagged:
        return tagged[-1].strip()
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else text.strip()


def _number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None


def same_answer(given: str, expected: str) -> bool:
    """Exactly the same text, or the same number (1,000 == 1000.0)."""
    given, expected = final_answer(given), final_answer(str(expected))
    if given == expected:
        return True
    a, b = _number(given), _number(expected)
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def answer(completions, answer, **kwargs) -> list[float]:
    """1 where the completion's final answer equals the answer column, else 0."""
    return [float(same_answer(text_of(c), a)) for c, a in zip(completions, answer, strict=True)]


THINK_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def think_format(completions, **kwargs) -> list[float]:
    """1 where the completion is <think>...</think> then <answer>...</answer>, nothing else."""
    return [float(bool(THINK_FORMAT.match(text_of(c)))) for c in completions]


def make_regex(pattern: str):
    compiled = re.compile(pattern, re.DOTALL)

    def regex(completions, **kwargs) -> list[float]:
        """1 where the pattern is found in the completion."""
        return [float(bool(compiled.search(text_of(c)))) for c in completions]

    return regex


def make_length(target: int):
    def length(completion_ids, **kwargs) -> list[float]:
        """1 at the target length in tokens, falling linearly to 0 at 0 and twice the target."""
        return [max(0.0, 1.0 - abs(len(ids) - target) / target) for ids in completion_ids]

    return length


# -- loading ----------------------------------------------------------------------------------


def reward_file(spec: str) -> Path:
    """The file a path.py:function names; RewardError when there is none."""
    file = Path(split_reward(spec)[0]).expanduser()
    if not file.is_file():
        raise RewardError(f"reward: {spec}: no file {file}")
    return file


def check_files(cfg: TrainConfig) -> None:
    """Each path.py:function reward's file exists: a cheap fact, checked with the data before
    a start model is written or a model read (the import waits for the run's start)."""
    for spec in cfg.reward:
        if split_reward(spec) is not None:
            reward_file(spec)


def load_function(spec: str):
    """The function a path.py:function names, imported now: a missing file, an import that
    fails or a missing function is one line, before the model loads."""
    file, name = reward_file(spec), split_reward(spec)[1]
    module_spec = importlib.util.spec_from_file_location(f"traindeck_reward_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # a sys.exit() in it does not end the caller
        raise RewardError(f"reward: {file} failed to import: {_described(e)}") from None
    function = getattr(module, name, None)
    if not callable(function):
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise RewardError(
            f"reward: {file} has no function {name!r} (it has: {', '.join(found) or 'none'})"
        )
    return function


def build(cfg: TrainConfig) -> list[tuple[str, object]]:
    """(name, function) of each --reward, in order; names are the functions' own, as TRL's
    metric names (rewards/<name>/mean)."""
    out = []
    for spec in cfg.reward:
        if split_reward(spec) is not None:
            function = load_function(spec)
        elif spec == "regex":
            function = make_regex(cfg.reward_regex)
        elif spec == "length":
            target = cfg.reward_length_target or max(1, cfg.max_completion_tokens // 2)
            function = make_length(target)
        else:
            function = {"answer": answer, "think_format": think_format}[spec]
        out.append((getattr(function, "__name__", spec), function))
    return out


def check_columns(funcs, columns: list[str]) -> None:
    """The answer reward needs the data's answer column: said before the model loads."""
    if any(f is answer for _, f in funcs) and "answer" not in columns:
        raise RewardError(
            f"reward: answer compares with the data's answer column; the prompts have "
            f"{', '.join(columns) or 'no other columns'}"
        )


# -- scoring ----------------------------------------------------------------------------------

POLL_S = 0.05  # how often a wait on a reward looks at the stop flag


class Raised(Exception):
    """What the user's function raised, carried out of its thread. Kept apart from what the
    waiting thread itself gets: a second Ctrl+C there is the user's abort, not the reward's."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


def call_guarded(name: str, function, kwargs: dict, limit_s: float, interrupt, rows) -> object:
    """function(**kwargs) in a daemon thread, waited on in short polls. Whatever it raises
    (SystemExit and KeyboardInterrupt too) comes back as Raised; past limit_s seconds it is a
    RewardError naming it and the data rows; interrupt() true (a stop) raises StepStopped at
    once. A thread cannot be killed: one left running is abandoned (a daemon, it ends with
    the process), and the run that stopped or failed does not call it again."""
    box = {}

    def work():
        try:
            box["value"] = function(**kwargs)
        except BaseException as e:  # the user's code: sys.exit and Ctrl+C-like raises too
            box["error"] = e

    worker = threading.Thread(target=work, name=f"reward {name}", daemon=True)
    deadline = time.monotonic() + limit_s
    worker.start()
    while True:
        worker.join(POLL_S)
        if not worker.is_alive():
            break
        if interrupt is not None and interrupt():
            raise StepStopped(f"stopped while reward {name} ran")
        if time.monotonic() > deadline:
            raise RewardError(
                f"reward {name} took longer than {limit_s:g} s on data rows {_span(rows)} "
                "(reward_timeout); make it faster or raise reward_timeout"
            )
    if "error" in box:
        raise Raised(box["error"])
    return box["value"]


class Rewards:
    """The run's reward functions and weights; score() gives each completion's rewards."""

    def __init__(self, cfg: TrainConfig):
        self.funcs = build(cfg)
        self.names = [name for name, _ in self.funcs]
        self.weights = torch.tensor(reward_weights(dataclass_values(cfg)))
        self.limit_s = cfg.reward_timeout
        self.extra: dict[str, list] = {}  # log_extra's columns of the latest call
        self.metrics: dict[str, list[float]] = {}  # log_metric's values of the latest call

    def log_extra(self, column: str, values: list) -> None:
        self.extra[column] = list(values)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(name, []).append(float(value))

    def score(
        self,
        prompts: list,
        completions: list,
        completion_ids: list,
        columns: dict,
        rows: list[int],
        state: SimpleNamespace,
        interrupt=None,
    ) -> torch.Tensor:
        """(completions, functions) rewards; NaN where a function returned None. interrupt:
        polled while a function runs; true stops the step (StepStopped)."""
        self.extra, self.metrics = {}, {}
        out = torch.zeros(len(completions), len(self.funcs))
        kwargs = dict(
            columns, trainer_state=state, log_extra=self.log_extra, log_metric=self.log_metric
        )
        for j, (name, function) in enumerate(self.funcs):
            call = dict(prompts=prompts, completions=completions, completion_ids=completion_ids)
            try:
                values = call_guarded(
                    name, function, {**call, **kwargs}, self.limit_s, interrupt, rows
                )
            except Raised as e:
                where = self._failing_row(name, function, call, kwargs, rows, interrupt)
                raise RewardError(f"reward {name} raised {_described(e.error)} ({where})") from None
            out[:, j] = torch.tensor(_checked(name, values, len(completions), rows))
        return out

    def _failing_row(self, name, function, call: dict, kwargs: dict, rows, interrupt) -> str:
        """The first data row on which the function raises alone; else the batch's rows."""
        n, deadline = len(call["completions"]), time.monotonic() + self.limit_s
        for i in range(n):
            left = deadline - time.monotonic()  # the search as a whole within the limit
            if left <= 0:
                break
            one = {k: [v[i]] for k, v in call.items()}
            one.update(
                {k: [v[i]] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()}
            )
            try:
                call_guarded(name, function, one, left, interrupt, rows[i : i + 1])
            except Raised:
                return f"data row {rows[i]}, completion {i}"
            except RewardError:
                break  # too slow to look further: the batch's rows
        return f"data rows {_span(rows)}"


def dataclass_values(cfg: TrainConfig) -> dict:
    return {"reward": cfg.reward, "reward_weights": cfg.reward_weights}


def _span(rows: list[int]) -> str:
    return f"{rows[0]}" if len(rows) == 1 else f"{rows[0]}..{rows[-1]}"


def _described(e: BaseException) -> str:
    """An exception as one line: its type, and its text's first line (SystemExit: its code)."""
    text = _first_line(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _first_line(value) -> str:
    try:
        text = str(value)
    except Exception:  # a user's __str__ that raises
        return ""
    return text.strip().splitlines()[0][:200] if text.strip() else ""


def _checked(name: str, values, n: int, rows: list[int]) -> list[float]:
    if not isinstance(values, (list, tuple)) or len(values) != n:
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else _shown(values, 60)
        raise RewardError(
            f"reward {name} returned {got} for {n} completions (data rows {_span(rows)}); "
            "return a list with one float (or None) per completion"
        )
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        try:
            f = float(v)
        except Exception:  # a string, a list, a user's object whose __float__ raises
            f = math.nan
        if isinstance(v, bool) or not math.isfinite(f):
            raise RewardError(
                f"reward {name} returned {_shown(v, 40)} for completion {i} (data row {rows[i]}); "
                "expected a finite number or None"
            )
        out.append(f)
    return out


def _shown(value, width: int) -> str:
    """A returned value as one short line, whatever its repr does."""
    try:
        text = repr(value)
    except Exception:
        text = f"a {type(value).__name__}"
    return " ".join(text.split())[:width]
