"""The Playground with a Gemma 4 image: a tiny Gemma 4 composite (built with transformers'
own config classes) answers a chat turn with a picture as transformers' greedy generate does,
the image processed by TrainDeck's own code (its aspect kept, its own count of tokens)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from vision_models import make_gemma4_vision, reloaded4, save_image  # noqa: E402


def test_the_playground_answers_about_an_image_as_transformers_does(
    make_window, qtbot, tmp_path, dialogs
):
    from PIL import Image

    folder = tmp_path / "gemma4"
    _, processor = make_gemma4_vision(folder)
    picture = save_image(tmp_path / "red.png", "png", (90, 50), 3)
    messages = [{"role": "user", "content": [{"type": "image", "image": str(picture)}]}]
    messages[0]["content"].append({"type": "text", "text": "What colour?"})
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = processor(text=text, images=[Image.open(picture).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        out = reloaded4(folder).generate(**inputs, max_new_tokens=5, do_sample=False)
    want = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
    want = want.split("<turn|>")[0].strip()
    assert want  # a real answer to compare (the tiny model does not stop at once)

    pg = make_window().playground
    pg.refresh_runs(folder)
    assert pg.image_button.isEnabled()
    assert pg.add_images([picture])
    pg.temperature.setValue(0.0)
    pg.length.setValue(5)
    pg.chat.setChecked(True)
    pg.prompt.setPlainText("What colour?")
    with qtbot.waitSignal(pg.generation_done, timeout=60_000):
        assert pg.generate()
    assert pg.status.text().startswith("Done"), pg.status.text()
    shown = pg.output.toPlainText()
    assert shown.startswith("You: [image red.png] What colour?\n\nModel: ")
    assert shown.removeprefix("You: [image red.png] What colour?\n\nModel: ").strip() == want
    assert not dialogs.calls
