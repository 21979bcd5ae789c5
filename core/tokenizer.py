"""Tokenizers: raw bytes (vocab 256) or a byte-level BPE trained with Hugging Face `tokenizers`.

Both kinds are held as a Hugging Face tokenizer with GPT-2's byte-to-character alphabet, so
both export to other tools the same way. Any byte sequence round-trips: bytes that are not
valid UTF-8 are encoded as their single-byte tokens, and decoding maps tokens back to bytes
through the alphabet instead of through text.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from .errors import DataError

KINDS = ("bytes", "bpe")
BPE_VOCAB_MIN, BPE_VOCAB_MAX = 512, 65536
# GPT-2's pre-tokenizer split, which the Hugging Face ByteLevel pre-tokenizer also uses.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Runs of bytes that are not valid UTF-8, as surrogateescape decoding shows them.
_ESCAPED = re.compile("[\udc80-\udcff]+")


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in character for each byte value, indexed by byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


BYTE_CHARS = _byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_CHARS)}


def _byte_level(hf: HFTokenizer) -> HFTokenizer:
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    return hf


class Tokenizer:
    """A tokenizer of one of KINDS; encode/decode are exact inverses on any bytes."""

    def __init__(self, hf: HFTokenizer, kind: str):
        self.hf = hf
        self.kind = kind
        self.vocab_size = hf.get_vocab_size()
        vocab = hf.get_vocab()
        # id -> the bytes it stands for, for exact decoding of any id sequence
        self._id_bytes = [b""] * self.vocab_size
        for token, i in vocab.items():
            self._id_bytes[i] = bytes(CHAR_TO_BYTE[c] for c in token if c in CHAR_TO_BYTE)
        self._byte_ids = np.array([vocab[c] for c in BYTE_CHARS], dtype=np.int64)
        self._fast = None

    def _encoder(self):
        """tiktoken over the same ranks and split pattern: the same ids as the Hugging Face
        tokenizer (a test checks) at about twice its speed, which large corpora need."""
        if self._fast is None:
            import tiktoken

            ranks = {b: i for i, b in enumerate(self._id_bytes)}
            self._fast = tiktoken.Encoding(
                f"traindeck-{self.fingerprint()}",
                pat_str=GPT2_SPLIT,
                mergeable_ranks=ranks,
                special_tokens={},
            )
        return self._fast

    @property
    def dtype(self):
        """The smallest unsigned type that holds every id (the token file's element type)."""
        return np.uint8 if self.vocab_size <= 256 else np.uint16

    def encode(self, data: bytes | str) -> list[int]:
        return self.encode_many([data])[0].tolist()

    def encode_many(self, chunks: list[bytes | str]) -> list[np.ndarray]:
        """Encode several chunks at once (the BPE runs them in parallel)."""
        raw = [c.encode("utf-8") if isinstance(c, str) else bytes(c) for c in chunks]
        if self.kind == "bytes":
            return [np.frombuffer(r, dtype=np.uint8).astype(np.int64) for r in raw]
        pieces, owner = [], []  # text pieces to encode, and which chunk each belongs to
        plans = []
        for n, r in enumerate(raw):
            text = r.decode("utf-8", errors="surrogateescape")
            plan, pos = [], 0
            for m in _ESCAPED.finditer(text):
                if m.start() > pos:
                    plan.append(("text", len(pieces)))
                    pieces.append(text[pos : m.start()])
                    owner.append(n)
                plan.append(("bytes", m.group().encode("utf-8", errors="surrogateescape")))
                pos = m.end()
            if pos < len(text):
                plan.append(("text", len(pieces)))
                pieces.append(text[pos:])
                owner.append(n)
            plans.append(plan)
        threads = os.cpu_count() or 1
        encoded = self._encoder().encode_ordinary_batch(pieces, num_threads=threads)
        out = []
        for plan in plans:
            parts = [
                np.asarray(encoded[ref], dtype=np.int64)
                if kind == "text"
                else self._byte_ids[np.frombuffer(ref, dtype=np.uint8)]
                for kind, ref in plan
            ]
            out.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        table = self._id_bytes
        return b"".join(table[i] if 0 <= i < len(table) else b"" for i in map(int, ids))

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        return self._id_bytes[i]

    def hf_json(self) -> str:
        return self.hf.to_str()

    def to_hf_tokenizer(self) -> HFTokenizer:
        return HFTokenizer.from_str(self.hf.to_str())

    def fingerprint(self) -> str:
        return hashlib.blake2b(self.hf_json().encode(), digest_size=8).hexdigest()

    def save(self, path: str | Path) -> None:
        from .atomic import write_text

        write_text(Path(path), self.hf_json())

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        try:
            return cls.from_json(path.read_text(encoding="utf-8"))
        except (OSError, DataError) as e:
            raise DataError(f"tokenizer: {path} is not a readable tokenizer.json ({e})") from None

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        try:
            hf = HFTokenizer.from_str(text)
            merges = json.loads(text)["model"].get("merges") or []
        except Exception as e:
            raise DataError(f"tokenizer: not a tokenizer.json ({e})") from None
        return cls(hf, "bpe" if merges else "bytes")


def bytes_tokenizer() -> Tokenizer:
    """Byte tokens as a BPE with no merges: id == byte value."""
    vocab = {c: b for b, c in enumerate(BYTE_CHARS)}
    return Tokenizer(_byte_level(HFTokenizer(models.BPE(vocab=vocab, merges=[]))), "bytes")


def train_bpe(texts: Iterable[bytes | str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of at most vocab_size tokens learned from texts."""
    if not BPE_VOCAB_MIN <= vocab_size <= BPE_VOCAB_MAX:
        raise DataError(
            f"vocab_size: expected an integer from {BPE_VOCAB_MIN} to {BPE_VOCAB_MAX}, "
            f"got {vocab_size}"
        )
    hf = _byte_level(HFTokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=BYTE_CHARS,
        show_progress=False,
        special_tokens=[],
    )

    def as_text():
        for t in texts:
            yield t.decode("utf-8", errors="replace") if isinstance(t, bytes) else t

    hf.train_from_iterator(as_text(), trainer=trainer)
    return Tokenizer(hf, "bpe")
