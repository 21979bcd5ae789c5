"""core.eval's measures against lm-evaluation-harness itself (0.4.13, its hf backend) on a tiny
random Llama and local task YAMLs: per-request log-likelihoods, acc / acc_norm / acc_bytes and
each item's picks, rolling perplexities, greedy generate_until, the chat template with few-shot
as multi-turn, and TrainDeck's model behind lm_eval's LM interface."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

from helpers import LM_EVAL_MC as MC  # noqa: E402
from hf_models import TEXT, make_model  # noqa: E402

from core.use import evaluate, harness, scoring  # noqa: E402
from core.weights.loader import load  # noqa: E402

ITEMS = [
    {
        "question": "2 + 2 is",
        "context": "Two and two make",
        "choices": ["four", "five", "a fox"],
        "answer": 0,
        "topic": "sums",
    },
    {
        "question": "The quick brown fox jumps over the",
        "context": "A fox jumps over the",
        "choices": ["lazy dog", "moon"],
        "answer": 0,
        "topic": "animals",
    },
    {
        "question": "def add(a, b): return",
        "context": "def add(a, b):\n    return",
        "choices": ["a + b", "hello world", "0"],
        "answer": 1,
        "topic": "code",
    },
    {
        "question": "Numbers: 0 1 2",
        "context": "0 1 2",
        "choices": ["3 4", " x y"],
        "answer": 0,
        "topic": "sums",
    },
    {
        "question": "Hello",
        "context": "Hello ",
        "choices": ["world", "model", "Ünïcödé"],
        "answer": 2,
        "topic": "words",
    },
    {
        "question": "Emoji",
        "context": "A snowman:",
        "choices": ["\u2603", "a b c d e"],
        "answer": 0,
        "topic": "words",
    },
]
DOCS = [TEXT[:700], "Hello world, hello model.", TEXT[300:1500], "Ünïcödé \u2603  stays whole"]
GENERATE = [
    {"question": "The quick brown", "answer": "fox"},
    {"question": "0 1 2 3", "answer": "4"},
    {"question": "def add(a, b):", "answer": "return"},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("harness") / "llama"
    make_model(path, "llama")
    return path


@pytest.fixture(scope="module")
def hf_lm(folder):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(folder), batch_size=1, device="cpu", dtype="float32")


def task_yaml(folder, name: str, rows: list[dict], body: str):
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    path = folder / f"{name}.yaml"
    path.write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"test_split: test\nfewshot_split: test\n{body}",
        encoding="utf-8",
    )
    return path, data


def run_lm_eval(lm, yaml_path, **kwargs):
    import lm_eval
    from lm_eval.tasks import TaskManager

    name = yaml_path.stem
    manager = TaskManager(include_path=str(yaml_path.parent), include_defaults=False)
    out = lm_eval.simple_evaluate(
        model=lm, tasks=[name], task_manager=manager, log_samples=True, bootstrap_iters=0, **kwargs
    )
    samples = sorted(out["samples"][name], key=lambda s: s["doc_id"])
    return {k.split(",")[0]: v for k, v in out["results"][name].items()}, samples


@pytest.mark.parametrize(
    "template, description, fewshot",
    [
        (None, "", 0),  # the question frame, as before
        ("context", "", 0),  # the context as is, no frame (HellaSwag-style completions)
        ("Topic {{topic}}. {{question}}\nA:", "Answer each question.\n\n", 2),
    ],
)
def test_questions_equal_lm_eval(folder, hf_lm, tmp_path, template, description, fewshot):
    text = template or evaluate.FRAME.replace("{question}", "{{question}}")
    extra = f"description: {json.dumps(description)}\n" if description else ""
    # without a template: a file with no context column gets the question frame
    rows = ITEMS if template else [{k: v for k, v in r.items() if k != "context"} for r in ITEMS]
    yaml_path, data = task_yaml(
        tmp_path, "td_mc", rows, f"doc_to_text: {json.dumps(text)}\n" + extra + MC
    )
    theirs, samples = run_lm_eval(hf_lm, yaml_path, num_fewshot=fewshot)
    loaded = load(folder)
    fmt = evaluate.QuestionFormat(template=template, description=description, fewshot=fewshot)
    items = evaluate.read_choices(data)
    _, requests = evaluate.question_requests(loaded, items, fmt)
    for sample, ours in zip(samples, requests, strict=True):
        assert [tuple(a) for a in sample["arguments"]] == ours  # the same prompts
        lls = [ll for ll, _ in scoring.loglikelihood(loaded, ours)]
        assert lls == pytest.approx([r[0][0] for r in sample["resps"]], abs=1e-5)
    result = evaluate.choice_metrics(loaded, items, fmt)
    for name in ("acc", "acc_norm", "acc_bytes"):
        assert result[name] == theirs[name]
        assert [
            p[("acc", "acc_norm", "acc_bytes").index(name)] == i["answer"]
            for p, i in zip(result["picks"], items, strict=True)
        ] == [s[name] == 1.0 for s in samples]


def test_acc_norm_is_per_character_and_acc_bytes_per_byte(folder):
    """The two differ where a choice has multi-byte characters; the delimiter is not counted."""
    loaded = load(folder)
    items = [evaluate._item(r, "t") for r in ITEMS]
    result = evaluate.choice_metrics(loaded, items)
    _, requests = evaluate.question_requests(loaded, items, evaluate.QuestionFormat())
    for item, reqs, pick in zip(items, requests, result["picks"], strict=True):
        lls = [ll for ll, _ in scoring.loglikelihood(loaded, reqs)]
        per_char = [ll / len(c) for ll, c in zip(lls, item["choices"], strict=True)]
        per_byte = [ll / len(c.encode()) for ll, c in zip(lls, item["choices"], strict=True)]
        assert pick == [
            lls.index(max(lls)),
            per_char.index(max(per_char)),
            per_byte.index(max(per_byte)),
        ]


def test_rolling_perplexity_equals_lm_eval(folder, hf_lm, tmp_path):
    body = (
        'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n"
        "  - metric: bits_per_byte\n"
    )
    yaml_path, data = task_yaml(tmp_path, "td_ppl", [{"text": d} for d in DOCS], body)
    theirs, samples = run_lm_eval(hf_lm, yaml_path)
    loaded = load(folder)
    assert len(scoring.tok_encode(loaded.tokenizer, DOCS[2])) > 2 * loaded.model.config.seq_len
    rolled = scoring.loglikelihood_rolling(loaded, DOCS)
    # a document's sum of float32 window sums, each token's log-prob from logits of other
    # batch shapes: a few float32 steps of the sum (1.6e-7 seen under plain kernels)
    want = [s["resps"][0][0] for s in samples]
    assert [r["ll"] for r in rolled] == pytest.approx(want, rel=8 * 2**-23)
    for doc in DOCS:
        windows = scoring.rolling_windows(
            scoring.tok_encode(loaded.tokenizer, doc), hf_lm.prefix_token_id, hf_lm.max_length
        )
        # one window a call, as loglikelihood_rolling sends them at batch size 1
        theirs_w = [hf_lm._loglikelihood_tokens([(None, c, x)])[0] for c, x in windows]
        ours_w = scoring.loglikelihood_tokens(loaded, windows)
        # within 1e-5, or one float32 step of a large window sum (3e-5 at -479)
        assert [w[0] for w in ours_w] == pytest.approx([w[0] for w in theirs_w], abs=1e-5, rel=1e-7)
    ours = evaluate.text_metrics(loaded, evaluate.read_documents(data))
    assert ours["bits_per_byte"] == pytest.approx(theirs["bits_per_byte"], abs=1e-6)
    for name in ("word_perplexity", "byte_perplexity"):  # a random model's: 10^4, so relative
        assert ours[name] == pytest.approx(theirs[name], rel=1e-6)
    assert ours["token_perplexity"] == pytest.approx(
        math.exp(-ours["loglikelihood"] / ours["tokens"])
    )


def test_rolling_windows_are_lm_eval_s(folder):
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    for n in (1, 5, 8, 9, 17, 40):
        tokens = list(range(100, 100 + n))
        theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 7, 8, 1)]
        assert scoring.rolling_windows(tokens, 7, 8) == theirs


def test_encode_pair_moves_trailing_spaces_like_lm_eval(folder, hf_lm):
    tok = load(folder).tokenizer
    for context, continuation in [
        ("Hello ", "world"),
        ("Answer:  ", "a b"),
        ("", " four"),
        ("x\n", "y"),
        ("<|begin|>Hi", " there"),
    ]:
        if context:
            assert scoring.encode_pair(tok, context, continuation) == hf_lm._encode_pair(
                context, continuation
            )
        for text in (context + continuation, continuation):
            assert scoring.tok_encode(tok, text) == hf_lm.tok_encode(text)


def test_generate_until_equals_lm_eval_greedy(folder, hf_lm, tmp_path):
    body = (
        'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: answer\n'
        'generation_kwargs:\n  until: ["\\n", "."]\n  max_gen_toks: 12\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n"
    )
    yaml_path, _ = task_yaml(tmp_path, "td_gen", GENERATE, body)
    _, theirs = run_lm_eval(hf_lm, yaml_path)
    ours_lm = harness.make_lm(load(folder))
    _, ours = run_lm_eval(ours_lm, yaml_path)
    assert [s["resps"] for s in ours] == [s["resps"] for s in theirs]
    assert any(s["resps"][0][0] for s in ours)  # it generated something


def test_chat_template_with_fewshot_as_multiturn_equals_lm_eval(folder, hf_lm, tmp_path):
    body = 'doc_to_text: "{{question}}"\ndescription: "Be brief."\n' + MC
    yaml_path, data = task_yaml(tmp_path, "td_chat", ITEMS, body)
    loaded = load(folder)
    items = evaluate.read_choices(data)
    for multiturn in (True, False):
        theirs, samples = run_lm_eval(
            hf_lm,
            yaml_path,
            num_fewshot=2,
            apply_chat_template=True,
            fewshot_as_multiturn=multiturn,
        )
        fmt = evaluate.QuestionFormat(
            template="question", description="Be brief.", fewshot=2, chat=True, multiturn=multiturn
        )
        _, requests = evaluate.question_requests(loaded, items, fmt)
        assert [[tuple(a) for a in s["arguments"]] for s in samples] == requests
        assert requests[0][0][0].startswith("<|begin|><|start|>system<|sep|>Be brief.")
        result = evaluate.choice_metrics(loaded, items, fmt)
        assert [result[k] for k in ("acc", "acc_norm", "acc_bytes")] == [
            theirs[k] for k in ("acc", "acc_norm", "acc_bytes")
        ]


def test_the_lm_wrapper_gives_lm_eval_s_numbers(folder, hf_lm, tmp_path):
    yaml_path, _ = task_yaml(tmp_path, "td_wrap", ITEMS, 'doc_to_text: "{{context}}"\n' + MC)
    theirs, their_samples = run_lm_eval(hf_lm, yaml_path, num_fewshot=1)
    ours, our_samples = run_lm_eval(harness.make_lm(load(folder)), yaml_path, num_fewshot=1)
    for name in ("acc", "acc_norm", "acc_bytes"):
        assert ours[name] == theirs[name]
    for a, b in zip(our_samples, their_samples, strict=True):
        assert [r[0][0] for r in a["resps"]] == pytest.approx(
            [r[0][0] for r in b["resps"]], abs=1e-5
        )
        assert [r[0][1] for r in a["resps"]] == [r[0][1] for r in b["resps"]]  # is_greedy


@pytest.fixture(scope="module")
def lora_run(folder, tmp_path_factory):
    from helpers import tiny_config

    from core.training.trainer import Trainer

    root = tmp_path_factory.mktemp("lora")
    text = root / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        data=str(text),
        lr=3e-3,
        lora_rank=4,
        max_steps=6,
        eval_every=6,
        ckpt_every=6,
        hidden_dim=32,
        n_heads=4,
        bias=False,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(cfg, root / "run").run()
    return root / "run"


def test_a_lora_run_unmerged_equals_lm_eval_on_its_merged_export(lora_run, tmp_path):
    """The adapters stay on and unmerged behind the LM interface; lm_eval's hf backend reads
    the merged export: the same log-likelihoods, picks and perplexities."""
    from lm_eval.models.huggingface import HFLM

    from core.models import lora
    from core.use.export import export

    export(lora_run, "hf", tmp_path / "merged", log=lambda _: None)
    theirs_lm = HFLM(
        pretrained=str(tmp_path / "merged"), batch_size=1, device="cpu", dtype="float32"
    )
    loaded = load(lora_run)
    assert any(lora.is_adapter(k) for k in loaded.model.state_dict())  # not merged
    ours_lm = harness.make_lm(loaded)
    assert ours_lm.max_length == theirs_lm.max_length
    mc, _ = task_yaml(tmp_path, "td_lora", ITEMS, 'doc_to_text: "{{context}}"\n' + MC)
    theirs, their_samples = run_lm_eval(theirs_lm, mc, num_fewshot=1)
    ours, our_samples = run_lm_eval(ours_lm, mc, num_fewshot=1)
    assert {k: ours[k] for k in ("acc", "acc_norm", "acc_bytes")} == {
        k: theirs[k] for k in ("acc", "acc_norm", "acc_bytes")
    }
    for a, b in zip(our_samples, their_samples, strict=True):
        assert [r[0][0] for r in a["resps"]] == pytest.approx(
            [r[0][0] for r in b["resps"]], abs=1e-5
        )
    body = (
        'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: bits_per_byte\n  - metric: word_perplexity\n"
    )
    ppl, _ = task_yaml(tmp_path, "td_lora_ppl", [{"text": d} for d in DOCS], body)
    theirs, _ = run_lm_eval(theirs_lm, ppl)
    ours, _ = run_lm_eval(ours_lm, ppl)
    assert ours["bits_per_byte"] == pytest.approx(theirs["bits_per_byte"], abs=1e-6)
    assert ours["word_perplexity"] == pytest.approx(theirs["word_perplexity"], rel=1e-6)


def test_eval_tasks_on_a_run_are_saved_with_the_start_model_beside(lora_run, tmp_path, capsys):
    from core.cli.eval import main as eval_main

    mc, _ = task_yaml(tmp_path, "td_cli", ITEMS, 'doc_to_text: "{{context}}"\n' + MC)
    args = [str(lora_run), "--tasks", str(mc), "--compare", "--limit", "4", "--json"]
    assert eval_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["tasks"]["td_cli"]) >= {"acc", "acc_norm", "acc_bytes", "acc_stderr"}
    record = next(r for r in evaluate.list_results(lora_run) if r["kind"] == "tasks")
    assert record["result"]["tasks"] == out["tasks"] and record["result"]["n"]["td_cli"] == 4
    assert record["start"]["tasks"] == out["start"]["tasks"]
    # the table: each measure of each task, the start model beside the fine-tune
    assert eval_main([str(lora_run), "--tasks", str(mc), "--compare", "--limit", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "start" in lines[0] and "fine-tuned" in lines[0]
    assert any(line.split()[:2] == ["td_cli", "acc_norm"] for line in lines)


def test_without_lm_eval_tasks_say_how_to_install_it(folder, tmp_path, capsys, monkeypatch):
    import subprocess
    import sys

    from core.cli.eval import main as eval_main

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    assert eval_main([str(folder), "--tasks", "hellaswag"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install "traindeck[eval]"' in err
    # core.eval's own measures do not import it
    code = (
        "import sys, core.eval, core.use.evaluate, core.use.harness; "
        "print('lm_eval' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert done.stdout.strip() == "False"


def test_a_4_bit_lora_run_is_evaluated_as_it_trained(folder, tmp_path):
    """The base quantized to NF4 as training made it, the adapters on: the same logits as the
    trainer's own model of the run, and lm_eval runs on it."""
    pytest.importorskip("bitsandbytes")
    import torch
    from helpers import tiny_config

    from core.runs import checkpoint as ckpt
    from core.training.inputs import build_model
    from core.training.trainer import Trainer
    from core.weights.loader import open_pretrained

    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        data=str(text),
        lr=3e-3,
        lora_rank=4,
        base_bits="4",
        max_steps=3,
        eval_every=3,
        ckpt_every=3,
        hidden_dim=32,
        n_heads=4,
        bias=False,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(cfg, tmp_path / "run").run()
    loaded = evaluate.load_model(tmp_path / "run")
    quantized = [m for m in loaded.model.modules() if type(m).__name__ == "Linear4bit"]
    assert quantized and all(m.weight.dtype == torch.uint8 for m in quantized)
    trained = build_model(
        loaded.config, open_pretrained(folder), torch.device("cpu"), "fp32", lambda _: None
    )
    trained.load_state_dict(ckpt.load(loaded.checkpoint)["model"], strict=False)
    ids = torch.tensor([scoring.tok_encode(loaded.tokenizer, TEXT[:200])[:32]])
    with torch.no_grad():
        ours, theirs = loaded.model.logits(ids), trained.eval().logits(ids)
        plain = load(tmp_path / "run").model.logits(ids)  # the 32-bit base: not what trained
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert not torch.allclose(ours, plain, atol=1e-3)
    yaml_path, _ = task_yaml(tmp_path, "td_q4", ITEMS, 'doc_to_text: "{{context}}"\n' + MC)
    result, _ = run_lm_eval(harness.make_lm(loaded), yaml_path)
    assert 0 <= result["acc"] <= 1


