"""Training data from .parquet, .csv and .json tables (core.data.tables): the same rows give
the same prepared tokens and masks as the .jsonl, columns are mapped, ShareGPT conversations
read, a text column trains as plain text a document a row, and bad files are one line."""

from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import tiny_config

from core.cli.train import main as train_main
from core.data import tables
from core.data.prepare import data_spec, prepare
from core.errors import DataError

PAIRS = [
    {"prompt": f"Question {i}, with a comma", "completion": f'Answer {i}:\n"quoted" \u00e9'}
    for i in range(12)
]
CHATS = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"Hi {i}"},
            {"role": "assistant", "content": f"Hello, {i}!"},
        ]
    }
    for i in range(12)
]


def write(path, rows):
    """rows in the file kind path's ending names (a CSV cell holding a list: JSON text)."""
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5)
    else:
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            for r in rows:
                w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
    return path


def prepared(tmp_path, data, **overrides):
    """(tokens, mask or None, manifest) of the data as a run would prepare it."""
    cfg = tiny_config(data=str(data), seq_len=160, **overrides)
    folder, manifest = prepare(data_spec(cfg), tmp_path / "cache", log=lambda m: None)
    tokens = np.fromfile(folder / "tokens.bin", dtype=manifest["dtype"])
    mask = np.fromfile(folder / "mask.bin", dtype=np.uint8) if "row" in manifest else None
    return tokens, mask, manifest


@pytest.mark.parametrize("rows", [PAIRS, CHATS], ids=["prompt-completion", "messages"])
def test_parquet_csv_and_json_prepare_as_the_jsonl_does(tmp_path, rows):
    tokens, mask, manifest = prepared(tmp_path, write(tmp_path / "d.jsonl", rows))
    assert manifest["examples"]["train"] + manifest["examples"]["val"] == 12
    for suffix in (".parquet", ".csv", ".json"):
        other = prepared(tmp_path, write(tmp_path / f"d{suffix}", rows))
        assert np.array_equal(other[0], tokens) and np.array_equal(other[1], mask), suffix
        assert other[2]["examples"] == manifest["examples"]


def test_columns_are_mapped_and_the_mapping_is_part_of_the_cache_key(tmp_path):
    qa = [
        {"id": i, "question": r["prompt"], "answer": r["completion"]} for i, r in enumerate(PAIRS)
    ]
    csv_file = write(tmp_path / "qa.csv", qa)
    expected = prepared(tmp_path, write(tmp_path / "d.jsonl", PAIRS))
    mapped = prepared(tmp_path, csv_file, prompt_column="question", completion_column="answer")
    assert np.array_equal(mapped[0], expected[0]) and np.array_equal(mapped[1], expected[1])
    # the same file, another column as the answer: another cache entry, other tokens
    swapped = prepared(tmp_path, csv_file, prompt_column="answer", completion_column="question")
    assert not np.array_equal(swapped[0], mapped[0])
    assert tables.layout_of(["question", "answer"], {"prompt": "question"}) == "prompt/completion"


def test_sharegpt_conversations_read_as_messages(tmp_path):
    roles = {"system": "system", "user": "human", "assistant": "gpt"}
    share = [
        {
            "conversations": [
                {"from": roles[m["role"]], "value": m["content"]} for m in r["messages"]
            ]
        }
        for r in CHATS
    ]
    expected = prepared(tmp_path, write(tmp_path / "d.jsonl", CHATS))
    for suffix in (".jsonl", ".parquet"):
        got = prepared(tmp_path, write(tmp_path / f"share{suffix}", share))
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])


def test_layouts_are_detected():
    assert tables.detect_layout(["text", "id"]) == "text"
    assert tables.detect_layout(["conversations"]) == "messages"
    assert tables.detect_layout(["instruction", "input", "output"]) == "alpaca"
    assert tables.detect_layout(["prompt", "completion"]) == "prompt/completion"
    assert tables.detect_layout(["prompt", "chosen", "rejected"]) == "preference"
    assert tables.detect_layout(["a", "b"]) == ""
    # a mapped text column decides over a messages column the file also has
    assert tables.layout_of(["body", "messages"], {"text": "body"}) == "text"


