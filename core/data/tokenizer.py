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

from core.errors import DataError

KINDS = ("bytes", "bpe", "model")  # model: a pretrained model's own tokenizer
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


def byte_level_bytes(token: str) -> bytes:
    """The bytes a GPT-2 byte-level token stands for."""
    return bytes(CHAR_TO_BYTE[c] for c in token if c in CHAR_TO_BYTE)


def _byte_level(hf: HFTokenizer) -> HFTokenizer:
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    return hf


class Tokenizer:
    """A tokenizer of one of KINDS; encode/decode are exact inverses on any bytes."""

    def __init__(self, hf: HFTokenizer, kind: str, meta: dict | None = None):
        self.hf = hf
        self.kind = kind
        # A pretrained tokenizer's special tokens and chat template; for bytes/bpe, only a
        # chat template (and its stop_strings) once trained on chat data.
        self.meta = dict(meta or {})
        self.vocab_size = hf.get_vocab_size()
        vocab = hf.get_vocab()
        # id -> the bytes it stands for, for exact decoding of any id sequence
        self._id_bytes = [b""] * self.vocab_size
        if kind == "model":
            self._id_bytes = _model_token_bytes(hf, self.vocab_size)
        else:
            for token, i in vocab.items():
                self._id_bytes[i] = byte_level_bytes(token)
            self._byte_ids = np.array([vocab[c] for c in BYTE_CHARS], dtype=np.int64)
        self._fast = None

    @property
    def bos_id(self) -> int | None:
        return self.meta.get("bos_id")

    @property
    def eos_id(self) -> int | None:
        return self.meta.get("eos_id")

    @property
    def add_bos(self) -> bool:
        return bool(self.meta.get("add_bos"))

    @property
    def stop_ids(self) -> list[int]:
        """Tokens that end a generated answer: EOS and the end-of-turn tokens."""
        ids = list(self.meta.get("stop_ids") or [])
        return ids or ([self.eos_id] if self.eos_id is not None else [])

    @property
    def stop_strings(self) -> list[str]:
        """Text that ends an answer where no token does (the default template's end mark
        for a tokenizer without EOS)."""
        return list(self.meta.get("stop_strings") or [])

    @property
    def chat_template(self) -> str | None:
        return self.meta.get("chat_template")

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
        if self.vocab_size <= 256:
            return np.uint8
        return np.uint16 if self.vocab_size <= 65536 else np.uint32

    def encode(self, data: bytes | str) -> list[int]:
        return self.encode_many([data])[0].tolist()

    def encode_many(self, chunks: list[bytes | str]) -> list[np.ndarray]:
        """Encode several chunks at once (the BPE runs them in parallel)."""
        if self.kind == "model":
            texts = [
                c if isinstance(c, str) else bytes(c).decode("utf-8", "replace") for c in chunks
            ]
            encoded = self.hf.encode_batch(texts, add_special_tokens=False)
            return [np.asarray(e.ids, dtype=np.int64) for e in encoded]
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

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of ids; skip_special leaves a pretrained tokenizer's special tokens out
        (as transformers' skip_special_tokens: what GRPO's rewards read, as TRL's do)."""
        if self.kind == "model":
            return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special)
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        """An id past the tokenizer's vocabulary (a model row it never trained, which a
        barely trained model can still pick) stands for nothing."""
        return self._id_bytes[i] if 0 <= i < len(self._id_bytes) else b""

    def hf_json(self) -> str:
        return self.hf.to_str()

    def to_hf_tokenizer(self) -> HFTokenizer:
        return HFTokenizer.from_str(self.hf.to_str())

    def fingerprint(self) -> str:
        return hashlib.blake2b(self.hf_json().encode(), digest_size=8).hexdigest()

    def save(self, path: str | Path) -> None:
        from core.platform.atomic import write_text

        write_text(Path(path), self.hf_json())

    @classmethod
    def load(cls, path: str | Path, meta: dict | None = None) -> Tokenizer:
        path = Path(path)
        try:
            return cls.from_json(path.read_text(encoding="utf-8"), meta)
        except (OSError, UnicodeDecodeError, DataError) as e:
            raise DataError(f"tokenizer: {path} is not a readable tokenizer.json ({e})") from None

    @classmethod
    def from_json(cls, text: str, meta: dict | None = None) -> Tokenizer:
        """meta: a pretrained tokenizer's (as `meta` holds it); for bytes and bpe, the chat
        template of a run trained on chat data, or None."""
        try:
            hf = HFTokenizer.from_str(text)
            merges = json.loads(text)["model"].get("merges") or []
        except Exception as e:
            raise DataError(f"tokenizer: not a tokenizer.json ({e})") from None
        if meta and meta.get("kind") == "model":
            return cls(hf, "model", meta)
        return cls(hf, "bpe" if merges else "bytes", meta)


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


