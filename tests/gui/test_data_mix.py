"""The window's data field mixes several sources with a weight each (core.data.mix)."""

from __future__ import annotations


def test_add_source_rows_fill_extra_data_and_weights(make_window, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "general.txt"
    window = make_window()
    window.select_preset("cpu-tiny")
    form = window.form
    form.data.edit.setText(str(a))
    assert form.data.weight.isHidden() and form.config().extra_data == []
    form.data.add_source(str(b))
    assert not form.data.weight.isHidden()  # a weight for each source once there are two
    cfg = form.config()
    assert (cfg.data, cfg.extra_data, cfg.data_weights) == (str(a), [str(b)], None)
    assert "mixed with 1 more source (shares by training tokens)" in form.data_info.text()
    form.data.weight.setText("0.8")
    form.data.rows[0][2].setText("0.2")
    assert form.config().data_weights == "0.8,0.2" and form.is_valid
    form.data.rows[0][2].setText("-1")  # core's one line, shown in the form
    assert not form.is_valid and form.error.startswith("data_weights:")
    # a preset applied keeps the user's sources; loading a config shows its mix
    form.data.rows[0][2].setText("0.2")
    window.select_preset("cpu")
    assert form.config().preset == "cpu"
    assert form.config().extra_data == [str(b)] and form.config().data_weights == "0.8,0.2"
    form.data._remove(form.data.rows[0][0])
    assert form.config().extra_data == [] and form.config().data_weights is None


def test_the_resume_dialog_names_every_source():
    from gui.resume_dialog import _data_text

    mixed = {"data": "a.jsonl", "extra_data": ["general.txt"], "data_weights": "0.8,0.2"}
    assert _data_text(mixed) == "a.jsonl + general.txt (weights 0.8,0.2)"
    assert _data_text({"data": None}) == "embedded corpus"  # a run from before the mix
