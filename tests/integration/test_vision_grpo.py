"""GRPO on prompts that show an image, on a tiny Gemma 3 composite (tests/vision_models.py;
six layers, so the answers see the image): both prompt forms carry their image; the greedy
completion is transformers' generate with the same pixels; the policy's and reference's
completion log-probabilities equal transformers' within 1e-4; steps run, the Completions rows
name the image, and a run with images resumes bitwise."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from helpers import StopAfter, tiny_config  # noqa: E402
from vision_models import make_gemma3_vision, reloaded, save_image  # noqa: E402

from core.runs.folder import read_metrics  # noqa: E402
from core.training import grpo  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402

TOLERANCE = 1e-4  # fp32 log-probabilities of a few tokens


def prompts(folder):
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(6):
        save_image(folder / f"{i % 2}.png", "png", (40, 30), i % 2)
        answer = "red" if i % 2 else "blue"
        if i % 2 == 0:  # message parts
            parts = [{"type": "image", "image": f"{i % 2}.png"}, {"type": "text", "text": "Hue?"}]
            rows.append({"prompt": [{"role": "user", "content": parts}], "answer": answer})
        else:  # ShareGPT's images list and its <image> mark
            prompt = [{"role": "user", "content": "<image>Hue?"}]
            rows.append({"prompt": prompt, "images": [f"{i % 2}.png"], "answer": answer})
    (folder / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in rows), "utf-8")
    return folder / "prompts.jsonl"


def config(base, data, **kw):
    values = dict(
        init_from=str(base),
        tokenizer="model",
        data=str(data),
        method="grpo",
        reward=["regex"],
        reward_regex=r"^\s*\w",
        num_generations=4,
        max_completion_tokens=4,
        seq_len=40,
        lr=2e-2,
        dropout=0.0,
        lora_rank=4,
        grpo_beta=0.04,
        max_steps=4,
        batch_size=2,
        eval_every=100,
        ckpt_every=2,
        sample_tokens=0,
        log_every=1,
        warmup_steps=0,
    )
    values.update(kw)
    return tiny_config(**values)


def hf_logps(model, ids, segments, width, targets, mask, pixels, image_id):
    """Each row's completion-token log-probs by transformers' composite, one row at a time
    (without its left padding)."""
    out = []
    for i in range(len(ids)):
        row = ids[i][segments[i] != 0][None]
        pad = int((segments[i] == 0).sum())
        with torch.no_grad():
            logits = model(
                input_ids=row,
                pixel_values=pixels[i : i + 1],
                token_type_ids=(row == image_id).long(),
            ).logits[0]
        start = width - pad - 1
        logp = F.log_softmax(logits.float(), -1)[start : start + targets.shape[1]]
        out.append(logp.gather(1, targets[i][:, None])[:, 0] * mask[i])
    return torch.stack(out)


def test_grpo_samples_and_scores_image_prompts_as_transformers(tmp_path):
    base = tmp_path / "base"
    make_gemma3_vision(base)
    data = prompts(tmp_path / "data")
    t = Trainer(config(base, data), tmp_path / "run")
    t._setup()
    run, cfg, objective = t.run_state, t.cfg, t.objective
    assert [len(n) for n in t.data.image_names] == [1] * 6
    from core.data import prompts as prompt_file

    line = prompt_file.describe(data)  # the form's line about the file
    assert line.startswith("6 prompts (conversational, 6 with images) for GRPO"), line
    image_id = t.model.vision.options.token_id
    hf = reloaded(base)
    # (a) the greedy completion of an image prompt (each form) is transformers' generate's
    for i in (0, 1):
        ids = t.data.ids[i]
        drawn = grpo.sample(
            run.model,
            [ids],
            4,
            0.0,
            1.0,
            [],
            0,
            torch.zeros(1, 4),
            run.device,
            "fp32",
            t.data.images_of([i]),
        )
        x = torch.tensor([ids])
        want = hf.generate(
            input_ids=x,
            pixel_values=t.data.images_of([i]),
            token_type_ids=(x == image_id).long(),
            max_new_tokens=4,
            do_sample=False,
            eos_token_id=None,
        )[0, len(ids) :]
        assert drawn.completions[0].tolist() == want.tolist()
    # (b) a step's rows: the policy's (LoRA at its start) and the reference's log-probs
    chunks = objective.micro_batches(run, cfg, torch.tensor([0, 1]), 0)
    roll = chunks[0]
    assert roll.images is not None and len(roll.images) == 8  # each row its prompt's image
    targets = roll.ids[:, roll.prompt_width :]
    with torch.no_grad():
        policy, _, _ = objective._logps(run.model, run.model, run, cfg, roll, targets)
        ref, _, _ = objective._logps(
            run.model, run.model, run, cfg, roll, targets, no_adapters=True
        )
    want = hf_logps(
        hf,
        roll.ids,
        roll.segments,
        roll.prompt_width,
        targets,
        roll.completion_mask,
        roll.images,
        image_id,
    )
    m = roll.completion_mask
    assert ((policy - want) * m).abs().max() < TOLERANCE
    assert ((ref - want) * m).abs().max() < TOLERANCE
    rows = objective.latest
    assert rows[0]["images"] == ["0.png"] and rows[4]["images"] == ["1.png"]
    assert rows[0]["prompt"] == "Hue?"
    t._end("stopped")


def test_grpo_with_image_prompts_trains_and_resumes_bitwise(tmp_path):
    base = tmp_path / "base"
    make_gemma3_vision(base)
    cfg = config(base, prompts(tmp_path / "data"))
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(2))
    Trainer(
        cfg, tmp_path / "split", resume_from=tmp_path / "split" / "checkpoints" / "latest.pt"
    ).run()
    a, _ = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    b, _ = read_metrics(tmp_path / "split" / "metrics.jsonl")
    keys = ("loss", "reward", "reward_std", "kl", "completions/mean_length")
    assert len(a) == 4 and [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    assert a[-1]["kl"] > 0  # the policy moved from the reference
    wa = torch.load(tmp_path / "straight" / "checkpoints" / "latest.pt", weights_only=False)
    wb = torch.load(tmp_path / "split" / "checkpoints" / "latest.pt", weights_only=False)
    for name, tensor in wa["model"].items():
        assert torch.equal(tensor, wb["model"][name]), name
    table = (tmp_path / "split" / "completions.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in table] == [1, 2, 3, 4]
    assert all(r["images"][0] in ("0.png", "1.png") for r in json.loads(table[-1])["rows"])


def test_qwen3_vl_samples_left_padded_image_prompts_as_core_generate_and_trains(tmp_path):
    """Qwen3-VL's M-RoPE: prompts whose images differ in size (so their lengths differ and
    the batch is left-padded) sample greedily as core.generate does each alone, and score
    as transformers' composite does each alone (within 1e-4); two steps run."""
    from vision_models import make_qwen_vision, qwen_reloaded

    from core.use.generate import generate_ids

    base = tmp_path / "base"
    make_qwen_vision(base, "qwen3_vl")
    folder = tmp_path / "data"
    folder.mkdir()
    rows = []
    for i, size in enumerate([(50, 40), (32, 32), (40, 48)]):
        save_image(folder / f"{i}.png", "png", size, i)
        parts = [{"type": "image", "image": f"{i}.png"}, {"type": "text", "text": "Hue?"}]
        rows.append({"prompt": [{"role": "user", "content": parts}], "answer": "red"})
    (folder / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows), "utf-8")
    cfg = config(base, folder / "p.jsonl", max_steps=2, num_generations=2, seq_len=64)
    t = Trainer(cfg, tmp_path / "run")
    t._setup()
    run = t.run_state
    assert len({len(i) for i in t.data.ids}) > 1  # the batch below is left-padded
    index = [0, 1, 2]
    drawn = grpo.sample(
        run.model,
        [t.data.ids[i] for i in index],
        4,
        0.0,
        1.0,
        [],
        0,
        torch.zeros(3, 4),
        run.device,
        "fp32",
        t.data.images_of(index),
    )
    for r, i in enumerate(index):
        alone = generate_ids(
            run.model, t.data.ids[i], 4, temperature=0, images=t.data.images_of([i])
        )
        assert drawn.completions[r].tolist() == list(alone)
    # a step's left-padded rows score as transformers' composite scores each alone
    roll = t.objective.micro_batches(run, t.cfg, torch.tensor([0, 1]), 0)[0]
    targets = roll.ids[:, roll.prompt_width :]
    with torch.no_grad():
        policy, _, _ = t.objective._logps(run.model, run.model, run, t.cfg, roll, targets)
    hf, image_id = qwen_reloaded(base), run.model.vision.options.token_id
    for r in range(len(roll.ids)):
        row = roll.ids[r][roll.segments[r] != 0][None]
        start = roll.prompt_width - int((roll.segments[r] == 0).sum()) - 1
        one = t.data.images_of([[0, 0, 1, 1][r]])
        with torch.no_grad():
            logits = hf(
                input_ids=row,
                pixel_values=one.values,
                image_grid_thw=one.grid,
                mm_token_type_ids=(row == image_id).int(),
            ).logits[0]
        want = F.log_softmax(logits.float(), -1)[start : start + targets.shape[1]]
        want = want.gather(1, targets[r][:, None])[:, 0]
        m = roll.completion_mask[r]
        assert ((policy[r] - want) * m).abs().max() < TOLERANCE
    t._end("stopped")
    result = Trainer(cfg, tmp_path / "trained").run()
    assert result["status"] == "finished"
    train, _ = read_metrics(tmp_path / "trained" / "metrics.jsonl")
    assert len(train) == 2 and all(r["loss"] == r["loss"] for r in train)


