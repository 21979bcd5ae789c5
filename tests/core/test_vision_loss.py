"""The loss with images is on text only: an image's tokens never carry the loss, not with
train_on_prompts (every other token of the prompt counts then) and not in a row where several
examples with images are packed; the model's loss is the mean cross-entropy over exactly the
scored positions, whatever the image positions' targets hold."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from vision_models import make_gemma3_vision, save_image

from core.data.prepare import data_spec, prepare
from core.data.windows import TokenData
from core.models.vision import attach
from core.weights import vision
from core.weights.loader import load, open_pretrained


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("g3loss") / "base"
    make_gemma3_vision(folder, layers=2)
    return folder


def packed_row(folder, tmp_path, **kw):
    """The first training row of six short examples with images, 160 tokens long."""
    from helpers import tiny_config

    data = tmp_path / "d"
    lines = []
    for i in range(6):
        save_image(data / f"{i % 3}.png", "png", (40, 30), i % 3)
        user = [{"type": "image", "image": f"{i % 3}.png"}, {"type": "text", "text": "Colour?"}]
        answer = {"role": "assistant", "content": "red" if i % 2 else "blue"}
        lines.append(json.dumps({"messages": [{"role": "user", "content": user}, answer]}))
    (data / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    pre = open_pretrained(folder)
    spec = data_spec(tiny_config(data=str(data / "chat.jsonl"), seq_len=160, **kw))
    vision.tell_specs([spec], pre, None)
    entry, manifest = prepare(spec, tmp_path / "cache", pre.tokenizer, log=lambda m: None)
    rows = TokenData(entry, manifest, 160, 0)
    return rows.train_batch(rows.sample_starts(1) * 0), spec.images.token_id, pre.tokenizer


@pytest.mark.parametrize("on_prompts", [False, True])
def test_image_tokens_never_count_in_a_packed_row(gemma3, tmp_path, on_prompts):
    batch, image_id, tok = packed_row(gemma3, tmp_path, train_on_prompts=on_prompts)
    x, y, weights, seg = batch
    assert int(seg.max()) >= 2  # several examples in the row, each with its image
    is_image = y == image_id
    assert int(is_image.sum()) >= 8  # two images' tokens at least
    assert weights[is_image].sum() == 0
    scored = tok.decode(y[weights > 0].tolist())
    if on_prompts:  # the rest of the prompt counts: its text, the image's start and end marks
        assert "Colour?" in scored and "<start_of_image>" in scored
    else:  # the answers alone, each with its end of turn
        words = scored.replace("<end_of_turn>", " ").split()
        assert len(words) >= 2 and set(words) <= {"red", "blue"}
    model = load(gemma3).model
    attach(model, vision.load_vision(gemma3, open_pretrained(gemma3).hf_config))
    model.eval()
    with torch.no_grad():
        _, loss = model(x, y, weights, seg, images=batch.images)
        other = torch.where(is_image, torch.zeros_like(y), y)  # the image targets changed
        _, same = model(x, other, weights, seg, images=batch.images)
        logits = model.logits(x, segments=seg, images=batch.images)
    keep = weights > 0
    want = F.cross_entropy(logits[keep], y[keep])
    assert abs(float(loss) - float(want)) < 1e-5  # fp32, a mean of a few dozen terms
    assert float(same) == float(loss)  # not a bit of the image positions reaches it
