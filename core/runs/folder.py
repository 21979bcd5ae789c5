"""The run folder: the one place a run's state lives."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch
import yaml

from core.config.spec import TrainConfig, for_processes, from_dict, validate
from core.errors import CheckpointError, ConfigError
from core.platform.atomic import disk_full_as_enospc, writable_problem, write_text

DEFAULT_RUNS_ROOT = Path("runs")
# What a run folder may hold; a folder with anything else is not ours and is never written into.
RUN_NAMES = frozenset(
    {
        "config.yaml",
        "metrics.jsonl",
        "checkpoints",
        "samples.txt",
        "train.log",
        "status.json",
        "data.json",
        "tokenizer.json",
        "tensorboard",
        "eval",
        "FINISH",
        "STOP",
        "SAVE",
        ".traindeck.lock",
    }
)
RUN_MARKS = ("status.json", "train.log", ".traindeck.lock")  # written by every run we start


class RunFolder:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"
        self.config_file = self.path / "config.yaml"
        self.metrics_file = self.path / "metrics.jsonl"
        self.samples_file = self.path / "samples.txt"
        self.log_file = self.path / "train.log"
        self.status_file = self.path / "status.json"
        self.data_file = self.path / "data.json"
        self.tokenizer_file = self.path / "tokenizer.json"
        self._metrics = None
        self.resume_note: str | None = None  # why resume picked an older checkpoint

    @property
    def latest(self) -> Path:
        return self.ckpt_dir / "latest.pt"

    @property
    def best(self) -> Path:
        return self.ckpt_dir / "best.pt"

    def holds_run(self) -> bool:
        return self.config_file.exists() or self.metrics_file.exists() or self.latest.exists()

    def create(self, resuming: bool) -> None:
        check_out(self.path, resuming)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.ckpt_dir.glob(".*.tmp"):  # left by a write that was killed
            stale.unlink(missing_ok=True)

    def write_config(self, cfg: TrainConfig) -> None:
        write_text(self.config_file, yaml.safe_dump(cfg.to_dict(), sort_keys=False))

    def write_data_info(self, summary: dict, tokenizer) -> None:
        """data.json (what the run trains on) and the run's own copy of its tokenizer."""
        write_text(self.data_file, json.dumps(summary, indent=1))
        tokenizer.save(self.tokenizer_file)

    def read_config(self) -> TrainConfig:
        data = yaml.safe_load(self.config_file.read_text(encoding="utf-8"))
        return validate(from_dict(data, source=str(self.config_file)))

    def truncate_metrics(self, last_step: int) -> int:
        """Drop records past the checkpoint we resume from; they will be trained again."""
        return drop_records_past(self.metrics_file, last_step)

    def append_metric(self, record: dict) -> None:
        if self._metrics is None:
            # Kept open for the run; each record is flushed as it is written.
            self._metrics = open(self.metrics_file, "a", encoding="utf-8")  # noqa: SIM115
        with disk_full_as_enospc(self.metrics_file):
            self._metrics.write(json.dumps(record) + "\n")
            self._metrics.flush()

    def append_sample(self, step: int, text: str) -> None:
        with open(self.samples_file, "a", encoding="utf-8") as f:
            f.write(f"--- step {step} ---\n{text}\n\n")

    def log(self, message: str) -> None:
        with open(self.log_file, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")

    def write_status(self, state: str, step: int, max_steps: int, **extra) -> None:
        body = {"state": state, "step": step, "max_steps": max_steps, "updated": time.time()}
        body.update(extra)
        # Not fsynced: status is advisory and written often.
        write_text(self.status_file, json.dumps(body), durable=False)

    def read_status(self) -> dict:
        try:
            return json.loads(self.status_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return {}

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


def drop_records_past(path: Path, last_step: int) -> int:
    """Keep a JSON Lines file's records up to last_step (metrics.jsonl, GRPO's
    completions.jsonl on resume); records past it, and lines a crash cut or that hold no
    record, go. Returns how many went."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash mid-write
            rec = None
        if isinstance(rec, dict) and rec.get("step", 0) <= last_step:
            kept.append(line)
        else:
            dropped += 1
    write_text(path, "".join(k + "\n" for k in kept))
    return dropped


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """(train records, eval records) from a metrics.jsonl; damaged lines are skipped. An
    evaluation holds a val_ or eval_ measure (SFT and DPO's val_loss, GRPO's eval_reward)."""
    train, evals = [], []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return train, evals
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        if "loss" in rec:
            train.append(rec)
        elif any(k.startswith(("val_", "eval_")) for k in rec):
            evals.append(rec)
    return train, evals


def list_runs(root: Path = DEFAULT_RUNS_ROOT) -> list[RunFolder]:
    """Run folders with a latest checkpoint, newest checkpoint first."""
    root = Path(root)
    if not root.is_dir():
        return []
    runs = [RunFolder(p) for p in root.iterdir() if (p / "checkpoints" / "latest.pt").is_file()]
    return sorted(runs, key=lambda r: r.latest.stat().st_mtime, reverse=True)


def interrupted_run(root: Path = DEFAULT_RUNS_ROOT) -> RunFolder | None:
    """The most recent run, if it has no clean finish recorded."""
    runs = list_runs(root)
    if runs and runs[0].read_status().get("state") != "finished":
        return runs[0]
    return None


def resolve_resume(spec: str, root: Path = DEFAULT_RUNS_ROOT) -> tuple[Path, RunFolder]:
    """--resume RUN_DIR | CHECKPOINT | latest -> (checkpoint file, its run folder)."""
    if spec == "latest":
        runs = list_runs(root)
        if not runs:
            raise CheckpointError(f"resume: no run with a checkpoint found under {root}/")
        return newest_intact(runs[0]), runs[0]
    path = Path(spec)
    if path.is_dir():
        run = RunFolder(path)
        if not run.latest.is_file() and not any(run.ckpt_dir.glob("*.pt")):
            raise CheckpointError(f"resume: {path} has no checkpoints/latest.pt")
        return newest_intact(run), run
    if path.is_file():
        parent = path.parent
        run_dir = parent.parent if parent.name == "checkpoints" else parent
        return path, RunFolder(run_dir)
    raise CheckpointError(f"resume: {spec} is not a run folder, a checkpoint file or 'latest'")


def newest_intact(run: RunFolder) -> Path:
    """latest.pt, else the newest step file, else best.pt: the first that loads whole.
    Sets run.resume_note when it had to pass over a damaged file."""
    from core.runs.checkpoint import load

    candidates = [run.latest, *sorted(run.ckpt_dir.glob("step-*.pt"), reverse=True), run.best]
    tried = []
    for path in candidates:
        if not path.is_file():
            continue
        try:
            step = load(path)["step"]
        except CheckpointError as e:
            tried.append(f"{path.name} ({str(e).split(' is ', 1)[-1]})")
            continue
        if tried:
            run.resume_note = (
                f"resume: {'; '.join(tried)}; continuing from {path.name} (step {step}), "
                "the newest intact checkpoint"
            )
        return path
    raise CheckpointError(
        f"resume: no intact checkpoint in {run.ckpt_dir}; tried {'; '.join(tried) or 'nothing'}"
    )


def checkpoint_summary(path: Path) -> dict:
    """What a checkpoint holds (step, losses, config, date) without reading every tensor."""
    from core.runs.checkpoint import load

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        state = load(path)  # raises the clear CheckpointError
    if not isinstance(state, dict) or "meta" not in state:
        raise CheckpointError(f"checkpoint: {path} is not a TrainDeck checkpoint")
    meta = dict(state["meta"])
    meta["config"] = state["config"]
    meta["step"] = state["step"]
    return meta


def new_run_dir(root: Path, preset: str | None) -> Path:
    """runs/<preset>-<date>-<time>, with -2, -3... when two runs start in the same second."""
    name = f"{preset or 'custom'}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = Path(root) / name, 2
    while path.exists():
        path, n = Path(root) / f"{name}-{n}", n + 1
    return path


def _foreign(folder: Path) -> list[str]:
    """The names in folder that no run of ours writes (none: an empty folder or our own)."""
    names = [p.name for p in folder.iterdir()]
    if not names:
        return []
    if not any(n in names for n in RUN_MARKS):
        return sorted(names)
    return sorted(n for n in names if n not in RUN_NAMES and not n.startswith(".tmp"))


def check_out(path: Path, resuming: bool = False) -> None:
    """Refuse, before any work, a run folder we must not write into: a link, a file, a folder
    that holds what is not ours (an export, a model, the user's files), a run when not
    resuming, or a place we cannot write. A new folder, an empty one or our own run is fine."""
    path = Path(path)
    if path.is_symlink() and not resuming:  # a new run never writes through a link
        raise ConfigError(f"--out: {path} is a symbolic link; give the folder itself or a new one")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out: {path} exists and is not a folder; choose a new folder")
    if path.is_dir() and RunFolder(path).holds_run():
        if not resuming:
            raise ConfigError(
                f"--out: {path} already holds a run; choose another folder or resume it "
                f"with --resume {path}"
            )
    elif path.is_dir():  # not a run: empty, or what a run that failed early left
        try:
            foreign = _foreign(path)
        except OSError as e:
            raise ConfigError(f"--out: cannot read {path} ({e.strerror or e})") from None
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise ConfigError(
                f"--out: {path} holds files that are not a TrainDeck run ({shown}); give a new "
                "or empty folder"
            )
    check_writable(path, "--out")


def check_writable(path: Path, flag: str) -> None:
    problem = writable_problem(path)
    if problem:
        raise ConfigError(f"{flag}: {problem}")


def check_resume_out(run: RunFolder, out: str | Path | None) -> None:
    """A resumed run stays in its own folder: an --out elsewhere is refused, not obeyed."""
    if out and Path(out).resolve() != run.path.resolve():
        raise ConfigError(f"--out: a resumed run stays in its own folder {run.path}")


def resume_config(
    spec: str,
    root: Path,
    preset: str | None = None,
    changes: dict | None = None,
    processes: int = 1,
    launched: bool = False,
) -> tuple[TrainConfig, Path, RunFolder]:
    """(config, checkpoint, run folder) to continue a run: the checkpoint's own config, then a
    preset if one is named, then the user's changes; on another number of processes than
    saved it (launched: under torchrun), the same sequences a step. The trainer judges the
    differences."""
    from core.config.presets import load_preset, to_config

    ckpt_file, run = resolve_resume(spec, root)
    summary = checkpoint_summary(ckpt_file)
    base = validate(from_dict(summary["config"], source=str(ckpt_file)))
    if preset:
        base = to_config(load_preset(preset), base)
    cfg = validate(dataclasses.replace(base, **(changes or {})))
    saved = int(summary.get("processes") or processes)
    cfg = for_processes(cfg, saved, processes, launched, changes or {})
    return cfg, ckpt_file, run


class SilentFolder(RunFolder):
    """What ranks other than 0 use: the run folder belongs to the main process alone."""

    def create(self, resuming: bool) -> None:
        pass

    def write_config(self, cfg) -> None:
        pass

    def truncate_metrics(self, last_step: int) -> int:
        return 0

    def append_metric(self, record: dict) -> None:
        pass

    def write_data_info(self, summary: dict, tokenizer) -> None:
        pass

    def append_sample(self, step: int, text: str) -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def write_status(self, state: str, step: int, max_steps: int, **extra) -> None:
        pass
