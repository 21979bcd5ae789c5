"""Several data sources mixed by weight: each is prepared into its own cache entry as a
single source is (one tokenizer for all), and for every sequence of a step a source is drawn
by the weights, then a window (text) or a packed row (chat) from it, all from ONE seeded
torch.Generator whose state is saved in checkpoints, so resume stays exact.

Chat rows and text windows share a batch: text windows then carry a loss mask of ones and
one segment, chat rows their own mask and packed-example segments."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import torch

from core.config.spec import parse_weights
from core.data import hub
from core.data.prepare import DataSpec, data_spec
from core.data.windows import TokenData
from core.errors import DataError

EMBEDDED = "embedded"  # a source naming the embedded corpus


def sources_of(cfg) -> list[str | None]:
    """The run's data sources in order: data (None: the embedded corpus), then extra_data."""
    return [cfg.data, *cfg.extra_data]


def source_names(sources: list[str | None]) -> list[str]:
    """Short unique names for the log and metrics (val_loss/<name>)."""
    names = []
    for src in sources:
        if src is None or src == EMBEDDED:
            base = EMBEDDED
        elif hub.is_hub_id(src):
            base = src.split("/")[-1]
        else:
            base = Path(src).expanduser().name or str(src)
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


def source_spec(cfg, src: str | None, progress=None) -> DataSpec:
    """What to prepare for one source: a path or the embedded corpus as data_spec says, or the
    chosen split's files of a Hugging Face dataset id (downloaded into the HF cache)."""
    if src == EMBEDDED:
        src = None
    if not hub.is_hub_id(src):
        return data_spec(dataclasses.replace(cfg, data=src, extra_data=[]))
    files = hub.dataset_files(src, cfg.data_split, progress)
    # The first file decides the format (chat for .jsonl, as for a local file).
    spec = data_spec(dataclasses.replace(cfg, data=str(files[0]), extra_data=[]))
    spec.sources.files = files
    spec.sources.description = f"{src} ({cfg.data_split}, {len(files)} files)"
    return spec


def weights_of(cfg, parts: list[TokenData]) -> list[float]:
    """Each source's probability: data_weights normalised, else its share of training tokens."""
    if cfg.data_weights:
        raw = parse_weights(cfg.data_weights, len(parts))
    else:
        raw = [float(p.train_tokens) for p in parts]
    top = max(raw)  # weights are relative: scaled to at most 1 first, their sum cannot overflow
    raw = [w / top for w in raw]
    total = sum(raw)
    return [w / total for w in raw]


def check_pairs_alone(specs: list[DataSpec], sources: list[str | None]) -> None:
    """Preference pairs train alone: refused before any source of a mix is prepared."""
    if len(specs) < 2:
        return
    for name, spec in zip(source_names(sources), specs, strict=True):
        if spec.chat is not None and spec.chat.pairs:
            raise DataError(
                f"data: {name} holds preference pairs (method dpo), which train alone; "
                "give it as the only --data"
            )


def check_sources(cfg) -> None:
    """The cheap facts of every local data source (exists, kind, first record, layout) and of
    the mix, before anything is prepared; a dataset id is checked when it is downloaded."""
    sources = sources_of(cfg)
    local = [s for s in sources if not hub.is_hub_id(s if s != EMBEDDED else None)]
    specs = [source_spec(cfg, s) for s in local]
    check_pairs_alone(specs, local)


