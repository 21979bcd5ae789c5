"""Several runs side by side (the window's Compare tab): each run's loss curves by step and by
time, a one-line summary of the settings that tell runs apart, and beside the loss the
evaluations saved in each run (RUN/eval/, written by core.use.evaluate)."""

from __future__ import annotations

import json
from pathlib import Path

from core.config import methods
from core.errors import UserError
from core.runs import experts
from core.runs.folder import RunFolder, read_metrics


def settings_line(run: RunFolder) -> str:
    """What distinguishes a run: its start, size, data, learning rate, batch, LoRA, length."""
    try:
        c = run.read_config()
    except (UserError, OSError, ValueError):
        return "settings unreadable"
    start = Path(c.init_from).name if c.init_from else f"new {c.hidden_dim}x{c.n_layers}"
    data = Path(c.data).name if c.data else "embedded"
    parts = [
        start,
        data,
        f"lr {'auto' if c.lr is None else f'{c.lr:g}'}",
        f"batch {c.batch_size}x{c.grad_accum}",
    ]
    if c.method != methods.DEFAULT:
        parts.insert(1, c.method)
    if c.lora_rank:
        parts.append(
            f"LoRA {c.lora_rank}" + (f" {c.base_bits}-bit" if c.base_bits in ("4", "8") else "")
        )
    return ", ".join(parts)


# what a curve shows: (the training records' key, the evaluations' key or None); the loss, what
# the methods declare (GRPO: its reward), then a mixture of experts' routing signals
MEASURES = {
    "loss": ("loss", "val_loss"),
    **{m.name: (m.train_key, m.eval_key) for m in methods.measures()},
    "router entropy (MoE)": (experts.ENTROPY, None),
    "aux loss (MoE)": (experts.AUX, None),
}


def run_curves(path: str | Path, measure: str = "loss") -> dict:
    """{"name", "label", "train": [(step, elapsed_s, value)], "val": [(step, train_s, value)]}
    of one measure (MEASURES: the loss, or a method's, GRPO's reward); records without it are left
    out, so a run that has none draws nothing."""
    run = RunFolder(Path(path))
    train, evals = read_metrics(run.metrics_file)
    train_key, eval_key = MEASURES[measure]
    return {
        "name": run.path.name,
        "label": f"{run.path.name} ({settings_line(run)})",
        "train": [
            (r["step"], r.get("elapsed_s", 0.0), r[train_key])
            for r in train
            if isinstance(r.get(train_key), int | float)
        ],
        "val": [
            (r["step"], r.get("train_s", 0.0), r[eval_key])
            for r in evals
            if eval_key and isinstance(r.get(eval_key), int | float)
        ],
    }


def _routing(train: list[dict]) -> dict[str, float]:
    """A mixture of experts' last router entropy and its final step's idle experts (dense: {})."""
    out = {}
    entropy = [r[experts.ENTROPY] for r in train if isinstance(r.get(experts.ENTROPY), int | float)]
    if entropy:
        out["router entropy"] = float(entropy[-1])
    load = experts.latest(train)
    if load is not None:
        out["idle experts"] = sum(len(idle) for idle in load.idle().values())
    return out


# the measures a saved evaluation shows beside the loss (lm_eval tasks: all of theirs)
HEADLINE = {"text": ("bits_per_byte", "word_perplexity"), "choices": ("acc", "acc_norm")}


def eval_records(run: str | Path) -> list[dict]:
    """The evaluation records of a run (RUN/eval/*.json), newest first, each with its "path";
    an unreadable file is left out."""
    out = []
    for path in sorted(Path(run, "eval").glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("result"), dict):
            out.append({**record, "path": str(path)})
    return sorted(out, key=lambda r: str(r.get("time", "")), reverse=True)


def _measures(record: dict, result: dict) -> dict[str, float]:
    kind, data = record.get("kind"), record.get("data", "")
    if kind in HEADLINE:
        keys = [k for k in HEADLINE[kind] if isinstance(result.get(k), float)]
        return {f"{data} {k}": result[k] for k in keys}
    out = {}
    for task, measures in (result.get("tasks") or {}).items():
        for k, v in measures.items():
            if isinstance(v, int | float) and not k.endswith("_stderr"):
                out[f"{task} {k}"] = float(v)
    return out


def run_summary(path: str | Path) -> dict[str, float]:
    """{"val_loss": the last, "best val_loss" (a GRPO run: "eval_reward" and its best; a mixture
    of experts: the last "router entropy" and the final step's "idle experts"), then
    each saved evaluation's measures (the newest of each file and settings), and "start: ..."
    for the model a fine-tune began from}."""
    run = RunFolder(Path(path))
    train, evals = read_metrics(run.metrics_file)
    out = {}
    losses = [float(e["val_loss"]) for e in evals if isinstance(e.get("val_loss"), int | float)]
    if losses:
        out["val_loss"] = losses[-1]
        out["best val_loss"] = min(losses)
    for measure in methods.measures():  # GRPO: the held-out reward, higher is better
        key = measure.eval_key
        values = [float(e[key]) for e in evals if isinstance(e.get(key), int | float)]
        if values:
            out[key] = values[-1]
            out[f"best {key}"] = (max if measure.higher_is_better else min)(values)
    out.update(_routing(train))
    for record in reversed(eval_records(path)):  # oldest first: the newest wins
        out.update(_measures(record, record["result"]))
        if isinstance(record.get("start"), dict):
            out.update({f"start: {k}": v for k, v in _measures(record, record["start"]).items()})
    return out
