"""GRPO's log-probabilities come from the chunked pass: on a tiny Qwen2-shaped model, the
completion tokens' log-probs, entropies and the parameters' gradients equal the plain
computation over the whole logits, while the head never makes more than one chunk of them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")

from helpers import plain_token_logps, tiny_config  # noqa: E402
from hf_models import make_model  # noqa: E402

from core.config.spec import validate  # noqa: E402
from core.models import loss as chunked  # noqa: E402
from core.training import grpo  # noqa: E402
from core.training.inputs import build_model  # noqa: E402
from core.weights.loader import apply_pretrained, open_pretrained  # noqa: E402


@pytest.mark.parametrize("fused", [True, False])  # LinearTokenLogps; checkpointed chunks
def test_chunked_logps_entropy_and_gradients_equal_the_whole_logits_ones(
    tmp_path, monkeypatch, fused
):
    make_model(tmp_path / "model", "qwen2")
    pre = open_pretrained(str(tmp_path / "model"))
    values = tiny_config(
        init_from=str(tmp_path / "model"), tokenizer="model", dropout=0.0, temperature=0.7
    )
    cfg = validate(apply_pretrained(values, pre))
    model = build_model(cfg, pre, torch.device("cpu"), "fp32", lambda m: None)
    vocab = model.head.weight.shape[0]
    torch.manual_seed(0)
    width, c = 6, 9
    ids = torch.randint(3, vocab, (4, width + c))
    segments = torch.ones_like(ids)
    segments[0, :2] = 0  # a left-padded prompt
    mask = torch.ones(4, c, dtype=torch.bool)
    mask[1, 5:] = False  # completions that stopped early
    mask[2, 1:] = False
    roll = grpo.Rollout(ids, segments, width, mask, torch.ones(4), float(mask.sum()))
    targets = ids[:, width:]
    weight = torch.randn(4, c)
    run = SimpleNamespace(
        model=model, train_model=model, device=torch.device("cpu"), precision="fp32"
    )

    def pass_(fn):
        model.zero_grad()
        logps, entropy = fn()
        (logps * weight * mask).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return logps.detach() * mask, entropy.detach() * mask, grads

    def plain():
        logits = model.logits(ids, segments=segments)
        return plain_token_logps(logits[:, width - 1 : -1], targets, cfg.temperature)

    sizes = []  # positions of each logits block the head makes (vocabulary-wide rows)
    model.head.register_forward_hook(lambda m, i, out: sizes.append(out[..., 0].numel()))
    mm = torch.mm

    def counted(a, b, **kw):  # LinearTokenLogps's blocks: hidden @ head.weight.T
        out = mm(a, b, **kw)
        if out.shape[-1] == vocab:
            sizes.append(out.shape[0])
        return out

    monkeypatch.setattr(torch, "mm", counted)
    want = pass_(plain)
    assert max(sizes) == ids.numel()  # the whole: every position's logits at once
    sizes.clear()
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 5 * 4 * vocab)  # 5 positions a chunk
    monkeypatch.setattr(chunked, "FUSED_CHUNK_BYTES", 5 * 4 * vocab)
    if not fused:
        monkeypatch.setattr(chunked, "fusable", lambda head, hidden: False)
    objective = grpo.GRPO(cfg)
    got = pass_(lambda: objective._logps(model, model, run, cfg, roll, targets)[:2])
    assert 0 < max(sizes) <= 5  # a chunk at most, forward and the backward's recompute
    assert sum(sizes) >= 2 * int(mask.sum())  # each chunk made again in the backward pass
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    assert len(got[2]) == len(want[2])
    for a, b in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_estimate_counts_one_chunk_of_logits_not_every_completion_position(
    tmp_path, monkeypatch
):
    from dataclasses import replace

    from core.training.estimate import estimate

    make_model(tmp_path / "model", "qwen2")
    pre = open_pretrained(str(tmp_path / "model"))
    cfg = apply_pretrained(
        tiny_config(
            init_from=str(tmp_path / "model"),
            tokenizer="model",
            method="grpo",
            reward=["length"],
            num_generations=4,
            max_completion_tokens=8,
            seq_len=64,
            batch_size=2,
        ),
        pre,
    )
    vocab = pre.config.vocab_size
    positions = 2 * 4 * 8  # under a chunk: every completion position, in two fp32 blocks
    assert estimate(cfg, "fp32").logits == positions * vocab * 8
    # checkpointed chunks (bf16): the logits, their fp32 copy, log-softmax, exp, gradient
    assert estimate(cfg, "bf16").logits == positions * vocab * (2 + 16)
    monkeypatch.setattr(chunked, "FUSED_CHUNK_BYTES", 16 * 4 * vocab)  # 16 positions a chunk
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 16 * 4 * vocab)
    for precision, per_position in (("fp32", 8), ("bf16", 18)):
        a = estimate(cfg, precision)
        b = estimate(replace(cfg, num_generations=16), precision)
        assert a.logits == b.logits == 16 * vocab * per_position  # one chunk, whatever G
