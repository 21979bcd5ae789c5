"""python -m core.eval: perplexity and bits per byte of a text, multiple-choice accuracy as
lm-evaluation-harness scores it, proven against transformers on tiny random models."""

from __future__ import annotations

import csv
import json
import math
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from hf_models import TEXT, make_model  # noqa: E402

from core.cli.eval import main as eval_main  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use import evaluate  # noqa: E402
from core.weights.loader import load  # noqa: E402

ITEMS = [
    {"question": "2 + 2 is", "choices": ["four", "five", "a fox"], "answer": 0},
    {"question": "The quick brown fox jumps over the", "choices": ["lazy dog", "moon"],
     "answer": "A"},
    {"question": "def add(a, b): return", "choices": ["a + b", "hello world", "0"], "answer": 1},
    {"question": "Numbers: 0 1 2", "choices": ["3 4", "x y"], "answer": "0"},
]  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval") / "llama"
    make_model(folder, "llama")
    return folder


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
    shot = f"Question: {items[0]['question']}\nAnswer: {items[0]['choices'][0]}\n\n"
    for shots in ("", shot):  # zero-shot and with one worked example before the question
        for item in items:
            ours = evaluate.choice_scores(loaded, item, shots)
            context = f"{shots}Question: {item['question']}\nAnswer:"
            theirs = [hf_loglikelihood(hf_model, tok, context, " " + c) for c in item["choices"]]
            assert [s for s, _ in ours] == pytest.approx(theirs, abs=1e-4)
            assert max(range(len(ours)), key=lambda i: ours[i][0]) == max(
                range(len(theirs)), key=theirs.__getitem__
            )
            assert [b for _, b in ours] == [len((" " + c).encode()) for c in item["choices"]]


def test_perplexity_equals_transformers_on_the_same_tokens(model, hf):
    hf_model, tok = hf
    loaded = load(model)
    text = TEXT[:600]
    result = evaluate.text_metrics(loaded, text)
    ids = tok(text)["input_ids"]  # BOS first, as this tokenizer adds one
    assert ids == evaluate._ids(loaded, text) and ids[0] == tok.bos_token_id
    n = loaded.model.config.seq_len
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, n):  # non-overlapping windows of the context
        window = torch.tensor([ids[start : start + n + 1]])
        with torch.no_grad():
            logits = hf_model(window[:, :-1]).logits[0].float()
        nll += float(torch.nn.functional.cross_entropy(logits, window[0, 1:], reduction="sum"))
        count += window.shape[1] - 1
    assert count == result["tokens"] == len(ids) - 1 and count > 2 * n  # several windows
    assert result["ppl"] == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert result["bytes"] == len(text.encode())
    assert result["bpb"] == pytest.approx(nll / math.log(2) / len(text.encode()), rel=1e-5)
    assert result["bpb"] == pytest.approx(
        math.log(result["ppl"]) * result["tokens"] / math.log(2) / result["bytes"], rel=1e-9
    )


def test_csv_jsonl_and_the_letter_layout_read_the_same(model, tmp_path):
    jsonl = write_jsonl(tmp_path / "q.jsonl", ITEMS)
    with open(tmp_path / "q.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, ["question", "choices", "answer"])
        w.writeheader()
        for r in ITEMS:
            w.writerow({**r, "choices": json.dumps(r["choices"])})
    letters = [{"question": r["question"], **dict(zip("ABC", r["choices"], strict=False)),
                "answer": "ABC"[evaluate._item(r, "t")["answer"]]} for r in ITEMS]  # fmt: skip
    layout = write_jsonl(tmp_path / "letters.jsonl", letters)
    read = [evaluate.read_choices(p) for p in (jsonl, tmp_path / "q.csv", layout)]
    assert read[0] == read[1] == read[2]
    assert [r["answer"] for r in read[0]] == [0, 0, 1, 0]
    as_letters = write_jsonl(
        tmp_path / "letters_answer.jsonl",
        [{**r, "answer": "abc"[a["answer"]]} for r, a in zip(ITEMS, read[0], strict=True)],
    )
    as_indexes = write_jsonl(
        tmp_path / "index_answer.jsonl",
        [{**r, "answer": a["answer"]} for r, a in zip(ITEMS, read[0], strict=True)],
    )
    assert evaluate.read_choices(as_letters) == evaluate.read_choices(as_indexes) == read[0]
    loaded = load(model)
    assert evaluate.choice_metrics(loaded, read[0]) == evaluate.choice_metrics(loaded, read[2])


def test_json_output_and_the_run_folder_record(tmp_path, capsys):
    Trainer(tiny_config(max_steps=3, eval_every=3, ckpt_every=3), tmp_path / "run").run()
    questions = write_jsonl(tmp_path / "q.jsonl", ITEMS)
    text = tmp_path / "t.txt"
    text.write_text(TEXT[:500], encoding="utf-8")
    capsys.readouterr()
    args = [str(tmp_path / "run"), "--text", str(text), "--choices", str(questions),
            "--fewshot", "1", "--json"]  # fmt: skip
    assert eval_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"text", "choices"} and out["choices"]["n"] == 3
    assert out["text"]["ppl"] > 1 and 0 <= out["choices"]["acc"] <= 1
    record = json.loads((tmp_path / "run" / "eval" / "q.json").read_text())
    assert record["result"] == out["choices"] and record["settings"]["fewshot"] == 1
    assert len(record["data_fingerprint"]) == 16 and record["step"] == 3


