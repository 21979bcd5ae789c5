"""--train-vision on a tiny Gemma 3 composite built with transformers' own classes
(tests/vision_models.py): under LoRA the tower's and projector's weights train, the hf export
holds them merged and loads as the original class with TrainDeck's logits with images, and
the PEFT adapter on transformers' composite equals that export; under full fine-tuning the
checkpoint keeps the tower and a stopped run resumes bit for bit; bad uses are one line."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import StopAfter, tiny_config  # noqa: E402
from vision_models import (  # noqa: E402
    conversation,
    inputs_of,
    make_gemma3_vision,
    reloaded,
    save_image,
)

from core.runs.folder import read_metrics  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.weights.loader import load  # noqa: E402

TOLERANCE = 1e-4  # fp32, logits up to about 7


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision") / "base"
    # six layers: the sixth attends globally (the others slide over 8 tokens), so the
    # answers see the image and the tower has a gradient
    _, processor = make_gemma3_vision(folder)
    return folder, processor


def image_data(folder, n=8):
    lines = []
    for i in range(n):
        save_image(folder / f"{i % 4}.png", "png", (40, 30), i % 4)
        messages = conversation(f"{i % 4}.png", answer="red circle" if i % 2 else "blue")
        lines.append(json.dumps({"messages": messages}))
    (folder / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    return folder / "chat.jsonl"


def settings(base, data, **kw):
    values = dict(
        init_from=str(base),
        tokenizer="model",
        data=str(data),
        train_vision=True,
        max_steps=4,
        eval_every=4,
        ckpt_every=2,
        log_every=1,
        sample_tokens=0,
        seq_len=40,
        batch_size=2,
        dropout=0.0,
    )
    return tiny_config(**{**values, **kw})


def tower_tensors(folder):
    from safetensors.torch import load_file

    files = load_file(str(folder / "model.safetensors"))
    return {k: v for k, v in files.items() if "vision_tower" in k or "multi_modal" in k}


def test_lora_on_the_tower_exports_merged_and_as_peft_on_the_composite(gemma3, tmp_path):
    from peft import PeftModel

    folder, processor = gemma3
    data = image_data(tmp_path / "data")
    run = tmp_path / "run"
    Trainer(settings(folder, data, lora_rank=4, lr=3e-2), run).run()
    assert "tower and projector" in (run / "train.log").read_text()
    assert "LoRA on its linear layers" in (run / "train.log").read_text()
    saved = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["model"]
    tower_keys = [k for k in saved if k.startswith("vision.")]
    assert any(".lora_A" in k for k in tower_keys)  # the tower's adapters
    # Gemma 3's projector is one matrix (no linear layer): it trains whole
    assert "vision.multi_modal_projector.mm_input_projection_weight" in tower_keys
    export(run, "hf", tmp_path / "hf", which="latest")
    export(run, "peft", tmp_path / "peft", which="latest")
    before, after = tower_tensors(folder), tower_tensors(tmp_path / "hf")
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("self_attn.q_proj.weight" in k for k in changed)  # merged adapters
    assert any("mm_input_projection_weight" in k for k in changed)
    assert not any("layer_norm" in k for k in changed)  # no adapter: as it came
    adapter = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert "model.vision_tower.encoder.layers.0.self_attn.q_proj" in (adapter["target_modules"])
    assert adapter["modules_to_save"] == ["model.multi_modal_projector"]
    merged, base = reloaded(tmp_path / "hf"), reloaded(folder)
    picture = data.parent / "1.png"
    inputs = inputs_of(processor, conversation(picture), [picture])
    with torch.no_grad():
        want = merged(**inputs).logits
        ours = load(run, "latest").model.eval()  # the trained tower comes with it
        got = ours.logits(inputs["input_ids"], images=inputs["pixel_values"])
        assert (got - want).abs().max() < TOLERANCE
        adapted = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        assert (adapted(**inputs).logits - want).abs().max() < TOLERANCE


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_a_run_training_the_tower_resumes_bitwise(gemma3, tmp_path, lora_rank):
    """Full fine-tuning (every tower weight in the checkpoint) and LoRA (the tower's adapters
    and its projector): stopped and resumed, the straight run's losses bit for bit."""
    folder, processor = gemma3
    data = image_data(tmp_path / "data")
    cfg = settings(folder, data, lr=1e-3 if not lora_rank else 2e-2, lora_rank=lora_rank)
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(2))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    saved = torch.load(latest, weights_only=True)["model"]
    kept = "self_attn.q_proj.lora_A" if lora_rank else "embeddings.patch_embedding.weight"
    assert any(k.startswith("vision.") and kept in k for k in saved)  # what trains of it
    Trainer(cfg, tmp_path / "split", resume_from=latest).run()

    def losses(run):
        return [r["loss"] for r in read_metrics(run / "metrics.jsonl")[0]]

    assert losses(tmp_path / "split") == losses(tmp_path / "straight")
    if lora_rank:  # its export: test_lora_on_the_tower_exports_merged_and_as_peft_...
        return
    export(tmp_path / "straight", "hf", tmp_path / "hf", which="latest")
    before, after = tower_tensors(folder), tower_tensors(tmp_path / "hf")
    assert all(not torch.equal(before[k], after[k]) for k in before)  # every weight trained
    picture = data.parent / "1.png"
    inputs = inputs_of(processor, conversation(picture), [picture])
    with torch.no_grad():
        want = reloaded(tmp_path / "hf")(**inputs).logits
        model = load(tmp_path / "straight", "latest").model.eval()
        got = model.logits(inputs["input_ids"], images=inputs["pixel_values"])
        assert (got - want).abs().max() < TOLERANCE


