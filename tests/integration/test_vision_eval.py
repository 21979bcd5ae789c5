"""core.eval --choices with images: an item's "image": PATH (relative to the questions' file)
is shown to the model before its question and each choice is scored through the one forward
pass with the image; the log-likelihoods equal transformers' on a tiny Gemma 3 composite
given the same text and image; a bad image (before any model loads), an image for a
text-only model and few-shot with images are one line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from vision_models import make_gemma3_vision, reloaded, save_image  # noqa: E402

from core.cli.eval import main as eval_main  # noqa: E402
from core.use import evaluate, scoring  # noqa: E402
from core.weights.loader import load  # noqa: E402

TOLERANCE = 1e-4  # fp32 sums of a few log-probabilities


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    root = tmp_path_factory.mktemp("g3eval")
    _, processor = make_gemma3_vision(root / "base")
    for i in range(2):
        save_image(root / "pics" / f"{i}.png", "png", (40, 30), i)
    rows = [
        {
            "question": "What colour?",
            "choices": ["red", "blue"],
            "answer": i,
            "image": f"pics/{i}.png",
        }
        for i in range(2)
    ]
    rows.append({"question": "No picture here?", "choices": ["yes", "no"], "answer": 0})
    path = root / "questions.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    return root, processor, path


def transformers_ll(model, processor, context: str, continuation: str, picture) -> float:
    """log p(continuation | context) by transformers, the context's <start_of_image> made
    into the image's tokens by its processor."""
    from PIL import Image

    pic = [Image.open(picture).convert("RGB")]
    whole = processor(text=context + continuation, images=pic, return_tensors="pt")
    head = processor(text=context, images=pic, return_tensors="pt")["input_ids"].shape[1]
    ids = whole["input_ids"]
    with torch.no_grad():
        logits = model(**whole).logits[0]
    logp = F.log_softmax(logits[head - 1 : ids.shape[1] - 1].float(), -1)
    return float(logp.gather(1, ids[0, head:, None]).sum())


def test_choices_with_an_image_score_as_transformers(gemma3):
    root, processor, path = gemma3
    loaded = load(root / "base")
    items = evaluate.read_choices(path)
    fmt = evaluate.QuestionFormat()
    shown = evaluate._shown(loaded, items, fmt)
    scored, requests = evaluate.question_requests(loaded, items, fmt)
    flat = [r for rs in requests for r in rs]
    pixels = [shown.get(id(item)) for item in scored for _ in item["choices"]]
    lls = [ll for ll, _ in scoring.loglikelihood(loaded, flat, None, pixels)]
    reference = reloaded(root / "base")
    for n in range(4):  # the two pictured questions' choices
        item = scored[n // 2]
        context = f"<start_of_image>Question: {item['doc']['question']}\nAnswer:"
        want = transformers_ll(
            reference, processor, context, " " + item["choices"][n % 2], item["image"]
        )
        assert abs(lls[n] - want) < TOLERANCE
    assert abs(lls[0] - lls[2]) > 1e-3  # the same text, another picture: another score
    out = evaluate.choice_metrics(loaded, items)
    assert out["n"] == 3 and 0 <= out["acc"] <= 1


def test_the_eval_command_scores_images_and_refuses_bad_ones(gemma3, tmp_path, capsys):
    from hf_models import make_model

    root, _, path = gemma3
    assert eval_main([str(root / "base"), "--choices", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["choices"]["n"] == 3
    (root / "pics" / "bad.png").write_text("not an image", encoding="utf-8")
    bad = tmp_path / "bad.jsonl"
    row = {
        "question": "?",
        "choices": ["a", "b"],
        "answer": 0,
        "image": str(root / "pics" / "bad.png"),
    }
    bad.write_text(json.dumps(row), encoding="utf-8")
    assert eval_main([str(root / "base"), "--choices", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {bad}: line 1: image ") and "\n" not in err
    make_model(tmp_path / "text", "qwen3")
    capsys.readouterr()
    assert eval_main([str(tmp_path / "text"), "--choices", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--choices: this model reads text only" in err
    assert eval_main([str(root / "base"), "--choices", str(path), "--fewshot", "1"]) == 2
    assert "--fewshot: questions with images are scored zero-shot" in capsys.readouterr().err
