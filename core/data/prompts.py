"""Prompts for GRPO, in TRL's prompt-only layout: one record per prompt, {"prompt": text} or
{"prompt": [{"role": ..., "content": ...}, ...]} (rendered with the model's chat template), in
a .jsonl, .json, .csv or .parquet file. Every other column goes to the reward functions by
name. Prompts are drawn with a torch.Generator whose state is saved in checkpoints."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from core.data import images
from core.data.chat import chat_ids
from core.data.chatdata import BadLine, refuse_media_parts
from core.data.tables import iter_records
from core.data.tokenizer import Tokenizer
from core.errors import DataError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def _prompt_ids(tok: Tokenizer, prompt, where: str) -> list[int]:
    if isinstance(prompt, str):
        if not prompt.strip():  # nothing to continue from: sampling would index no token
            raise DataError(f"{where}: the prompt is empty; give each row a prompt text")
        ids = tok.encode(prompt)
        return [tok.bos_id, *ids] if tok.add_bos else ids
    for n, m in enumerate(prompt if isinstance(prompt, list) else ()):
        parts = m.get("content") if isinstance(m, dict) else None
        if isinstance(parts, list) and any(images.is_image_part(p) for p in parts):
            raise DataError(
                f"{where}: prompt[{n}] shows an image: GRPO prompts are text only here "
                "(images train with SFT and DPO); remove the image part"
            )
        try:  # an audio or video part: named
            refuse_media_parts(m if isinstance(m, dict) else {}, f"prompt[{n}]")
        except BadLine as e:
            raise DataError(f"{where}: {e}") from None
    ok = (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in prompt
        )
    )
    if not ok:
        raise DataError(
            f"{where}: prompt must be text or a list of messages with role and content, got "
            f"{json.dumps(prompt)[:80]}"
        )
    if not any(m["content"].strip() for m in prompt):
        raise DataError(f"{where}: the prompt's messages are all empty; give each row a prompt")
    return chat_ids(tok, prompt)


class PromptData:
    """The prompts of a GRPO run, tokenized, split into training and held-out prompts."""

    is_chat, is_pairs = False, False

    def __init__(
        self,
        path: str | Path,
        tokenizer: Tokenizer,
        room: int,
        seed: int,
        val_fraction: float,
        rows_per_prompt: int,
        seq_len: int,
    ):
        """room: the most prompt tokens that leave space for a completion."""
        self.path = Path(path)
        if not self.path.is_file() or self.path.suffix.lower() not in SUFFIXES:
            raise DataError(
                f"data: {path} is not a prompt file; method grpo reads a .jsonl, .json, .csv "
                'or .parquet file of {"prompt": ...} records'
            )
        self.tokenizer = tokenizer
        self.records, self.ids = [], []
        for number, record in iter_records(self.path):
            where = f"{self.path} row {number}"
            if "prompt" not in record:
                raise DataError(f"{where}: no prompt column (found {', '.join(record) or 'none'})")
            ids = _prompt_ids(tokenizer, record["prompt"], where)
            if not ids:
                raise DataError(f"{where}: the prompt encodes to no tokens; give it some text")
            if len(ids) > room:
                raise DataError(
                    f"{where}: the prompt is {len(ids)} tokens; with max_completion_tokens it "
                    f"must fit seq_len (at most {room} prompt tokens): shorten it or raise seq_len"
                )
            self.records.append({**record, "row": number})
            self.ids.append(ids)
        if not self.records:
            raise DataError(f"data: {self.path} holds no prompts")
        self.conversational = isinstance(self.records[0]["prompt"], list)
        self.columns = [k for k in self.records[0] if k not in ("prompt", "row")]
        n_val = int(len(self.records) * val_fraction) if len(self.records) >= 10 else 0
        self.n_train = len(self.records) - n_val
        self.val_index = list(range(self.n_train, len(self.records)))
        self.generator = torch.Generator().manual_seed(seed)
        self.seq_len, self.rows_per_prompt = seq_len, rows_per_prompt
        digest = hashlib.blake2b(self.path.read_bytes(), digest_size=10)
        digest.update(tokenizer.fingerprint().encode())
        self.source = str(self.path)
        self.manifest = {
            "fingerprint": digest.hexdigest(),
            "source": self.source,
            "tokenizer": tokenizer.kind,
            "files": [[str(self.path), self.path.stat().st_size]],
        }

    @property
    def train_tokens(self) -> int:
        """The training prompts as tokens through the model (each as its G padded rows):
        what an epoch is counted in, with TrainConfig.tokens_per_step."""
        return self.n_train * self.seq_len * self.rows_per_prompt

    def size_text(self) -> str:
        """The training data in the start's log line: prompts, not padded rows."""
        tokens = sum(len(self.ids[i]) for i in range(self.n_train))
        return f"{self.n_train:,} train prompts ({tokens:,} prompt tokens)"

    def sample_starts(self, n: int) -> torch.Tensor:
        """The indices of one optimizer step's n prompts."""
        return torch.randint(0, self.n_train, (n,), generator=self.generator)

    def eval_index(self, n: int) -> list[int]:
        """Held-out prompts (the first training ones when none are held out), the same each time."""
        index = self.val_index or list(range(self.n_train))
        return index[:n]

    def prompt(self, n: int = 16) -> torch.Tensor:
        """A held-out prompt, for the sample at evaluation."""
        return torch.tensor(self.ids[self.eval_index(1)[0]])

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    def summary(self) -> dict:
        return {
            "source": self.source,
            "data_format": "prompts",
            "files": 1,
            "examples": {"train": self.n_train, "val": len(self.val_index)},
            "conversational": self.conversational,
            "columns": self.columns,
            "train_tokens": self.train_tokens,
            "val_tokens": 0,
            "prompt_tokens": sum(len(i) for i in self.ids),
            "tokenizer": self.tokenizer.kind,
            "fingerprint": self.manifest["fingerprint"],
        }


def describe(path: str | Path) -> str:
    """The form's line about a GRPO prompt file: how many prompts, their kind, the columns
    the rewards get (read without a tokenizer: cheap)."""
    path = Path(path).expanduser()
    if not path.is_file() or path.suffix.lower() not in SUFFIXES:
        return f"method grpo reads a prompt file ({', '.join(SUFFIXES)}); {path} is not one"
    try:
        records = [record for _, record in iter_records(path)]
    except DataError as e:
        return str(e)
    if not records or "prompt" not in records[0]:
        return f'{path.name}: no prompt column; method grpo reads {{"prompt": ...}} records'
    kind = "conversational" if isinstance(records[0]["prompt"], list) else "text"
    columns = [k for k in records[0] if k != "prompt"]
    extra = f"; columns for the rewards: {', '.join(columns)}" if columns else ""
    return f"{len(records):,} prompts ({kind}) for GRPO{extra}"
