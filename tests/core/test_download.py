"""Hub downloads without a network: huggingface_hub's functions replaced by fakes that raise
its real exception classes or write files, a fake file-size listing for the disk check."""

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import httpx2
import huggingface_hub
import pytest
from huggingface_hub.errors import (
    GatedRepoError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)

from core.errors import EXIT_BAD_INPUT, UserError
from core.weights import download

REPO = "someone/big-model"
GB = 1024**3


def response(status: int):
    return httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/x"))


class FakeHub:
    """A hub with one repo of files (name -> bytes), a cache folder, call records."""

    def __init__(self, monkeypatch, tmp_path, files, error=None):
        self.files, self.error = files, error
        self.snapshot = tmp_path / "hub" / "snapshots" / "abc123"
        self.fetched = []
        monkeypatch.setattr(download, "cache_dir", lambda: tmp_path / "hub")
        monkeypatch.setattr(huggingface_hub, "snapshot_download", self.snapshot_download)
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self.hf_hub_download)
        monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", self.cached)
        monkeypatch.setattr(huggingface_hub, "HfApi", lambda: self)

    def model_info(self, repo_id, files_metadata=False):
        assert files_metadata
        if self.error is not None:
            raise self.error
        siblings = [SimpleNamespace(rfilename=n, size=len(b)) for n, b in self.files.items()]
        siblings.append(SimpleNamespace(rfilename="README.md", size=10**12))  # not wanted
        return SimpleNamespace(sha="abc123", siblings=siblings)

    def cached(self, repo_id, name, revision=None):
        path = self.snapshot / name
        return str(path) if path.is_file() else None

    def snapshot_download(self, repo_id, local_files_only=False, **kw):
        if not all((self.snapshot / n).is_file() for n in self.files):
            raise LocalEntryNotFoundError("not cached")
        return str(self.snapshot)

    def hf_hub_download(self, repo_id, name, revision=None, tqdm_class=None, **kw):
        assert revision == "abc123"  # every file from one pinned revision
        data = self.files[name]
        bar = tqdm_class(total=len(data))
        for i in range(0, len(data), 4):  # chunks, as http_get reports them
            bar.update(len(data[i : i + 4]))
        self.snapshot.mkdir(parents=True, exist_ok=True)
        (self.snapshot / name).write_bytes(data)
        self.fetched.append(name)
        return str(self.snapshot / name)


FILES = {"config.json": b"{}" * 8, "model.safetensors": b"x" * 64, "tokenizer.json": b"t" * 8}


def test_progress_reaches_the_total_and_a_cached_model_needs_no_network(monkeypatch, tmp_path):
    hub = FakeHub(monkeypatch, tmp_path, FILES)
    seen = []
    folder = download.download(REPO, progress=lambda done, total: seen.append((done, total)))
    assert folder == hub.snapshot and sorted(hub.fetched) == sorted(FILES)
    assert seen[-1] == (88, 88) and len(seen) > 3  # chunk by chunk, README.md left out
    hub.error = RuntimeError("no network wanted")
    assert download.download(REPO, progress=lambda *a: None) == hub.snapshot


def test_cancel_keeps_finished_files_and_the_next_start_goes_on(monkeypatch, tmp_path):
    hub = FakeHub(monkeypatch, tmp_path, FILES)
    with pytest.raises(download.DownloadCancelled, match="cancelled at .* stay in"):
        download.download(REPO, progress=lambda *a: None, cancel=lambda: len(hub.fetched) == 1)
    assert len(hub.fetched) == 1  # stopped between the chunks of the second file
    first = hub.fetched[0]
    hub.fetched.clear()
    download.download(REPO, progress=lambda *a: None)
    assert first not in hub.fetched and len(hub.fetched) == 2  # only what was missing


def test_a_model_larger_than_the_free_disk_is_refused_before_any_byte(monkeypatch, tmp_path):
    hub = FakeHub(monkeypatch, tmp_path, FILES)
    monkeypatch.setattr(
        download, "list_files", lambda r: ("abc123", [("model.safetensors", 16 * GB, None)])
    )
    monkeypatch.setattr(download.shutil, "disk_usage", lambda p: SimpleNamespace(free=5 * GB))
    with pytest.raises(download.DownloadError) as e:
        download.download(REPO, progress=lambda *a: None)
    line = str(e.value)
    assert "16.0 GB" in line and "5.0 GB" in line and "HF_HOME" in line
    assert str(tmp_path / "hub") in line and "\n" not in line
    assert hub.fetched == []


@pytest.mark.parametrize(
    "error, needles",
    [
        (
            GatedRepoError("gated", response=response(403)),
            ["gated", "HF_TOKEN", "huggingface-cli login", f"https://huggingface.co/{REPO}"],
        ),
        (
            huggingface_hub.errors.HfHubHTTPError("401", response=response(401)),
            ["HF_TOKEN", f"https://huggingface.co/{REPO}"],
        ),
        (
            RepositoryNotFoundError("404", response=response(404)),
            ["nor a model on the Hugging Face hub", "spelling"],
        ),
        (httpx2.ConnectError("Name or service not known"), ["offline", "HF_HUB_OFFLINE"]),
    ],
)
def test_hub_failures_are_one_line(monkeypatch, tmp_path, error, needles):
    FakeHub(monkeypatch, tmp_path, FILES, error=error)
    with pytest.raises(UserError) as e:
        download.download(REPO, progress=lambda *a: None)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"init_from: {REPO}")
    for needle in needles:
        assert needle in str(e.value)


