"""Images through Qwen3-VL and Qwen3.5, proven against transformers on tiny composites built
with their own config classes and image processor (tests/vision_models.py): the tower (2-D
rotary, merger, Qwen3-VL's DeepStack) and the 3-D positions (M-RoPE) give transformers'
logits with images, uncached and cached (Qwen3.5's MoE class too), packed rows each
example's own, and its greedy generation (core.generate --image too); a LoRA fine-tune on
chat data with images runs, its hf export loads as the original class with equal logits
with images, and its PEFT adapter on transformers' composite equals the export."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from vision_models import (  # noqa: E402
    conversation,
    make_qwen_vision,
    qwen_inputs,
    qwen_reloaded,
    save_image,
)

from core.data import images  # noqa: E402
from core.models.vision import attach  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids  # noqa: E402
from core.weights import vision  # noqa: E402
from core.weights.loader import load, open_pretrained  # noqa: E402

TOLERANCE = 1e-4  # fp32, logits up to about 8


KINDS = ["qwen3_vl", "qwen3_5"]  # and Qwen3.5's MoE class, whose logits alone are checked
# (its transformers reference runs the delta rule and the experts slowly)
each_kind = pytest.mark.parametrize("qwen", KINDS, indirect=True)


@pytest.fixture(scope="module", params=[*KINDS, "qwen3_5_moe"])
def qwen(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "base"
    from transformers import AutoTokenizer

    _, processor = make_qwen_vision(folder, request.param)
    return folder, processor, AutoTokenizer.from_pretrained(folder)


def ours(base, run=None):
    """TrainDeck's model of base (or of a run's latest checkpoint) with base's tower."""
    model = (load(run, "latest") if run else load(base)).model
    attach(model, vision.load_vision(base, open_pretrained(base).hf_config))
    return model.eval()


def reference_inputs(processor, tok, messages, paths):
    from PIL import Image

    text = tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=messages[-1]["role"] == "user"
    )
    return qwen_inputs(processor, tok, text, [Image.open(p).convert("RGB") for p in paths])


def our_pixels(base, paths):
    pretrained = open_pretrained(base)
    spec = vision.image_spec(base, pretrained.hf_config, pretrained.tokenizer)
    return images.pixel_batch([images.resized(images.open_rgb(p), spec) for p in paths], spec)


def test_logits_with_images_equal_transformers_uncached_and_cached(qwen, tmp_path):
    folder, processor, tok = qwen
    paths = [
        save_image(tmp_path / "a.png", "png", (70, 45), 1),  # a 3 x 2 grid of tokens
        save_image(tmp_path / "b.jpg", "jpeg", (33, 60), 2),  # 2 x 4: another count
    ]
    inputs = reference_inputs(processor, tok, conversation(paths, "Compare them."), paths)
    pixels = our_pixels(folder, paths)
    assert torch.equal(pixels.values, inputs["pixel_values"])
    assert torch.equal(pixels.grid, inputs["image_grid_thw"])
    ids = inputs["input_ids"]
    model = ours(folder)
    with torch.no_grad():
        want = qwen_reloaded(folder)(**inputs).logits
        got = model.logits(ids, images=pixels)
        assert (got - want).abs().max() < TOLERANCE
        first, cache = model.forward_cached(ids[:, :-3], images=pixels)
        assert (first - want[:, :-3]).abs().max() < TOLERANCE
        rest, _ = model.forward_cached(ids[:, -3:], cache)  # text after the images, cached
        assert (rest - want[:, -3:]).abs().max() < TOLERANCE
        text = tok("What colour is the sky today?", return_tensors="pt")["input_ids"]
        alone = qwen_reloaded(folder)(input_ids=text).logits  # text alone: 1-D positions
        assert (model.logits(text) - alone).abs().max() < TOLERANCE


@each_kind
def test_packed_rows_count_positions_per_example(qwen, tmp_path):
    """Two examples with images packed in one row give each one's logits alone."""
    folder, processor, tok = qwen
    a = save_image(tmp_path / "a.png", "png", (40, 30), 3)
    b = save_image(tmp_path / "b.png", "png", (20, 50), 4)
    one = reference_inputs(processor, tok, conversation([a]), [a])["input_ids"]
    two = reference_inputs(processor, tok, conversation([b], "Which shape?"), [b])["input_ids"]
    model = ours(folder)
    pixels = our_pixels(folder, [a, b])
    row = torch.cat([one, two], dim=1)
    segments = torch.cat([torch.zeros_like(one), torch.ones_like(two)], dim=1)
    with torch.no_grad():
        got = model.logits(row, segments=segments, images=pixels)
        alone = [
            model.logits(one, images=our_pixels(folder, [a])),
            model.logits(two, images=our_pixels(folder, [b])),
        ]
    assert (got - torch.cat(alone, dim=1)).abs().max() < TOLERANCE


