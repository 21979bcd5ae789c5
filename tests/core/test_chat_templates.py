"""Chat templates render as transformers renders them, and the answers-only mask is the
assistant's text: {% generation %} blocks where a template has them (SmolLM3), and the
reasoning a template drops (DeepSeek-R1's) kept in the last answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_templates import REAL, SHAPES, m, shapes_for, transformers_prompt

from core.data import chat
from core.data.chatdata import encode_example

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", REAL)
def test_real_templates_render_as_transformers(name):
    model = REAL[name]
    tokens = {"bos_token": model.bos, "eos_token": model.eos}
    for shape, messages in shapes_for(model).items():
        want = transformers_prompt(model.template, messages, model.bos, model.eos)
        if messages[-1]["role"] == "user":
            got = chat.render(model.template, messages, True, **tokens)
        else:
            from core.use.ollama import jinja_prompt

            got = jinja_prompt(model.template, messages, **tokens)
        assert got == want, shape
        whole = transformers_whole(model, messages)
        assert chat.render(model.template, messages, False, **tokens) == whole, shape


def transformers_whole(model, messages, **extra):
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        [messages],
        chat_template=model.template,
        bos_token=model.bos,
        eos_token=model.eos,
        **extra,
    )
    return rendered[0]


def test_smollm3_thinking_off_renders_as_transformers():
    model = REAL["smollm3"]
    messages = SHAPES["multi-turn"]
    for flags in ({"enable_thinking": False}, {"enable_thinking": True}):
        want = transformers_whole(model, messages, **flags)
        assert chat.render(model.template, messages, False, eos_token="<|im_end|>", **flags) == (
            want
        )
    no_think = [m("system", "Be brief. /no_think"), *SHAPES["multi-turn"][1:]]
    assert "<think>\n\n</think>\n" in chat.render(model.template, no_think, False)


def test_generation_spans_are_transformers_assistant_indices():
    from transformers.utils.chat_template_utils import render_jinja_template

    model = REAL["smollm3"]
    messages = SHAPES["multi-turn"][:-1]
    (want_text,), (want_spans,) = render_jinja_template(
        [messages], chat_template=model.template, return_assistant_tokens_mask=True
    )
    text, spans = chat.generation_spans(model.template, messages)
    assert (text, spans) == (want_text, want_spans)
    assert [text[a:b] for a, b in spans] == [
        "<|im_start|>assistant\nBlue.<|im_end|>\n",
        "<|im_start|>assistant\nRed.<|im_end|>\n",
    ]
    # Outside generation_spans the tag only renders its body.
    assert chat.render(model.template, messages, False) == text


def _tokenizer(tmp_path, template: str, specials: list[str], bos="", eos=""):
    """A small byte-level BPE (hf_models' text) with the template's special tokens, saved as
    a transformers tokenizer and loaded as TrainDeck's; both returned."""
    from hf_models import TEXT
    from transformers import PreTrainedTokenizerFast

    from core.data.tokenizer import pretrained_tokenizer, train_bpe

    hf = train_bpe([TEXT], 512).hf
    hf.add_special_tokens(specials)
    kw = {"bos_token": bos or None, "eos_token": eos or None, "chat_template": template}
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=hf, **kw)
    hf_tok.save_pretrained(tmp_path)
    return hf_tok, pretrained_tokenizer(tmp_path)


def _runs(tok, ids, weights) -> list[str]:
    runs, current = [], []
    for i, w in zip(ids.tolist(), weights.tolist(), strict=True):
        if w:
            current.append(i)
        elif current:
            runs.append(tok.decode(current))
            current = []
    return runs + ([tok.decode(current)] if current else [])