def _model_token_bytes(hf: HFTokenizer, n: int) -> list[bytes]:
    """What each token of a pretrained tokenizer stands for: GPT-2 byte characters for
    byte-level BPEs (Llama 3, Qwen, SmolLM, GPT-2); for SentencePiece-style ones (Llama 2,
    Mistral, TinyLlama) '\u2581' is a space and <0xNN> is the byte NN. Special tokens stand
    for their own text."""
    spec = json.loads(hf.to_str())
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
    special = {t["id"] for t in spec.get("added_tokens") or [] if t.get("special")}
    out = [b""] * n
    for token, i in hf.get_vocab().items():
        if i >= n:
            continue
        if i in special:
            out[i] = token.encode("utf-8")
        elif byte_level:
            out[i] = byte_level_bytes(token)
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
            out[i] = bytes([int(token[3:5], 16)])
        else:
            out[i] = token.replace("\u2581", " ").encode("utf-8")
    return out


def _token_text(value) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"tokenizer: {path} is not readable JSON ({e})") from None


def chat_template_of(folder: Path, tok_config: dict) -> str | None:
    """The folder's chat template: chat_template.jinja, else tokenizer_config.json's."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template


def pretrained_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer of a Hugging Face model folder (tokenizer.json, tokenizer_config.json,
    generation_config.json, chat_template.jinja), with its BOS/EOS and end-of-turn tokens."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise DataError(
            f"tokenizer: {folder} has no tokenizer.json (a fast tokenizer file); TrainDeck "
            "cannot read tokenizer.model alone"
        )
    try:
        hf = HFTokenizer.from_file(str(path))
    except Exception as e:
        raise DataError(f"tokenizer: {path} is not a tokenizer.json ({e})") from None
    tok_config = _read_json(folder / "tokenizer_config.json")
    gen_config = _read_json(folder / "generation_config.json")
    model_config = _read_json(folder / "config.json")

    def token_id(value):
        text = _token_text(value)
        return hf.token_to_id(text) if text else None

    bos = token_id(tok_config.get("bos_token"))
    eos = token_id(tok_config.get("eos_token"))
    if bos is None and isinstance(model_config.get("bos_token_id"), int):
        bos = model_config["bos_token_id"]
    if eos is None and isinstance(model_config.get("eos_token_id"), int):
        eos = model_config["eos_token_id"]
    stops = gen_config.get("eos_token_id", model_config.get("eos_token_id"))
    stops = [stops] if isinstance(stops, int) else list(stops or [])
    if eos is not None and eos not in stops:
        stops.insert(0, eos)
    # Whether the tokenizer itself puts BOS first (Llama does, Qwen and GPT-2 do not).
    probe = hf.encode("a", add_special_tokens=True).ids
    meta = {
        "kind": "model",
        "bos_id": bos,
        "eos_id": eos,
        "add_bos": bool(probe) and bos is not None and probe[0] == bos,
        "stop_ids": stops,
        "bos_token": hf.id_to_token(bos) if bos is not None else None,
        "eos_token": hf.id_to_token(eos) if eos is not None else None,
        "chat_template": chat_template_of(folder, tok_config),
    }
    return Tokenizer(hf, "model", meta)
