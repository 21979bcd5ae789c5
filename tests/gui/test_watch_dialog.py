"""Watch from another device: the window's button starts the web monitor on its runs folder
and shows the link and its QR code; the network choice is explicit and said; closing the
window stops serving."""

from __future__ import annotations

import http.client
import json
import re
import socket
from urllib.parse import urlsplit

import segno

from core.monitor.server import lan_address


def get(url: str, headers=None) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=10)
    try:
        conn.request(
            "GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers or {}
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def qr_modules(pixmap, size: int, scale: int, border: int) -> list[list[bool]]:
    """The dark modules the image shows, read back pixel by pixel."""
    image = pixmap.toImage()
    return [
        [
            image.pixelColor(
                (border + c) * scale + scale // 2, (border + r) * scale + scale // 2
            ).lightness()
            < 128
            for c in range(size)
        ]
        for r in range(size)
    ]


def write_run(folder):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 4.2}) + "\n")
    (folder / "status.json").write_text(
        json.dumps({"state": "finished", "step": 1, "max_steps": 1})
    )


def test_the_watch_button_serves_the_runs_with_a_link_and_its_qr_code(make_window, gui_env):
    from gui.watch_dialog import QR_PIXELS

    write_run(gui_env / "runs" / "alpha")
    window = make_window()
    window.watch_button.click()
    dialog = window.watch_dialog
    assert dialog.isVisible() and not dialog.serving
    assert not dialog.lan_box.isChecked() and not dialog.control_box.isChecked()
    dialog.port = 0  # any free port: tests run side by side
    dialog.start_button.click()
    assert dialog.serving and dialog.start_button.text() == "Stop serving"
    url = dialog.url_edit.text()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{43}", url)
    assert "Only this computer" in dialog.reach.text()
    assert not dialog.lan_box.isEnabled()  # fixed while serving

    code = segno.make(url, error="m")
    shown = qr_modules(dialog.qr.pixmap(), len(code.matrix), QR_PIXELS, 4)
    assert shown == [[bool(v) for v in row] for row in code.matrix]  # the QR code of the link

    status, body = get(url)
    assert status == 200 and b"TrainDeck monitor" in body
    assert get(url.split("?")[0])[0] == 403
    token = url.split("token=")[1]
    status, body = get(url.split("?")[0] + "api/runs", {"Authorization": f"Bearer {token}"})
    assert [r["name"] for r in json.loads(body)] == ["alpha"]
    log = window.run_view.log_view.toPlainText()
    assert f"serving {url.split('?')[0]} (this computer only, read-only)" in log
    assert token not in log  # the window's log never holds the key

    dialog.close()
    assert dialog.serving  # the dialog closed, the page still served
    port = dialog.monitor.port
    window.close()
    assert not dialog.serving and refused(port)


def test_on_my_network_is_an_explicit_choice_and_said(make_window, gui_env):
    window = make_window()
    dialog = window.open_watch_dialog()
    dialog.port = 0
    dialog.lan_box.setChecked(True)
    dialog.control_box.setChecked(True)
    assert dialog.start_serving()
    m = dialog.monitor
    assert m.server.server_address[0] == "0.0.0.0" and m.control
    assert dialog.url_edit.text().startswith(f"http://{lan_address()}:{m.port}/?token=")
    assert "Reachable from your network" in dialog.reach.text()
    assert "watch and stop" in dialog.reach.text()
    dialog.stop_serving()
    assert dialog.url_edit.text() == "" and dialog.lan_box.isEnabled()
    assert refused(m.port)


def test_a_taken_port_moves_to_the_next_and_says_so(make_window):
    window = make_window()
    dialog = window.open_watch_dialog()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        dialog.port = port
        assert dialog.start_serving()
        assert dialog.monitor.port != port
        assert f"port {port} is in use; serving on port {dialog.monitor.port}" in (
            dialog.reach.text()
        )
    dialog.stop_serving()
