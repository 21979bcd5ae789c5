"""A run's progress as the front ends show it: step, rate, elapsed time and ETA.

Qt-free, so the arithmetic is tested on its own; the window feeds it records and a clock.
"""

from __future__ import annotations

from core.config import methods


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def describe_run_data(info: dict) -> str:
    """'<source>, 11.2 MB, 3.1M tokens (bpe), 2.4 passes' for a status line."""
    data = info.get("data") or {}
    if not data:
        return info.get("data_source", "")
    steps = info["max_steps"] - info["start_step"]
    passes = info["max_steps"] * info["tokens_per_step"] / max(1, data["train_tokens"])
    if data.get("data_format") == "prompts":  # GRPO (core.data.prompts)
        return (
            f"{data['source']}, {data['examples']['train']:,} prompts "
            f"({data['examples']['val']:,} held out), {passes:.2f} passes ({steps:,} steps to go)"
        )
    used = f"{data['source_bytes'] / 1e6:,.1f} MB"
    if data["source_bytes"] < data["total_bytes"]:
        used = f"using {data['source_bytes'] / 1e6:,.1f} of {data['total_bytes'] / 1e6:,.1f} MB"
    tokens = data["train_tokens"] + data["val_tokens"]
    return (
        f"{data['source']}, {used}, {tokens:,} tokens ({data['tokenizer']}), "
        f"{passes:.2f} passes over the training data ({steps:,} steps to go)"
    )


class Progress:
    """Fed batch and eval records with the time they arrived; answers step, elapsed, ETA.

    The ETA rate is measured from the first record this session saw, so a resumed run's
    earlier steps (done at another time, maybe on another machine) do not bend it.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.max_steps: int | None = None
        self.start_step = 0
        self.first: tuple[int, float] | None = None  # (step, time) of the first record
        self.last: dict | None = None  # the newest batch record
        self.last_at = 0.0  # when it arrived
        self.last_val: float | None = None
        self.last_evals: dict[str, float] = {}  # what the methods' status shows (GRPO: reward)

    def start(self, max_steps: int, start_step: int) -> None:
        self.max_steps, self.start_step = max_steps, start_step

    def add_batch(self, record: dict, now: float) -> None:
        if self.first is None:
            self.first = (record["step"], now)
        self.last, self.last_at = record, now

    def add_eval(self, record: dict) -> None:
        self.last_val = record.get("val_loss")
        self.last_evals = {
            k: record[k] for _, k in methods.status_fields() if record.get(k) is not None
        }

    @property
    def step(self) -> int | None:
        return None if self.last is None else self.last["step"]

    def elapsed(self, now: float, running: bool) -> float | None:
        """The run's wall time (its records' elapsed_s), ticking on between records."""
        if self.last is None or self.last.get("elapsed_s") is None:
            return None
        return self.last["elapsed_s"] + (now - self.last_at if running else 0.0)

    def eta(self, running: bool) -> float | None:
        """Seconds to max_steps at this session's rate; 0 once the run has ended."""
        if self.first is None or not self.max_steps or self.step <= self.first[0]:
            return None
        if not running:
            return 0.0
        rate = (self.step - self.first[0]) / max(self.last_at - self.first[1], 1e-6)
        return (self.max_steps - self.step) / rate

    def summary(self, now: float, running: bool) -> str:
        """'loss 1.2345    val 1.3000    12,345 tok/s    elapsed 0:01:02    ETA 0:10:00'."""
        last = self.last
        if last is None:
            return ""
        parts = [
            f"loss {last['loss']:.4f}",
            f"val {self.last_val:.4f}" if self.last_val is not None else None,
            *(
                f"{label} {self.last_evals[key]:.4f}"
                for label, key in methods.status_fields()
                if key in self.last_evals
            ),
            f"{last.get('tokens_per_s', 0):,.0f} tok/s",
            f"elapsed {fmt_duration(self.elapsed(now, running))}",
            f"ETA {fmt_duration(self.eta(running))}",
        ]
        return "    ".join(p for p in parts if p)
