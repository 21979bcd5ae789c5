"""Tables in the window: a Parquet file picked as data shows its layout, the column mapping in
use and its first rows before Start; the column fields change what is read."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq


def test_a_parquet_file_is_previewed_with_its_layout_columns_and_rows(make_window, tmp_path):
    rows = [
        {"question": f"What is {i} + {i}? " + "pad " * 40, "answer": str(2 * i)} for i in range(20)
    ]
    data = tmp_path / "qa.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    form = make_window().form
    assert form.data_preview.isHidden()
    form.data.set_value(str(data))
    preview = form.data_preview.text()
    assert not form.data_preview.isHidden()
    assert "layout not recognised (columns question, answer)" in preview
    assert "no known layout in its columns (question, answer)" in form.data_info.text()
    form.widgets["prompt_column"].setText("question")
    form.widgets["completion_column"].setText("answer")
    lines = form.data_preview.text().splitlines()
    assert lines[0] == (
        "Parquet file qa.parquet: layout prompt/completion; columns prompt \u2190 question, "
        "completion \u2190 answer"
    )
    assert len(lines) == 4 and lines[1].startswith("1. prompt: What is 0 + 0? pad")
    assert lines[1].endswith("| completion: 0") and "\u2026" in lines[1]  # cut, not wrapped
    assert form.data_info.text().startswith("Chat data: 20 examples (prompt/completion 20)")
    assert form.config().prompt_column == "question" and form.is_valid
    form.data.set_value("")  # the embedded corpus: nothing to preview
    assert form.data_preview.isHidden()
