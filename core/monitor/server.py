"""The monitor's HTTP server: the standard library's ThreadingHTTPServer, a thread a client.

Why the standard library (docs/window.md, "Watch from another device"): the page needs a few
GET routes, three POST actions and one stream of server-sent events, which is a response
written a line at a time; a thread per client suits a handful of clients, and the server adds
no package to a base install that every entry point carries. What a framework would add is
done here in a few lines each, and tested: limits on the request line, headers, body and
connections, socket timeouts for slow clients, the security headers.

Every request needs the token (its query parameter, its cookie, or an Authorization: Bearer
header); only the page, its assets and the watched runs' metrics, samples, log tail and
completions are served (core.monitor.reading opens fixed names only); control actions need
--control, the CSRF token, and a run that is training now.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import math
import os
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from core.errors import ConfigError
from core.monitor import access, reading
from core.runs.events import REQUEST_FILES, leave_request
from core.runs.signals import CURVES, EVAL_KEYS, PLOTS, RIGHT_LABELS

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8484
PORT_TRIES = 20  # the default port taken: the next free one of these, said in the log
POLL_S = 0.5  # a page hears of a new record within this (plus the network)
HEARTBEAT_S = 15.0  # a comment line to idle streams, so a gone client is noticed
SOCKET_TIMEOUT_S = 10.0  # a client that sends or reads nothing for this long is dropped
MAX_CONNECTIONS = 32  # at once; more are closed unanswered
MAX_STREAMS = 16  # live pages at once; more get 503
MAX_TARGET = 2048  # characters of a request's path and query (414 past it)
MAX_BODY = 1024  # bytes of a POST body (413 past it; the actions carry none)
LINGER_S = 2.0  # core.train --monitor: open pages hear of the run's end before it closes

STATIC = "static"
ASSETS = {  # URL path -> (file under static/, content type): all the page ever loads
    "/static/monitor.js": ("monitor.js", "text/javascript; charset=utf-8"),
    "/static/monitor.css": ("monitor.css", "text/css; charset=utf-8"),
    "/static/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/static/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    "/static/icon.svg": ("icon.svg", "image/svg+xml"),
}
PAGE = ("index.html", "text/html; charset=utf-8")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
)


def asset(name: str) -> bytes:
    return resources.files("core.monitor").joinpath(STATIC, name).read_bytes()


def to_json(data) -> bytes:
    """JSON a browser parses: a NaN or infinity anywhere becomes null."""
    try:
        text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    except ValueError:
        text = json.dumps(_finite(data), separators=(",", ":"))
    return text.encode("utf-8")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def plot_specs() -> list[dict]:
    """The plots and curves the page draws: the window's own (core.runs.signals)."""
    return [
        {
            "name": name,
            "title": title,
            "unit": unit,
            "right": RIGHT_LABELS.get(name),
            "curves": [
                {
                    "key": c.key,
                    "label": c.label,
                    "color": c.color,
                    "width": c.width,
                    "right": c.right_axis,
                    "points": c.symbol is not None or c.key in EVAL_KEYS,
                    "evaluation": c.key in EVAL_KEYS,
                }
                for c in CURVES
                if c.plot == name
            ],
        }
        for name, (title, unit) in PLOTS.items()
    ]


