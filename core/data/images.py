"""Images in chat data: the parts that name them, reading them with Pillow, the checkpoint's own
image processing (as its preprocessor_config.json says), and the cache's store of processed
pixels.

Two forms of a record carry images (core.data.chatdata parses them):
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "cat.png"},
                                               {"type": "text", "text": "What is this?"}]}, ...]}
      (also "path" or "url" for a local file; paths are relative to the data file)
    {"messages": [{"role": "user", "content": "<image>What is this?"}, ...],
     "images": ["cat.png"]}                                    (ShareGPT, as LLaMA-Factory)

An image is PNG, JPEG or WebP; EXIF orientation is applied, transparency composited on white
(as transformers' convert_to_rgb) and palette or grey images become RGB. Each bad image is one
line naming the data file, its line and the image, before any training.

What a model does with an image (ImageSpec) comes from the model's folder (core.weights.vision
makes it): how the template marks an image, the tokens the mark expands to, and how pixels are
resized and normalized. The cache keeps each image resized (uint8) once, so a second run does
not decode again; normalizing happens per batch (exact and cheap).
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

FORMATS = ("PNG", "JPEG", "WEBP")
MIN_SIDE = 8  # pixels: smaller shows nothing a model could learn from
MAX_PIXELS = 89_478_485  # Pillow's decompression-bomb limit (a 20,000 x 20,000 image is over)
PLACEHOLDER = "<image>"  # ShareGPT's mark of where an image of the "images" list goes
IMAGE_KEYS = ("image", "path", "url")  # an image part's keys naming its file


class ImageProblem(ValueError):
    """What is wrong with one image (the caller adds the file, line and image)."""


@dataclass(frozen=True)
class ImageSpec:
    """How a model sees an image: the text its chat template writes for an image part
    (placeholder), what that text becomes for an image of n tokens (before + token * n +
    after), and its image processor's settings (preprocessor_config.json)."""

    kind: str  # "fixed": resized to height x width (SigLIP: Gemma 3); "dynamic": Qwen's;
    # "pooled_patches": Gemma 4's (aspect kept, patch_size patches, pooling^2 of them a token)
    placeholder: str  # what the template writes for an image part
    token: str  # the image token, repeated once per embedding the tower gives
    token_id: int
    before: str
    after: str
    tokens: int  # embeddings an image gives (fixed size)
    height: int
    width: int
    resample: int = 2  # PIL's BILINEAR
    rescale: float = 1 / 255
    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)
    do_rescale: bool = True
    do_normalize: bool = True
    max_pixels: int | None = None  # --image-max-pixels: a cap on an image's resized pixels
    # "dynamic" (Qwen2VLImageProcessor: Qwen3-VL, Qwen3.5): sides resized to multiples of
    # patch_size * merge_size within min_pixels..longest pixels, cut into patches
    patch_size: int = 0
    merge_size: int = 1
    temporal_patch_size: int = 1
    min_pixels: int = 0
    longest: int = 0  # the processor's own most pixels (size.longest_edge)
    # "pooled_patches" (Gemma 4): patches pooled pooling x pooling into a token; tokens: the
    # most an image gives (its max_soft_tokens)
    pooling: int = 0

    def key(self) -> dict:
        """What the cache key holds of it: everything that changes the rows or pixels."""
        return asdict(self)

    def text(self, n_tokens: int) -> str:
        return self.before + self.token * n_tokens + self.after


# -- reading ------------------------------------------------------------------------------------


def image_path(value, base: Path) -> Path:
    """An image part's file: a local path (or file:// URL), relative to the data file's
    folder; ImageProblem for what is not one."""
    if not isinstance(value, str) or not value.strip():
        raise ImageProblem("must name an image file (a path string)")
    text = value.strip()
    if text.startswith(("http://", "https://", "data:")):
        raise ImageProblem("is a URL: only local files are read; download it and give its path")
    if text.startswith("file://"):
        text = text[len("file://") :]
    path = Path(text).expanduser()
    return path if path.is_absolute() else base / path


def outside(path: Path, base: Path) -> bool:
    """Whether path leaves the data file's folder (through ..): allowed, and logged."""
    try:
        Path(os.path.normpath(path)).relative_to(os.path.normpath(base))
    except ValueError:
        return True
    return False


