import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import Recorder, StopAfter, tiny_config

from core.data import build_text
from core.data.prepare import DataSpec, PrepareCancelled, prepare
from core.data.sources import DEFAULT_CORPUS, find_sources
from core.data.tokenizer import Tokenizer, bytes_tokenizer, train_bpe
from core.data.windows import TokenData
from core.errors import CheckpointError, DataError
from core.runs.folder import read_metrics
from core.training.trainer import Trainer

TEXT = "The quick brown fox jumps over the lazy dog. Ünïcödé: 日本語 ça va? 🙂\n"


def spec_for(path, tokenizer="bytes", vocab=512, cap=None, exts=(".txt",), val=0.1):
    return DataSpec(find_sources(str(path), list(exts), 10_000, cap), tokenizer, vocab, val)


def all_tokens(td: TokenData) -> list[int]:
    return np.concatenate([td.train, td.val]).tolist()


@pytest.fixture
def text_file(tmp_path):
    f = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = TEXT.split(" ")
    f.write_text(" ".join(rng.choice(words, 40_000)), encoding="utf-8")
    return f


# -- sources and preparation -----------------------------------------------------------------


def test_default_corpus_is_capped_python_source(tmp_path):
    src = find_sources(None, [".txt"], 200_000)
    folder, m = prepare(DataSpec(src, "bytes", 512, 0.05), tmp_path)
    assert m["source"] == DEFAULT_CORPUS and m["source_bytes"] == 200_000
    assert m["total_bytes"] > 200_000
    assert b"def " in (folder / "tokens.bin").read_bytes()


def test_a_users_file_is_used_whole_and_round_trips(tmp_path, text_file):
    folder, m = prepare(spec_for(text_file), tmp_path / "cache")
    size = text_file.stat().st_size
    assert size > 10_000  # larger than the embedded-corpus cap passed in spec_for
    assert m["source_bytes"] == m["total_bytes"] == size
    assert m["train_bytes"] + m["val_bytes"] == size
    td = TokenData(folder, m, seq_len=32, seed=0)
    assert isinstance(td.train, np.memmap)
    assert td.tokenizer.decode_bytes(all_tokens(td)) == text_file.read_bytes()


def test_max_data_bytes_uses_a_prefix_and_says_so(tmp_path, text_file):
    cfg = tiny_config(data=str(text_file), max_data_bytes=50_000, max_steps=2, eval_every=2)
    events = Recorder()
    Trainer(cfg, tmp_path / "run").run(events)
    size = text_file.stat().st_size
    assert f"data: using 50,000 of {size:,} bytes" in [m for (m,) in events.named("on_log")]
    info = json.loads((tmp_path / "run" / "data.json").read_text())
    assert info["source_bytes"] == 50_000 and info["total_bytes"] == size


def test_folder_is_read_recursively_with_chosen_extensions_in_sorted_order(tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("BBB" * 1000)
    (d / "a.md").write_text("AAA" * 1000)
    (d / "sub" / "c.txt").write_text("CCC" * 1000)
    (d / "skip.bin").write_bytes(b"XXX")
    (d / "empty.txt").write_text("")
    folder, m = prepare(spec_for(d, exts=(".txt", ".md")), tmp_path / "cache")
    assert (folder / "tokens.bin").read_bytes() == b"AAA" * 1000 + b"BBB" * 1000 + b"CCC" * 1000
    assert "4 files" in m["source"] and m["empty_files"] == 1


def test_bad_data_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="neither a file nor a folder"):
        find_sources(str(tmp_path / "nope.txt"), [".txt"], 10_000)
    with pytest.raises(DataError, match="no files ending in .txt"):
        find_sources(str(tmp_path), [".txt"], 10_000)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="holds no text"):
        prepare(spec_for(empty), tmp_path / "cache")
    short = tmp_path / "short.txt"
    short.write_text("x" * 100)
    folder, m = prepare(spec_for(short), tmp_path / "cache")
    with pytest.raises(DataError, match="seq_len 64 needs at least"):
        TokenData(folder, m, seq_len=64, seed=0)
    with pytest.raises(DataError, match="vocab_size: expected an integer from 512 to 65536"):
        train_bpe(["abc"], 100)


def test_unreadable_file_is_named(tmp_path, monkeypatch):
    f = tmp_path / "locked.txt"
    f.write_text("hello" * 100)
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path) == str(f):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", deny)
    with pytest.raises(DataError, match=r"cannot read .*locked\.txt"):
        prepare(spec_for(f), tmp_path / "cache")


# -- the cache ---------------------------------------------------------------------------------


