"""The Playground with images: an image attached by Image… or dropped on it shows as a
thumbnail, and a tiny Gemma 3 composite answers about it exactly as `core.generate --image`
does; a text-only model's button is off with the reason, and a bad file is a dialog."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDropEvent  # noqa: E402
from PySide6.QtWidgets import QApplication, QLabel, QToolButton  # noqa: E402
from vision_models import make_gemma3_vision, save_image  # noqa: E402

from core.cli.generate import main as generate_main  # noqa: E402


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision") / "gemma3"
    make_gemma3_vision(folder, layers=2)
    return folder


def thumbnails(pg) -> list[QLabel]:
    return pg.image_row.findChildren(QLabel, "thumbnail")


def drop(widget, paths) -> QDropEvent:
    """A file drag entering widget and dropped on it, as a file manager sends them."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    action, button = Qt.DropAction.CopyAction, Qt.MouseButton.LeftButton
    enter = QDragEnterEvent(QPoint(5, 5), action, mime, button, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    event = QDropEvent(QPointF(5, 5), action, mime, button, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, event)
    return enter


def cli_answer(capsys, pg, pictures, prompt, chat: bool) -> str:
    """core.generate's answer on the Playground's model and device, greedy."""
    args = [pg.target(), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "6"]
    args += ["--device", pg.device()]
    args += [a for p in pictures for a in ("--image", str(p))] + (["--chat"] if chat else [])
    assert generate_main(args) == 0
    out = capsys.readouterr().out
    return out.removesuffix("\n") if chat else out.removeprefix(prompt).removesuffix("\n")


def answer(pg, qtbot, prompt: str) -> str:
    pg.prompt.setPlainText(prompt)
    with qtbot.waitSignal(pg.generation_done, timeout=60_000):
        assert pg.generate()
    assert pg.status.text().startswith("Done"), pg.status.text()
    return pg.output.toPlainText()


def test_playground_answers_about_an_image_as_core_generate_does(
    make_window, qtbot, gemma3, tmp_path, capsys, dialogs
):
    pg = make_window().playground
    pg.refresh_runs(gemma3)
    assert pg.image_button.isEnabled()
    picture = save_image(tmp_path / "red.png", "png", (160, 100), 3)
    assert pg.add_images([picture]) and pg.images == [picture]
    (thumb,) = thumbnails(pg)
    assert thumb.toolTip() == "red.png" and not pg.image_row.isHidden()
    size = thumb.pixmap().size()
    assert (size.width(), size.height()) == (72, 45)  # scaled, aspect kept
    pg.temperature.setValue(0.0)
    pg.length.setValue(6)

    # a plain prompt: the image's tokens before it, as core.generate without --chat
    shown = answer(pg, qtbot, "colour:")
    want = cli_answer(capsys, pg, [picture], "colour:", chat=False)
    assert shown == "[image red.png]\ncolour:" + want
    assert pg.images == [picture]  # kept for the next try
    second = save_image(tmp_path / "blue.jpg", "jpeg", (80, 80), 4)
    assert pg.add_images([second])  # several images, in order, as --image repeated
    shown = answer(pg, qtbot, "colour:")
    want = cli_answer(capsys, pg, [picture, second], "colour:", chat=False)
    assert shown == "[image red.png] [image blue.jpg]\ncolour:" + want
    pg.remove_image(1)

    # chat: the image goes in the user's turn, as core.generate --chat
    pg.chat.setChecked(True)
    shown = answer(pg, qtbot, "What colour?")
    want = cli_answer(capsys, pg, [picture], "What colour?", chat=True)
    assert shown == f"You: [image red.png] What colour?\n\nModel: {want}"
    assert pg.images == [] and pg.image_row.isHidden()  # sent: it is in the conversation
    image_part = {"type": "image", "image": str(picture)}
    assert pg.history[0]["content"] == [image_part, {"type": "text", "text": "What colour?"}]
    # the next turn still sees the first image (in its history) without a new one
    shown = answer(pg, qtbot, "And now?")
    assert shown.startswith(f"You: [image red.png] What colour?\n\nModel: {want}\n\nYou: And")
    # the conversation's image stays in view above the transcript until a new chat
    assert pg.chat_images == [picture] and not pg.chat_row.isHidden()
    pg.new_chat_button.click()
    assert pg.chat_images == [] and pg.chat_row.isHidden()
    assert not dialogs.calls


def test_an_image_dropped_on_the_playground_shows_and_is_removed_by_its_cross(
    make_window, gemma3, tmp_path, dialogs
):
    pg = make_window().playground
    pg.show()
    pg.refresh_runs(gemma3)
    one = save_image(tmp_path / "one.jpg", "jpeg", (90, 120), 1)
    two = save_image(tmp_path / "two.webp", "webp", (64, 64), 2)
    enter = drop(pg.prompt.viewport(), [one])  # on the prompt box: an image, not text
    assert enter.isAccepted()
    assert pg.images == [one] and pg.prompt.toPlainText() == ""
    drop(pg, [two])
    assert pg.images == [one, two]
    assert [t.toolTip() for t in thumbnails(pg)] == ["one.jpg", "two.webp"]
    pg.image_row.findChildren(QToolButton, "remove_image")[0].click()
    assert pg.images == [two] and [t.toolTip() for t in thumbnails(pg)] == ["two.webp"]
    pg.image_row.findChildren(QToolButton, "remove_image")[-1].click()
    assert pg.images == [] and pg.image_row.isHidden()
    assert not dialogs.calls


def test_a_text_only_model_turns_the_button_off_and_refuses_a_dropped_image(
    make_window, gemma3, tmp_path, dialogs
):
    from hf_models import make_model

    make_model(tmp_path / "text", "qwen3")
    pg = make_window().playground
    pg.refresh_runs(tmp_path / "text")
    assert not pg.image_button.isEnabled()
    assert "reads text only" in pg.image_button.toolTip()
    drop(pg, [save_image(tmp_path / "a.png")])
    ((title, text),) = dialogs.named("warning")
    assert title == "Playground" and "reads text only" in text and "\n" not in text
    assert pg.images == [] and pg.image_row.isHidden()
    # a run's base says it: a fine-tune of the vision model takes images; a new model not
    run = tmp_path / "runs" / "ft"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(f"init_from: {gemma3}\n", encoding="utf-8")
    pg.run_combo.setCurrentText(str(run))
    assert pg.image_button.isEnabled()
    (run / "config.yaml").write_text("init_from: null\n", encoding="utf-8")
    (run / "checkpoints" / "best.pt").write_bytes(b"")  # only its place is read
    pg.run_combo.setCurrentText(str(run / "checkpoints" / "best.pt"))
    assert not pg.image_button.isEnabled()
    assert "trained from scratch reads text only" in pg.image_button.toolTip()


def test_a_bad_image_is_a_one_line_dialog_and_nothing_is_attached(
    make_window, gemma3, tmp_path, dialogs
):
    pg = make_window().playground
    pg.refresh_runs(gemma3)
    fake = tmp_path / "notes.png"
    fake.write_text("not an image", encoding="utf-8")
    good = save_image(tmp_path / "good.png")
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(save_image(tmp_path / "whole.jpg", "jpeg", (64, 64)).read_bytes()[:300])
    assert pg.add_images([fake, good, cut])  # the good one is taken
    assert pg.images == [good]
    texts = [text for _, text in dialogs.named("critical")]
    assert len(texts) == 2 and all("\n" not in t for t in texts)
    assert texts[0] == f"image: {fake} is not an image Pillow can read (PNG, JPEG or WebP)"
    assert texts[1].startswith(f"image: {cut} is damaged")
