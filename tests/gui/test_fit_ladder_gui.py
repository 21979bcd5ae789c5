"""The window's side of large pretrained models: a hub id downloaded off the GUI thread with
progress and Cancel, one line for a gated model, the fit ladder's table, a 4-bit base's
saving on the estimate, the VRAM spill notice. No network: core's download is replaced."""

from __future__ import annotations

import threading
import time

import pytest
from hf_models import make_model
from PySide6.QtWidgets import QPushButton

from core.training import spill
from core.weights import download

pytest.importorskip("transformers")

REPO = "someone/tiny-llama"


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hub") / "tiny-llama"
    make_model(folder, "llama")
    return folder


@pytest.fixture
def hub(monkeypatch, llama_folder):
    """A hub whose download reports progress, can block until cancelled, or fail."""
    gate = threading.Event()
    gate.set()  # cleared: the download waits for it
    state = {"progress": [], "block": False, "error": None, "calls": 0, "have": set()}
    state["gate"] = gate

    def cached(repo_id):
        return llama_folder if repo_id in state["have"] else None

    def fake(repo_id, progress=None, cancel=None):
        if cached(repo_id):  # as core's: a cached model needs no network
            return cached(repo_id)
        state["calls"] += 1
        if state["error"]:
            raise state["error"]
        progress = progress or (lambda d, t: None)
        assert gate.wait(20)
        while state["block"]:  # a long download: only Cancel ends it
            if cancel is not None and cancel():
                raise download.DownloadCancelled(f"init_from: downloading {repo_id} cancelled")
            time.sleep(0.01)
        for done in (25, 50, 100):
            progress(done, 100)
            state["progress"].append((done, threading.current_thread().name))
        state["have"].add(repo_id)
        return llama_folder

    monkeypatch.setattr(download, "cached", cached)
    # the estimate reads the hub model's config.json: in the cache once downloaded
    monkeypatch.setattr(download, "config_file", lambda repo_id: llama_folder / "config.json")
    monkeypatch.setattr(download, "download", fake)
    return state


def test_a_hub_id_downloads_off_the_gui_thread_then_fills_the_form(make_window, hub, qtbot):
    window = make_window()
    box = window.start_from
    hub["gate"].clear()  # the weights wait
    box.set_source(REPO)
    assert box.download is not None and "Downloading" in box.info.text()
    assert not window.start_button.isEnabled()  # nothing to start from yet
    # config.json first: what the model is shows while its weights come
    qtbot.waitUntil(lambda: "(llama, 0.0M parameters)" in box.info.text(), timeout=10_000)
    hub["gate"].set()
    qtbot.waitUntil(lambda: box.pretrained is not None, timeout=20_000)
    assert [d for d, _ in hub["progress"]] == [25, 50, 100]
    assert all(name != threading.main_thread().name for _, name in hub["progress"])
    assert "llama" in box.info.text() and box.error is None
    assert window.form.validated().init_from == REPO  # the run names the hub id


def test_the_fit_ladder_shows_from_config_json_before_the_weights_arrive(
    make_window, hub, qtbot, monkeypatch
):
    from test_gui import FAKE_8GB

    from core.platform import hardware

    monkeypatch.setattr(hardware, "gpus", lambda: [dict(FAKE_8GB)])
    window = make_window()
    hub["gate"].clear()  # the weights never come during this test
    window.start_from.set_source(REPO)
    choice = window.estimate.choice
    qtbot.waitUntil(lambda: "weights are downloading" in choice.text(), timeout=10_000)
    assert "Fit ladder" in choice.text() and "QLoRA" in choice.text()
    assert window.start_from.pretrained is None  # nothing to start from yet
    hub["gate"].set()
    qtbot.waitUntil(lambda: window.start_from.pretrained is not None, timeout=20_000)
    assert "weights are downloading" not in choice.text()  # now from the model itself


def test_cancel_stops_the_download_and_says_so(make_window, hub, qtbot):
    hub["block"] = True
    window = make_window()
    box = window.start_from
    box.set_source(REPO)
    qtbot.waitUntil(lambda: hub["calls"] == 1, timeout=5_000)
    box.download.dialog.findChild(QPushButton).click()  # the dialog's Cancel button
    qtbot.waitUntil(lambda: box.download is None, timeout=5_000)
    assert "cancelled" in box.info.text() and box.pretrained is None


def test_a_gated_model_is_one_line_in_the_box(make_window, hub, qtbot):
    hub["error"] = download.DownloadError(
        f"init_from: {REPO} is a gated model: accept its licence on "
        f"https://huggingface.co/{REPO}, then set HF_TOKEN or run `huggingface-cli login`"
    )
    window = make_window()
    window.start_from.set_source(REPO)
    qtbot.waitUntil(lambda: window.start_from.download is None, timeout=5_000)
    assert "HF_TOKEN" in window.start_from.info.text()
    assert window.start_from.error.startswith("init_from:")
    assert not window.start_button.isEnabled()


def test_a_4_bit_base_shows_what_it_saves(make_window, llama_folder):
    window = make_window()
    window.start_from.set_source(str(llama_folder))
    window.form.set_values(lora_rank=4, base_bits="4")
    assert "4-bit base: saves ~" in window.estimate.label.text()
    window.form.set_values(base_bits="auto")
    assert "bit base: saves" not in window.estimate.label.text()


def test_the_spill_warning_is_the_run_views_notice(make_window, tmp_path):
    window = make_window()
    cfg = window.form.validated()
    line = spill.message({"nvml_used_mb": 8100.0, "nvml_total_mb": 8188.0}, cfg)
    window.run_view.log(line)
    assert not window.run_view.notice.isHidden()
    assert window.run_view.notice.text().startswith(spill.PREFIX)
    assert line in window.run_view.log_view.toPlainText()