def test_the_cli_says_a_gated_model_in_one_line_and_exits_2(monkeypatch, tmp_path, capsys):
    from core.train import main

    monkeypatch.chdir(tmp_path)
    FakeHub(monkeypatch, tmp_path, FILES, error=GatedRepoError("x", response=response(401)))
    assert main(["--init-from", REPO, "--max-steps", "1"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "huggingface-cli login" in err


def test_an_estimate_of_a_hub_model_downloads_its_config_json_only(monkeypatch, tmp_path, capsys):
    from hf_models import QWEN_1_5B

    from core.train import main

    hub = FakeHub(monkeypatch, tmp_path, {"config.json": json.dumps(QWEN_1_5B).encode()})
    asked = []

    def only_config(repo_id, name, **kw):
        asked.append(name)
        if kw.get("local_files_only"):
            raise LocalEntryNotFoundError("not cached")
        return hub.hf_hub_download(repo_id, name, revision="abc123", tqdm_class=_Quiet)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", only_config)
    monkeypatch.chdir(tmp_path)
    assert main(["--init-from", "Qwen/Qwen2.5-1.5B", "--estimate", "--seq-len", "256"]) == 0
    out = capsys.readouterr().out
    assert "qwen2, 1,543.7M" in out  # its parameters, from config.json alone
    assert "parameters                 1,543,714,304" in out
    assert set(asked) == {"config.json"}
    assert Path(hub.snapshot / "config.json").is_file()


class _Quiet:
    def __init__(self, *a, **k):
        pass

    def update(self, n=1):
        pass


class RangeServer:
    """A local HTTP server for one file's bytes that honours `Range: bytes=N-` (206) as the
    hub's CDN does, and records the ranges asked for."""

    def __init__(self, data: bytes):
        import http.server
        import threading

        self.data, self.ranges = data, []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                start = 0
                if rng := self.headers.get("Range"):
                    start = int(rng.split("=")[1].split("-")[0])
                owner.ranges.append(start)
                body = owner.data[start:]
                self.send_response(206 if start else 200)
                if start:
                    n = len(owner.data)
                    self.send_header("Content-Range", f"bytes {start}-{n - 1}/{n}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)  # a cancelled download hangs up part way

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/model.safetensors"


@pytest.fixture
def lfs_hub(monkeypatch, tmp_path):
    """A hub with one Git LFS weight file served over real HTTP, and a real cache folder."""
    import hashlib
    import os

    from huggingface_hub import constants

    data = os.urandom(600_000)
    server = RangeServer(data)
    revision, sha = "a" * 40, hashlib.sha256(data).hexdigest()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    monkeypatch.setattr(download, "cache_dir", lambda: tmp_path / "hub")
    listing = (revision, [("model.safetensors", len(data), sha)])
    monkeypatch.setattr(download, "list_files", lambda repo_id: listing)
    monkeypatch.setattr(download, "file_url", lambda *a: server.url)
    yield SimpleNamespace(data=data, sha=sha, server=server, part=download.partial_dir() / sha)
    server.server.shutdown()


def test_a_cancelled_weight_file_resumes_from_the_byte_it_reached(lfs_hub):
    seen = []

    def cancel():
        return bool(seen) and seen[-1][0] >= 200_000

    with pytest.raises(download.DownloadCancelled, match="cut short in"):
        download.download(REPO, progress=lambda d, t: seen.append((d, t)), cancel=cancel)
    kept = lfs_hub.part.stat().st_size
    assert 200_000 <= kept < len(lfs_hub.data)  # the partial file stays
    assert lfs_hub.data.startswith(lfs_hub.part.read_bytes())
    seen.clear()
    folder = download.download(REPO, progress=lambda d, t: seen.append((d, t)))
    assert lfs_hub.server.ranges == [0, kept]  # the second start asked for the rest only
    assert (folder / "model.safetensors").read_bytes() == lfs_hub.data
    assert not lfs_hub.part.exists()
    assert seen[-1] == (len(lfs_hub.data), len(lfs_hub.data))  # the kept bytes counted
    assert download.cached(REPO) == folder  # the next start needs no network


def test_a_damaged_partial_file_is_one_line_and_thrown_away(lfs_hub):
    lfs_hub.part.parent.mkdir(parents=True, exist_ok=True)
    lfs_hub.part.write_bytes(b"not the file's first bytes")
    with pytest.raises(download.DownloadError, match="arrived damaged") as e:
        download.download(REPO, progress=lambda *a: None)
    assert "\n" not in str(e.value) and not lfs_hub.part.exists()
    folder = download.download(REPO, progress=lambda *a: None)  # the next start: whole again
    assert (folder / "model.safetensors").read_bytes() == lfs_hub.data
