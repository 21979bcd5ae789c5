"""The chunked language-model loss equals plain cross-entropy, and its gradients too, while
never holding logits for more than one chunk of labelled positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.models.loss import lm_loss, token_logps


def plain(head, hidden, targets, mask=None):
    logits = head(hidden).float().reshape(-1, head.weight.shape[0])
    per = F.cross_entropy(logits, targets.reshape(-1), reduction="none")
    if mask is None:
        return per.mean()
    m = mask.reshape(-1).float()
    return (per * m).sum() / m.sum().clamp(min=1)


def grads(loss_fn, head, hidden, *args):
    head.zero_grad()
    h = hidden.clone().requires_grad_(True)
    loss = loss_fn(head, h, *args)
    loss.backward()
    return loss.detach(), h.grad, head.weight.grad.clone()


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("chunk", [None, 7])  # 7: several chunks and a short last one
def test_chunked_loss_and_gradients_equal_the_plain_ones(masked, chunk):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(3, 20, 16)
    targets = torch.randint(0, 50, (3, 20))
    mask = (torch.rand(3, 20) < 0.4).to(torch.uint8) if masked else None
    want = grads(plain, head, hidden, targets, mask)
    got = grads(lambda hd, h, t, m: lm_loss(hd, h, t, m, chunk=chunk), head, hidden, targets, mask)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_no_logits_for_unlabelled_positions_and_one_chunk_at_a_time():
    torch.manual_seed(0)
    vocab, n = 1000, 64
    head = torch.nn.Linear(8, vocab, bias=False)
    hidden = torch.randn(1, n, 8, requires_grad=True)
    targets = torch.randint(0, vocab, (1, n))
    mask = torch.zeros(1, n, dtype=torch.uint8)
    mask[0, :10] = 1  # ten labelled positions
    largest = []

    def pack(t):
        largest.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm_loss(head, hidden, targets, mask, chunk=4)
    loss.backward()
    assert max(largest) < 10 * vocab  # never the logits of all ten labelled positions
    assert hidden.grad[0, 10:].abs().sum() == 0  # unlabelled positions do not move


def test_a_model_trains_with_the_chunked_loss_as_with_the_plain_one():
    from core.models.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=300, seq_len=16, hidden_dim=32, n_layers=1, n_heads=2))
    idx = torch.randint(0, 300, (2, 17))
    _, loss = model(idx[:, :-1], idx[:, 1:])
    logits = model.logits(idx[:, :-1])
    want = F.cross_entropy(logits.reshape(-1, 300).float(), idx[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("chunk", [None, 7])
def test_token_logps_and_entropy_equal_the_whole_logits_ones_with_their_gradients(chunk, fused):
    from helpers import plain_token_logps as plain_logps

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(3, 20, 16)
    targets = torch.randint(0, 50, (3, 20))
    mask = torch.rand(3, 20) < 0.6
    weight = torch.randn(3, 20)  # a loss that weighs each token differently

    def run(fn):
        head.zero_grad()
        h = hidden.clone().requires_grad_(True)
        logps, entropy = fn(h)
        (logps * weight * mask).sum().backward()
        return logps.detach() * mask, entropy * mask, h.grad, head.weight.grad.clone()

    want = run(lambda h: plain_logps(head(h), targets, 0.7))
    got = run(lambda h: token_logps(head, h, targets, mask, 0.7, chunk=chunk, fused=fused))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert not got[1].requires_grad


def test_a_large_heads_fused_chunks_grow_with_it():
    """Each fused chunk streams the whole head: at a 248k vocabulary 32 MiB held 33 positions
    (the loss twice as slow as at 128). The buffer grows to an eighth of a large head's bytes,
    at most 256 MiB; small heads keep 32 MiB, and the checkpointed chunks their 64 MiB."""
    from core.models.loss import FUSED_MAX_BYTES, chunk_positions

    assert chunk_positions(32_000, True, 512) == 32 * 1024**2 // (4 * 32_000)  # 262
    assert chunk_positions(248_320, True, 1024) == 128  # Qwen3.5: 127 MiB, an eighth of 1 GiB
    assert chunk_positions(262_144, True, 5376) == FUSED_MAX_BYTES // (4 * 262_144)  # capped
    assert chunk_positions(248_320) == 64 * 1024**2 // (4 * 248_320)  # unchanged: 67
