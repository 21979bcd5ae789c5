"""The Completions table names the images a sampled prompt showed (an image column of file
names); prompts without images get no such column."""

from __future__ import annotations

import json

from gui.completions_view import CompletionsView


def row(prompt, completion, reward, **extra):
    return {
        "prompt": prompt,
        "completion": completion,
        "rewards": {"exact": reward},
        "reward": reward,
        "advantage": 0.0,
        **extra,
    }


def headers(table) -> list[str]:
    return [table.horizontalHeaderItem(j).text() for j in range(table.columnCount())]


def cells(table, i) -> list[str]:
    return [table.item(i, j).text() for j in range(table.columnCount())]


def test_the_completions_table_names_the_image_each_prompt_showed(qtbot, tmp_path):
    view = CompletionsView()
    qtbot.addWidget(view)
    rows = [
        row("What colour?", "red", 1.0, image=str(tmp_path / "pics" / "red.png")),
        row("Which is bigger?", "the left", 0.0, images=["/data/a.jpg", "/data/b.webp"]),
        row("And this?", "blue", 0.5),
    ]
    (tmp_path / "completions.jsonl").write_text(
        json.dumps({"step": 3, "rows": rows}) + "\n", encoding="utf-8"
    )
    view.refresh(tmp_path)
    table = view.table
    assert headers(table) == ["prompt", "image", "completion", "reward", "advantage", "exact"]
    assert cells(table, 0)[:3] == ["What colour?", "red.png", "red"]
    assert cells(table, 1)[1] == "a.jpg, b.webp"
    assert cells(table, 2)[1] == ""
    view.show_rows(4, [row("hi", "hello", 1.0)])  # text prompts: no image column
    assert headers(table) == ["prompt", "completion", "reward", "advantage", "exact"]