def test_smollm3_chat_data_masks_as_transformers_assistant_mask(tmp_path):
    """SmolLM3 chat-fine-tunes: ids and mask equal apply_chat_template(...,
    return_assistant_tokens_mask=True)."""
    model = REAL["smollm3"]
    hf_tok, tok = _tokenizer(
        tmp_path,
        model.template,
        ["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        eos="<|im_end|>",
    )
    messages = SHAPES["multi-turn"][:-1]
    tokens = chat.special_tokens(tok)
    ids, weights = encode_example(tok, chat.template_of(tok), messages, tokens, False)
    out = hf_tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert ids.tolist() == list(out["input_ids"])
    assert weights.tolist() == list(out["assistant_masks"])
    assert _runs(tok, ids, weights) == [
        "<|im_start|>assistant\nBlue.<|im_end|>\n",
        "<|im_start|>assistant\nRed.<|im_end|>\n",
    ]


DS = REAL["deepseek-r1-distill"]
REASONED = [
    m("user", "What is 2+2?"),
    m("assistant", "<think>\nTwo and two.\n</think>\n\n4"),
    m("user", "And 3+3?"),
    m("assistant", "<think>\nThree and three make six.\n</think>\n\n6"),
]


def test_deepseek_keeps_the_last_answers_reasoning_and_masks_it(tmp_path):
    hf_tok, tok = _tokenizer(
        tmp_path,
        DS.template,
        ["<｜begin▁of▁sentence｜>", DS.eos, "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"],
        bos=DS.bos,
        eos=DS.eos,
    )
    tokens = chat.special_tokens(tok)
    # The template itself drops every answer's reasoning, the last one's too.
    plain = transformers_whole(DS, REASONED)
    assert "Three and three" not in plain and "Two and two" not in plain
    notes = set()
    ids, weights = encode_example(tok, chat.template_of(tok), REASONED, tokens, False, notes)
    assert notes == {chat.REASONING_NOTE}
    text = tok.decode(ids.tolist())
    # The last answer keeps its reasoning, right after the generation prompt ends with
    # <think>\n as at inference; the earlier one is written as the template writes it.
    prompt = transformers_prompt(DS.template, REASONED[:3], DS.bos, DS.eos)
    assert prompt.endswith("<｜Assistant｜><think>\n")
    assert text == prompt + "Three and three make six.\n</think>\n\n6" + DS.eos
    assert text.startswith(plain[: plain.index("<｜User｜>And")])
    assert _runs(tok, ids, weights) == [
        "\n\n4" + DS.eos,
        "Three and three make six.\n</think>\n\n6" + DS.eos,
    ]
    # train_on_prompts: the same text, every token weighted.
    all_ids, everything = encode_example(tok, chat.template_of(tok), REASONED, tokens, True)
    assert all_ids.tolist() == ids.tolist() and everything.all()


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])
def test_a_template_that_keeps_reasoning_is_left_alone(name):
    """Qwen3 and Qwen3.5 keep the last answer's reasoning themselves: nothing replaced, no
    note (Qwen3.5 writes an empty <think> block in no earlier answer)."""
    model = REAL[name]
    notes = set()
    text, spans = chat.answer_spans(model.template, REASONED, notes)
    assert not notes and text == transformers_whole(model, REASONED)
    assert text[spans[-1][0] : spans[-1][1]].endswith(
        "Three and three make six.\n</think>\n\n6<|im_end|>\n"
    )
    assert text[spans[0][0] : spans[0][1]] == "4<|im_end|>\n"  # its reasoning is gone


def test_gemma4_keeps_the_last_answers_thought_channel_and_masks_it():
    """Gemma 4's template strips the thought channel from every answer's text; TrainDeck
    keeps it in the last answer (and says so), masked with the answer."""
    model = REAL["gemma4-31b"]
    thought = [
        m("user", "What is 2+2?"),
        m("assistant", "<|channel>thought\nTwo and two.<channel|>4"),
        m("user", "And 3+3?"),
        m("assistant", "<|channel>thought\nThree and three make six.<channel|>6"),
    ]
    plain = transformers_whole(model, thought)
    assert "Three and three" not in plain
    notes = set()
    text, spans = chat.answer_spans(model.template, thought, notes, bos_token=model.bos)
    assert notes == {chat.REASONING_NOTE}
    assert text == plain.replace("\n6<turn|>", "\n" + thought[-1]["content"] + "<turn|>")
    assert [text[a:b] for a, b in spans] == ["4<turn|>\n", thought[-1]["content"] + "<turn|>\n"]


def test_answers_without_reasoning_get_no_note():
    notes = set()
    text, spans = chat.answer_spans(DS.template, SHAPES["no-system-turns"][:2], notes)
    assert not notes
    assert text[spans[0][0] : spans[0][1]] == "Fine, thanks.\nAnd you?" + DS.eos


@pytest.mark.parametrize("name", ["deepseek-r1-distill", "smollm3"])
def test_chat_fine_tuning_through_a_family_template(tmp_path, capsys, name):
    """A Qwen2-architecture model (as DeepSeek-R1-Distill-Qwen is) with DeepSeek-R1's or
    SmolLM3's template fine-tunes on reasoning data; with DeepSeek's the log says the last
    answer keeps its reasoning, and the prepared rows hold it."""
    import json

    from hf_models import make_model

    from core.cli.train import main as train_main
    from core.data.windows import TokenData

    model = REAL[name]
    seq = 1536 if name == "smollm3" else 64  # SmolLM3's default system prompt is long
    make_model(tmp_path / "base", "qwen2", max_position_embeddings=seq)
    config = tmp_path / "base" / "tokenizer_config.json"
    for f in (tmp_path / "base").glob("chat_template.j*"):
        f.unlink()
    meta = json.loads(config.read_text())
    config.write_text(json.dumps({**meta, "chat_template": model.template}))
    data = tmp_path / "d.jsonl"
    row = {"messages": [m("user", "2+2?"), m("assistant", "<think>\nAdd.\n</think>\n\n4")]}
    data.write_text((json.dumps(row) + "\n") * 8, encoding="utf-8")
    args = [
        "--data",
        str(data),
        "--out",
        str(tmp_path / "run"),
        "--device",
        "cpu",
        "--max-steps",
        "1",
        "--seq-len",
        str(seq),
        "--batch-size",
        "2",
        "--grad-accum",
        "1",
        "--precision",
        "fp32",
        "--sample-tokens",
        "0",
        "--data-cache",
        str(tmp_path / "cache"),
        "--init-from",
        str(tmp_path / "base"),
    ]
    assert train_main(args) == 0
    captured = capsys.readouterr()
    assert (chat.REASONING_NOTE in captured.out + captured.err) == (name != "smollm3")
    info = json.loads((tmp_path / "run" / "data.json").read_text())
    manifest = json.loads((Path(info["cache"]) / "manifest.json").read_text())
    rows = TokenData(info["cache"], manifest, manifest["row"] - 1, 0)
    tok = rows.tokenizer
    first = tok.decode(rows.train[: manifest["row"]].tolist())
    assert "Add." in first  # the reasoning is trained on