def test_records_carry_the_row_numbers_a_user_sees(tmp_path):
    rows = [{"prompt": f"p{i}", "chosen": "a", "rejected": "b"} for i in range(2500)]
    numbers = [n for n, _ in tables.iter_records(write(tmp_path / "p.parquet", rows))]
    assert numbers == list(range(1, 2501))  # across record batches
    lines = tmp_path / "gaps.jsonl"
    lines.write_text('{"text": "a"}\n\n{"text": "b"}\n', encoding="utf-8")
    assert [n for n, _ in tables.iter_records(lines)] == [1, 3]
    multiline = tmp_path / "m.csv"
    multiline.write_text('\ufefftext\n"two\nlines"\nnext\n', encoding="utf-8")
    assert list(tables.iter_records(multiline)) == [
        (3, {"text": "two\nlines"}),
        (4, {"text": "next"}),
    ]
    wrapped = tmp_path / "w.json"
    wrapped.write_text(json.dumps({"data": [{"text": "x"}], "version": 1}), encoding="utf-8")
    assert list(tables.iter_records(wrapped)) == [(1, {"text": "x"})]


def test_a_text_column_trains_as_plain_text_a_document_a_row(tmp_path):
    docs = [{"body": f"Document {i}: " + "words " * i, "n": i} for i in range(30)]
    tokens, mask, manifest = prepared(
        tmp_path, write(tmp_path / "docs.parquet", docs), text_column="body"
    )
    assert mask is None and "row" not in manifest  # the plain text path
    text = "".join(d["body"] + "\n" for d in docs).encode()
    assert bytes(tokens.astype(np.uint8)) == text  # bytes: train and validation in order
    assert manifest["source_bytes"] == len(text)
    as_text = write(tmp_path / "docs.jsonl", [{"text": d["body"]} for d in docs])
    assert np.array_equal(prepared(tmp_path, as_text)[0], tokens)  # auto: the text layout


def test_a_pretrained_tokenizer_puts_bos_and_eos_around_each_row(tmp_path):
    pytest.importorskip("transformers")
    from hf_models import make_tokenizer

    from core.data.tokenizer import pretrained_tokenizer

    make_tokenizer(tmp_path / "tok", "llama")  # its tokenizer adds BOS
    tok = pretrained_tokenizer(tmp_path / "tok")
    data = write(tmp_path / "docs.csv", [{"text": "hello world"}, {"text": "def add(a, b):"}])
    cfg = tiny_config(data=str(data), val_fraction=0.001)
    folder, manifest = prepare(data_spec(cfg), tmp_path / "cache", tok, log=lambda m: None)
    ids = np.fromfile(folder / "tokens.bin", dtype=manifest["dtype"]).tolist()
    first = tok.hf.encode("hello world", add_special_tokens=False).ids
    second = tok.hf.encode("def add(a, b):", add_special_tokens=False).ids
    assert ids == [tok.bos_id, *first, tok.eos_id, tok.bos_id, *second, tok.eos_id]


@pytest.mark.parametrize(
    "name, content, words",
    [
        (
            "bad.csv",
            "question,answer\nq,a\nr,b\n",
            "no column 'query' (the prompt column, prompt_column); columns found: question, answer",
        ),
        ("bad.parquet", b"PAR1 not really", "bad.parquet: not a readable Parquet file"),
        ("bad.json", '{"rows": 3}', "expected a JSON array of objects"),
        ("bad.csv", "prompt,completion\nq,a\nq,a,extra\n", "line 3: has 3 fields, the header 2"),
        (
            "bad.jsonl",
            '{"question": "q", "completion": "a"}\n{"completion": "a"}\n',
            "line 2: no column 'question'",
        ),
    ],
)
def test_bad_tables_are_one_line_exit_2_and_nothing_prepared(
    tmp_path, capsys, name, content, words
):
    data = tmp_path / name
    if isinstance(content, bytes):
        data.write_bytes(content)
    else:
        data.write_text(content, encoding="utf-8")
    cache = tmp_path / "cache"
    args = [
        "--data",
        str(data),
        "--max-steps",
        "1",
        "--data-cache",
        str(cache),
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "run"),
        "--hidden-dim",
        "32",
        "--n-layers",
        "1",
        "--n-heads",
        "2",
        "--prompt-column",
        "query" if "query" in words else "question",
    ]
    if name == "bad.csv" and "fields" in words:
        args = args[:-2]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and str(data) in err and len(err.splitlines()) == 1, err
    assert err.startswith("error: data: ")
    assert not [p for p in cache.glob("*") if not p.name.startswith(".")]


