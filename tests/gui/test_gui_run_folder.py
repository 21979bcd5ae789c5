"""The run-folder field: a folder that is not ours (core.runs.folder.check_out) is flagged
under the field as it is chosen, and Start refuses it in a dialog before any work."""

from __future__ import annotations


def test_a_run_folder_that_is_not_ours_is_flagged_before_start(make_window, gui_env, dialogs):
    window = make_window()
    window.select_preset("cpu-tiny")
    warning = window.output_box.warning
    assert warning.isHidden()
    mine = gui_env / "photos"
    mine.mkdir()
    (mine / "holiday.jpg").write_bytes(b"x" * 100)
    window.out_edit.setText(str(mine))
    assert not warning.isHidden()
    assert "holiday.jpg" in warning.text() and "not a TrainDeck run" in warning.text()
    assert "--out" not in warning.text()  # the window's words, not the command line's

    assert window.start() is False
    [(title, text)] = dialogs.named("critical")
    assert title == "Run folder" and "holiday.jpg" in text
    assert window.worker is None and not window.running
    assert [p.name for p in mine.iterdir()] == ["holiday.jpg"]  # untouched
    assert window.out_edit.text() == str(mine)  # kept, to be corrected

    window.out_edit.setText(str(mine / "holiday.jpg"))
    assert "not a folder" in warning.text() and not warning.isHidden()
    empty = gui_env / "empty"
    empty.mkdir()
    for fine in (empty, gui_env / "new" / "run", ""):
        window.out_edit.setText(str(fine))
        assert warning.isHidden(), (fine, warning.text())
