"""python -m core.eval: perplexity and bits per byte of a text, multiple-choice accuracy as
lm-evaluation-harness scores it, proven against transformers on tiny random models."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from hf_models import TEXT, make_model  # noqa: E402

from core.cli.eval import main as eval_main  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use import evaluate, scoring  # noqa: E402
from core.weights.loader import load  # noqa: E402

ITEMS = [
    {"question": "2 + 2 is", "choices": ["four", "five", "a fox"], "answer": 0},
    {
        "question": "The quick brown fox jumps over the",
        "choices": ["lazy dog", "moon"],
        "answer": "A",
    },
    {"question": "def add(a, b): return", "choices": ["a + b", "hello world", "0"], "answer": 1},
    {"question": "Numbers: 0 1 2", "choices": ["3 4", "x y"], "answer": "0"},
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval") / "llama"
    make_model(folder, "llama")
    return folder


def scored(items):
    """What is scored of each item: its prompt, choices and answer."""
    return [(evaluate.doc_to_text(i, None), i["choices"], i["answer"]) for i in items]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def hf_loglikelihood(hf, tok, context, continuation):
    ids = tok(context + continuation)["input_ids"]
    n = len(ids) - len(tok(context)["input_ids"])
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0, :-1].float(), -1)
    return float(logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])][-n:].sum())


@pytest.fixture(scope="module")
def hf(model):
    """(transformers' own model, its tokenizer) of the same folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_model = AutoModelForCausalLM.from_pretrained(model).float().eval()
    return hf_model, AutoTokenizer.from_pretrained(model)


def test_choice_log_likelihoods_and_answers_equal_transformers(model, hf):
    hf_model, tok = hf
    loaded = load(model)
    items = [evaluate._item(raw, "test") for raw in ITEMS]
    shot = f"Question: {ITEMS[0]['question']}\nAnswer: {items[0]['choices'][0]}\n\n"
    for shots in ("", shot):  # zero-shot and with one worked example before the question
        for raw, item in zip(ITEMS, items, strict=True):
            context = f"{shots}Question: {raw['question']}\nAnswer:"
            ours = [
                ll
                for ll, _ in scoring.loglikelihood(
                    loaded, [(context, " " + c) for c in item["choices"]]
                )
            ]
            theirs = [hf_loglikelihood(hf_model, tok, context, " " + c) for c in item["choices"]]
            assert ours == pytest.approx(theirs, abs=1e-4)
            assert ours.index(max(ours)) == theirs.index(max(theirs))


def test_a_table_as_text_is_scored_by_its_text_column(model, tmp_path, capsys):
    """One document a row, not the file's bytes; a table without the column is refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [TEXT[:300], TEXT[300:450], "Hello world."]
    pq.write_table(pa.table({"body": docs, "n": [1, 2, 3]}), tmp_path / "t.parquet")
    write_jsonl(tmp_path / "t.jsonl", [{"text": d} for d in docs])
    loaded = load(model)
    expected = evaluate.text_metrics(loaded, docs)
    assert expected["documents"] == 3 and expected["bytes"] == sum(len(d.encode()) for d in docs)
    assert evaluate.read_documents(tmp_path / "t.parquet", "body") == docs
    assert eval_main([str(model), "--text", str(tmp_path / "t.jsonl"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == expected
    assert eval_main([str(model), "--text", str(tmp_path / "t.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --text:") and "text" in err and len(err.splitlines()) == 1
    args = [str(model), "--text", str(tmp_path / "t.parquet"), "--text-column", "body", "--json"]
    assert eval_main(args) == 0
    assert json.loads(capsys.readouterr().out)["text"] == expected
    assert eval_main([str(model), "--text", str(tmp_path)]) == 2  # a folder
    err = capsys.readouterr().err.strip()
    assert "is a folder" in err and "not found" not in err and len(err.splitlines()) == 1


def test_csv_jsonl_and_the_letter_layout_read_the_same(model, tmp_path):
    jsonl = write_jsonl(tmp_path / "q.jsonl", ITEMS)
    with open(tmp_path / "q.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, ["question", "choices", "answer"])
        w.writeheader()
        for r in ITEMS:
            w.writerow({**r, "choices": json.dumps(r["choices"])})
    letters = [
        {
            "question": r["question"],
            **dict(zip("ABC", r["choices"], strict=False)),
            "answer": "ABC"[evaluate._item(r, "t")["answer"]],
        }
        for r in ITEMS
    ]
    layout = write_jsonl(tmp_path / "letters.jsonl", letters)
    read = [scored(evaluate.read_choices(p)) for p in (jsonl, tmp_path / "q.csv", layout)]
    assert read[0] == read[1] == read[2]
    assert [r[2] for r in read[0]] == [0, 0, 1, 0]
    as_letters = write_jsonl(
        tmp_path / "letters_answer.jsonl",
        [{**r, "answer": "abc"[a[2]]} for r, a in zip(ITEMS, read[0], strict=True)],
    )
    as_indexes = write_jsonl(
        tmp_path / "index_answer.jsonl",
        [{**r, "answer": a[2]} for r, a in zip(ITEMS, read[0], strict=True)],
    )
    assert scored(evaluate.read_choices(as_letters)) == scored(evaluate.read_choices(as_indexes))
    assert scored(evaluate.read_choices(as_indexes)) == read[0]
    loaded = load(model)
    assert evaluate.choice_metrics(loaded, evaluate.read_choices(jsonl)) == (
        evaluate.choice_metrics(loaded, evaluate.read_choices(layout))
    )


def test_json_output_and_the_run_folder_record(tmp_path, capsys):
    Trainer(tiny_config(max_steps=3, eval_every=3, ckpt_every=3), tmp_path / "run").run()
    questions = write_jsonl(tmp_path / "q.jsonl", ITEMS)
    text = tmp_path / "t.txt"
    text.write_text(TEXT[:500], encoding="utf-8")
    capsys.readouterr()
    args = [
        str(tmp_path / "run"),
        "--text",
        str(text),
        "--choices",
        str(questions),
        "--fewshot",
        "1",
        "--json",
    ]
    assert eval_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    # every question scored, each with one example drawn from the others
    assert set(out) == {"text", "choices"} and out["choices"]["n"] == 4
    assert out["text"]["word_perplexity"] > 1 and 0 <= out["choices"]["acc"] <= 1
    records = evaluate.list_results(tmp_path / "run")
    assert [r["kind"] for r in records] == ["choices", "text"] or [r["kind"] for r in records] == [
        "text",
        "choices",
    ]
    record = next(r for r in records if r["kind"] == "choices")
    assert record["result"] == out["choices"] and record["settings"]["fewshot"] == 1
    assert len(record["data_fingerprint"]) == 16 and record["step"] == 3
    assert next(r for r in records if r["kind"] == "text")["result"] == out["text"]


def test_two_question_files_of_one_name_keep_their_own_results(tmp_path, capsys):
    """q.csv and q.parquet (and q.jsonl in two folders) are four results, not one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    Trainer(tiny_config(max_steps=2, eval_every=2, ckpt_every=2), tmp_path / "run").run()
    rows = [
        {"question": r["question"], "choices": json.dumps(r["choices"]), "answer": str(r["answer"])}
        for r in ITEMS
    ]
    with open(tmp_path / "q.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, ["question", "choices", "answer"])
        w.writeheader()
        w.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "q.parquet")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files = [
        tmp_path / "q.csv",
        tmp_path / "q.parquet",
        write_jsonl(tmp_path / "a" / "q.jsonl", ITEMS),
        write_jsonl(tmp_path / "b" / "q.jsonl", ITEMS[:2]),
    ]
    for path in files:
        assert eval_main([str(tmp_path / "run"), "--choices", str(path), "--json"]) == 0
    capsys.readouterr()
    records = evaluate.list_results(tmp_path / "run")
    assert len(records) == 4 and len({r["path"] for r in records}) == 4
    assert sorted(r["settings"]["file"] for r in records) == sorted(str(p) for p in files)
    assert eval_main([str(tmp_path / "run"), "--choices", str(files[0])]) == 0  # again: replaced
    assert len(evaluate.list_results(tmp_path / "run")) == 4


@pytest.mark.parametrize(
    "rows, words",
    [
        ([{"question": "q", "choices": ["a", "b"], "answer": 5}], "answer '5' is not one of"),
        ([{"question": "q", "choices": ["a", "b"], "answer": "C"}], "answer 'C' is not one of"),
        ([{"prompt": "q", "answer": 0}], "found answer, prompt"),
        # what cannot be scored: a tie between equal choices would always pick the first
        (
            [{"question": "q", "choices": ["a", "b", "a"], "answer": 0}],
            "choices 0 and 2 are the same ('a')",
        ),
        ([{"question": "q", "choices": ["a", ""], "answer": 0}], "choice 1 is empty"),
        ([{"question": "q", "choices": ["a", "  "], "answer": 0}], "choice 1 is empty"),
        ([{"question": "q", "choices": [1, 2], "answer": 0}], "choice 0 is int 1, not text"),
        ([{"question": "q", "choices": ["a", None], "answer": 0}], "choice 1 is NoneType"),
        ([{"question": "q", "choices": ["a", ["b"]], "answer": 0}], "choice 1 is list"),
        ([{"question": "q", "A": "x", "B": 2.5, "answer": "A"}], "choice 1 is float 2.5"),
    ],
)
def test_bad_questions_are_one_line_and_exit_2(model, tmp_path, capsys, rows, words):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    assert eval_main([str(model), "--choices", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "line 1" in err and len(err.splitlines()) == 1
    assert str(path) in err and not (tmp_path / "eval").exists()


def test_bad_formats_are_refused_before_the_model_loads(tmp_path, capsys):
    path = write_jsonl(tmp_path / "q.jsonl", ITEMS)
    missing = str(tmp_path / "no-model")  # never loaded: the refusal comes first
    for args, words in [
        (["--template", "{{nope}}"], "--template: 'nope' is undefined"),
        (["--template", "{% if %}"], "--template:"),
        (["--fewshot", "4"], "--fewshot: 4 examples need at least 5 questions"),
        (["--single-turn"], "--single-turn: only with --chat"),
    ]:
        assert eval_main([missing, "--choices", str(path), *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, (args, err)


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("bad.csv", "prompt,A,B,answer\nq,a,b,A\n", "row 1 (line 2): needs the columns"),
        ("bad.csv", "question,A,B,answer\nq,a,b,A\nq, a, b,c,A\n", "row 2 (line 3) has 5 fields"),
        ("bad.csv", 'question,choices,answer\nq,"[""a"", ""b""]",2\n', "answer '2' is not one"),
        (
            "bad.jsonl",
            '{"question": "q", "choices": ["a", "b"], "answer": 0}\n\n[1]\n',
            "line 3: expected an object",
        ),
        (
            "bad.jsonl",
            '{"question": "q", "choices": ["a", "b"], "answer": 0}\n{"question"\n',
            "line 2 is not JSON",
        ),
        ("bad.jsonl", "", "holds no questions"),
    ],
)
def test_bad_rows_name_the_row_or_line(model, tmp_path, capsys, name, content, words):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    assert eval_main([str(model), "--choices", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and str(path) in err and len(err.splitlines()) == 1
    if "needs the columns" in words:
        assert "found A, B, answer, prompt" in err


def test_odd_but_valid_files_read(tmp_path):
    bom = tmp_path / "excel.csv"  # saved by Excel: a byte-order mark before the header
    bom.write_text("\ufeffquestion,A,B,answer\nq,a,b,B\n", encoding="utf-8")
    floats = write_jsonl(
        tmp_path / "floats.jsonl", [{"question": "q", "choices": ["a", "b"], "answer": 1.0}]
    )
    assert scored(evaluate.read_choices(bom)) == scored(evaluate.read_choices(floats))
    latin = tmp_path / "latin.csv"
    latin.write_bytes("question,A,B,answer\nq,\xe9,b,A\n".encode("latin-1"))
    with pytest.raises(evaluate.DataError, match="is not UTF-8 text"):
        evaluate.read_choices(latin)


def test_a_plain_model_folder_writes_no_record(model, tmp_path):
    data = write_jsonl(tmp_path / "q.jsonl", ITEMS)
    inside = tmp_path / "run" / "export" / "model"  # an export kept inside a run folder
    shutil.copytree(model, inside)
    (tmp_path / "run" / "config.yaml").write_text("seq_len: 32\n", encoding="utf-8")
    for folder in (model, inside):
        assert evaluate.write_result(load(folder), data, "choices", {}, {"acc": 1.0}) is None
    assert not (tmp_path / "run" / "eval").exists() and not (model.parent / "eval").exists()


def test_missing_files_and_no_data_are_one_line_exit_2(model, tmp_path, capsys):
    assert eval_main([str(model)]) == 2
    assert "give --text FILE, --choices FILE, --tasks NAME or --report" in capsys.readouterr().err
    assert eval_main([str(model), "--text", str(tmp_path / "nope.txt")]) == 2
    assert "nope.txt not found" in capsys.readouterr().err
    parquet = tmp_path / "q.parquet"
    parquet.write_bytes(b"not parquet")
    assert eval_main([str(model), "--choices", str(parquet)]) == 2
    assert "q.parquet" in capsys.readouterr().err


def test_compare_evaluates_the_model_a_fine_tune_started_from(model, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(model),
        tokenizer="model",
        data=str(text),
        lr=3e-3,
        lora_rank=4,
        max_steps=10,
        eval_every=10,
        ckpt_every=10,
        hidden_dim=32,
        n_heads=4,
        bias=False,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(cfg, tmp_path / "run").run()
    capsys.readouterr()
    assert eval_main([str(tmp_path / "run"), "--text", str(text), "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["start"]["text"] == evaluate.text_metrics(load(model), TEXT)
    # it learned this very text
    assert out["text"]["bits_per_byte"] < out["start"]["text"]["bits_per_byte"]
    record = evaluate.list_results(tmp_path / "run")[0]  # before and after in one record
    assert record["start"] == out["start"]["text"] and record["result"] == out["text"]
    assert eval_main([str(tmp_path / "run"), "--text", str(text), "--compare"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "start" in lines[0] and "fine-tuned" in lines[0] and lines[1].startswith("text")
    Trainer(tiny_config(max_steps=2), tmp_path / "new").run()
    assert eval_main([str(tmp_path / "new"), "--text", str(text), "--compare"]) == 2
    assert "not a fine-tune" in capsys.readouterr().err


def test_cli_question_format_flags_reach_the_prompt(model, tmp_path, capsys):
    """--template, --description, --target-delimiter (\\n typed as two characters, as on a
    command line), --fewshot with its seed, and the chat template."""
    path = write_jsonl(tmp_path / "q.jsonl", ITEMS)
    loaded = load(model)
    items = evaluate.read_choices(path)
    fmt = evaluate.QuestionFormat(
        template="Q: {{question}}\nA:",
        description="Quiz.\n\n",
        target_delimiter="\t",
        fewshot=2,
        seed=7,
    )
    _, requests = evaluate.question_requests(loaded, items, fmt)
    assert requests[0][0][0].startswith("Quiz.\n\nQ: ") and requests[0][0][1] == "\tfour"
    args = [
        str(model),
        "--choices",
        str(path),
        "--template",
        r"Q: {{question}}\nA:",
        "--description",
        r"Quiz.\n\n",
        "--target-delimiter",
        r"\t",
        "--fewshot",
        "2",
        "--fewshot-seed",
        "7",
        "--json",
    ]
    assert eval_main(args) == 0
    assert json.loads(capsys.readouterr().out)["choices"] == evaluate.choice_metrics(
        loaded, items, fmt
    )
    assert eval_main([*args[:-1], "--chat", "--json"]) == 0
    chat = evaluate.QuestionFormat(**{**fmt.__dict__, "chat": True})
    _, turns = evaluate.question_requests(loaded, items, chat)
    assert turns[0][0][0].startswith("<|begin|><|start|>system<|sep|>Quiz.")
    assert turns[0][0][1] == "four"  # after a chat prompt the choice follows with no delimiter
    assert json.loads(capsys.readouterr().out)["choices"] == evaluate.choice_metrics(
        loaded, items, chat
    )
