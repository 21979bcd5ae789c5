"""python -m core.eval RUN --report: the first held-out chat examples answered by the start
model and the fine-tuned one, proven against direct greedy generation of each model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from hf_models import TEXT, make_model  # noqa: E402

from core.cli.eval import main as eval_main  # noqa: E402
from core.data.chatdata import is_val  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.generate import generate_ids, start_ids, stream_text  # noqa: E402
from core.use.report import inline, make_report  # noqa: E402
from core.weights.loader import load  # noqa: E402

ROWS = [{"prompt": f"Add {i} and {i + 1}", "completion": f"{2 * i + 1}"} for i in range(60)]
HELD = [r for i, r in enumerate(ROWS) if is_val(i, 0.05)]  # val_fraction's default
NEW = 12  # prompt + answer stay inside the run's 32-token context: no window slides


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def fine_tune(base, data, run, **overrides):
    values = dict(
        init_from=str(base),
        tokenizer="model",
        data=str(data),
        lr=2e-2,
        max_steps=6,
        eval_every=6,
        ckpt_every=6,
        n_heads=4,
        bias=False,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(tiny_config(**{**values, **overrides}), run).run()
    return run


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(base model folder, chat data, a LoRA fine-tune of the base on it)."""
    tmp = tmp_path_factory.mktemp("report")
    make_model(tmp / "base", "llama")
    data = write_jsonl(tmp / "chat.jsonl", ROWS)
    return tmp / "base", data, fine_tune(tmp / "base", data, tmp / "lora", lora_rank=4)


def greedy_chat(model, tok, user: str) -> str:
    """What `python -m core.generate MODEL --chat --temperature 0` answers."""
    ids, stops, until = start_ids(tok, user, True)
    return "".join(
        stream_text(tok, generate_ids(model, ids, NEW, 0, stop_ids=stops), hide=stops, until=until)
    )


def test_report_answers_held_out_prompts_with_both_models(setup):
    base, _, run = setup
    out = make_report(run, 2, NEW)
    examples = out["examples"]
    assert len(examples) == 2 and len(HELD) == 3  # N of the held-out examples, first first
    tuned, start = load(run), load(base)
    for ex, row in zip(examples, HELD, strict=False):
        assert ex["prompt"] == [{"role": "user", "content": row["prompt"]}]
        assert ex["reference"] == row["completion"]
        assert ex["fine_tuned"] == greedy_chat(tuned.model, tuned.tokenizer, row["prompt"])
        assert ex["start"] == greedy_chat(start.model, tuned.tokenizer, row["prompt"])
    assert any(ex["start"] != ex["fine_tuned"] for ex in examples)  # two models, not one twice
    text = (run / "eval" / "report.md").read_text(encoding="utf-8")
    assert text == out["markdown"] and out["path"] == str(run / "eval" / "report.md")
    assert text.count("## Example") == 2
    for ex in examples:  # the prompt, then the three answers side by side in a table row
        assert f"**user:** {inline(ex['prompt'][0]['content'])}\n" in text
        row = " | ".join(inline(ex[k]) for k in ("reference", "start", "fine_tuned"))
        assert f"\n| {row} |\n" in text
    assert make_report(run, 50, NEW)["examples"][2]["reference"] == HELD[2]["completion"]


def test_cli_report_of_a_full_fine_tune_prints_the_path_and_json(setup, tmp_path, capsys):
    base, data, _ = setup
    run = fine_tune(base, data, tmp_path / "full")  # no LoRA: the base is loaded as is
    assert eval_main([str(run), "--report", "--max-new-tokens", str(NEW)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "eval" / "report.md")
    assert eval_main([str(run), "--report", "1", "--max-new-tokens", str(NEW), "--json"]) == 0
    (ex,) = json.loads(capsys.readouterr().out)["report"]["examples"]
    tuned, start = load(run), load(base)
    assert ex["start"] == greedy_chat(start.model, tuned.tokenizer, HELD[0]["prompt"])
    assert ex["fine_tuned"] == greedy_chat(tuned.model, tuned.tokenizer, HELD[0]["prompt"])


def one_line_error(capsys, argv) -> str:
    assert eval_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_bad_targets_are_one_line_exit_2(setup, tmp_path, capsys, monkeypatch):
    base, data, run = setup
    err = one_line_error(capsys, [str(base), "--report"])
    assert "is not a run folder" in err
    assert "N must be at least 1" in one_line_error(capsys, [str(run), "--report", "0"])
    new = tmp_path / "new"
    Trainer(tiny_config(max_steps=2, sample_tokens=0, data=str(data), seq_len=64), new).run()
    assert "not a fine-tune of a pretrained model" in one_line_error(capsys, [str(new), "--report"])
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    plain = fine_tune(base, text, tmp_path / "plain", max_steps=2, lora_rank=4)
    assert "not trained on chat data" in one_line_error(capsys, [str(plain), "--report"])
    copy = write_jsonl(tmp_path / "copy.jsonl", ROWS)
    monkeypatch.chdir(tmp_path)  # the data named relative to where the run was trained
    gone = fine_tune(base, "copy.jsonl", tmp_path / "gone", max_steps=2, lora_rank=4)
    monkeypatch.chdir(base)  # elsewhere: the files the run was prepared from are found
    assert make_report(gone, 1, 2)["examples"][0]["reference"] == HELD[0]["completion"]
    write_jsonl(copy, [*ROWS, ROWS[0]])  # changed since training: said at the top
    note = f"The data changed since the run prepared it (modified {copy})"
    assert note in make_report(gone, 1, 2)["markdown"]
    copy.unlink()
    assert "data copy.jsonl is gone" in one_line_error(capsys, [str(gone), "--report"])


def test_inline_markdown_keeps_text_as_it_is():
    assert inline("a | b *c* `d` <e> [f](g) #h") == r"a \| b \*c\* \`d\` \<e\> \[f\](g) \#h"
    assert inline("line 1\n\n- line 2\x1e") == "line 1<br/><br/>- line 2\ufffd"
    assert inline(" \n") == "*(empty)*"


def test_the_report_puts_saved_before_after_measures_in_one_table(setup, tmp_path, capsys):
    run = setup[2]
    text = tmp_path / "t.txt"
    text.write_text(TEXT[:400], encoding="utf-8")
    assert eval_main([str(run), "--text", str(text), "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    markdown = make_report(run, 1, NEW)["markdown"]
    assert "## Measures\n\n| Data or task | Measure | Start model | Fine-tuned |" in markdown
    for key in ("bits_per_byte", "word_perplexity"):
        row = f"| t.txt | {key} | {out['start']['text'][key]:.4f} | {out['text'][key]:.4f} |"
        assert row in markdown
