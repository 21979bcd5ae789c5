"""Hugging Face dataset ids as data: `--data owner/name` that is not a local path is fetched
with huggingface_hub into its normal cache (only the .parquet, .jsonl, .json and .csv files),
and the files of one split are returned for reading like local files."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from core.errors import DataError

PATTERNS = ["*.parquet", "*.jsonl", "*.json", "*.csv"]
PREFERRED = (".jsonl", ".parquet", ".json", ".csv")  # one kind of file is read per split
SPLIT_WORDS = ("train", "test", "validation", "valid", "val", "dev", "eval")
_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def is_hub_id(data: str | None) -> bool:
    """owner/name that names no local file or folder."""
    if not data or not _ID.fullmatch(data):
        return False
    return not Path(data).expanduser().exists()


def _names_split(path: str, split: str) -> bool:
    """The path names the split: a folder called it (`default/train/0000.parquet`) or a file
    name starting with it (`data/train-00000-of-00001.parquet`, `train.jsonl`)."""
    p = PurePosixPath(path)
    if split in p.parts[:-1]:
        return True
    stem = p.name.split(".")[0]
    return stem == split or bool(re.match(rf"{re.escape(split)}[-_.]", p.name))


def _splits_named(paths: list[str]) -> list[str]:
    return [w for w in SPLIT_WORDS if any(_names_split(p, w) for p in paths)]


def split_files(folder: Path, split: str, repo_id: str = "") -> list[Path]:
    """The files of a downloaded snapshot that belong to split, of one kind (the first of
    PREFERRED there is); a dataset whose paths name no split at all is all 'train'."""
    folder = Path(folder)
    found = sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.suffix.lower() in PREFERRED and ".cache" not in p.parts
    )
    name = repo_id or str(folder)
    if not found:
        raise DataError(f"data: dataset {name} holds no .parquet, .jsonl, .json or .csv files")
    chosen = [p for p in found if _names_split(p, split)]
    if not chosen and split == "train" and not _splits_named(found):
        chosen = found  # one unnamed split: it is the training data
    if not chosen:
        named = ", ".join(_splits_named(found)) or "none"
        raise DataError(
            f"data_split: dataset {name} has no files for split {split!r} (splits found: "
            f"{named}); choose one with --data-split"
        )
    for kind in PREFERRED:
        of_kind = [p for p in chosen if p.lower().endswith(kind)]
        if of_kind:
            return [folder / p for p in of_kind]
    return [folder / p for p in chosen]  # not reached: every file has a PREFERRED ending


def _progress_class(callback, phase: str):
    """A tqdm class for snapshot_download that reports to the prepare progress callback
    (phase, done, total) and draws nothing itself."""
    from tqdm.auto import tqdm

    class Reporting(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self.done = 0

        def update(self, n=1):
            self.done += n or 0
            callback(phase, self.done, self.total or self.done)

    return Reporting


def download(repo_id: str, progress=None) -> Path:
    """The dataset's snapshot folder in the Hugging Face cache (fetched unless cached); one
    line saying what to do when it cannot be had."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    kwargs = {}
    if progress is not None:
        kwargs["tqdm_class"] = _progress_class(progress, f"downloading {repo_id} (files)")
    try:
        path = snapshot_download(repo_id, repo_type="dataset", allow_patterns=PATTERNS, **kwargs)
    except GatedRepoError:
        raise DataError(
            f"data: dataset {repo_id} is gated; accept its terms on huggingface.co and log "
            "in (hf auth login), then try again"
        ) from None
    except RepositoryNotFoundError:
        raise DataError(
            f"data: {repo_id} is neither a local file or folder nor a dataset on the "
            "Hugging Face hub (private ones need hf auth login)"
        ) from None
    except LocalEntryNotFoundError:
        raise DataError(
            f"data: dataset {repo_id} is not in the Hugging Face cache and the hub cannot be "
            "reached; connect to the internet once (or unset HF_HUB_OFFLINE), or give a "
            "local file"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"data: downloading dataset {repo_id} failed ({first})") from None
    return Path(path)


def dataset_files(repo_id: str, split: str, progress=None) -> list[Path]:
    """The local files of one split of a hub dataset, downloading them if needed."""
    return split_files(download(repo_id, progress), split, repo_id)
