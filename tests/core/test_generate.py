"""Generation: a KV cache that agrees with the full forward, seeds, sliding, the CLI."""

import pytest
import torch
from helpers import cached_forward, tiny_config

from core.cli.generate import main
from core.models.model import GPT, GPTConfig
from core.training.trainer import Trainer
from core.use.generate import generate_ids, load, pick


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / "run"
    Trainer(tiny_config(max_steps=30, eval_every=10, ckpt_every=10), path).run()
    return path


def test_cached_logits_equal_the_full_forward():
    torch.manual_seed(0)
    model = GPT(GPTConfig(hidden_dim=32, n_layers=2, n_heads=4, seq_len=24)).eval()
    idx = torch.randint(0, 256, (1, 24))
    full = model.logits(idx)
    assert torch.allclose(cached_forward(model, idx, 10), full, atol=1e-5)


def test_cache_and_no_cache_give_the_same_text_past_the_context(run):
    model = load(run).model
    prompt = list(b"def main():\n")
    n = 3 * model.config.seq_len  # slides the window several times
    with_cache = list(generate_ids(model, prompt, n, temperature=0))
    without = list(generate_ids(model, prompt, n, temperature=0, use_cache=False))
    assert with_cache == without and len(with_cache) == n
    sampled = list(generate_ids(model, prompt, 40, temperature=1.0, seed=5))
    assert sampled == list(generate_ids(model, prompt, 40, temperature=1.0, seed=5, use_cache=0))


def test_sampling_is_deterministic_per_seed_and_filters_work():
    logits = torch.tensor([0.0, 5.0, 4.9, -3.0])
    draws = [pick(logits, 1.0, None, None, torch.Generator().manual_seed(s)) for s in range(50)]
    assert set(draws) >= {1, 2}
    again = [pick(logits, 1.0, None, None, torch.Generator().manual_seed(s)) for s in range(50)]
    assert draws == again
    assert pick(logits, 0.0, None, None, torch.Generator()) == 1  # greedy
    top1 = {pick(logits, 1.0, 1, None, torch.Generator().manual_seed(s)) for s in range(30)}
    assert top1 == {1}
    nucleus = {pick(logits, 1.0, None, 0.5, torch.Generator().manual_seed(s)) for s in range(30)}
    assert nucleus == {1}


def test_cli_streams_prompt_then_continuation_and_repeats_with_a_seed(run, capsys):
    args = [str(run), "--prompt", "import os", "--max-new-tokens", "40", "--seed", "3"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("import os") and len(first) > len("import os")
    assert main(args) == 0
    assert capsys.readouterr().out == first
    assert main([*args, "--checkpoint", "latest", "--temperature", "0"]) == 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--max-new-tokens", "-1"], "must be >= 0"),
        (["--top-p", "1.5"], "--top-p"),
        (["--checkpoint", "newest"], "invalid choice"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(run, capsys, args, needle):
    assert main([str(run), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and needle in err


def test_missing_or_damaged_checkpoint_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "is neither a run folder" in capsys.readouterr().err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main([str(bad)]) == 2
    assert "damaged or not a checkpoint" in capsys.readouterr().err


def test_an_id_past_the_tokenizers_vocabulary_decodes_to_nothing():
    from core.data.tokenizer import bytes_tokenizer
    from core.use.generate import stream_text

    tok = bytes_tokenizer()  # 256 ids; a BPE model's spare embedding rows lie past them
    assert "".join(stream_text(tok, iter([104, 300, 105, 4000]))) == "hi"
