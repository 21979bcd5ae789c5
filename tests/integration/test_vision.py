"""Images through the model, proven against transformers on a tiny Gemma 3 composite built
with its own config classes and processor (tests/vision_models.py): the tower and projector
in the forward pass give transformers' logits with images, uncached and cached, and its
greedy generation; a LoRA fine-tune on chat data with images learns, its hf export loads as
the original class with equal logits with images, and its PEFT adapter on transformers'
composite equals the export."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from vision_models import (  # noqa: E402
    conversation,
    inputs_of,
    make_gemma3_vision,
    reloaded,
    save_image,
)

from core.models.vision import attach  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids  # noqa: E402
from core.weights import vision  # noqa: E402
from core.weights.loader import load, open_pretrained  # noqa: E402

TOLERANCE = 1e-4  # fp32, logits up to about 7


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision") / "base"
    _, processor = make_gemma3_vision(folder)
    return folder, processor


def ours(base, run=None):
    """TrainDeck's model of base (or of a run's latest checkpoint) with base's tower."""
    model = (load(run, "latest") if run else load(base)).model
    attach(model, vision.load_vision(base, open_pretrained(base).hf_config))
    return model.eval()


def test_logits_with_images_equal_transformers_uncached_and_cached(gemma3, tmp_path):
    folder, processor = gemma3
    a = save_image(tmp_path / "a.png", "png", (70, 45), 1)
    b = save_image(tmp_path / "b.jpg", "jpeg", (33, 60), 2)
    messages = conversation(a, "Compare")
    messages[0]["content"].append({"type": "image", "image": str(b)})
    messages[0]["content"].append({"type": "text", "text": "with this one."})
    inputs = inputs_of(processor, messages, [a, b])
    reference = reloaded(folder)
    model = ours(folder)
    with torch.no_grad():
        want = reference(**inputs).logits
        causal = reference(input_ids=inputs["input_ids"], pixel_values=inputs["pixel_values"])
        # an image's tokens see each other both ways: it changes the logits
        assert (causal.logits - want).abs().max() > 0.1
        ids, pixels = inputs["input_ids"], inputs["pixel_values"]
        got = model.logits(ids, images=pixels)
        assert (got - want).abs().max() < TOLERANCE
        first, cache = model.forward_cached(ids[:, :-3], images=pixels)
        assert (first - want[:, :-3]).abs().max() < TOLERANCE
        rest, _ = model.forward_cached(ids[:, -3:], cache)  # text after the images, cached
        assert (rest - want[:, -3:]).abs().max() < TOLERANCE


def test_greedy_generation_with_an_image_equals_transformers(gemma3, tmp_path):
    folder, processor = gemma3
    a = save_image(tmp_path / "a.webp", "webp", (50, 50), 3)
    inputs = inputs_of(processor, conversation(a), [a])
    with torch.no_grad():
        out = reloaded(folder).generate(**inputs, max_new_tokens=6, do_sample=False)
    want = out[0, inputs["input_ids"].shape[1] :].tolist()
    model = ours(folder)
    prompt = inputs["input_ids"][0].tolist()
    for cached in (True, False):
        got = generate_ids(
            model, prompt, len(want), temperature=0, use_cache=cached, images=inputs["pixel_values"]
        )
        assert list(got) == want


def test_a_lora_fine_tune_on_images_learns_and_exports_the_whole_class(gemma3, tmp_path):
    """The loss falls; the hf export is the original class, its logits with images ours;
    PEFT's adapter on transformers' composite equals the export. (That a model learns from
    what it sees: benchmarks/vision_shapes.py.)"""
    from peft import PeftModel

    folder, processor = gemma3
    data = tmp_path / "data"
    lines = []
    for i in range(12):
        save_image(data / "pics" / f"{i % 2}.png", "png", (40, 30), i % 2)
        answer = "red circle" if i % 2 else "blue square"
        messages = conversation(f"pics/{i % 2}.png", answer=answer)
        lines.append(json.dumps({"messages": messages}))  # relative to the data file
    (data / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        data=str(data / "chat.jsonl"),
        lora_rank=4,
        lr=3e-2,
        max_steps=6,
        eval_every=6,
        ckpt_every=6,
        dropout=0.0,
        sample_tokens=3,
        seq_len=48,
    )
    run = tmp_path / "run"
    Trainer(cfg, run).run()
    log = (run / "train.log").read_text()
    assert "vision: gemma3 tower and projector" in log and "frozen" in log
    export(run, "hf", tmp_path / "hf", which="latest")
    export(run, "peft", tmp_path / "peft", which="latest")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [
        "Gemma3ForConditionalGeneration"
    ]
    merged, base = reloaded(tmp_path / "hf"), reloaded(folder)
    picture = data / "pics" / "1.png"
    inputs = inputs_of(processor, conversation(picture), [picture])
    with torch.no_grad():
        want = merged(**inputs).logits
        assert (want - base(**inputs).logits).abs().max() > 0.1  # it trained
        got = ours(folder, run).logits(inputs["input_ids"], images=inputs["pixel_values"])
        assert (got - want).abs().max() < TOLERANCE
        adapted = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        assert (adapted(**inputs).logits - want).abs().max() < TOLERANCE
    _, evals = read_metrics(run / "metrics.jsonl")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]


