"""Gemma 4's images through the model, proven against transformers on tiny composites built
with its own config classes and image processor (tests/vision_models.py), dense and E2B-form
(per-layer inputs): its encoder and embed_vision in the forward pass give transformers'
logits with images of several sizes (each image its own token count), uncached and cached,
and its greedy generation; a LoRA fine-tune on chat data with images runs and its hf export
loads as the original class with equal logits with images."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from vision_models import (  # noqa: E402
    conversation,
    inputs_of,
    make_gemma4_vision,
    reloaded4,
    save_image,
)

from core.models.vision import attach  # noqa: E402
from core.models.vision_gemma4 import joined  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids  # noqa: E402
from core.weights import vision  # noqa: E402
from core.weights.loader import load, open_pretrained  # noqa: E402

TOLERANCE = 1e-4  # fp32


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The composites by form, each built once: "dense", "per_layer" (E2B's form)."""
    made = {}

    def get(form):
        if form not in made:
            folder = tmp_path_factory.mktemp(form) / "base"
            made[form] = (folder, make_gemma4_vision(folder, per_layer=form == "per_layer")[1])
        return made[form]

    return get


@pytest.fixture(params=["dense", "per_layer"])
def gemma4(request, built):
    return built(request.param)


def ours(base, run=None):
    """TrainDeck's model of base (or of a run's latest checkpoint) with base's tower."""
    model = (load(run, "latest") if run else load(base)).model
    attach(model, vision.load_vision(base, open_pretrained(base).hf_config))
    return model.eval()


def pixels_of(inputs):
    return joined(inputs["pixel_values"], inputs["image_position_ids"])


def test_logits_with_images_equal_transformers_uncached_and_cached(gemma4, tmp_path):
    folder, processor = gemma4
    a = save_image(tmp_path / "a.png", "png", (70, 45), 1)  # wide: 60 tokens
    b = save_image(tmp_path / "b.jpg", "jpeg", (33, 90), 2)  # tall: another count
    messages = conversation(a, "Compare")
    messages[0]["content"].append({"type": "image", "image": str(b)})
    messages[0]["content"].append({"type": "text", "text": "with this one."})
    inputs = inputs_of(processor, messages, [a, b])
    ids = inputs["input_ids"]
    image = open_pretrained(folder).hf_config["image_token_id"]
    runs = torch.unique_consecutive(ids[0], return_counts=True)
    counts = [int(n) for t, n in zip(*runs, strict=True) if t == image]
    assert len(counts) == 2 and counts[0] != counts[1]  # each image its own count
    reference = reloaded4(folder)
    model = ours(folder)
    with torch.no_grad():
        want = reference(**inputs).logits
        plain = {k: v for k, v in inputs.items() if k != "mm_token_type_ids"}
        causal = reference(**plain).logits
        # an image's tokens see each other both ways in the sliding layers: it counts
        assert (causal - want).abs().max() > 0.05
        pixels = pixels_of(inputs)
        got = model.logits(ids, images=pixels)
        assert (got - want).abs().max() < TOLERANCE
        first, cache = model.forward_cached(ids[:, :-3], images=pixels)
        assert (first - want[:, :-3]).abs().max() < TOLERANCE
        rest, _ = model.forward_cached(ids[:, -3:], cache)  # text after the images, cached
        assert (rest - want[:, -3:]).abs().max() < TOLERANCE


def test_greedy_generation_with_an_image_equals_transformers(gemma4, tmp_path):
    folder, processor = gemma4
    a = save_image(tmp_path / "a.webp", "webp", (50, 50), 3)
    inputs = inputs_of(processor, conversation(a), [a])
    with torch.no_grad():
        out = reloaded4(folder).generate(**inputs, max_new_tokens=6, do_sample=False)
    want = out[0, inputs["input_ids"].shape[1] :].tolist()
    model = ours(folder)
    prompt = inputs["input_ids"][0].tolist()
    for cached in (True, False):
        got = generate_ids(
            model, prompt, len(want), temperature=0, use_cache=cached, images=pixels_of(inputs)
        )
        assert list(got) == want


def test_a_lora_fine_tune_on_images_runs_and_exports_the_whole_class(built, tmp_path):
    """Chat data with images of several aspect ratios (each its own token count): the loss
    falls; the hf export is Gemma4ForConditionalGeneration, its logits with images ours;
    PEFT's adapter on transformers' composite equals the export."""
    from peft import PeftModel

    folder, processor = built("per_layer")
    data = tmp_path / "data"
    sizes = [(40, 30), (30, 44), (50, 50)]
    lines = []
    for i in range(12):
        n = i % 3
        save_image(data / "pics" / f"{n}.png", "png", sizes[n], n)
        answer = ["red circle", "blue square", "green triangle"][n]
        messages = conversation(f"pics/{n}.png", answer=answer)
        lines.append(json.dumps({"messages": messages}))  # relative to the data file
    (data / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        data=str(data / "chat.jsonl"),
        lora_rank=4,
        lr=3e-2,
        max_steps=4,
        eval_every=4,
        ckpt_every=4,
        dropout=0.0,
        sample_tokens=3,
        seq_len=96,
    )
    run = tmp_path / "run"
    Trainer(cfg, run).run()
    log = (run / "train.log").read_text()
    assert "vision: gemma4 tower and projector" in log and "frozen" in log
    export(run, "hf", tmp_path / "hf", which="latest")
    export(run, "peft", tmp_path / "peft", which="latest")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [
        "Gemma4ForConditionalGeneration"
    ]
    merged, base = reloaded4(tmp_path / "hf"), reloaded4(folder)
    picture = data / "pics" / "1.png"
    inputs = inputs_of(processor, conversation(picture), [picture])
    with torch.no_grad():
        want = merged(**inputs).logits
        assert (want - base(**inputs).logits).abs().max() > 0.1  # it trained
        got = ours(folder, run).logits(inputs["input_ids"], images=pixels_of(inputs))
        assert (got - want).abs().max() < TOLERANCE
        adapted = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        assert (adapted(**inputs).logits - want).abs().max() < TOLERANCE
    _, evals = read_metrics(run / "metrics.jsonl")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]


def test_the_generate_command_answers_about_an_image(built, tmp_path, capsys):
    """core.generate MODEL --chat --image PATH --prompt TEXT on Gemma 4: transformers'
    greedy answer (the image processed by TrainDeck's own code, its token count its own)."""
    from core.cli.generate import main as generate_main

    folder, processor = built("dense")
    picture = save_image(tmp_path / "a.png", "png", (60, 36), 5)
    inputs = inputs_of(processor, conversation(picture), [picture])
    with torch.no_grad():
        out = reloaded4(folder).generate(**inputs, max_new_tokens=5, do_sample=False)
    want = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
    want = want.split("<turn|>")[0]
    args = [str(folder), "--chat", "--prompt", "What colour?", "--temperature", "0"]
    args += ["--max-new-tokens", "5", "--image", str(picture)]
    assert generate_main(args) == 0
    assert capsys.readouterr().out.strip() == want.strip()


def test_a_vision_config_that_leaves_fields_out_means_transformers_defaults():
    """A released config.json may leave out what equals Gemma4VisionConfig's defaults: the
    tower reads the same values transformers would."""
    import transformers as t

    from core.models.vision_gemma4 import DEFAULTS, settings

    defaults = t.Gemma4VisionConfig()
    for key, value in DEFAULTS.items():
        assert getattr(defaults, key) == value, key
    assert settings({"hidden_size": 32, "head_dim": None})["head_dim"] == 64
