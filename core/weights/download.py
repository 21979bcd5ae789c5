"""A hub model's files into the normal Hugging Face cache: a disk-space check before the
first byte, progress (a tqdm bar on the command line, a callback for the window), a cancel
callback checked between chunks and files, and one line for a gated, missing or unreachable
model instead of a traceback.

Resuming: files are fetched one at a time at one pinned revision, and each finished file
stays in the cache, so a cancelled or broken download goes on from the first file it lacks.
Within a weight file (a Git LFS file: every `.safetensors`), the bytes come through
huggingface_hub's own `http_get` into a partial file of TrainDeck's, kept when the download
is cancelled or cut off; the next start asks for the rest only (an HTTP Range request), checks
the whole file's SHA-256 against the hub's and then files it in the cache as huggingface_hub
does (a blob named by that hash and a snapshot link to it). huggingface_hub's own downloads
(2.x) cannot do this: their partial files are unique per process and deleted on failure.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import inspect
import logging
import os
import shutil
from pathlib import Path

from core.errors import ConfigError

PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model"]
GB = 1024**3
DISK_SLACK = 256 * 1024**2  # leave this much free beyond the files themselves


class DownloadError(ConfigError):
    """A hub model could not be had: the message is one line saying what to do."""


class DownloadCancelled(DownloadError):
    pass


@contextlib.contextmanager
def quiet():
    """huggingface_hub's own warnings (a failed HEAD request, retries) off: the one line
    that explain() gives is what the user sees."""
    log = logging.getLogger("huggingface_hub")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def wanted(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in PATTERNS)


def explain(repo_id: str, e: BaseException, what: str = "init_from") -> DownloadError:
    """huggingface_hub's exceptions as one line each."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, GatedRepoError) or (isinstance(e, HfHubHTTPError) and status in (401, 403)):
        return DownloadError(
            f"{what}: {repo_id} is a gated model: accept its licence on "
            f"https://huggingface.co/{repo_id}, then set HF_TOKEN or run `huggingface-cli login`",
            field=what,
        )
    if isinstance(e, RepositoryNotFoundError):
        return DownloadError(
            f"{what}: {repo_id} is neither a folder here nor a model on the Hugging Face hub "
            "(check the spelling; a private model needs HF_TOKEN or `huggingface-cli login`)",
            field=what,
        )
    if isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled)) or _is_offline(e):
        return DownloadError(
            f"{what}: {repo_id} is not in the Hugging Face cache ({cache_dir()}) and the hub "
            "cannot be reached (offline); connect once, unset HF_HUB_OFFLINE, or point "
            "--init-from at a model folder",
            field=what,
        )
    first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
    return DownloadError(f"{what}: downloading {repo_id} failed ({first})", field=what)


def _is_offline(e: BaseException) -> bool:
    """A connection that could not be made (no network, DNS, a proxy refusing)."""
    try:
        import httpx2 as httpx
    except ImportError:  # older huggingface_hub: httpx or requests
        import httpx
    return isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, ConnectionError))


def list_files(repo_id: str) -> tuple[str, list[tuple[str, int, str | None]]]:
    """(revision, [(file, bytes, SHA-256 of a Git LFS file or None)]) of the files TrainDeck
    reads from a hub model."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id, files_metadata=True)
    files = [
        (s.rfilename, int(s.size or 0), getattr(getattr(s, "lfs", None), "sha256", None))
        for s in info.siblings or []
        if wanted(s.rfilename)
    ]
    return info.sha, files


def missing_files(repo_id: str, revision: str, files: list):
    """The files not yet in the cache at that revision."""
    from huggingface_hub import try_to_load_from_cache

    return [
        f
        for f in files
        if not isinstance(try_to_load_from_cache(repo_id, f[0], revision=revision), str)
    ]


def partial_dir() -> Path:
    """Where weight files being downloaded wait, by SHA-256, until they are whole."""
    return cache_dir().parent / "traindeck-partial"


def file_url(repo_id: str, name: str, revision: str) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo_id, name, revision=revision)


def fetch_resumable(repo_id: str, revision: str, name: str, size: int, sha256: str, tqdm_class):
    """One Git LFS file into the cache, from the bytes an earlier, stopped download left."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    part = partial_dir() / sha256
    part.parent.mkdir(parents=True, exist_ok=True)
    have = _partial_bytes(sha256)
    if have > size:  # not this file's beginning: start over
        part.unlink()
        have = 0
    if have:  # the bytes already here count towards the progress
        tqdm_class(total=size).update(have)
    with open(part, "ab") as f:
        http_get(
            file_url(repo_id, name, revision),
            f,
            resume_size=have,
            headers=build_hf_headers(),
            expected_size=size,
            tqdm_class=tqdm_class,
        )
    if _sha256(part) != sha256:
        part.unlink()  # a corrupt partial would fail every later start the same way
        raise DownloadError(
            f"init_from: {name} of {repo_id} arrived damaged (its SHA-256 is not the hub's); "
            "start again to download it anew",
            field="init_from",
        )
    _file_in_cache(repo_id, revision, name, part, sha256)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * 1024**2):
            digest.update(block)
    return digest.hexdigest()


