"""Prompts for GRPO, in TRL's prompt-only layout: one record per prompt, {"prompt": text} or
{"prompt": [{"role": ..., "content": ...}, ...]} (rendered with the model's chat template), in
a .jsonl, .json, .csv or .parquet file. Every other column goes to the reward functions by
name. Prompts are drawn with a torch.Generator whose state is saved in checkpoints."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import torch

from core.data import images
from core.data.chat import chat_ids
from core.data.chatdata import BadLine, _messages, _sharegpt_images, refuse_media_parts
from core.data.tables import iter_records
from core.data.tokenizer import Tokenizer
from core.errors import DataError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def shows_images(record: dict) -> bool:
    """Whether a prompt record shows images: image parts, or ShareGPT's "images" list."""
    prompt = record.get("prompt")
    if record.get("images") is not None:
        return True
    return isinstance(prompt, list) and any(
        isinstance(m, dict)
        and isinstance(m.get("content"), list)
        and any(images.is_image_part(p) for p in m["content"])
        for m in prompt
    )


def image_messages(record: dict, where: str) -> list[dict]:
    """A prompt that shows images as messages with image parts (both forms, as DPO's)."""
    prompt = record["prompt"]
    try:
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        else:
            prompt = _messages(prompt, "prompt", images_ok=True)
        return _sharegpt_images(record, prompt)
    except BadLine as e:
        raise DataError(f"{where}: {e}") from None


def _prompt_ids(tok: Tokenizer, prompt, where: str) -> list[int]:
    if isinstance(prompt, str):
        if not prompt.strip():  # nothing to continue from: sampling would index no token
            raise DataError(f"{where}: the prompt is empty; give each row a prompt text")
        ids = tok.encode(prompt)
        return [tok.bos_id, *ids] if tok.add_bos else ids
    for n, m in enumerate(prompt if isinstance(prompt, list) else ()):
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
        spec: images.ImageSpec | None = None,
        images_problem: str = "",
    ):
        """room: the most prompt tokens that leave space for a completion; spec: how the
        model sees images (None: text only), images_problem: why it cannot, if so."""
        self.path = Path(path)
        if not self.path.is_file() or self.path.suffix.lower() not in SUFFIXES:
            raise DataError(
                f"data: {path} is not a prompt file; method grpo reads a .jsonl, .json, .csv "
                'or .parquet file of {"prompt": ...} records'
            )
        self.tokenizer = tokenizer
        self.records, self.ids = [], []
        self.spec = spec
        self.pixels: list[list] = []  # each prompt's images, resized (uint8 (3, H, W))
        self.image_names: list[list[str]] = []  # each prompt's image files, as written
        digest = hashlib.blake2b(self.path.read_bytes(), digest_size=10)
        for number, record in iter_records(self.path):
            where = f"{self.path} row {number}"
            if "prompt" not in record:
                raise DataError(f"{where}: no prompt column (found {', '.join(record) or 'none'})")
            if shows_images(record):
                ids = self._image_prompt(record, where, images_problem, digest)
            else:
                ids = _prompt_ids(tokenizer, record["prompt"], where)
                self.pixels.append([])
                self.image_names.append([])
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
        # what the setup attaches the tower for (as a chat cache's ImageStore): its spec
        self.images = SimpleNamespace(spec=spec) if any(self.pixels) else None
        self.conversational = isinstance(self.records[0]["prompt"], list)
        self.columns = [k for k in self.records[0] if k not in ("prompt", "row")]
        n_val = int(len(self.records) * val_fraction) if len(self.records) >= 10 else 0
        self.n_train = len(self.records) - n_val
        self.val_index = list(range(self.n_train, len(self.records)))
        self.generator = torch.Generator().manual_seed(seed)
        self.seq_len, self.rows_per_prompt = seq_len, rows_per_prompt
        digest.update(tokenizer.fingerprint().encode())
        self.source = str(self.path)
        self.manifest = {
            "fingerprint": digest.hexdigest(),
            "source": self.source,
            "tokenizer": tokenizer.kind,
            "files": [[str(self.path), self.path.stat().st_size]],
        }

    def _image_prompt(self, record: dict, where: str, problem: str, digest) -> list[int]:
        """A prompt that shows images: its ids with each image's tokens, its images read
        and resized now (before any model work), their bytes in the fingerprint."""
        messages = image_messages(record, where)
        files = images.conversation_images(messages)
        if self.spec is None:
            raise DataError(
                f"{where}: image {files[0]}: "
                + (
                    problem
                    or "this model reads text only here (no vision tower TrainDeck runs); "
                    "use a vision model (Gemma 3 4B and up, Gemma 4, Qwen3-VL, Qwen3.5), "
                    "or remove the image"
                )
            )
        pixels = []
        for f in files:
            try:
                path = images.image_path(f, self.path.parent)
                pixels.append(images.resized(images.open_rgb(path), self.spec))
            except images.ImageProblem as e:
                raise DataError(f"{where}: image {f} {e}") from None
            digest.update(path.read_bytes())
        counts = [images.image_tokens(self.spec, p) for p in pixels]
        try:
            ids = chat_ids(self.tokenizer, messages, images=self.spec, counts=counts)
        except images.ImageProblem as e:
            raise DataError(f"{where}: {e}") from None
        self.pixels.append(pixels)
        self.image_names.append(files)
        return ids

    def images_of(self, index: list[int]):
        """The forward's images= for rows of these prompts (each prompt's images in turn),
        or None where none shows one."""
        shown = [p for i in index for p in self.pixels[i]]
        return images.pixel_batch(shown, self.spec) if shown else None

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
    the rewards get, how many show images (read without a tokenizer: cheap)."""
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
    shown = sum(shows_images(r) for r in records)
    seen = f", {shown:,} with images" if shown else ""
    return f"{len(records):,} prompts ({kind}{seen}) for GRPO{extra}"
