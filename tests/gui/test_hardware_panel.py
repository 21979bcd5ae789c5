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


def test_the_panel_says_which_tier_is_recommended_for_the_free_vram(qtbot):
    # A 24 GB card with 22.5 GiB free reaches the 24 GB tier (21.6 GiB needed) ...
    g = {**card(), "name": "NVIDIA GeForce RTX 4090", "total_bytes": 24 * 1024**3}
    panel = HardwarePanel(HardwareInfo(gpus=[{**g, "free_bytes": int(22.5 * 1024**3)}]))
    qtbot.addWidget(panel)
    text = panel.label.text()
    assert "Recommended: gpu-24gb, the largest VRAM tier at or below the 22.5 GiB free" in text
    # ... and with 6 GiB taken by other programs, the tier below.
    panel.show_info(HardwareInfo(gpus=[{**g, "free_bytes": 18 * 1024**3}]))
    assert "Recommended: gpu-16gb" in panel.label.text()
    # On the CPU the panel says nothing of presets, as before.
    panel.show_info(HardwareInfo(cpu={"cores": 2, "ram_bytes": 8 << 30, "ram_free_bytes": 4 << 30}))
    assert "no CUDA GPU" in panel.label.text() and "ecommended" not in panel.label.text()