def open_rgb(path: Path):
    """The image at path decoded whole and checked, as an RGB PIL image with its EXIF
    orientation applied; ImageProblem for a missing, unreadable, damaged, tiny or huge one."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                check_header(im.format, *im.size)
                im.load()  # a truncated or damaged file fails here, not in training
                return to_rgb(ImageOps.exif_transpose(im))
    except FileNotFoundError:
        raise ImageProblem("does not exist") from None
    except IsADirectoryError:
        raise ImageProblem("is a folder, not an image file") from None
    except UnidentifiedImageError:
        raise ImageProblem("is not an image Pillow can read (PNG, JPEG or WebP)") from None
    except Image.DecompressionBombError as e:  # over twice the limit: Pillow's own check
        raise ImageProblem(
            f"is over the {MAX_PIXELS:,}-pixel limit that guards against decompression bombs "
            f"(Pillow: {str(e).rstrip('.')}); resize it"
        ) from None
    except PermissionError:
        raise ImageProblem("cannot be read (permission denied)") from None
    except (OSError, SyntaxError, ValueError) as e:  # Pillow's damaged-file errors
        if isinstance(e, ImageProblem):
            raise
        raise ImageProblem(f"is damaged ({e})") from None


def check_header(fmt: str | None, width: int, height: int) -> None:
    """The cheap facts of an image from its header: its format and size."""
    if fmt not in FORMATS:
        raise ImageProblem(f"is a {fmt or 'unknown'} image; PNG, JPEG or WebP are read")
    if width * height > MAX_PIXELS:
        raise ImageProblem(
            f"is {width:,}x{height:,} ({width * height:,} pixels), over the {MAX_PIXELS:,}-pixel "
            "limit that guards against decompression bombs; resize it"
        )
    if min(width, height) < MIN_SIDE:
        raise ImageProblem(
            f"is {width}x{height} pixels; an image needs at least {MIN_SIDE} pixels a side"
        )


def to_rgb(im):
    """RGB as transformers' convert_to_rgb makes it: transparency composited on white."""
    from PIL import Image

    if "A" in im.getbands() or im.info.get("transparency") is not None:
        im = im.convert("RGBA")
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, im).convert("RGB")
    return im.convert("RGB")


