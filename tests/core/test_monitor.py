"""The web monitor (core.monitor) over HTTP, without a browser: the token and its cookie, the
paths it refuses, its headers and limits, control actions and their checks, slow clients, and
the faults of the folders it watches. The page in a real browser:
tests/integration/test_monitor_browser.py."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.cli import monitor as monitor_cli
from core.errors import ConfigError
from core.monitor import access, reading, server
from core.runs import lock as run_lock
from core.runs.events import REQUEST_FILES, TrainControl
from core.training.time_budget import RequestWatch

ROOT = Path(__file__).resolve().parents[2]


# -- a watched folder and its monitor ------------------------------------------------------


def record(step: int, **extra) -> dict:
    return {
        "step": step,
        "loss": 5.0 - step * 0.01,
        "lr": 1e-3,
        "tokens_per_s": 1000.0,
        "max_steps": 100,
        "elapsed_s": step * 0.5,
        "rss_mb": 400.0,
        **extra,
    }


def write_run(folder: Path, steps: int = 10, state: str = "finished") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w", encoding="utf-8") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps(record(step)) + "\n")
        f.write(json.dumps({"step": steps, "val_loss": 4.5, "val_bpb": 1.9}) + "\n")
    status = {"state": state, "step": steps, "max_steps": 100, "updated": time.time()}
    (folder / "status.json").write_text(json.dumps(status))
    (folder / "samples.txt").write_text(f"--- step {steps} ---\nonce upon a time\n\n")
    (folder / "train.log").write_text("2026-01-01 00:00:00 started\n")
    (folder / "config.yaml").write_text("method: sft\n")
    return folder


def append(folder: Path, *records: dict) -> None:
    with open(folder / "metrics.jsonl", "a", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    write_run(root / "alpha")
    return root


@pytest.fixture
def serve(monkeypatch):
    """serve(path, **options) -> a started Monitor on a free port, closed after the test."""
    started = []

    def start(path: Path, **options) -> server.Monitor:
        options.setdefault("port", 0)
        m = server.Monitor(server.watch_target(path), explicit_port=True, **options).start()
        started.append(m)
        return m

    yield start
    for m in started:
        m.close()


def request(m, method, target, headers=None, body=None, timeout=10.0):
    """(status, headers, body) of one raw request; the target is sent exactly as given."""
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=timeout)
    try:
        conn.putrequest(method, target, skip_host=False, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def auth(m) -> dict:
    return {"Cookie": f"{access.cookie_name(m.port)}={m.token}"}


def raw(m, data: bytes, read_timeout=10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", m.port), timeout=read_timeout) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


class Stream:
    """An open /api/stream, read event by event."""

    def __init__(self, m, run: str | None, headers=None):
        target = "/api/stream" + (f"?run={run}" if run else "")
        self.conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=15)
        self.conn.request("GET", target, headers=headers or auth(m))
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200

    def next(self) -> tuple[str, object]:
        name, data = None, None
        while True:
            line = self.resp.fp.readline().decode()
            if not line:
                raise EOFError("the stream ended")
            if line.startswith("event: "):
                name = line[7:].strip()
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif line == "\n" and name:
                return name, data

    def until(self, wanted: str, check=lambda data: True, most: int = 200):
        for _ in range(most):
            name, data = self.next()
            if name == wanted and check(data):
                return data
        raise AssertionError(f"no {wanted} event")

    def close(self):
        self.conn.close()


def tree(path: Path) -> dict:
    """Every file and folder under path with its size and modification time."""
    out = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(path))] = (st.st_size, st.st_mtime_ns, p.is_dir())
    return out


# -- the token -------------------------------------------------------------------------------


def test_a_missing_wrong_or_partial_token_gets_403_and_nothing_else(runs, serve):
    m = serve(runs)
    assert len(m.token) >= 43  # 256 bits in URL-safe base64 (the issue asks >= 128)
    wrong = {
        "missing": "/",
        "wrong": "/?token=" + "A" * len(m.token),
        "partial": "/?token=" + m.token[:-1],
        "longer": "/?token=" + m.token + "A",
        "empty": "/?token=",
    }
    for why, target in wrong.items():
        status, headers, body = request(m, "GET", target)
        assert status == 403, why
        assert "Set-Cookie" not in headers, why
        assert b"alpha" not in body and m.token.encode() not in body, why
    status, headers, body = request(m, "GET", "/?token=" + m.token)
    assert status == 200 and b"<title>TrainDeck monitor</title>" in body
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"{access.cookie_name(m.port)}={m.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert request(m, "GET", "/api/runs", auth(m))[0] == 200  # the cookie alone
    bearer = {"Authorization": f"Bearer {m.token}"}
    assert request(m, "GET", "/api/runs", bearer)[0] == 200


def test_a_token_in_the_query_is_judged_alone_against_the_cookie(runs, serve):
    m = serve(runs)
    good_cookie, name = auth(m), access.cookie_name(m.port)
    # a wrong token in the URL is refused even with a good cookie
    assert request(m, "GET", "/?token=nope", good_cookie)[0] == 403
    # a good token in the URL replaces a stale cookie (a monitor started again)
    status, headers, _ = request(m, "GET", "/?token=" + m.token, {"Cookie": f"{name}=stale"})
    assert status == 200 and m.token in headers["Set-Cookie"]
    # the cookie of another port's monitor is not this one's
    other = {"Cookie": f"{access.cookie_name(m.port + 1)}={m.token}"}
    assert request(m, "GET", "/api/runs", other)[0] == 403


def test_every_route_needs_the_token(runs, serve):
    m = serve(runs, control=True)
    for target in ["/", "/api/runs", "/api/session", "/api/stream", "/static/monitor.js", "/x"]:
        assert request(m, "GET", target)[0] == 403, target
    assert request(m, "POST", "/api/runs/alpha/stop", {"X-TrainDeck-CSRF": m.csrf})[0] == 403


def test_wrong_tokens_from_one_address_wait_longer_each_time():
    now = [0.0]
    failures = access.Failures(clock=lambda: now[0])
    delays = [failures.failed("10.0.0.2") for _ in range(8)]
    assert delays[: access.FREE_FAILURES] == [0.0] * access.FREE_FAILURES
    assert delays[access.FREE_FAILURES :] == sorted(delays[access.FREE_FAILURES :])
    assert 0 < delays[access.FREE_FAILURES] < delays[-1] <= access.MAX_DELAY_S
    assert failures.failed("10.0.0.3") == 0.0  # another address is not slowed
    now[0] += access.FORGET_AFTER_S + 1
    assert failures.failed("10.0.0.2") == 0.0  # forgotten after a quiet while
    failures.failed("10.0.0.2")
    failures.succeeded("10.0.0.2")
    assert failures.failed("10.0.0.2") == 0.0


# -- what is served, and how -------------------------------------------------------------------


def test_headers_forbid_framing_inline_code_and_caching_of_data(runs, serve):
    m = serve(runs)
    for target, headers in [("/", auth(m)), ("/api/runs", auth(m)), ("/api/runs", {})]:
        status, h, _ = request(m, "GET", target, headers)
        csp = h["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert h["X-Frame-Options"] == "DENY"
        assert h["Cache-Control"] == "no-store"
        assert "Python" not in h["Server"]
    status, h, body = request(m, "GET", "/static/uPlot.iife.min.js", auth(m))
    assert status == 200 and h["Content-Type"].startswith("text/javascript")
    assert b"uPlot" in body  # served from the package: no CDN


@pytest.mark.parametrize(
    "target",
    [
        "/../core/monitor/server.py",
        "/static/../server.py",
        "/static/%2e%2e/server.py",
        "/static/..%2fserver.py",
        "/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/static/%2Fetc%2Fpasswd",
        "/static/..\\server.py",
        "//etc/passwd",
        "/static//etc/passwd",
        "http://127.0.0.1/etc/passwd",
        "/static/%ff%fe",
        "/static/monitor.js%00.txt",
    ],
)
def test_paths_that_leave_the_served_set_are_refused(runs, serve, target):
    m = serve(runs)
    status, _, body = request(m, "GET", target, auth(m))
    assert status in (400, 404)
    assert b"import" not in body and b"root:" not in body


def test_a_stream_for_a_name_outside_the_list_reads_nothing(runs, serve, tmp_path):
    outside = write_run(tmp_path / "secret")
    (outside / "samples.txt").write_text("--- step 1 ---\nTOP SECRET\n")
    m = serve(runs)
    for name in ["../secret", str(outside), "%2E%2E%2Fsecret"]:
        stream = Stream(m, name)
        assert stream.until("gone") == {"run": name.replace("%2E%2E%2F", "../")}
        stream.close()


def test_oversized_requests_are_refused(runs, serve):
    m = serve(runs, control=True)
    long_target = "/api/runs?" + "a" * (server.MAX_TARGET + 10)
    assert request(m, "GET", long_target, auth(m))[0] == 414
    assert status_of(raw(m, b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")) == 414
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(150))
    assert status_of(raw(m, b"GET / HTTP/1.1\r\n" + many + b"\r\n")) == 431
    huge = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    assert status_of(raw(m, huge)) == 431
    # a large body is refused from its length, before it is read
    cookie = auth(m)["Cookie"].encode()
    head = (
        b"POST /api/runs/alpha/stop HTTP/1.1\r\nHost: x\r\nCookie: " + cookie + b"\r\n"
        b"X-TrainDeck-CSRF: " + m.csrf.encode() + b"\r\nContent-Length: 100000000\r\n\r\n"
    )
    assert status_of(raw(m, head)) == 413
    assert not (runs / "alpha" / "STOP").exists()


def test_the_default_binding_is_this_computer_only(runs):
    m = server.Monitor(server.watch_target(runs), port=0, explicit_port=True)
    try:
        assert m.server.server_address[0] == "127.0.0.1" and not m.lan
        assert m.url == f"http://127.0.0.1:{m.port}/?token={m.token}"
        assert "only this computer" in " ".join(m.lines())
    finally:
        m.close()
    args = monitor_cli.build_parser().parse_args([])
    assert args.host == "127.0.0.1" and not args.control


def test_the_network_binding_says_so_and_names_the_lan_address(runs):
    m = server.Monitor(server.watch_target(runs), host="0.0.0.0", port=0, explicit_port=True)
    try:
        assert m.lan and m.server.server_address[0] == "0.0.0.0"
        assert m.url.startswith(f"http://{server.lan_address()}:{m.port}/?token=")
        assert "reachable from your network" in " ".join(m.lines())
    finally:
        m.close()


# -- control actions ---------------------------------------------------------------------------


@pytest.fixture
def training(runs):
    """alpha as a run training now: status running, its lock held by this live process."""
    folder = runs / "alpha"
    write_run(folder, state="running")
    lock = run_lock.RunLock(folder)
    lock.acquire()
    yield folder
    lock.release()


def test_control_actions_need_control_mode_csrf_and_a_training_run(runs, serve, training):
    read_only = serve(runs)
    csrf = {"X-TrainDeck-CSRF": read_only.csrf}
    status, _, body = request(
        read_only, "POST", "/api/runs/alpha/stop", {**auth(read_only), **csrf}
    )
    assert status == 403 and b"read-only" in body
    m = serve(runs, control=True)
    good = {**auth(m), "X-TrainDeck-CSRF": m.csrf}
    assert request(m, "POST", "/api/runs/alpha/stop", auth(m))[0] == 403  # no CSRF token
    wrong = {**auth(m), "X-TrainDeck-CSRF": m.csrf[:-1]}
    assert request(m, "POST", "/api/runs/alpha/stop", wrong)[0] == 403
    evil = {**good, "Origin": "http://evil.example"}
    assert request(m, "POST", "/api/runs/alpha/stop", evil)[0] == 403
    assert request(m, "POST", "/api/runs/alpha/explode", good)[0] == 404
    assert request(m, "POST", "/api/runs/nobody/stop", good)[0] == 404
    assert not any((training / name).exists() for name in REQUEST_FILES.values())
    status, _, body = request(m, "POST", "/api/runs/alpha/save", good)
    assert status == 202 and json.loads(body)["action"] == "save"
    assert (training / "SAVE").read_text() == "save\n"
    origin = {**good, "Origin": f"http://127.0.0.1:{m.port}"}
    assert request(m, "POST", "/api/runs/alpha/stop", origin)[0] == 202
    assert (training / "STOP").exists()


def test_a_run_that_is_not_training_gets_no_request(runs, serve):
    m = serve(runs, control=True)
    good = {**auth(m), "X-TrainDeck-CSRF": m.csrf}
    status, _, body = request(m, "POST", "/api/runs/alpha/stop", good)
    assert status == 409 and b"not training (it is finished)" in body
    crashed = write_run(runs / "crashed", state="running")  # its process is gone
    (crashed / run_lock.LOCK_NAME).write_text(
        json.dumps({"pid": 2**22 + 7, "host": socket.gethostname(), "started": 1.0})
    )
    time.sleep(reading.LIST_EVERY_S)
    assert request(m, "POST", "/api/runs/crashed/stop", good)[0] == 409
    assert reading.summary(crashed)["state"] == "interrupted"
    assert not (crashed / "STOP").exists() and not (runs / "alpha" / "STOP").exists()


def test_request_files_reach_the_trainer_as_its_own_controls(tmp_path):
    watch, control = RequestWatch(tmp_path), TrainControl()
    (tmp_path / "SAVE").write_text("save\n")
    (tmp_path / "STOP").write_text("stop\n")
    assert watch.asked(control) is False  # no FINISH file
    assert control.take_save_request() and control.stop_requested
    assert not (tmp_path / "SAVE").exists() and not (tmp_path / "STOP").exists()
    (tmp_path / "FINISH").write_text("finish\n")
    watch._checked = 0.0  # a second later
    assert watch.asked(control) is True


@pytest.mark.slow  # a real run's start: about 6 s here, 20 under load
def test_stop_from_the_page_stops_a_real_run_with_a_checkpoint(tmp_path, serve):
    """The same path as the window's Stop: the request file becomes the trainer's control."""
    from core.runs import checkpoint as ckpt
    from core.training.trainer import Trainer
    from tests.helpers import tiny_config

    root = tmp_path / "runs"
    cfg = tiny_config(max_steps=100_000, eval_every=10_000, ckpt_every=10_000, log_every=1)
    trainer = Trainer(cfg, root / "live")
    result = {}
    thread = threading.Thread(target=lambda: result.update(trainer.run()))
    thread.start()
    try:
        m = serve(root, control=True)
        good = {**auth(m), "X-TrainDeck-CSRF": m.csrf}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, _, _ = request(m, "POST", "/api/runs/live/stop", good)
            if status == 202:
                break
            time.sleep(0.2)
        assert status == 202
        thread.join(timeout=60)
    finally:
        trainer.control.request_stop()
        thread.join(timeout=60)
    assert result["status"] == "stopped" and 0 < result["step"] < 100_000
    assert ckpt.load(root / "live" / "checkpoints" / "latest.pt")["step"] == result["step"]
    assert not (root / "live" / "STOP").exists()  # taken by the trainer


# -- streams, slow clients, faults ---------------------------------------------------------


def test_a_stream_sends_the_records_then_each_new_one(runs, serve):
    m = serve(runs)
    stream = Stream(m, "alpha")
    assert [r["name"] for r in stream.until("runs")] == ["alpha"]
    reset = stream.until("reset")
    assert [r["step"] for r in reset["train"]] == list(range(1, 11))
    assert reset["evals"] == [{"step": 10, "val_loss": 4.5, "val_bpb": 1.9}]
    assert stream.until("samples")["text"] == "once upon a time"
    append(runs / "alpha", record(11, loss=float("nan")))
    news = stream.until("records")
    assert news["train"][0]["step"] == 11 and news["train"][0]["loss"] is None  # NaN: null
    stream.close()


def test_metrics_ending_in_a_half_written_line_wait_for_its_end(tmp_path):
    folder = write_run(tmp_path / "run", steps=3)
    tail = reading.MetricsTail(folder / "metrics.jsonl")
    reset, first = tail.read()
    assert reset and [r["step"] for r in first] == [1, 2, 3, 3]
    line = json.dumps(record(4))
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(line[:20])
    assert tail.read() == (False, [])  # still being written
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(line[20:] + "\n" + '{"step": 5, "lo\n' + json.dumps(record(6)) + "\n")
    reset, news = tail.read()
    assert not reset and [r["step"] for r in news] == [4, 6]  # the cut line is skipped
    # a resume rewrites the file (records past its checkpoint dropped): read again whole
    tmp = folder / "metrics.tmp"
    tmp.write_text(json.dumps(record(1)) + "\n" + json.dumps(record(2)) + "\n")
    os.replace(tmp, folder / "metrics.jsonl")
    reset, again = tail.read()
    assert reset and [r["step"] for r in again] == [1, 2]


def test_a_run_folder_that_vanishes_and_comes_back(runs, serve):
    m = serve(runs)
    stream = Stream(m, "alpha")
    stream.until("reset")
    shutil.rmtree(runs / "alpha")
    assert stream.until("gone") == {"run": "alpha"}
    assert stream.until("runs", lambda runs_now: runs_now == []) == []
    assert request(m, "GET", "/api/runs", auth(m))[:2][0] == 200
    write_run(runs / "alpha", steps=4)  # a new run under the same name
    assert [r["step"] for r in stream.until("reset")["train"]] == [1, 2, 3, 4]
    stream.close()


def test_new_runs_appear_and_one_run_may_not_exist_yet(tmp_path):
    root, now = tmp_path / "runs", [0.0]
    index = reading.RunIndex(root, single=False, clock=lambda: now[0])
    assert index.runs() == []  # no runs folder yet
    write_run(root / "first")
    (root / "not-a-run").mkdir()
    assert index.runs() == []  # read at most once a second ...
    now[0] += reading.LIST_EVERY_S
    assert [r["name"] for r in index.runs()] == ["first"]  # ... then it is there
    single = reading.RunIndex(root / "later", single=True, clock=lambda: now[0])
    assert single.runs()[0]["state"] == "missing"
    write_run(root / "later", state="running")
    now[0] += reading.LIST_EVERY_S
    assert single.runs()[0]["state"] == "interrupted"  # says running; no live lock


def test_a_slow_client_does_not_hold_up_the_server_or_training(runs, serve, monkeypatch):
    monkeypatch.setattr(server.Handler, "timeout", 1.0)
    big = runs / "big"
    write_run(big, steps=1)
    append(big, *(record(s, **{f"field_{i}": float(i) for i in range(40)}) for s in range(2, 4000)))
    m = serve(runs)
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    slow.connect(("127.0.0.1", m.port))
    slow.sendall(
        f"GET /api/stream?run=big HTTP/1.1\r\nCookie: {auth(m)['Cookie']}\r\n\r\n".encode()
    )  # and never reads
    lazy = socket.create_connection(("127.0.0.1", m.port))
    lazy.sendall(b"GET /api/ru")  # and never finishes its request
    writer_done = threading.Event()

    def train():  # stands for training: it appends records while the client stalls
        for step in range(4000, 4100):
            append(big, record(step))
        writer_done.set()

    threading.Thread(target=train).start()
    for _ in range(5):
        assert request(m, "GET", "/api/runs", auth(m), timeout=20)[0] == 200
    assert writer_done.wait(30)
    lazy.settimeout(30)
    assert lazy.recv(100) == b""  # dropped once its time was up
    deadline = time.monotonic() + 30
    while m.open_streams and time.monotonic() < deadline:
        time.sleep(0.1)
    assert m.open_streams == 0  # the stalled stream was dropped too
    slow.close()
    lazy.close()


def test_watching_writes_nothing_into_the_runs(runs, serve, training):
    before = tree(runs)
    m = serve(runs, control=True)
    for target in ["/", "/api/runs", "/api/session", "/static/monitor.js", "/../x", "/nope"]:
        request(m, "GET", target, auth(m))
    stream = Stream(m, "alpha")
    stream.until("reset")
    stream.close()
    request(m, "POST", "/api/runs/alpha/stop", auth(m))  # no CSRF token: refused
    assert tree(runs) == before


# -- the port, the command ---------------------------------------------------------------------


def test_a_taken_port_is_named_or_the_next_free_one_is_used(runs):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"--port: port {port} on 127.0.0.1 is in use"):
            server.Monitor(server.watch_target(runs), port=port, explicit_port=True)
        m = server.Monitor(server.watch_target(runs), port=port, explicit_port=False)
        try:
            assert m.port != port
            assert (
                m.lines()[0] == f"Monitor: port {port} is in use; serving on port {m.port} instead"
            )
        finally:
            m.close()
        done = subprocess.run(
            [sys.executable, "-m", "core.monitor", str(runs), "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: --port: port {port} on 127.0.0.1 is in use by another program; choose "
        "another (--port 0: any free port)"
    ]


def test_the_command_refuses_a_missing_folder_and_imports_no_torch(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "core.monitor", str(tmp_path / "nowhere")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "RUNS_OR_RUN:" in done.stderr and "does not exist" in done.stderr
    probe = "import sys, core.cli.monitor; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True)
    assert out.stdout.strip() == b"False", out.stderr
    from core.cli.monitor import DEFAULT_RUNS_ROOT
    from core.runs.folder import DEFAULT_RUNS_ROOT as FOLDERS_DEFAULT

    assert DEFAULT_RUNS_ROOT == FOLDERS_DEFAULT


def test_train_monitor_checks_its_port_and_flags_before_any_work(tmp_path, capsys):
    from core.cli.train import main

    out = tmp_path / "run"
    base = ["--preset", "cpu-tiny", "--max-steps", "1", "--out", str(out)]
    assert main([*base, "--monitor", "--estimate"]) == 2
    assert "--monitor: --estimate trains no run" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([*base, "--monitor-port", str(port)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --monitor-port: port {port} on 127.0.0.1 is in use by another program; "
        "choose another (--monitor-port 0: any free port)"
    )
    assert not out.exists()


def test_train_monitor_prints_the_link_and_serves_the_run(tmp_path, capsys):
    from core.cli.train import main

    out = tmp_path / "run"
    args = ["--preset", "cpu-tiny", "--max-steps", "2", "--eval-every", "2", "--out", str(out)]
    assert main([*args, "--monitor", "--monitor-port", "0"]) == 0
    printed = capsys.readouterr().out
    link = re.search(r"^Monitor: http://127\.0\.0\.1:(\d+)/\?token=([\w-]{43})$", printed, re.M)
    assert link, printed
    assert "only this computer can open it" in printed and "read-only" in printed
    assert f"watching the run {out}" in printed
    with socket.socket() as s:  # it ended with the run
        assert s.connect_ex(("127.0.0.1", int(link.group(1)))) != 0
