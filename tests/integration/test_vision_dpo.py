"""DPO with images on a tiny Gemma 3 composite (tests/vision_models.py): pairs whose prompt
shows an image, in both data forms (message parts; a prompt with <image> and an "images"
list), each pair's two rows carrying the prompt's image. Step 0 is ln 2 (the reference is
the starting model, images included); after LoRA steps with --train-vision, the policy's and
the reference's answer log-probabilities equal transformers' (the merged hf export's and
the base's) on the same rows and pixels, so the DPO loss is the one TRL's formula gives."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from vision_models import make_gemma3_vision, reloaded, save_image  # noqa: E402

from core.models import lora  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training import dpo  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402

TOLERANCE = 1e-4  # fp32 sums of a few log-probabilities


def pairs(folder):
    out = []
    for i in range(8):
        save_image(folder / f"{i % 2}.png", "png", (40, 30), i % 2)
        good, bad = ("red", "blue") if i % 2 else ("blue", "red")
        if i < 4:  # message parts (held out: pairs 3 and 7, one of each form)
            parts = [
                {"type": "image", "image": f"{i % 2}.png"},
                {"type": "text", "text": "Colour?"},
            ]
            prompt = [{"role": "user", "content": parts}]
            out.append({"prompt": prompt, "chosen": good, "rejected": bad})
        else:  # ShareGPT's images list and its <image> mark
            out.append(
                {
                    "prompt": "<image>Colour?",
                    "images": [f"{i % 2}.png"],
                    "chosen": good,
                    "rejected": bad,
                }
            )
    (folder / "pairs.jsonl").write_text("\n".join(json.dumps(p) for p in out), encoding="utf-8")
    return folder / "pairs.jsonl"


def transformers_logps(model, x, y, mask, pixels, image_id):
    """Each row's answer log-probability by transformers' composite, one row at a time."""
    out, at = [], 0
    for i in range(len(x)):
        n = int((x[i] == image_id).sum()) // 4  # the tiny tower's 4 tokens an image
        ids = x[i : i + 1]
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                pixel_values=pixels[at : at + n],
                token_type_ids=(ids == image_id).long(),
            ).logits
        at += n
        logp = F.log_softmax(logits[0].float(), -1).gather(1, y[i][:, None])[:, 0]
        out.append((logp * mask[i]).sum())
    return torch.stack(out)


def test_dpo_on_pairs_with_images_equals_transformers(tmp_path):
    base = tmp_path / "base"
    make_gemma3_vision(base)
    data = pairs(tmp_path / "data")
    cfg = tiny_config(
        init_from=str(base),
        tokenizer="model",
        data=str(data),
        method="dpo",
        lora_rank=4,
        train_vision=True,
        lr=2e-2,
        seq_len=40,
        dropout=0.0,
        max_steps=4,
        eval_every=4,
        ckpt_every=4,
        sample_tokens=0,
        val_fraction=0.25,
        warmup_steps=1,
    )
    t = Trainer(cfg, tmp_path / "run")
    t.run()
    train, _ = read_metrics(t.folder.path / "metrics.jsonl")
    assert train[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    batch = t.data.pair_batch(t.data.val_pair_starts(2), val=True)
    x, y, mask, _ = batch
    image_id = t.model.vision.options.token_id
    assert batch.images is not None and len(batch.images) == int((x == image_id).sum()) // 4
    t.model.eval()
    with torch.no_grad():
        policy, _ = dpo.answer_logps(t.model, t.model, x, y, mask, images=batch.images)
        with lora.adapters_disabled(t.model):
            ref, _ = dpo.answer_logps(t.model, t.model, x, y, mask, images=batch.images)
    export(t.folder.path, "hf", tmp_path / "hf", which="latest")
    want_policy = transformers_logps(reloaded(tmp_path / "hf"), x, y, mask, batch.images, image_id)
    want_ref = transformers_logps(reloaded(base), x, y, mask, batch.images, image_id)
    assert (policy - want_policy).abs().max() < TOLERANCE
    assert (ref - want_ref).abs().max() < TOLERANCE
    assert (policy - ref).abs().max() > 1e-3  # it trained, the tower's adapters included
    n, beta = len(x) // 2, cfg.dpo_beta
    losses, _, _ = dpo.dpo_loss(policy[:n], policy[n:], ref[:n], ref[n:], beta)
    margin = beta * ((want_policy[:n] - want_ref[:n]) - (want_policy[n:] - want_ref[n:]))
    assert (losses + F.logsigmoid(margin)).abs().max() < TOLERANCE  # TRL's sigmoid loss


def test_image_pairs_and_grpo_image_prompts_for_a_text_model_are_one_line(tmp_path, capsys):
    """Each before any training: one line naming the file and line, exit 2, no run folder
    (image pairs, and GRPO prompts that show an image, for a model without a tower)."""
    from hf_models import make_model

    from core.cli.train import main as train_main

    data = pairs(tmp_path / "data")
    make_model(tmp_path / "text", "qwen3")
    make_gemma3_vision(tmp_path / "base", layers=2)
    prompts = tmp_path / "prompts.jsonl"
    parts = [{"type": "image", "image": "0.png"}, {"type": "text", "text": "Colour?"}]
    row = {"prompt": [{"role": "user", "content": parts}], "answer": "red"}
    prompts.write_text(json.dumps(row) + "\n" + json.dumps(row), encoding="utf-8")
    common = ["--tokenizer", "model", "--max-steps", "1", "--seq-len", "40", "--device", "cpu"]
    cases = [
        (
            ["--init-from", str(tmp_path / "text"), "--data", str(data), "--method", "dpo"],
            f"data: {data} line 1: image ",
            "this model reads text only here",
        ),
        (
            ["--init-from", str(tmp_path / "text"), "--data", str(prompts), "--method", "grpo"]
            + ["--reward", "answer", "--num-generations", "2", "--batch-size", "2"]
            + ["--max-completion-tokens", "6"],
            f"{prompts} row 1: image 0.png: ",
            "this model reads text only here",
        ),
    ]
    capsys.readouterr()
    for args, start, why in cases:
        out = tmp_path / "out"
        assert train_main([*args, *common, "--out", str(out)]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
        assert len(err) == 1 and err[0].startswith(f"error: {start}") and why in err[0], err
        assert not out.exists()