END_MARKS = {
    "chatml": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "smollm3": "<|im_end|>",
    "llama3": "<|eot_id|>",
    "gemma": "<end_of_turn>",
    "phi": "<|end|>",
    "deepseek": "<｜end▁of▁sentence｜>",
    "mistral": "</s>",
    "llama4": "<|eot|>",
    "granite": "<|end_of_text|>",
    "mistral_small": "</s>",
    "harmony": "<|return|>",
    "qwen3_5": "<|im_end|>",
    "gemma4": "<turn|>",
}
# gpt-oss: an earlier answer's <|end|> stands where the model wrote <|return|> (the template
# writes <|return|> after a last answer only), so nothing after its text is trained.
EARLIER_END_MARKS = {"harmony": ""}


@pytest.mark.parametrize("name", REAL)
def test_every_family_masks_each_answer_and_its_end_mark(name):
    """The answers-only mask of every real template: each answer's text and the end-of-turn
    mark after it, nothing of the user turns (Gemma, Phi, DeepSeek: found after the
    generation prompt; SmolLM3: its {% generation %} blocks)."""
    model = REAL[name]
    messages = [*SHAPES["no-system-turns"], m("assistant", "Sure: {{ .Prompt }} and </s>.")]
    tokens = {"bos_token": model.bos, "eos_token": model.eos}
    text, spans = chat.answer_spans(model.template, messages, None, **tokens)
    assert text == transformers_whole(model, messages)
    answers = [x["content"] for x in messages if x["role"] == "assistant"]
    for k, ((a, b), answer) in enumerate(zip(spans, answers, strict=True)):
        piece, mark = text[a:b], END_MARKS[model.kind]
        if k < len(answers) - 1:
            mark = EARLIER_END_MARKS.get(model.kind, mark)
            assert piece.endswith(answer) or mark
        assert answer in piece
        # Phi's template ends the whole text with EOS after the last end mark.
        ends = (piece, piece.removesuffix(model.eos))
        assert any(p.rstrip("\n").endswith(mark) for p in ends)
        assert not any(x["content"] in piece for x in messages if x["role"] == "user")
    between = text[: spans[0][0]] + text[spans[0][1] : spans[1][0]]
    assert all(x["content"] in between for x in messages if x["role"] == "user")


# What a generation prompt ends with, thinking on and off, as each template writes it.
THINKING_PROMPTS = {
    "qwen3.5": {True: "<|im_start|>assistant\n<think>\n", False: "<think>\n\n</think>\n\n"},
    "gemma4-31b": {True: "<|turn>model\n", False: "<|turn>model\n<|channel>thought\n<channel|>"},
    "gemma4-e2b": {True: "<|turn>model\n", False: "<turn|>\n<|turn>model\n"},
}


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("name", THINKING_PROMPTS)
def test_thinking_on_and_off_render_and_mask_as_transformers(name, thinking):
    """Qwen3.5's and Gemma 4's templates with enable_thinking on and off: the chat data text
    and its answers-only mask, and the generation prompt, as transformers renders them."""
    model = REAL[name]
    tokens = {"bos_token": model.bos, "eos_token": model.eos, "enable_thinking": thinking}
    messages = [*SHAPES["multi-turn"], m("assistant", "Green.")]
    text, spans = chat.answer_spans(model.template, messages, None, **tokens)
    assert text == transformers_whole(model, messages, enable_thinking=thinking)
    answers = [x["content"] for x in messages if x["role"] == "assistant"]
    for (a, b), answer in zip(spans, answers, strict=True):
        assert answer in text[a:b] and text[a:b].rstrip("\n").endswith(END_MARKS[model.kind])
        assert not any(x["content"] in text[a:b] for x in messages if x["role"] != "assistant")
    prompt = chat.render(model.template, messages[:-1], True, **tokens)
    flag = {"enable_thinking": thinking}
    want = transformers_prompt(model.template, messages[:-1], model.bos, model.eos, **flag)
    assert prompt == want and prompt.endswith(THINKING_PROMPTS[name][thinking])
    assert ("<|think|>" in prompt) == (thinking and model.kind == "gemma4")
