"""The hardware panel names a GPU this torch build cannot run, before any training starts."""

from __future__ import annotations

from gui.hardware_panel import HardwareInfo, HardwarePanel


def card(problem=None) -> dict:
    return {
        "index": 0,
        "name": "NVIDIA GeForce RTX 5090",
        "total_bytes": 32 * 1024**3,
        "free_bytes": 30 * 1024**3,
        "capability": "12.0",
        "bf16": True,
        "tf32": True,
        "driver": "580.1",
        "build_problem": problem,
    }


def test_the_panel_shows_the_reinstall_line_for_a_gpu_too_new_for_the_build(qtbot):
    line = "GPU NVIDIA GeForce RTX 5090 (sm_120) is newer than this torch build (... cu128 ...)"
    panel = HardwarePanel(HardwareInfo(gpus=[card(line)]))
    qtbot.addWidget(panel)
    assert "(sm_120) is newer than this torch build" in panel.label.text()
    panel.show_info(HardwareInfo(gpus=[card()]))
    assert "torch build" not in panel.label.text()