def test_the_generate_command_answers_about_an_image(gemma3, tmp_path, capsys):
    """core.generate MODEL --chat --image PATH --prompt TEXT: transformers' greedy answer;
    a bad image or a text-only model is one line, exit 2, before any model loads."""
    from hf_models import make_model

    from core.cli.generate import main as generate_main

    folder, processor = gemma3
    picture = save_image(tmp_path / "a.png", "png", (50, 40), 5)
    inputs = inputs_of(processor, conversation(picture), [picture])
    with torch.no_grad():
        out = reloaded(folder).generate(**inputs, max_new_tokens=5, do_sample=False)
    want = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
    want = want.split("<end_of_turn>")[0]
    args = [str(folder), "--chat", "--prompt", "What colour?", "--temperature", "0"]
    args += ["--max-new-tokens", "5", "--image", str(picture)]
    assert generate_main(args) == 0
    assert capsys.readouterr().out.strip() == want.strip()
    (tmp_path / "not.png").write_text("text", encoding="utf-8")
    assert generate_main([*args[:-1], str(tmp_path / "not.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --image: {tmp_path / 'not.png'} is not an image Pillow")
    make_model(tmp_path / "text", "qwen3")
    assert generate_main([str(tmp_path / "text"), *args[1:]]) == 2
    assert "--image: this model reads text only" in capsys.readouterr().err


def test_full_fine_tuning_on_images_resumes_bitwise_and_refuses_changed_images(tmp_path):
    """The checkpoint keeps the language model (the frozen tower is the base's): a run
    stopped and resumed gives the straight run's losses; an image changed since refuses the
    resume as changed data; the hf export's logits with images are TrainDeck's."""
    from helpers import StopAfter

    from core.errors import CheckpointError

    folder = tmp_path / "base"
    _, processor = make_gemma3_vision(folder, layers=2)
    data = tmp_path / "data"
    lines = []
    for i in range(8):
        save_image(data / f"{i % 4}.png", "png", (40, 30), i % 4)
        messages = conversation(f"{i % 4}.png", answer="red" if i % 2 else "blue")
        lines.append(json.dumps({"messages": messages}))
    (data / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        data=str(data / "chat.jsonl"),
        lr=1e-3,
        max_steps=4,
        eval_every=2,
        ckpt_every=2,
        log_every=1,
        sample_tokens=0,
        seq_len=40,
        batch_size=2,
    )
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(2))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    saved = torch.load(latest, weights_only=True)
    assert not [k for k in saved["model"] if k.startswith("vision.")]
    Trainer(cfg, tmp_path / "split", resume_from=latest).run()

    def losses(run):
        return [r["loss"] for r in read_metrics(run / "metrics.jsonl")[0]]

    assert losses(tmp_path / "split") == losses(tmp_path / "straight")
    export(tmp_path / "straight", "hf", tmp_path / "hf", which="latest")
    picture = data / "1.png"
    inputs = inputs_of(processor, conversation(picture), [picture])
    with torch.no_grad():
        want = reloaded(tmp_path / "hf")(**inputs).logits
        model = ours(folder, tmp_path / "straight")
        got = model.logits(inputs["input_ids"], images=inputs["pixel_values"])
        assert (got - want).abs().max() < TOLERANCE
    save_image(data / "2.png", "png", (40, 30), 77)  # another picture under the same name
    with pytest.raises(CheckpointError, match="the data changed since the checkpoint"):
        Trainer(cfg, tmp_path / "split", resume_from=latest).run()