@each_kind
def test_greedy_generation_with_an_image_equals_transformers(qwen, tmp_path):
    folder, processor, tok = qwen
    a = save_image(tmp_path / "a.webp", "webp", (50, 40), 3)
    inputs = reference_inputs(processor, tok, conversation([a]), [a])
    with torch.no_grad():
        out = qwen_reloaded(folder).generate(**inputs, max_new_tokens=6, do_sample=False)
    want = out[0, inputs["input_ids"].shape[1] :].tolist()
    model = ours(folder)
    prompt = inputs["input_ids"][0].tolist()
    for cached in (True, False):
        got = generate_ids(
            model,
            prompt,
            len(want),
            temperature=0,
            use_cache=cached,
            images=our_pixels(folder, [a]),
        )
        assert list(got) == want


@each_kind
def test_a_lora_fine_tune_on_images_exports_the_whole_class(qwen, tmp_path):
    """A few LoRA steps on chat data with images of two sizes; the hf export is the original
    class and its logits with images are ours; PEFT's adapter on transformers' composite
    equals the export."""
    from peft import PeftModel

    folder, processor, tok = qwen
    data = tmp_path / "data"
    lines = []
    for i in range(8):
        size = (40, 30) if i % 2 else (24, 56)
        save_image(data / "pics" / f"{i % 2}.png", "png", size, i % 2)
        answer = "red circle" if i % 2 else "blue square"
        lines.append(json.dumps({"messages": conversation([f"pics/{i % 2}.png"], answer=answer)}))
    (data / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        data=str(data / "chat.jsonl"),
        lora_rank=4,
        lr=3e-2,
        max_steps=3,
        eval_every=3,
        ckpt_every=3,
        dropout=0.0,
        sample_tokens=2,
        seq_len=64,
    )
    run = tmp_path / "run"
    Trainer(cfg, run).run()
    log = (run / "train.log").read_text()
    kind = open_pretrained(folder).hf_config["model_type"]
    assert f"vision: {kind} tower" in log and "frozen" in log
    export(run, "hf", tmp_path / "hf", which="latest")
    export(run, "peft", tmp_path / "peft", which="latest")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == open_pretrained(folder).hf_config["architectures"]
    merged, base = qwen_reloaded(tmp_path / "hf"), qwen_reloaded(folder)
    picture = data / "pics" / "1.png"
    inputs = reference_inputs(processor, tok, conversation([picture]), [picture])
    with torch.no_grad():
        want = merged(**inputs).logits
        assert (want - base(**inputs).logits).abs().max() > 1e-3  # it trained
        got = ours(folder, run).logits(inputs["input_ids"], images=our_pixels(folder, [picture]))
        assert (got - want).abs().max() < TOLERANCE
        adapted = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        assert (adapted(**inputs).logits - want).abs().max() < TOLERANCE


@each_kind
def test_the_generate_command_answers_about_an_image(qwen, tmp_path, capsys):
    """core.generate MODEL --chat --image PATH --prompt TEXT: transformers' greedy answer,
    the image's token count its own size's."""
    from core.cli.generate import main as generate_main

    folder, processor, tok = qwen
    picture = save_image(tmp_path / "a.png", "png", (60, 35), 5)
    inputs = reference_inputs(processor, tok, conversation([picture]), [picture])
    with torch.no_grad():
        out = qwen_reloaded(folder).generate(**inputs, max_new_tokens=3, do_sample=False)
    want = tok.decode(out[0, inputs["input_ids"].shape[1] :]).split("<|im_end|>")[0]
    assert want.strip()  # a random model says something
    args = [str(folder), "--chat", "--prompt", "What colour?", "--temperature", "0"]
    args += ["--max-new-tokens", "3", "--image", str(picture)]
    assert generate_main(args) == 0
    assert capsys.readouterr().out.strip() == want.strip()