def test_the_loss_on_image_prompts_equals_trls_own(tmp_path):
    """TRL's GRPOTrainer._compute_loss on transformers' composite and ours on a step's rows:
    the same completions, advantages, reference log-probs and pixels (TRL's VLM path: its
    pixel_values, num_images and token_type_ids)."""
    pytest.importorskip("trl")
    import datasets
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    base = tmp_path / "base"
    make_gemma3_vision(base)
    t = Trainer(config(base, prompts(tmp_path / "data")), tmp_path / "run")
    t._setup()
    run, cfg, objective = t.run_state, t.cfg, t.objective
    roll = objective.micro_batches(run, cfg, torch.tensor([0, 1]), 0)[0]
    assert bool((roll.segments != 0).all())  # prompts of one length: no padding for TRL
    targets = roll.ids[:, roll.prompt_width :]
    # advantages and a reference apart from the policy (at its start the two are one): the
    # loss then weighs the image-conditioned log-probs and the KL term
    roll.advantages = torch.linspace(-1.0, 1.0, len(roll.ids))
    with torch.no_grad():
        ref, _, _ = objective._logps(
            run.model, run.model, run, cfg, roll, targets, no_adapters=True
        )
    ref = ref - 0.5 * torch.rand(ref.shape, generator=torch.Generator().manual_seed(0))
    logps, _, _ = objective._logps(run.train_model, run.model, run, cfg, roll, targets)
    mask = roll.completion_mask
    ours, kl, _ = grpo.policy_loss(
        logps, logps.detach(), ref, roll.advantages, mask, cfg, roll.n_items
    )
    assert abs(float(ours)) > 1e-3 and float((kl * mask).sum()) > 1e-3
    tok = AutoTokenizer.from_pretrained(base)
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=8,
        num_generations=4,
        beta=cfg.grpo_beta,
        loss_type=cfg.loss_type,
        max_completion_length=targets.shape[1],
        gradient_checkpointing=False,
    )
    trl = GRPOTrainer(
        model=reloaded(base),
        reward_funcs=lambda completions, **k: [0.0] * len(completions),
        args=args,
        processing_class=tok,
        train_dataset=datasets.Dataset.from_list([{"prompt": "a"}] * 8),
    )
    trl.current_gradient_accumulation_steps = 1
    image_id = run.model.vision.options.token_id
    inputs = {
        "prompt_ids": roll.ids[:, : roll.prompt_width],
        "prompt_mask": torch.ones_like(roll.ids[:, : roll.prompt_width]),
        "completion_ids": targets,
        "completion_mask": roll.completion_mask.long(),
        "advantages": roll.advantages,
        "num_items_in_batch": torch.tensor(roll.n_items),
        "ref_per_token_logps": ref,
        "pixel_values": roll.images,
        "num_images": [1] * len(roll.ids),
        "token_type_ids": (roll.ids == image_id).long(),
    }
    trl.model.train()
    want = float(trl._compute_loss(trl.model, inputs).detach())
    assert float(ours.detach()) == pytest.approx(want, rel=1e-5, abs=1e-6)
    t._end("stopped")