def test_train_vision_without_a_tower_or_images_is_one_line(gemma3, tmp_path, capsys):
    from hf_models import make_model

    from core.cli.train import main as train_main

    folder, _ = gemma3
    data = image_data(tmp_path / "data", 2)
    text = tmp_path / "text.txt"
    text.write_text("plain text to train on. " * 40, encoding="utf-8")
    make_model(tmp_path / "qwen", "qwen3")
    capsys.readouterr()
    common = ["--max-steps", "1", "--seq-len", "32", "--train-vision", "--tokenizer", "model"]
    cases = [
        (["--init-from", str(tmp_path / "qwen"), "--data", str(text)], "has no vision tower"),
        (["--init-from", str(folder), "--data", str(text)], "the data holds no images"),
        (["--data", str(data)], "needs a pretrained vision model"),
    ]
    for args, why in cases:
        out = tmp_path / "out"
        assert train_main([*args, *common, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after any progress bar
        assert err.startswith("error: train_vision: ") and why in err
        assert not out.exists()


def test_under_qlora_the_tower_stays_unquantized(gemma3, tmp_path):
    """--base-bits 4: the language model's adapted layers are NF4, the tower's fp32 (its
    adapters train on the unquantized weights)."""
    from core.models.lora import LoRALinear

    folder, _ = gemma3
    data = image_data(tmp_path / "data", 4)
    t = Trainer(settings(folder, data, lora_rank=4, base_bits="4", max_steps=1), tmp_path / "r")
    t.run()
    adapted = {n: m for n, m in t.model.named_modules() if isinstance(m, LoRALinear)}
    tower = [m for n, m in adapted.items() if n.startswith("vision.")]
    text = [m for n, m in adapted.items() if not n.startswith("vision.")]
    assert tower and all(m.base_quantized is None for m in tower)
    assert all(m.weight.dtype == torch.float32 for m in tower)
    assert text and all(m.base_quantized is not None for m in text)


def test_a_qwen3_vl_tower_trains_under_lora_and_exports(tmp_path):
    """The same switch on Qwen3-VL's tower (its merger has linear layers: adapters there too):
    the hf export's logits with images are ours, and PEFT's adapter on transformers'
    composite equals the export."""
    from peft import PeftModel
    from test_vision_qwen import our_pixels, reference_inputs
    from transformers import AutoTokenizer
    from vision_models import make_qwen_vision, qwen_reloaded

    folder = tmp_path / "base"
    _, processor = make_qwen_vision(folder, "qwen3_vl")
    tok = AutoTokenizer.from_pretrained(folder)
    data, lines = tmp_path / "data", []
    for i in range(8):
        save_image(data / f"{i % 2}.png", "png", (40, 30) if i % 2 else (24, 56), i % 2)
        answer = "red circle" if i % 2 else "blue square"
        lines.append(json.dumps({"messages": conversation([f"{i % 2}.png"], answer=answer)}))
    (data / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    cfg = settings(folder, data / "chat.jsonl", lora_rank=4, lr=3e-2, max_steps=3, seq_len=64)
    Trainer(cfg, tmp_path / "run").run()
    saved = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=True)
    assert any(k.startswith("vision.visual.merger.") and ".lora_A" in k for k in saved["model"])
    export(tmp_path / "run", "hf", tmp_path / "hf", which="latest")
    export(tmp_path / "run", "peft", tmp_path / "peft", which="latest")
    picture = data / "1.png"
    inputs = reference_inputs(processor, tok, conversation([picture]), [picture])
    with torch.no_grad():
        want = qwen_reloaded(tmp_path / "hf")(**inputs).logits
        model = load(tmp_path / "run", "latest").model.eval()
        got = model.logits(inputs["input_ids"], images=our_pixels(folder, [picture]))
        assert (got - want).abs().max() < TOLERANCE
        adapted = PeftModel.from_pretrained(qwen_reloaded(folder), tmp_path / "peft").eval()
        assert (adapted(**inputs).logits - want).abs().max() < TOLERANCE


@pytest.mark.parametrize("lora_rank", [4, pytest.param(0, marks=pytest.mark.slow)])
def test_a_gemma4_tower_trains_and_exports(tmp_path, lora_rank):
    """The same switch on Gemma 4's encoder (its linear layers clipped: adapters inside the
    clamps; its projector a linear layer, adapted too), under LoRA and in full: the hf
    export holds the trained tower merged and loads as Gemma4ForConditionalGeneration with
    our logits with images, and PEFT's adapter on transformers' composite equals it."""
    from peft import PeftModel
    from test_vision_gemma4 import pixels_of
    from vision_models import make_gemma4_vision, reloaded4

    folder = tmp_path / "base"
    _, processor = make_gemma4_vision(folder)
    data, lines = tmp_path / "data", []
    for i in range(8):
        save_image(data / f"{i % 2}.png", "png", (40, 30) if i % 2 else (30, 44), i % 2)
        answer = "red circle" if i % 2 else "blue square"
        lines.append(json.dumps({"messages": conversation(f"{i % 2}.png", answer=answer)}))
    (data / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    cfg = settings(folder, data / "chat.jsonl", lora_rank=lora_rank, lr=3e-2, max_steps=3)
    cfg = type(cfg)(**{**cfg.__dict__, "seq_len": 96})
    Trainer(cfg, tmp_path / "run").run()
    log = (tmp_path / "run" / "train.log").read_text()
    how = "LoRA on its linear layers" if lora_rank else "trained in full"
    assert "vision: gemma4 tower and projector" in log and how in log
    saved = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=True)
    key = ".lora_A" if lora_rank else "encoder.layers.0.self_attn.q_proj.linear.weight"
    assert any(k.startswith("vision.") and key in k for k in saved["model"])
    export(tmp_path / "run", "hf", tmp_path / "hf", which="latest")
    before, after = tower4(folder), tower4(tmp_path / "hf")
    assert before.keys() == after.keys()  # the clip bounds and standardizing kept, named so
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("encoder.layers" in k and k.endswith("proj.linear.weight") for k in changed)
    assert "model.embed_vision.embedding_projection.weight" in changed
    assert not any("_min" in k or "_max" in k or "std_" in k for k in changed)
    picture = data / "1.png"
    inputs = inputs_of(processor, conversation(picture), [picture])
    base = reloaded4(folder)
    with torch.no_grad():
        want = reloaded4(tmp_path / "hf")(**inputs).logits
        assert (want - base(**inputs).logits).abs().max() > 0.1  # it trained
        model = load(tmp_path / "run", "latest").model.eval()
        got = model.logits(inputs["input_ids"], images=pixels_of(inputs))
        assert (got - want).abs().max() < TOLERANCE
        if lora_rank:
            export(tmp_path / "run", "peft", tmp_path / "peft", which="latest")
            adapted = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
            assert (adapted(**inputs).logits - want).abs().max() < TOLERANCE


def tower4(folder):
    """Gemma 4's tower and projector tensors in a folder's safetensors."""
    from safetensors.torch import load_file

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return {k: v for k, v in out.items() if "vision_tower" in k or "embed_vision" in k}
