"""Packed chat examples stay apart: attention does not cross their boundaries and positions
restart in each, so a packed row gives each example the logits it gets alone."""

from __future__ import annotations

import pytest
import torch

from core.models.model import GPT, GPTConfig, packed
from core.models.tiling import causal_rows


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # rotary and learned positions
def test_each_packed_example_gets_the_logits_it_gets_alone(arch):
    torch.manual_seed(0)
    extra = (
        {"positions": "learned", "norm": "layernorm", "mlp": "gelu"}
        if arch == "gpt2"
        else {"positions": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False}
    )
    model = GPT(
        GPTConfig(vocab_size=100, seq_len=32, hidden_dim=32, n_layers=2, n_heads=4, **extra)
    ).eval()
    lengths = [7, 11, 5]
    examples = [torch.randint(0, 100, (n,)) for n in lengths]
    row = torch.cat([*examples, torch.zeros(32 - sum(lengths), dtype=torch.long)])[None]
    segments = torch.cat(
        [torch.full((n,), i + 1) for i, n in enumerate([*lengths[:-1], 32 - sum(lengths[:-1])])]
    )[None]
    with torch.no_grad():
        together = model.logits(row, segments=segments)
        start = 0
        for ids in examples:
            alone = model.logits(ids[None])
            torch.testing.assert_close(
                together[:, start : start + len(ids)], alone, rtol=1e-5, atol=1e-5
            )
            start += len(ids)
        plain = model.logits(row)  # without segments, later examples see the earlier ones
    assert (plain[:, 7:18] - together[:, 7:18]).abs().max() > 1e-3


def test_positions_restart_and_the_mask_is_causal_within_each_example():
    positions, mask = packed(torch.tensor([[1, 1, 1, 2, 2, 3]]))
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0]]
    m = causal_rows(0, 6, "cpu", mask=mask)[0, 0]
    assert m[4].tolist() == [False, False, False, True, True, False]
    assert m[2].tolist() == [True, True, True, False, False, False]
    # a chunk of query rows (3..4) is made alone, keys up to its last query
    assert causal_rows(3, 5, "cpu", mask=mask)[0, 0].tolist() == m[3:5, :5].tolist()


def test_chat_data_windows_carry_their_segments(tmp_path):
    from core.data.chatdata import START, Packer

    packer = Packer(row=12, pad=0, sep=9, drop_long=False)
    packer.add(torch.tensor([1, 2, 3]).numpy(), torch.tensor([0, 1, 1]).numpy().astype("uint8"))
    packer.add(torch.tensor([4, 5]).numpy(), torch.tensor([0, 1]).numpy().astype("uint8"))
    ((ids, weights),) = packer.finish()
    assert ids.tolist()[:7] == [1, 2, 3, 9, 4, 5, 9]
    assert (weights & START).nonzero()[0].tolist() == [0, 4]  # where each example begins
    assert (weights & 1).tolist()[:7] == [0, 1, 1, 0, 0, 1, 0]  # the loss weights as before