def _file_in_cache(repo_id: str, revision: str, name: str, whole: Path, sha256: str) -> None:
    """As huggingface_hub files a download: blobs/<sha256>, and snapshots/<revision>/<name>
    a relative link to it (the file itself where links cannot be made, as on Windows without
    developer mode)."""
    repo = _repo_cache(repo_id)
    blob = repo / "blobs" / sha256
    blob.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(whole), blob)
    link = repo / "snapshots" / revision / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    try:
        link.symlink_to(os.path.relpath(blob, link.parent))
    except OSError:  # as huggingface_hub then does: the file itself, not a second copy
        shutil.move(str(blob), link)


def check_disk(repo_id: str, need: int, folder: Path | None = None) -> None:
    """Refuse before the first byte when the files do not fit the cache's disk."""
    folder = folder or cache_dir()
    probe = folder
    while not probe.exists() and probe.parent != probe:  # the cache may not exist yet
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need + DISK_SLACK > free:
        raise DownloadError(
            f"init_from: {repo_id} needs {need / GB:.1f} GB to download but only "
            f"{free / GB:.1f} GB is free for the Hugging Face cache {folder}; free some "
            "space, or set HF_HOME (or HF_HUB_CACHE) to a folder on a larger disk",
            field="init_from",
        )


def _reporting_tqdm(on_bytes, cancel):
    """A tqdm class for hf_hub_download: each chunk goes to on_bytes, cancel is asked
    between chunks (raising aborts the file; the files before it stay cached)."""
    from tqdm.auto import tqdm

    class Reporting(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if cancel is not None and cancel():
                raise DownloadCancelled("download cancelled")
            on_bytes(n or 0)

    return Reporting


def _note_main(repo_id: str, revision: str) -> None:
    """refs/main -> the revision just downloaded, as huggingface_hub writes it for a download
    by branch name: files fetched at a pinned commit leave none, and without it the next
    start could not find the model offline (cached())."""
    ref = _repo_cache(repo_id) / "refs" / "main"
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(revision)


def _repo_cache(repo_id: str) -> Path:
    """The model's folder in the hub cache (models--owner--name)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model")


def _partial_bytes(sha256: str | None) -> int:
    part = partial_dir() / sha256 if sha256 else None
    return part.stat().st_size if part is not None and part.exists() else 0


def _cli_bar(total: int, repo_id: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {repo_id}")


def cached(repo_id: str) -> Path | None:
    """The model's snapshot folder when the cache has every file it needs; no network."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=PATTERNS, local_files_only=True))
    except Exception:
        return None


def download(repo_id: str, progress=None, cancel=None) -> Path:
    """The model's snapshot folder, downloading what the cache lacks. progress(done, total)
    in bytes (None: a tqdm bar on stderr); cancel() -> True stops it with DownloadCancelled."""
    from huggingface_hub import hf_hub_download, snapshot_download

    if (folder := cached(repo_id)) is not None:  # no network at all
        return folder
    try:
        with quiet():
            revision, files = list_files(repo_id)
    except Exception as e:
        raise explain(repo_id, e) from None
    todo = missing_files(repo_id, revision, files)
    total = sum(size for _, size, _ in todo)
    check_disk(repo_id, total - sum(_partial_bytes(sha) for _, _, sha in todo))
    bar = _cli_bar(total, repo_id) if progress is None else None
    done = 0

    def on_bytes(n: int) -> None:
        nonlocal done
        done += n
        if bar is not None:
            bar.update(n)
        else:
            progress(done, total)

    # huggingface_hub before 1.x has no tqdm_class here: progress and cancel per file then
    chunked = "tqdm_class" in inspect.signature(hf_hub_download).parameters
    extra = {"tqdm_class": _reporting_tqdm(on_bytes, cancel)} if chunked else {}
    try:
        for name, size, sha256 in todo:
            if cancel is not None and cancel():
                raise DownloadCancelled("download cancelled")
            if sha256 and chunked:  # a weight file: resumable within itself
                fetch_resumable(repo_id, revision, name, size, sha256, extra["tqdm_class"])
                continue
            hf_hub_download(repo_id, name, revision=revision, **extra)
            if not chunked:
                on_bytes(size)
        folder = snapshot_download(
            repo_id, revision=revision, allow_patterns=PATTERNS, local_files_only=True
        )
        _note_main(repo_id, revision)
    except DownloadCancelled:
        raise DownloadCancelled(
            f"init_from: downloading {repo_id} was cancelled at {done / GB:.2f} of "
            f"{total / GB:.2f} GB; the finished files stay in {cache_dir()}, a file cut "
            f"short in {partial_dir()}, and the next start goes on from there"
        ) from None
    except Exception as e:
        raise explain(repo_id, e) from None
    finally:
        if bar is not None:
            bar.close()
    return Path(folder)


def config_file(repo_id: str) -> Path:
    """A hub model's config.json alone (for an estimate before any weights come)."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, "config.json", local_files_only=True))
    except Exception:
        pass
    try:
        with quiet():
            return Path(hf_hub_download(repo_id, "config.json"))
    except Exception as e:
        raise explain(repo_id, e) from None