def file_facts(path: Path) -> dict:
    """What the cache keeps of an image file to know it again: path, size, mtime, hash."""
    st = path.stat()
    return {
        "path": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def changed_images(facts: list[dict]) -> list[str]:
    """The images (of a cache entry's manifest) that are gone or hold other bytes now; a
    file with the same size and mtime is taken as unchanged without reading it."""
    out = []
    for f in facts:
        path = Path(f["path"])
        try:
            st = path.stat()
        except OSError:
            out.append(f"{path} (gone)")
            continue
        if st.st_size == f["size"] and st.st_mtime_ns == f["mtime_ns"]:
            continue
        if hashlib.sha256(path.read_bytes()).hexdigest() != f["sha256"]:
            out.append(str(path))
    return out


# -- the checkpoint's processing ----------------------------------------------------------------


def smart_resize(height: int, width: int, spec: ImageSpec) -> tuple[int, int]:
    """Qwen's dynamic size (transformers' smart_resize): each side a multiple of patch_size *
    merge_size, the pixels within min_pixels and the processor's (or the cap's, the lower)
    most, the aspect ratio kept as near as those allow."""
    factor = spec.patch_size * spec.merge_size
    most = min(spec.longest, spec.max_pixels) if spec.max_pixels else spec.longest
    if max(height, width) / min(height, width) > 200:
        raise ImageProblem(
            f"is {width}x{height} pixels; this model reads images of an aspect ratio under 200"
        )
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > most:
        beta = math.sqrt(height * width / most)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < spec.min_pixels:
        beta = math.sqrt(spec.min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def resized(im, spec: ImageSpec) -> np.ndarray:
    """The image as the model's processor resizes it: uint8 (3, H, W)."""
    if spec.kind == "dynamic":
        h, w = smart_resize(im.height, im.width, spec)
        out = im.resize((w, h), resample=spec.resample)
        return np.ascontiguousarray(np.asarray(out, dtype=np.uint8).transpose(2, 0, 1))
    if spec.kind == "pooled_patches":
        return _gemma4_resized(im, spec)
    h, w = spec.height, spec.width
    if spec.max_pixels and h * w > spec.max_pixels:  # a fixed-size tower: the cap is its size
        raise ImageProblem(
            f"--image-max-pixels {spec.max_pixels:,} is below this model's fixed image size "
            f"{w}x{h}; raise it or leave it unset"
        )
    out = im.resize((w, h), resample=spec.resample)
    return np.ascontiguousarray(np.asarray(out, dtype=np.uint8).transpose(2, 0, 1))


def normalized(pixels: np.ndarray, spec: ImageSpec) -> np.ndarray:
    """uint8 (3, H, W) -> float32 pixel values, as transformers' PIL image processor makes
    them (rescaled in float64, cast, then (x - mean) / std in float32)."""
    x = pixels.astype(np.float64) * spec.rescale if spec.do_rescale else pixels
    x = x.astype(np.float32)
    if spec.do_normalize:
        mean = np.array(spec.mean, dtype=np.float32)
        std = np.array(spec.std, dtype=np.float32)
        x = ((x.T - mean) / std).T
    return np.ascontiguousarray(x, dtype=np.float32)


def image_tokens(spec: ImageSpec, pixels: np.ndarray) -> int:
    """Embeddings the tower gives for these processed (resized) pixels: Qwen's one per
    merge_size x merge_size patches, Gemma 4's one per pooling x pooling patches."""
    if spec.kind == "dynamic":
        _, h, w = pixels.shape
        return (h // spec.patch_size) * (w // spec.patch_size) // spec.merge_size**2
    if spec.kind == "pooled_patches":
        _, h, w = pixels.shape
        return (h // spec.patch_size) * (w // spec.patch_size) // spec.pooling**2
    return spec.tokens


def patchify(x: np.ndarray, spec: ImageSpec) -> np.ndarray:
    """Normalized pixels (C, H, W) -> Qwen's patches (grid_h * grid_w, C * T * P * P), as
    transformers' Qwen2VLImageProcessor lays them out: merge_size x merge_size blocks of
    patches together, each patch repeated temporal_patch_size times (a still image)."""
    c, h, w = x.shape
    p, m, t = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    gh, gw = h // p, w // p
    patches = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    patches = np.broadcast_to(
        patches[:, :, :, :, :, None], (*patches.shape[:5], t, *patches.shape[5:])
    )
    return np.ascontiguousarray(patches.reshape(gh * gw, c * t * p * p), dtype=np.float32)


@dataclass
class Patches:
    """A batch's images as a dynamic-resolution tower takes them: every image's patches in
    one (patches, C * T * P * P) tensor and each image's (t, h, w) grid of patches (N, 3), as
    transformers' pixel_values and image_grid_thw. Moves as a tensor does (to, pin_memory)."""

    values: torch.Tensor
    grid: torch.Tensor

    def to(self, *args, **kwargs) -> Patches:
        values = self.values.to(*args, **kwargs)
        return Patches(values, self.grid.to(values.device))

    def pin_memory(self) -> Patches:
        return Patches(self.values.pin_memory(), self.grid)

    def __len__(self) -> int:
        return len(self.grid)


def pixel_batch(resized_images: list[np.ndarray], spec: ImageSpec):
    """Resized images (uint8 (3, H, W) each) as the forward pass takes them: a fixed-size
    tower's (N, 3, H, W) float32 pixel values, a dynamic one's Patches, or Gemma 4's (N,
    budget, 3 p^2 + 2): each image's patches padded to its budget, with their grid positions
    (core.models.vision_gemma4.joined)."""
    import torch

    normed = [normalized(p, spec) for p in resized_images]
    if spec.kind == "pooled_patches":
        return torch.from_numpy(np.stack([_gemma4_patches(v, spec) for v in normed]))
    if spec.kind != "dynamic":
        return torch.from_numpy(np.stack(normed))
    p = spec.patch_size
    grid = [[1, x.shape[1] // p, x.shape[2] // p] for x in normed]
    values = np.concatenate([patchify(x, spec) for x in normed])
    return Patches(torch.from_numpy(values), torch.tensor(grid, dtype=torch.long))


def _gemma4_size(height: int, width: int, spec: ImageSpec) -> tuple[int, int]:
    """Gemma 4's resize: the largest size keeping the aspect ratio within max_soft_tokens x
    pooling^2 patches, each side a multiple of pooling x patch (transformers'
    get_aspect_ratio_preserving_size)."""
    p, k = spec.patch_size, spec.pooling
    patches = spec.tokens * k * k
    factor = math.sqrt(patches * p * p / (height * width))
    side = k * p
    h = int(math.floor(factor * height / side)) * side
    w = int(math.floor(factor * width / side)) * side
    longest = (patches // k**2) * side
    if h == 0 and w == 0:
        raise ImageProblem(f"is {width}x{height}: too small for this model's {side}-pixel blocks")
    if h == 0:
        h, w = side, min(int(math.floor(width / height)) * side, longest)
    elif w == 0:
        w, h = side, min(int(math.floor(height / width)) * side, longest)
    if h * w > patches * p * p:
        raise ImageProblem(
            f"is {width}x{height}: too elongated for this model's image budget; crop it"
        )
    return h, w


def _gemma4_resized(im, spec: ImageSpec) -> np.ndarray:
    h, w = _gemma4_size(im.height, im.width, spec)
    if (h, w) != (im.height, im.width):
        im = im.resize((w, h), resample=spec.resample)
    return np.ascontiguousarray(np.asarray(im, dtype=np.uint8).transpose(2, 0, 1))


def _gemma4_patches(values: np.ndarray, spec: ImageSpec) -> np.ndarray:
    """float32 (3, H, W) -> (budget, 3 p^2 + 2): patches row by row, each (row, column,
    channel) flat, then its x and y in the grid; padding: zeros at position (-1, -1)."""
    p = spec.patch_size
    c, h, w = values.shape
    rows, cols = h // p, w // p
    patches = values.reshape(c, rows, p, cols, p).transpose(1, 3, 2, 4, 0).reshape(rows * cols, -1)
    xs, ys = np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy")
    where = np.stack([xs, ys], -1).reshape(rows * cols, 2).astype(np.float32)
    out = np.zeros((spec.tokens * spec.pooling**2, patches.shape[1] + 2), dtype=np.float32)
    out[:, -2:] = -1.0
    out[: rows * cols, :-2] = patches
    out[: rows * cols, -2:] = where
    return out


def marks_expanded(text: str, spec: ImageSpec, counts: list[int]) -> tuple[str, list]:
    """A rendered conversation with each image mark its template wrote made into the model's
    image tokens (as its processor does: counts[i] for the i-th), and where the text grew:
    [(position in text, characters added)]."""
    pieces = text.split(spec.placeholder)
    if len(pieces) - 1 != len(counts):
        raise ImageProblem(
            f"the chat template wrote {len(pieces) - 1} image mark(s) ({spec.placeholder!r}) "
            f"for {len(counts)} image(s); this model's template does not show images as its "
            "processor expects"
        )
    out, shifts, at = [pieces[0]], [], len(pieces[0])
    for piece, n in zip(pieces[1:], counts, strict=True):
        expanded = spec.text(n)
        shifts.append((at, len(expanded) - len(spec.placeholder)))
        out += [expanded, piece]
        at += len(spec.placeholder) + len(piece)
    return "".join(out), shifts


# -- parts of a message -------------------------------------------------------------------------


def is_image_part(part) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image", "image_url", "input_image")


def part_path(part: dict):
    """The file an image part names (its "image", "path" or "url"; OpenAI's image_url's
    url), unresolved."""
    if part.get("type") == "image_url":
        inner = part.get("image_url")
        return inner.get("url") if isinstance(inner, dict) else inner
    for key in IMAGE_KEYS + ("image_url",):
        if part.get(key) is not None:
            return part[key]
    return None


def named_marks(text: str, spec: ImageSpec, names: list[str]) -> str:
    """Decoded text with each image's tokens (its before, token run and after) as
    [image NAME], in order: what a sample shows instead of hundreds of image tokens."""
    import re

    run = re.escape(spec.before) + f"(?:{re.escape(spec.token)})+" + re.escape(spec.after)
    left = iter(names)
    return re.sub(run, lambda _: f"[image {Path(next(left, '') or '?').name}]", text)


def split_placeholders(text: str, paths: list) -> list[dict]:
    """ShareGPT content with <image> marks as parts, taking the next paths in turn."""
    parts: list[dict] = []
    pieces = text.split(PLACEHOLDER)
    for i, piece in enumerate(pieces):
        if i:
            parts.append({"type": "image", "image": paths.pop(0)})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def conversation_images(messages: list[dict]) -> list[str]:
    """The image files a parsed conversation names, in order."""
    return [
        p["image"]
        for m in messages
        if isinstance(m["content"], list)
        for p in m["content"]
        if p.get("type") == "image"
    ]


# -- the cache's store ----------------------------------------------------------------------------


@dataclass
class ImageWriter:
    """Processed images into an entry's images.bin, each distinct file once; rows name
    theirs (row_images.npy: each row's images, flat; row_starts.npy: where each row's begin)."""

    folder: Path
    spec: ImageSpec
    index: list = field(default_factory=list)  # [offset, channels, height, width] an image
    by_file: dict = field(default_factory=dict)  # sha256 -> image number
    facts: dict = field(default_factory=dict)  # path -> file_facts
    offset: int = 0
    rows: list = field(default_factory=list)  # each row's image numbers (train, then val)
    names: list = field(default_factory=list)  # each image's file (the first with its pixels)

    def __post_init__(self):
        self.file = open(self.folder / "images.bin", "wb")  # noqa: SIM115 (closed in finish)

    def add(self, path: Path, pixels: np.ndarray, facts: dict) -> int:
        """The image's number, writing its pixels unless the same file's are there."""
        self.facts[str(path)] = facts
        known = self.by_file.get(facts["sha256"])
        if known is not None:
            return known
        self.file.write(pixels.tobytes())
        self.index.append([self.offset, *pixels.shape])
        self.names.append(str(path))
        self.offset += pixels.nbytes
        self.by_file[facts["sha256"]] = len(self.index) - 1
        return len(self.index) - 1

    def finish(self, rows: list[list[int]]) -> dict:
        """Close the store with each row's image numbers (train rows, then val rows); what
        the manifest says of it (and the hash that joins the entry's content hash)."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        index = np.array(self.index, dtype=np.int64).reshape(-1, 4)
        flat = np.array([i for r in rows for i in r], dtype=np.int64)
        starts = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
        np.save(self.folder / "image_index.npy", index)
        np.save(self.folder / "row_images.npy", flat)
        np.save(self.folder / "row_starts.npy", starts)
        digest = hashlib.blake2b(digest_size=16)
        for f in sorted(self.facts.values(), key=lambda f: f["path"]):
            digest.update(f"{f['path']}\0{f['sha256']}\0".encode())
        digest.update(flat.tobytes())
        return {
            "images": len(self.index),
            "image_files": sorted(self.facts.values(), key=lambda f: f["path"]),
            "image_spec": self.spec.key(),
            "image_hash": digest.hexdigest(),
            "image_names": self.names,  # what samples name (not in the hash: no pixels)
        }


def spec_of(saved: dict) -> ImageSpec:
    """An ImageSpec from its key() (JSON turns its tuples into lists)."""
    return ImageSpec(**{**saved, "mean": tuple(saved["mean"]), "std": tuple(saved["std"])})


class ImageStore:
    """A cache entry's processed images, read by row: a batch's pixel values."""

    def __init__(self, folder: Path, manifest: dict):
        self.spec = spec_of(manifest["image_spec"])
        self.index = np.load(folder / "image_index.npy")
        self.flat = np.load(folder / "row_images.npy")
        self.starts = np.load(folder / "row_starts.npy")
        size = int(self.index[-1, 0] + np.prod(self.index[-1, 1:])) if len(self.index) else 0
        self.pixels = np.memmap(folder / "images.bin", dtype=np.uint8, mode="r", shape=(size,))
        self.names = manifest.get("image_names") or []  # older entries have none

    def row_images(self, row: int) -> list[int]:
        return self.flat[self.starts[row] : self.starts[row + 1]].tolist()

    def row_names(self, row: int) -> list[str]:
        """The files of a row's images, in order ("" for an entry that kept no names)."""
        return [self.names[i] if i < len(self.names) else "" for i in self.row_images(row)]

    def image(self, number: int) -> np.ndarray:
        offset, *shape = (int(v) for v in self.index[number])
        return np.asarray(self.pixels[offset : offset + math.prod(shape)]).reshape(shape)

    def batch(self, rows: list[int]):
        """The pixel values (N, 3, H, W) float32 of the rows' images in order, or a dynamic
        tower's Patches (pixel_batch); None: none."""
        images = [self.image(i) for r in rows for i in self.row_images(r)]
        if not images:
            return None
        return pixel_batch(images, self.spec)