@pytest.mark.parametrize(
    "rows, words",
    [
        ([{"question": "q", "choices": ["a", "b"], "answer": 5}], "answer '5' is not one of"),
        ([{"question": "q", "choices": ["a", "b"], "answer": "C"}], "answer 'C' is not one of"),
        ([{"prompt": "q", "answer": 0}], "found answer, prompt"),
    ],
)
def test_bad_questions_are_one_line_and_exit_2(model, tmp_path, capsys, rows, words):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    assert eval_main([str(model), "--choices", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "line 1" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("bad.csv", "prompt,A,B,answer\nq,a,b,A\n", "row 1 (line 2): needs the columns"),
        ("bad.csv", "question,A,B,answer\nq,a,b,A\nq, a, b,c,A\n", "row 2 (line 3) has 5 fields"),
        ("bad.csv", 'question,choices,answer\nq,"[""a"", ""b""]",2\n', "answer '2' is not one"),
        ("bad.jsonl", '{"question": "q", "choices": ["a", "b"], "answer": 0}\n\n[1]\n',
         "line 3: expected an object"),
        ("bad.jsonl", '{"question": "q", "choices": ["a", "b"], "answer": 0}\n{"question"\n',
         "line 2 is not JSON"),
        ("bad.jsonl", "", "holds no questions"),
    ],
)  # fmt: skip
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
    floats = write_jsonl(tmp_path / "floats.jsonl", [{"question": "q", "choices": ["a", "b"],
                                                      "answer": 1.0}])  # fmt: skip
    assert evaluate.read_choices(bom) == evaluate.read_choices(floats)
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
    assert "give --text FILE, --choices FILE or both" in capsys.readouterr().err
    assert eval_main([str(model), "--text", str(tmp_path / "nope.txt")]) == 2
    assert "nope.txt not found" in capsys.readouterr().err
    parquet = tmp_path / "q.parquet"
    parquet.write_bytes(b"not parquet")
    assert eval_main([str(model), "--choices", str(parquet)]) == 2
    assert "q.parquet" in capsys.readouterr().err


def test_compare_evaluates_the_model_a_fine_tune_started_from(model, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    cfg = tiny_config(init_from=str(model), tokenizer="model", data=str(text), lr=3e-3,
                      lora_rank=4, max_steps=10, eval_every=10, ckpt_every=10, hidden_dim=32,
                      n_heads=4, bias=False, dropout=0.0, sample_tokens=0)  # fmt: skip
    Trainer(cfg, tmp_path / "run").run()
    capsys.readouterr()
    assert eval_main([str(tmp_path / "run"), "--text", str(text), "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["start"]["text"] == evaluate.text_metrics(load(model), TEXT)
    assert out["text"]["ppl"] < out["start"]["text"]["ppl"]  # it learned this very text
    assert eval_main([str(tmp_path / "run"), "--text", str(text), "--compare"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "start" in lines[0] and "fine-tuned" in lines[0] and lines[1].startswith("text")
    Trainer(tiny_config(max_steps=2), tmp_path / "new").run()
    assert eval_main([str(tmp_path / "new"), "--text", str(text), "--compare"]) == 2
    assert "not a fine-tune" in capsys.readouterr().err
