import pytest
import torch

from core.data import DEFAULT_CORPUS, ByteData, load_bytes
from core.errors import DataError


def test_default_corpus_is_deterministic_and_capped():
    a, source = load_bytes(None, [".txt"], 200_000)
    b, _ = load_bytes(None, [".txt"], 200_000)
    assert source == DEFAULT_CORPUS
    assert len(a) == 200_000
    assert a == b
    assert b"def " in a  # it really is Python source


def test_folder_is_read_recursively_with_chosen_extensions_in_sorted_order(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("BBB")
    (tmp_path / "a.md").write_text("AAA")
    (tmp_path / "sub" / "c.txt").write_text("CCC")
    (tmp_path / "skip.bin").write_bytes(b"XXX")
    raw, source = load_bytes(str(tmp_path), [".txt", ".md"], 10_000)
    assert raw == b"AAABBBCCC"
    assert "3 files" in source


def test_missing_empty_and_too_short_data_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="neither a file nor a folder"):
        load_bytes(str(tmp_path / "nope.txt"), [".txt"], 10_000)
    with pytest.raises(DataError, match="no files ending in .txt"):
        load_bytes(str(tmp_path), [".txt"], 10_000)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    raw, source = load_bytes(str(empty), [".txt"], 10_000)
    with pytest.raises(DataError, match=r"empty\.txt has 0 bytes"):
        ByteData(raw, source, seq_len=64, val_fraction=0.1, seed=0)
    short = tmp_path / "short.txt"
    short.write_text("x" * 100)
    raw, source = load_bytes(str(short), [".txt"], 10_000)
    with pytest.raises(DataError, match="seq_len 64 needs at least"):
        ByteData(raw, source, seq_len=64, val_fraction=0.1, seed=0)


def test_unreadable_file_is_named(tmp_path, monkeypatch):
    f = tmp_path / "locked.txt"
    f.write_text("hello")

    def deny(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(f), "read_bytes", deny)
    with pytest.raises(DataError, match="locked.txt"):
        load_bytes(str(f), [".txt"], 10_000)


def make_data(seed=0):
    raw = bytes(range(256)) * 40
    return ByteData(raw, "test", seq_len=16, val_fraction=0.1, seed=seed)


def test_split_and_windows_are_shifted_by_one():
    d = make_data()
    assert len(d.train) + len(d.val) == 256 * 40
    x, y = d.train_batch(d.sample_starts(5))
    assert x.shape == y.shape == (5, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_validation_is_fixed_and_never_moves_the_training_stream():
    d = make_data()
    state = d.state_dict()
    first = [x for x, _ in d.val_batches(12, 4)]
    second = [x for x, _ in d.val_batches(12, 4)]
    assert [x.shape[0] for x in first] == [4, 4, 4]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert torch.equal(state["generator"], d.state_dict()["generator"])


def test_sampler_state_restores_the_same_draws():
    d = make_data(seed=7)
    d.sample_starts(8)
    state = d.state_dict()
    a = d.sample_starts(8)
    d.load_state_dict(state)
    assert torch.equal(a, d.sample_starts(8))
    assert not torch.equal(make_data(seed=8).sample_starts(8), make_data(seed=7).sample_starts(8))