def lan_address() -> str:
    """This machine's address on its network (the one its default route uses); no packet is
    sent: a UDP socket's connect only picks the route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never answered, never sent to
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """The host a URL names: the LAN address for a wildcard binding."""
    if host in ("0.0.0.0", "", "::"):
        return lan_address()
    return f"[{host}]" if ":" in host else host


class MonitorServer(ThreadingHTTPServer):
    daemon_threads = True
    # POSIX: rebinding at once after a restart (TIME_WAIT). Not on Windows, where
    # SO_REUSEADDR would let two servers share a port that is in use.
    allow_reuse_address = os.name != "nt"
    request_queue_size = 16

    def __init__(self, address, handler):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.monitor: Monitor | None = None
        self._count_lock = threading.Lock()
        self.active = 0
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        with self._count_lock:
            if self.active >= MAX_CONNECTIONS:
                self.shutdown_request(request)
                return
            self.active += 1
        try:
            super().process_request(request, client_address)
        except Exception:
            with self._count_lock:
                self.active -= 1
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self.active -= 1

    def handle_error(self, request, client_address):
        pass  # a client that went away mid-answer is not news


def bind(host: str, port: int, explicit: bool) -> tuple[MonitorServer, str]:
    """The listening server, and a line when the default port was taken and another used."""
    tries = [port] if explicit or port == 0 else list(range(port, port + PORT_TRIES))
    for p in tries:
        try:
            return MonitorServer((host, p), Handler), (
                f"port {port} is in use; serving on port {p} instead" if p != port else ""
            )
        except socket.gaierror as e:
            raise ConfigError(f"--host: {host!r} is not an address of this machine ({e})") from None
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES, 10048, 10013):
                raise ConfigError(f"--host: cannot listen on {host} ({e.strerror or e})") from None
    if len(tries) == 1:
        raise ConfigError(
            f"--port: port {port} on {host} is in use by another program; choose another "
            "(--port 0: any free port)"
        )
    raise ConfigError(
        f"--port: ports {tries[0]}-{tries[-1]} on {host} are all in use; choose one with --port"
    )


class Monitor:
    """A monitor serving `index`'s runs. Bound (and the port checked) when made; serving
    from start() in a thread of its own; close() ends it and every stream."""

    def __init__(
        self,
        index: reading.RunIndex,
        host: str = LOOPBACK,
        port: int = DEFAULT_PORT,
        control: bool = False,
        explicit_port: bool = False,
        log=None,
    ):
        self.index = index
        self.host, self.control = host, control
        self.lan = not is_loopback(host)
        self.server, self.port_note = bind(host, port, explicit_port)
        self.server.monitor = self
        self.port = self.server.server_address[1]
        self.token, self.csrf = access.new_token(), access.new_token()
        self.failures = access.Failures()
        self.closing = threading.Event()
        self._streams_lock = threading.Lock()
        self.open_streams = 0  # live pages now
        self.log = log or (lambda message: None)
        self.base_url = f"http://{url_host(host)}:{self.port}/"
        self.url = f"{self.base_url}?token={self.token}"
        self.thread: threading.Thread | None = None

    def lines(self) -> list[str]:
        """What the command prints once: the URL with its token, who can reach it, what it
        may do."""
        reach = (
            f"reachable from your network on {self.host}: anyone there with this link can "
            "watch" + (" and stop your runs" if self.control else "")
            if self.lan
            else "only this computer can open it (--host 0.0.0.0 opens it to your network)"
        )
        mode = "Stop, Save now and Finish allowed" if self.control else "read-only"
        watching = self.index.describe()
        lines = [f"Monitor: {self.url}", f"Monitor: {reach}; {mode}; watching {watching}"]
        if self.port_note:
            lines.insert(0, f"Monitor: {self.port_note}")
        return lines

    def start(self) -> Monitor:
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.25},
            name="traindeck-monitor",
            daemon=True,
        )
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever(poll_interval=0.25)

    def linger(self, seconds: float = LINGER_S) -> None:
        """Before closing at a run's end: the pages open now hear of the end first (the run
        list is read once a second, each stream every POLL_S)."""
        if self.open_streams:
            time.sleep(seconds)

    def close(self) -> None:
        self.closing.set()
        if self.thread is not None:
            self.server.shutdown()
            self.thread.join(timeout=5)
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Refused(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class Handler(BaseHTTPRequestHandler):
    server_version = "TrainDeck"
    sys_version = ""

    def version_string(self) -> str:
        return "TrainDeck"  # no Python version for a stranger to read

    protocol_version = "HTTP/1.0"  # one request a connection: no keep-alive to manage
    timeout = SOCKET_TIMEOUT_S
    server: MonitorServer

    @property
    def monitor(self) -> Monitor:
        return self.server.monitor

    def log_message(self, format, *args):
        pass  # requests are not logged: the URL carries the token

    def end_headers(self):
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    # -- the two methods -----------------------------------------------------------------

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._serve(self._get)

    def do_POST(self):  # noqa: N802
        self._serve(self._post)

    def _serve(self, route) -> None:
        try:
            parts = self._check_target()
            self._authenticate(parts)
            route(parts)
        except Refused as e:
            self._plain(e.status, e.message)
        except (ConnectionError, TimeoutError, OSError):
            self.close_connection = True

    # -- checks before any route ---------------------------------------------------------

    def _check_target(self):
        target = self.path
        if len(target) > MAX_TARGET:
            raise Refused(HTTPStatus.REQUEST_URI_TOO_LONG, "request too long")
        if not target.startswith("/") or target.startswith("//"):
            raise Refused(HTTPStatus.BAD_REQUEST, "only paths on this server are served")
        return urlsplit(target)

    def _authenticate(self, parts) -> None:
        """The token from the query (judged alone when given: it replaces an old cookie), or
        the cookie, or a Bearer header. A wrong one waits a little more each time."""
        query = parse_qs(parts.query, max_num_fields=8)
        given = query.get("token", [None])[-1]
        if given is None:
            given = self._bearer() or access.cookie_token(
                self.headers.get("Cookie"), self.monitor.port
            )
        else:
            self._set_cookie = access.same(given, self.monitor.token)
        address = self.client_address[0]
        if access.same(given, self.monitor.token):
            self.monitor.failures.succeeded(address)
            return
        delay = self.monitor.failures.failed(address)
        if delay:
            time.sleep(delay)
        raise Refused(
            HTTPStatus.FORBIDDEN,
            "This page needs its token: open the full link TrainDeck printed (or its QR code).",
        )

    def _bearer(self) -> str | None:
        header = self.headers.get("Authorization", "")
        return header[7:].strip() if header.startswith("Bearer ") else None

    @staticmethod
    def _segments(path: str) -> list[str]:
        """The path's parts, each decoded; `..`, `.`, empty parts, slashes or backslashes
        inside a part, and NUL are refused: no request names a place on the disk."""
        try:
            parts = [unquote(p, errors="strict") for p in path.split("/")[1:]]
        except UnicodeDecodeError:
            raise Refused(HTTPStatus.BAD_REQUEST, "refused path") from None
        for i, part in enumerate(parts):
            bad = part in (".", "..") or any(c in part for c in "/\\\x00")
            if bad or (part == "" and i != len(parts) - 1):
                raise Refused(HTTPStatus.BAD_REQUEST, "refused path")
        return parts

    # -- GET -----------------------------------------------------------------------------

    def _get(self, parts) -> None:
        path = "/" + "/".join(self._segments(parts.path))
        if path == "/":
            self._bytes(asset(PAGE[0]), PAGE[1], cache=False)
        elif path in ASSETS:
            name, kind = ASSETS[path]
            self._bytes(asset(name), kind, cache=True)
        elif path == "/api/session":
            self._json(self._session())
        elif path == "/api/runs":
            self._json(self.monitor.index.runs())
        elif path == "/api/stream":
            run = parse_qs(parts.query, max_num_fields=8).get("run", [None])[-1]
            self._stream(run)
        else:
            raise Refused(HTTPStatus.NOT_FOUND, "not found")

    def _session(self) -> dict:
        m = self.monitor
        return {
            "csrf": m.csrf,
            "control": m.control,
            "lan": m.lan,
            "watching": m.index.describe(),
            "single": m.index.single,
            "poll_s": POLL_S,
            "plots": plot_specs(),
            "actions": list(REQUEST_FILES),
        }

    # -- POST: the control actions -------------------------------------------------------

    def _post(self, parts) -> None:
        m = self.monitor
        length = self._content_length()
        if length > MAX_BODY:
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
        if length:
            self.rfile.read(length)  # nothing in it is used
        segments = self._segments(parts.path)
        if len(segments) != 4 or segments[:2] != ["api", "runs"]:
            raise Refused(HTTPStatus.NOT_FOUND, "not found")
        if not m.control:
            raise Refused(
                HTTPStatus.FORBIDDEN, "read-only: the monitor was started without --control"
            )
        if not access.same(self.headers.get("X-TrainDeck-CSRF"), m.csrf):
            raise Refused(HTTPStatus.FORBIDDEN, "missing or wrong CSRF token")
        origin = self.headers.get("Origin")
        if origin is not None and origin != f"http://{self.headers.get('Host', '')}":
            raise Refused(HTTPStatus.FORBIDDEN, "cross-origin request refused")
        name, action = segments[2], segments[3]
        folder = m.index.folder(name)
        if action not in REQUEST_FILES or folder is None:
            raise Refused(HTTPStatus.NOT_FOUND, "no such run or action")
        state = reading.run_state(reading.read_json(folder / reading.STATUS), folder)
        if state != "running":  # fresh, not the list's: a finished run gets no request
            raise Refused(HTTPStatus.CONFLICT, f"{name} is not training (it is {state})")
        leave_request(folder, action)
        m.log(f"monitor: {action} requested for {name} from {self.client_address[0]}")
        self._json({"ok": True, "run": name, "action": action}, HTTPStatus.ACCEPTED)

    def _content_length(self) -> int:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise Refused(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if length < 0:
            raise Refused(HTTPStatus.BAD_REQUEST, "bad Content-Length")
        return length

    # -- the live stream -----------------------------------------------------------------

    def _stream(self, run: str | None) -> None:
        m = self.monitor
        with m._streams_lock:
            if m.open_streams >= MAX_STREAMS:
                raise Refused(HTTPStatus.SERVICE_UNAVAILABLE, "too many pages open at once")
            m.open_streams += 1
        try:
            self.send_response(HTTPStatus.OK)
            self._cookie_if_new()
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Accel-Buffering", "no")
            self.end_headers()
            self._follow(run)
        finally:
            with m._streams_lock:
                m.open_streams -= 1

    def _follow(self, run: str | None) -> None:
        """Send the run list and the chosen run's news until the client or the server goes."""
        m = self.monitor
        last_runs, watch, gone_sent, quiet_since = None, None, False, time.monotonic()
        while True:
            out = []
            runs = m.index.runs()
            if runs != last_runs:
                out.append(("runs", runs))
                last_runs = runs
            if run:
                folder = m.index.folder(run)
                if folder is None or not folder.is_dir():
                    if not gone_sent:  # vanished, or not there yet: told once, still watched
                        out.append(("gone", {"run": run}))
                        gone_sent, watch = True, None
                else:
                    if watch is None:
                        watch, gone_sent = reading.RunWatch(folder), False
                    out.extend(watch.poll())
            if out:
                self._events(out)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > HEARTBEAT_S:
                self.wfile.write(b": still here\n\n")
                self.wfile.flush()
                quiet_since = time.monotonic()
            if m.closing.wait(POLL_S):
                return

    def _events(self, events) -> None:
        chunk = b"".join(
            b"event: " + name.encode() + b"\ndata: " + to_json(data) + b"\n\n"
            for name, data in events
        )
        self.wfile.write(chunk)
        self.wfile.flush()

    # -- answers -------------------------------------------------------------------------

    _set_cookie = False

    def _cookie_if_new(self) -> None:
        if self._set_cookie:  # the token came in the URL: the cookie carries it from now on
            cookie = access.cookie_header(self.monitor.port, self.monitor.token)
            self.send_header("Set-Cookie", cookie)

    def _bytes(self, body: bytes, kind: str, cache: bool, status=HTTPStatus.OK) -> None:
        self.send_response(status)
        self._cookie_if_new()
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "private, max-age=3600" if cache else "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data, status=HTTPStatus.OK) -> None:
        self._bytes(to_json(data), "application/json", cache=False, status=status)

    def _plain(self, status: HTTPStatus, message: str) -> None:
        self.close_connection = True
        self._bytes(
            f"{status.value} {status.phrase}: {message}\n".encode(),
            "text/plain; charset=utf-8",
            cache=False,
            status=status,
        )


def watch_target(path: Path) -> reading.RunIndex:
    """A runs folder (all its runs) or one run folder (it holds a run's files)."""
    path = Path(path)
    return reading.RunIndex(path, single=reading.is_run(path))