def test_a_missing_text_column_names_the_columns_found(tmp_path):
    data = write(tmp_path / "docs.parquet", [{"content": "a"}, {"content": "b"}])
    with pytest.raises(DataError, match="no column 'text' .*columns found: content"):
        data_spec(tiny_config(data=str(data), text_column="text"))
    cfg = tiny_config(data=str(data), data_format="text")
    with pytest.raises(DataError, match="has no text column; columns found: content"):
        prepare(data_spec(cfg), tmp_path / "cache", log=lambda m: None)


def test_the_cli_maps_columns(tmp_path):
    qa = [{"question": r["prompt"], "answer": r["completion"]} for r in PAIRS]
    args = [
        "--data",
        str(write(tmp_path / "qa.parquet", qa)),
        "--prepare-only",
        "--data-cache",
        str(tmp_path / "cache"),
        "--seq-len",
        "160",
        "--prompt-column",
        "question",
        "--completion-column",
        "answer",
    ]
    assert train_main(args) == 0
    entries = [p for p in (tmp_path / "cache").glob("*") if not p.name.startswith(".")]
    manifest = json.loads((entries[0] / "manifest.json").read_text())
    assert manifest["examples"]["train"] + manifest["examples"]["val"] == 12


def test_a_text_table_run_resumes_exactly(tmp_path):
    from helpers import StopAfter

    from core.runs.folder import read_metrics
    from core.training.trainer import Trainer

    docs = [
        {"body": f"Row {i}: the fox {'jumps' if i % 2 else 'sleeps'} {i % 7} times."}
        for i in range(300)
    ]
    data = write(tmp_path / "docs.parquet", docs)
    cfg = tiny_config(
        data=str(data),
        text_column="body",
        max_steps=6,
        eval_every=3,
        ckpt_every=3,
        sample_tokens=0,
        n_layers=1,
    )

    def losses(run):
        train, evals = read_metrics(run / "metrics.jsonl")
        return [(r["step"], r["loss"]) for r in train], [(r["step"], r["val_loss"]) for r in evals]

    straight, run = tmp_path / "straight", tmp_path / "run"
    Trainer(cfg, straight, data_cache=tmp_path / "c").run()
    Trainer(cfg, run, data_cache=tmp_path / "c").run(control=StopAfter(4))
    latest = run / "checkpoints" / "latest.pt"
    Trainer(cfg, run, resume_from=latest, data_cache=tmp_path / "c").run()
    assert losses(run) == losses(straight)  # exact float equality, every step and eval
    assert len(losses(run)[0]) > 2


def test_preference_columns_come_with_canonical_keys(tmp_path):
    rows = [{"question": "2+2?", "good": "4", "bad": "5"}]
    data = write(tmp_path / "pairs.csv", rows)
    mapping = {"prompt": "question", "chosen": "good", "rejected": "bad"}
    assert list(tables.iter_records(data, mapping)) == [
        (2, {"prompt": "2+2?", "chosen": "4", "rejected": "5"})
    ]
    assert tables.file_layout(data, mapping) == "preference"


def test_a_folder_of_tables_and_json_lines_named_json(tmp_path):
    folder = tmp_path / "hub-export"
    (folder / "data").mkdir(parents=True)
    write(folder / "data" / "train-00000-of-00002.parquet", PAIRS[:6])
    write(folder / "data" / "train-00001-of-00002.parquet", PAIRS[6:])
    _, _, manifest = prepared(tmp_path, folder)
    assert manifest["examples"]["train"] + manifest["examples"]["val"] == 12
    lines = tmp_path / "lines.json"  # what datasets' to_json writes: JSON lines, named .json
    lines.write_text("".join(json.dumps(r) + "\n" for r in PAIRS[:2]), encoding="utf-8")
    assert [n for n, _ in tables.iter_records(lines)] == [1, 2]


def test_a_table_of_unknown_columns_names_them_once(tmp_path, capsys):
    data = write(tmp_path / "qa.parquet", [{"question": "q", "answer": "a"}] * 3)
    args = ["--data", str(data), "--prepare-only", "--data-cache", str(tmp_path / "cache")]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "qa.parquet: no known layout in its columns (question, answer)" in err
    assert "--prompt-column" in err and len(err.splitlines()) == 1


def test_core_eval_reads_questions_through_the_same_reader(tmp_path):
    from core.use.evaluate import read_choices

    items = [{"question": "2 + 2 is", "choices": ["four", "five"], "answer": 0}] * 2
    expected = read_choices(write(tmp_path / "q.jsonl", items))
    assert read_choices(write(tmp_path / "q.json", items)) == expected
    assert read_choices(write(tmp_path / "q.parquet", items)) == expected
