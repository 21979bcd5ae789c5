"""Chat data with images (core.data.images, chatdata, build_chat): the data forms, Pillow
reading, the checkpoint's own image processing (pixel values equal transformers' image
processor's), the rows equal transformers' processor's input ids, the cache's store of
processed pixels, and each hostile input as one line naming file, line and image, exit 2,
nothing cached."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from vision_models import IMAGE_TOKENS, make_gemma3_vision, save_image

from core.cli.train import main as train_main
from core.data import images
from core.data.chatdata import parse_example, read_examples
from core.data.prepare import data_spec, prepare
from core.data.windows import TokenData
from core.errors import DataError
from core.weights import vision
from core.weights.loader import open_pretrained

KINDS = ("png", "jpeg", "webp", "rgba", "palette", "grey", "exif")


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("g3") / "base"
    _, processor = make_gemma3_vision(folder, layers=2)
    return folder, processor


def spec_of(folder, max_pixels=None):
    pre = open_pretrained(folder)
    return vision.image_spec(folder, pre.hf_config, pre.tokenizer, max_pixels)


def asked(path: str) -> dict:
    """A chat example asking about the image at path."""
    user = [{"type": "image", "image": path}, {"type": "text", "text": "What colour?"}]
    return {"messages": [{"role": "user", "content": user}, answer("red")]}


def answer(text):
    return {"role": "assistant", "content": text}


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_pixel_values_equal_transformers_image_processor(gemma3, tmp_path):
    """Every kind of image file, resized to the tower's size, rescaled and normalized as the
    folder's processor says: the same float32 numbers as transformers' Gemma 3 processor
    (given the image with its EXIF orientation applied, as transformers' load_image does)."""
    from PIL import Image, ImageOps

    folder, processor = gemma3
    spec = spec_of(folder)
    for n, kind in enumerate(KINDS):
        path = save_image(tmp_path / f"x.{kind}", kind, (70 + n, 45), n)
        ours = images.normalized(images.resized(images.open_rgb(path), spec), spec)
        shown = ImageOps.exif_transpose(Image.open(path))
        want = processor.image_processor(images=[shown], return_tensors="np")["pixel_values"][0]
        assert ours.dtype == np.float32 and ours.shape == want.shape == (3, 56, 56)
        assert np.array_equal(ours, want), kind
    turned = images.open_rgb(tmp_path / "x.exif")  # stored 76 x 45, shown turned upright
    assert turned.size == (45, 76)


def test_the_data_forms_and_paths_relative_to_the_data_file(tmp_path):
    """Parts with image / path / url (a local file) keys and OpenAI's image_url; ShareGPT's
    images list with <image> marks; paths resolve against the data file's folder, and one
    that leaves it through .. is allowed and noted."""
    parts = [
        {"type": "image", "image": "a.png"},
        {"type": "image", "path": "sub/b.png"},
        {"type": "image", "url": "file://" + str(tmp_path / "c.png")},
        {"type": "image_url", "image_url": {"url": "../d.png"}},
        {"type": "text", "text": "Which is red?"},
    ]
    parsed = parse_example({"messages": [{"role": "user", "content": parts}, answer("a")]})
    assert [p.get("image") for p in parsed[0]["content"]][:4] == [
        "a.png",
        "sub/b.png",
        "file://" + str(tmp_path / "c.png"),
        "../d.png",
    ]
    sharegpt = {
        "conversations": [
            {"from": "human", "value": "<image>Is it <image> red?"},
            {"from": "gpt", "value": "yes"},
        ],
        "images": ["a.png", "b.png"],
    }
    data = write_jsonl(tmp_path / "data" / "d.jsonl", [sharegpt, {"messages": parsed}])
    found = read_examples([data], skip_bad_lines=False)
    first = found.conversations[0][0]["content"]
    assert [p["type"] for p in first] == ["image", "text", "image", "text"]
    assert first[0]["image"] == str(tmp_path / "data" / "a.png")
    assert first[1]["text"] == "Is it "
    second = [p["image"] for p in found.conversations[1][0]["content"] if p["type"] == "image"]
    assert second[1] == str(tmp_path / "data" / "sub" / "b.png")
    assert second[2] == str(tmp_path / "c.png")  # absolute stays absolute
    assert found.outside == ["file://" + str(tmp_path / "c.png"), "../d.png"]
    # a list of text parts alone is its text
    text_only = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert parse_example({"messages": [text_only, answer("a")]})[0]["content"] == "hi"


def test_rows_equal_transformers_processor_ids_and_the_cache_keeps_the_pixels(
    gemma3, tmp_path, monkeypatch
):
    """The cache's rows: the template's text with each image mark made into the image's
    tokens, as transformers' processor does (equal input ids), image tokens never scored;
    each row's pixels stored and read back as the processor's; a second preparation reads
    no image again; a changed image prepares again, under another fingerprint."""
    from PIL import Image

    folder, processor = gemma3
    data = tmp_path / "d"
    for i in range(4):
        save_image(data / f"{i}.png", "png", (40, 30), i)
    records = [asked(f"{i % 4}.png") for i in range(6)]
    path = write_jsonl(data / "chat.jsonl", records)
    pre = open_pretrained(folder)
    spec = data_spec(_cfg(path))
    vision.tell_specs([spec], pre, None)
    cache = tmp_path / "cache"
    entry, manifest = prepare(spec, cache, pre.tokenizer, log=lambda m: None)
    assert manifest["images"] == 4  # each file once, though six examples show them
    rows = TokenData(entry, manifest, 80, 0)
    batch = rows.train_batch(rows.sample_starts(1) * 0)  # the first row
    messages = records[0]["messages"]
    text = processor.apply_chat_template(messages, tokenize=False)
    want = processor(text=text, images=[Image.open(data / "0.png").convert("RGB")])
    n = len(want["input_ids"][0])
    assert batch[0][0, : n - 1].tolist() == want["input_ids"][0][: n - 1]
    weights, targets = batch[2][0], batch[1][0]
    assert weights[targets == spec.images.token_id].sum() == 0  # image tokens never count
    assert weights.sum() > 0
    shown = processor.image_processor(images=[Image.open(data / "0.png").convert("RGB")])
    assert np.array_equal(batch.images[0].numpy(), shown["pixel_values"][0])
    assert batch.images.shape[0] == (batch[0][0] == spec.images.token_id).sum() // IMAGE_TOKENS

    def no_decoding(path):
        raise AssertionError(f"decoded {path} again")

    monkeypatch.setattr(images, "open_rgb", no_decoding)
    again, same = prepare(spec, cache, pre.tokenizer, log=lambda m: None)
    assert again == entry and same["fingerprint"] == manifest["fingerprint"]
    monkeypatch.undo()
    save_image(data / "2.png", "png", (40, 30), 99)  # another picture, same name
    said = []
    _, changed = prepare(spec, cache, pre.tokenizer, log=said.append)
    assert any("images changed" in line and "2.png" in line for line in said)
    assert changed["fingerprint"] != manifest["fingerprint"]  # a resume would refuse it


def _cfg(path, **kw):
    from helpers import tiny_config

    return tiny_config(data=str(path), seq_len=80, **kw)


def png_header(path: Path, width: int, height: int) -> Path:
    """A PNG that claims width x height in a few bytes (a decompression bomb's header)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    head = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    body = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(b""))
    path.write_bytes(body + chunk(b"IEND", b""))
    return path


def hostile_inputs(data: Path) -> dict:
    """name -> (the image part's file, what the line must say)."""
    save_image(data / "good.png")
    save_image(data / "whole.jpg", "jpeg", (64, 64))
    raw = (data / "whole.jpg").read_bytes()
    (data / "cut.jpg").write_bytes(raw[: len(raw) // 2])
    (data / "text.png").write_text("not a picture", encoding="utf-8")
    png_header(data / "huge.png", 20000, 20000)
    png_header(data / "bomb.png", 10000, 10000)
    save_image(data / "dot.png", "png", (1, 1))
    return {
        "missing": ("gone.png", "does not exist"),
        "truncated jpeg": ("cut.jpg", "is damaged (image file is truncated"),
        "text named .png": ("text.png", "is not an image Pillow can read"),
        "20000 x 20000": ("huge.png", "over the 89,478,485-pixel limit that guards against"),
        "decompression bomb": ("bomb.png", "is 10,000x10,000 (100,000,000 pixels), over the"),
        "1 x 1": ("dot.png", "is 1x1 pixels; an image needs at least 8"),
    }


def run_cli(args, capsys) -> tuple[int, str]:
    """The exit code and the error line (after the preparation's progress bar)."""
    code = train_main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and not any("Traceback" in e for e in err)
    return code, err[-1]


def test_hostile_images_are_one_line_naming_file_line_and_image(gemma3, tmp_path, capsys):
    folder, _ = gemma3
    data = tmp_path / "data"
    data.mkdir()
    cache = tmp_path / "cache"
    common = ["--init-from", str(folder), "--tokenizer", "model", "--seq-len", "64"]
    common += ["--prepare-only", "--data-cache", str(cache)]
    for what, (name, says) in hostile_inputs(data).items():
        path = write_jsonl(data / "chat.jsonl", [asked("good.png"), asked(name), asked("good.png")])
        code, err = run_cli(["--data", str(path), *common], capsys)
        assert code == 2, what
        assert err.startswith(f"error: data: {path} line 2: image {data / name} "), (what, err)
        assert says in err, (what, err)
        assert not [p for p in cache.glob("*")], what  # nothing cached, no temporary left
    mismatch = {
        "messages": [{"role": "user", "content": "<image><image>Same?"}, answer("no")],
        "images": ["good.png"],
    }
    path = write_jsonl(data / "chat.jsonl", [asked("good.png"), mismatch])
    code, err = run_cli(["--data", str(path), *common], capsys)
    assert code == 2
    assert f"{path} line 2: 2 <image> placeholder(s) in the messages but 1 image(s)" in err
    url = asked("https://example.com/cat.png")
    path = write_jsonl(data / "chat.jsonl", [url])
    code, err = run_cli(["--data", str(path), *common], capsys)
    assert code == 2 and "is a URL: only local files are read" in err


def test_an_image_for_a_text_only_model_is_one_line(tmp_path, capsys):
    """A model without a vision tower (here TrainDeck's own, bytes): the line and image named,
    exit 2, nothing cached."""
    data = tmp_path / "data"
    save_image(data / "good.png")
    text = {"messages": [{"role": "user", "content": "hi"}, answer("hello")]}
    path = write_jsonl(data / "chat.jsonl", [text, asked("good.png")])
    cache = tmp_path / "cache"
    args = ["--data", str(path), "--seq-len", "64", "--prepare-only", "--data-cache", str(cache)]
    code, err = run_cli(args, capsys)
    assert code == 2
    assert f"{path} line 2: image {data / 'good.png'}: this model reads text only" in err
    assert not list(cache.glob("*"))


def test_a_path_out_of_the_data_folder_is_allowed_and_logged(gemma3, tmp_path):
    folder, _ = gemma3
    save_image(tmp_path / "elsewhere.png")
    path = write_jsonl(tmp_path / "data" / "chat.jsonl", [asked("../elsewhere.png")] * 3)
    pre = open_pretrained(folder)
    spec = data_spec(_cfg(path))
    vision.tell_specs([spec], pre, None)
    said = []
    _, manifest = prepare(spec, tmp_path / "cache", pre.tokenizer, log=said.append)
    assert manifest["images"] == 1
    assert any("../elsewhere.png" in s and "outside the data folder" in s for s in said)


def test_image_max_pixels_below_a_fixed_tower_is_refused(gemma3, tmp_path):
    folder, _ = gemma3
    save_image(tmp_path / "a.png")
    path = write_jsonl(tmp_path / "chat.jsonl", [asked("a.png")] * 3)
    pre = open_pretrained(folder)
    spec = data_spec(_cfg(path))
    vision.tell_specs([spec], pre, 1000)
    with pytest.raises(DataError) as e:
        prepare(spec, tmp_path / "cache", pre.tokenizer, log=lambda m: None)
    assert "--image-max-pixels 1,000 is below this model's fixed image size 56x56" in str(e.value)


def test_the_data_line_names_the_images(tmp_path):
    """The window's data line for chat data with images (any template: TrainDeck's default
    cannot render image parts)."""
    from core.data.describe import data_line

    save_image(tmp_path / "a.png")
    path = write_jsonl(tmp_path / "chat.jsonl", [asked("a.png")] * 3)
    line = data_line(_cfg(path))
    assert "3 examples" in line and "3 images (their tokens counted when prepared)" in line