def test_unchanged_data_reuses_the_cache_without_reading_the_sources(
    tmp_path, text_file, monkeypatch
):
    first, _ = prepare(spec_for(text_file, "bpe"), tmp_path / "cache")

    def no_reading(*args):
        raise AssertionError("sources were read again")

    monkeypatch.setattr(build_text, "read_blocks", no_reading)
    again, m = prepare(spec_for(text_file, "bpe"), tmp_path / "cache")
    assert again == first and m["tokenizer"] == "bpe"


def test_modified_added_or_removed_files_invalidate_the_cache(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("alpha " * 2000)
    (d / "b.txt").write_text("beta " * 2000)
    cache = tmp_path / "cache"
    seen = {prepare(spec_for(d), cache)[1]["fingerprint"]}
    (d / "a.txt").write_text("ALPHA " * 2000)
    seen.add(prepare(spec_for(d), cache)[1]["fingerprint"])
    (d / "c.txt").write_text("gamma " * 2000)
    seen.add(prepare(spec_for(d), cache)[1]["fingerprint"])
    (d / "b.txt").unlink()
    folder, m = prepare(spec_for(d), cache)
    seen.add(m["fingerprint"])
    assert len(seen) == 4
    assert (folder / "tokens.bin").read_bytes() == b"ALPHA " * 2000 + b"gamma " * 2000


def test_a_damaged_cache_is_rebuilt_with_a_notice(tmp_path, text_file):
    folder, m = prepare(spec_for(text_file), tmp_path / "cache")
    with open(folder / "tokens.bin", "r+b") as f:
        f.truncate(100)
    notes = []
    again, m2 = prepare(spec_for(text_file), tmp_path / "cache", log=notes.append)
    assert any("damaged; rebuilding" in n for n in notes)
    assert (again / "tokens.bin").read_bytes() == text_file.read_bytes()


def test_cancelled_preparation_leaves_nothing_trusted(tmp_path, text_file):
    cache = tmp_path / "cache"
    with pytest.raises(PrepareCancelled):
        prepare(spec_for(text_file, "bpe"), cache, cancelled=lambda: True)
    assert not cache.exists()  # nothing written, not even the cache folder


CHILD = """
import os, signal, sys
from pathlib import Path
from core.data.sources import find_sources
from core.data.prepare import DataSpec, prepare
spec = DataSpec(find_sources(sys.argv[1], [".txt"], 10_000), "bytes", 512, 0.1)
def die(phase, done, total):
    os.kill(os.getpid(), signal.SIGKILL)  # a power cut in the middle of tokenizing
prepare(spec, Path(sys.argv[2]), progress=die)
"""


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_a_process_killed_mid_preparation_leaves_no_trusted_cache(tmp_path, text_file):
    cache = tmp_path / "cache"
    child = subprocess.run([sys.executable, "-c", CHILD, str(text_file), str(cache)])
    assert child.returncode == -9
    leftovers = list(cache.iterdir())
    assert leftovers and all(".tmp-" in p.name for p in leftovers)
    assert not any((p / "manifest.json").exists() for p in leftovers)
    folder, m = prepare(spec_for(text_file), cache)
    assert (folder / "tokens.bin").read_bytes() == text_file.read_bytes()
    assert [p.name for p in cache.iterdir()] == [folder.name]  # the stale temp was removed


# -- tokenizers ----------------------------------------------------------------------------------


def test_bpe_round_trips_arbitrary_bytes_and_non_ascii_text():
    tok = train_bpe([TEXT * 50, "def f(x):\n    return x + 1\n" * 50], 600)
    assert tok.kind == "bpe" and 256 < tok.vocab_size <= 600
    rng = np.random.default_rng(1)
    for _ in range(20):
        raw = rng.integers(0, 256, rng.integers(0, 300), dtype=np.uint8).tobytes()
        assert tok.decode_bytes(tok.encode(raw)) == raw
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert len(tok.encode(TEXT)) < len(TEXT.encode())  # it really merges
    broken = TEXT.encode()[:-3] + b"\xff\xfe" + "ü".encode()[:1]
    assert tok.decode_bytes(tok.encode(broken)) == broken


def test_tokenizers_save_and_load_as_hugging_face_json(tmp_path):
    for tok in (bytes_tokenizer(), train_bpe([TEXT * 20], 512)):
        tok.save(tmp_path / "tokenizer.json")
        back = Tokenizer.load(tmp_path / "tokenizer.json")
        assert (back.kind, back.vocab_size) == (tok.kind, tok.vocab_size)
        assert back.encode(TEXT) == tok.encode(TEXT)
    assert bytes_tokenizer().encode(b"\x00A\xff") == [0, 65, 255]


# -- training on prepared data ------------------------------------------------------------------


def test_bpe_run_writes_data_json_tokenizer_and_bits_per_byte(tmp_path, text_file):
    cfg = tiny_config(data=str(text_file), tokenizer="bpe", vocab_size=512)
    run = tmp_path / "run"
    trainer = Trainer(cfg, run)
    assert trainer.run()["status"] == "finished"
    info = json.loads((run / "data.json").read_text())
    assert {
        "source",
        "source_bytes",
        "train_tokens",
        "val_tokens",
        "tokenizer",
        "vocab_size",
        "fingerprint",
    } <= set(info)
    assert info["tokenizer"] == "bpe" and info["source_bytes"] == text_file.stat().st_size
    assert Tokenizer.load(run / "tokenizer.json").kind == "bpe"
    assert trainer.model.tok_emb.num_embeddings == 512
    _, evals = read_metrics(run / "metrics.jsonl")
    per_token = info["val_bytes"] / info["val_tokens"]
    for e in evals:
        assert e["val_bpb"] == pytest.approx(e["val_loss"] / math.log(2) / per_token)


def test_bpe_stop_and_resume_is_bitwise_identical(tmp_path, text_file):
    cfg = tiny_config(data=str(text_file), tokenizer="bpe", vocab_size=512)
    Trainer(cfg, tmp_path / "straight").run()
    run = tmp_path / "resumed"
    Trainer(cfg, run).run(None, StopAfter(13))
    Trainer(cfg, run, resume_from=run / "checkpoints" / "latest.pt").run()
    a, ae = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    b, be = read_metrics(run / "metrics.jsonl")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r["val_loss"] for r in ae] == [r["val_loss"] for r in be]