def test_bad_tasks_are_refused_before_the_model_loads(tmp_path, capsys):
    from core.cli.eval import main as eval_main

    missing_data, _ = task_yaml(tmp_path, "td_gone", ITEMS, MC)
    (tmp_path / "td_gone.jsonl").unlink()
    (tmp_path / "no_task.yaml").write_text("dataset_path: json\n", encoding="utf-8")
    never = str(tmp_path / "no-model")  # never loaded: each refusal comes first
    for tasks, words in [
        (str(tmp_path / "nope.yaml"), "nope.yaml not found"),
        (str(tmp_path / "no_task.yaml"), "names no task"),
        (str(missing_data), "cannot be read: Unable to find"),
    ]:
        assert eval_main([never, "--tasks", tasks]) == 2, tasks
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, (tasks, err)


def test_rolling_in_chunks_sums_the_same(folder, monkeypatch):
    """Windows scored a few at a time, across documents: the same sums as all at once."""
    loaded = load(folder)
    whole = scoring.loglikelihood_rolling(loaded, DOCS)
    monkeypatch.setattr(scoring, "ROLLING_CHUNK", 2)
    chunked = scoring.loglikelihood_rolling(loaded, DOCS)
    assert [r["tokens"] for r in chunked] == [r["tokens"] for r in whole]
    assert [r["ll"] for r in chunked] == pytest.approx([r["ll"] for r in whole], abs=1e-4)
