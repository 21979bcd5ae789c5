"""A sample at an evaluation point names the image it answered: the held-out question's image
tokens are shown as [image NAME] (the cache keeps each image's file name beside its pixels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vision_models import make_gemma3_vision, save_image

from core.data.prepare import data_spec, prepare
from core.data.windows import TokenData
from core.models.vision import attach
from core.training import evaluation
from core.weights import vision
from core.weights.loader import load, open_pretrained


def test_the_sample_names_the_image_of_its_question(tmp_path):
    pytest.importorskip("transformers")
    from helpers import tiny_config

    folder = tmp_path / "base"
    make_gemma3_vision(folder, layers=2)
    data = tmp_path / "d"
    for i in range(3):
        save_image(data / f"pic{i}.png", "png", (40, 30), i)
    records = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": f"pic{i % 3}.png"},
                        {"type": "text", "text": "What colour?"},
                    ],
                },
                {"role": "assistant", "content": "red"},
            ]
        }
        for i in range(8)
    ]
    path = data / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    pre = open_pretrained(folder)
    spec = data_spec(tiny_config(data=str(path), seq_len=80))
    vision.tell_specs([spec], pre, None)
    entry, manifest = prepare(spec, tmp_path / "cache", pre.tokenizer, log=lambda m: None)
    assert sorted(manifest["image_names"]) == [str(data / f"pic{i}.png") for i in range(3)]
    rows = TokenData(entry, manifest, 80, 0)
    (name,) = rows.prompt_image_names()
    model = load(folder).model
    attach(model, vision.load_vision(folder, pre.hf_config))
    text = evaluation.sample_text(model, rows, 4, 0, "cpu", "fp32")
    shown = f"[image {Path(name).name}]"
    assert shown in text and text.count("[image ") == 1
    assert spec.images.token not in text  # the image's tokens are not spelled out