class MixedData:
    """TokenData's interface over several prepared sources. sample_starts returns (n, 2)
    rows of (source index, start), so a step's draws split into micro-batches and ranks as
    a single source's do."""

    def __init__(self, parts: list[TokenData], names: list[str], weights: list[float], seed: int):
        for name, part in zip(names, parts, strict=True):
            if part.manifest.get("data_format") == "preference":
                raise DataError(
                    f"data: {name} holds preference pairs (method dpo), which train alone; "
                    "give it as the only --data"
                )
        self.parts, self.names, self.weights = parts, names, weights
        self.seq_len = parts[0].seq_len
        self.generator = torch.Generator().manual_seed(seed)
        for part in parts:  # every draw, of a source or a window, comes from the one generator
            part.generator = self.generator
        self._probs = torch.tensor(weights, dtype=torch.float64)
        chat = [p for p in parts if p.is_chat]
        # The chat part's tokenizer carries the chat template the run and its exports use.
        self.main = chat[0] if chat else parts[0]
        self.tokenizer = self.main.tokenizer
        self.manifest = self.main.manifest
        self.source = " + ".join(p.source for p in parts)
        self.val_losses: dict[str, float] = {}  # the last evaluation's, per source

    @property
    def is_chat(self) -> bool:
        return any(p.is_chat for p in self.parts)

    @property
    def train_tokens(self) -> int:
        return sum(p.train_tokens for p in self.parts)

    @property
    def val_bytes_per_token(self) -> float:
        """The weighted mean of the sources' bytes per token (bits per byte of the mix)."""
        return sum(w * p.val_bytes_per_token for w, p in zip(self.weights, self.parts, strict=True))

    def sample_starts(self, n: int) -> torch.Tensor:
        which = torch.multinomial(self._probs, n, replacement=True, generator=self.generator)
        starts = torch.zeros(n, dtype=torch.int64)
        for i, part in enumerate(self.parts):
            rows = (which == i).nonzero().flatten()
            if len(rows):
                starts[rows] = part.sample_starts(len(rows))
        return torch.stack([which, starts], dim=1)

    def train_batch(self, picks: torch.Tensor):
        """(inputs, targets, weights, segments) of the picked windows, in the picks' order."""
        n = len(picks)
        x = torch.zeros(n, self.seq_len, dtype=torch.int64)
        y = torch.zeros_like(x)
        masked = self.is_chat
        mask = torch.ones(n, self.seq_len) if masked else None
        seg = torch.zeros(n, self.seq_len, dtype=torch.int64) if masked else None
        for i, part in enumerate(self.parts):
            rows = (picks[:, 0] == i).nonzero().flatten()
            if not len(rows):
                continue
            px, py, pmask, pseg = part.train_batch(picks[rows, 1])
            x[rows], y[rows] = px, py
            if pmask is not None:
                mask[rows], seg[rows] = pmask, pseg
        return x, y, mask, seg

    def val_batches(self, n_windows: int, batch_size: int):
        """Every source's validation windows, one after another (used by scorers that want
        the mix's held-out data; the run's val_loss weighs the sources: see
        core.training.evaluation)."""
        for part in self.parts:
            for x, y, mask, seg in part.val_batches(n_windows, batch_size):
                if self.is_chat and mask is None:
                    mask, seg = torch.ones(y.shape), torch.zeros(y.shape, dtype=torch.int64)
                yield x, y, mask, seg

    def mixed_loss(self, losses: list[float]) -> float:
        """The run's validation loss: the weighted mean of the sources' own."""
        self.val_losses = dict(zip(self.names, losses, strict=True))
        return sum(w * loss for w, loss in zip(self.weights, losses, strict=True))

    def prompt(self, n: int = 16) -> torch.Tensor:
        return self.main.prompt(n)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    def shares_line(self) -> str:
        """The run log's line: each source's share of the training sequences."""
        items = [
            f"{name} {w:.1%} ({p.train_tokens:,} train tokens)"
            for name, w, p in zip(self.names, self.weights, self.parts, strict=True)
        ]
        return "data mix (share of training sequences): " + ", ".join(items)

    @property
    def fingerprint(self) -> str:
        joined = ":".join(p.manifest["fingerprint"] for p in self.parts)
        return hashlib.blake2b(joined.encode(), digest_size=12).hexdigest()

    def summary(self) -> dict:
        """data.json: the main source's figures, the mix's totals and each source's own."""
        out = self.main.summary()
        each = [p.summary() for p in self.parts]
        totals = (
            "source_bytes",
            "total_bytes",
            "files",
            "empty_files",
            "train_tokens",
            "val_tokens",
            "train_bytes",
            "val_bytes",
        )
        out.update({key: sum(e[key] for e in each) for key in totals})
        out.update(
            source=self.source,
            fingerprint=self.fingerprint,
            mix=[
                {"name": name, "weight": round(w, 6), **e}
                for name, w, e in zip(self.names, self.weights, each, strict=True)
            ],
        )
        return out