def test_resume_refuses_changed_data_unless_allowed(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text(TEXT * 300)
    (d / "b.txt").write_text(TEXT[::-1] * 300)
    cfg = tiny_config(data=str(d), max_steps=4, eval_every=4, ckpt_every=4)
    run = tmp_path / "run"
    Trainer(cfg, run).run()
    latest = run / "checkpoints" / "latest.pt"
    more = tiny_config(data=str(d), max_steps=6, eval_every=4, ckpt_every=4)
    os.utime(d / "a.txt", ns=(0, 0))  # touched, content the same: no change
    assert Trainer(more, run, resume_from=latest).run()["step"] == 6
    (d / "b.txt").write_text("changed " * 500)
    (d / "c.txt").write_text("new " * 500)
    more = tiny_config(data=str(d), max_steps=8, eval_every=4, ckpt_every=4)
    with pytest.raises(CheckpointError, match=r"data changed .*added .*c\.txt.*modified .*b\.txt"):
        Trainer(more, run, resume_from=latest).run()
    events = Recorder()
    result = Trainer(more, run, resume_from=latest, allow_data_change=True).run(events)
    assert result["step"] == 8
    assert any("going on as allowed" in m for (m,) in events.named("on_log"))


def test_windows_are_shifted_by_one_and_validation_never_moves_the_sampler(tmp_path, text_file):
    folder, m = prepare(spec_for(text_file), tmp_path / "cache")
    d = TokenData(folder, m, seq_len=16, seed=0)
    x, y, mask, _ = d.train_batch(d.sample_starts(5))
    assert mask is None  # plain text: every token carries the loss
    assert x.shape == y.shape == (5, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    state = d.state_dict()
    first = [x for x, *_ in d.val_batches(12, 4)]
    second = [x for x, *_ in d.val_batches(12, 4)]
    assert [x.shape[0] for x in first] == [4, 4, 4]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert torch.equal(state["generator"], d.state_dict()["generator"])
    d.load_state_dict(state)
    a = d.sample_starts(8)
    d.load_state_dict(state)
    assert torch.equal(a, d.sample_starts(8))


def test_fast_encoder_gives_the_hugging_face_tokenizers_ids():
    """Training data is encoded with tiktoken over the same ranks; exports use the HF file."""
    rng = np.random.default_rng(3)
    corpus = [TEXT * 30, "def f(x):\n    return x + 1  # 42\n" * 30, "  spaces\t\ttabs\n\n" * 20]
    tok = train_bpe(corpus, 700)
    words = np.array((TEXT + " don't we'll 12345 x=y+1; \n\n  \t").split(" "))
    for _ in range(30):
        text = " ".join(rng.choice(words, 60)) + rng.choice(["", " ", "\n", "  \n "])
        assert tok.encode(text) == tok.to_hf_tokenizer().encode(text).ids
