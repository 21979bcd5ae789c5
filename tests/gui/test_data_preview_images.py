"""The data preview shows each previewed example's images as thumbnails beside its turns
(scaled with their aspect kept, the file name as tooltip); an image that cannot be read shows
its one-line reason in its place, and the window goes on."""

from __future__ import annotations

import json

from PySide6.QtWidgets import QLabel, QWidget
from vision_models import save_image


def write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_an_image_example_shows_thumbnails_beside_its_turns(make_window, tmp_path):
    pics = tmp_path / "pics"
    save_image(pics / "wide.png", "png", (200, 100), 1)
    save_image(pics / "tall.jpg", "jpeg", (60, 120), 2)
    (pics / "notes.png").write_text("not an image", encoding="utf-8")
    parts = [
        {"type": "image", "image": "pics/wide.png"},
        {"type": "image", "path": "pics/tall.jpg"},
        {"type": "text", "text": "Which is wider?"},
    ]
    data = tmp_path / "seen.jsonl"
    write_jsonl(
        data,
        [
            {
                "messages": [
                    {"role": "user", "content": parts},
                    {"role": "assistant", "content": "the first"},
                ]
            },
            {
                "messages": [
                    {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "hi"},
                ]
            },
            {
                "messages": [
                    {"role": "user", "content": "<image>What is it?"},
                    {"role": "assistant", "content": "a note"},
                ],
                "images": ["pics/notes.png"],
            },
        ],
    )
    form = make_window().form
    form.data.set_value(str(data))
    preview = form.data_preview
    assert not preview.isHidden()
    lines = preview.text().splitlines()
    assert lines[1].startswith("1. user: [image wide.png] [image tall")  # cut to fit
    wide, tall, bad = preview.thumbnails()
    assert (wide.toolTip(), tall.toolTip()) == ("wide.png", "tall.jpg")
    assert (wide.pixmap().width(), wide.pixmap().height()) == (56, 28)  # aspect kept
    assert (tall.pixmap().width(), tall.pixmap().height()) == (28, 56)
    assert bad.pixmap().isNull()
    assert bad.text() == "notes.png is not an image Pillow can read (PNG, JPEG or WebP)"
    # each row's images sit in its own row, beside its text
    rows = preview.findChildren(QWidget, "preview_row")
    assert [len(r.findChildren(QLabel, "thumbnail")) for r in rows] == [2, 1]
    form.data.set_value("")  # nothing to preview: no thumbnails left behind
    assert preview.isHidden() and preview.thumbnails() == []


def test_a_missing_image_or_a_url_shows_its_reason_and_text_rows_show_none(make_window, tmp_path):
    parts = [
        {"type": "image", "image": "gone.png"},
        {"type": "image", "url": "https://example.com/cat.png"},
        {"type": "image_url", "image_url": {"url": "file://gone2.png"}},  # OpenAI's form
        {"type": "text", "text": "?"},
    ]
    data = tmp_path / "d.jsonl"
    write_jsonl(
        data,
        [{"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "x"}]}],
    )
    form = make_window().form
    form.data.set_value(str(data))
    gone, url, openai = form.data_preview.thumbnails()
    assert gone.text() == "gone.png does not exist"
    assert openai.text() == "gone2.png does not exist"
    assert "user: [image gone.png] [image cat" in form.data_preview.text()  # cut to fit
    assert url.text().startswith("https://example.com/cat.png is a URL: only local files")
    plain = tmp_path / "plain.jsonl"
    write_jsonl(plain, [{"prompt": "a", "completion": "b"}])
    form.data.set_value(str(plain))
    assert form.data_preview.thumbnails() == [] and "prompt: a" in form.data_preview.text()
