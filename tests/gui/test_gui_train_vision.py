"""The window's Train vision tower box (beside LoRA rank): offered for a model with a vision
tower, greyed with a tooltip saying why for one without, and cleared when such a model is
picked; checked, the config the window starts trains the tower."""

from __future__ import annotations

import pytest
from hf_models import make_model
from test_gui_run import tiny_window

pytest.importorskip("transformers")


def test_the_box_follows_the_model(make_window, tmp_path):
    from vision_models import make_gemma3_vision

    make_gemma3_vision(tmp_path / "gemma3", layers=2)
    make_model(tmp_path / "llama", "llama")
    window = tiny_window(make_window, seq_len=32)
    form, box = window.form, window.form.widgets["train_vision"]
    assert not box.isEnabled()  # a new model has no tower
    window.start_from.set_source(str(tmp_path / "gemma3"))
    assert box.isEnabled() and not box.isChecked()
    box.setChecked(True)
    assert form.config().train_vision
    window.start_from.set_source(str(tmp_path / "llama"))
    assert not box.isChecked() and not box.isEnabled()
    assert "has no vision tower" in box.toolTip()
    assert form.validated().train_vision is False
