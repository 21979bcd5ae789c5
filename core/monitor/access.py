"""Who may see the page: the monitor's token (256 random bits, made at each start), the cookie
that carries it after the first visit, the CSRF token of the control actions, and the growing
delay after wrong tokens from one address. Comparisons take constant time."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from http.cookies import CookieError, SimpleCookie

TOKEN_BYTES = 32  # 256 bits; the issue asks for at least 128
FREE_FAILURES = 3  # wrong tokens from one address before each answer is delayed
DELAY_STEP_S = 0.25  # the delay grows by this with each further failure ...
MAX_DELAY_S = 2.0  # ... up to this
FORGET_AFTER_S = 600.0  # an address with no failure for this long starts over


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def same(given: str | None, expected: str) -> bool:
    """Constant-time equality; a missing or non-ASCII value is simply wrong."""
    if not given:
        return False
    try:
        return hmac.compare_digest(given.encode("ascii"), expected.encode("ascii"))
    except UnicodeEncodeError:
        return False


def cookie_name(port: int) -> str:
    # Browsers keep cookies per host, not per port: two monitors on one machine need two names.
    return f"traindeck_monitor_{port}"


def cookie_header(port: int, token: str) -> str:
    """HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it), for
    this browser session only."""
    return f"{cookie_name(port)}={token}; Path=/; HttpOnly; SameSite=Strict"


def cookie_token(header: str | None, port: int) -> str | None:
    if not header:
        return None
    jar = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return None
    morsel = jar.get(cookie_name(port))
    return morsel.value if morsel is not None else None


class Failures:
    """Wrong tokens per client address: after FREE_FAILURES, each answer waits a little longer
    (a guess costs time; 256 bits could not be guessed anyway, so the delay stays small and a
    person who mistyped is not locked out). `clock` is injectable for tests."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, float]] = {}  # address -> (failures, last failure)

    def failed(self, address: str) -> float:
        """Count a failure; returns how long to wait before answering it."""
        now = self.clock()
        with self._lock:
            count, last = self._seen.get(address, (0, now))
            if now - last > FORGET_AFTER_S:
                count = 0
            count += 1
            self._seen[address] = (count, now)
            if len(self._seen) > 10_000:  # many addresses: keep the memory bounded
                self._seen = {address: (count, now)}
        extra = count - FREE_FAILURES
        return 0.0 if extra <= 0 else min(MAX_DELAY_S, extra * DELAY_STEP_S)

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._seen.pop(address, None)
