"""The Ollama TEMPLATE of every family's real chat template renders what transformers'
apply_chat_template renders, under Go's own text/template (tests/gotemplate_go, where the go
tool is installed) and under tests/gotemplate.py's Python renderer; its tool and thinking
branches keep Ollama from replacing it with the GGUF's template."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from chat_templates import REAL, SHAPES, m, shapes_for, transformers_prompt
from gotemplate import go_available, go_prompt, go_prompts, ollama_prompt

from core.use import ollama

pytest.importorskip("transformers")
needs_go = pytest.mark.skipif(not go_available(), reason="go is not installed (golang-go)")


def today() -> str:
    """The date as Ollama's currentDate writes it."""
    return datetime.now().strftime("%Y-%m-%d")


class _OllamaDay:
    """Stands for datetime in transformers' strftime_now: every format gives currentDate's."""

    @staticmethod
    def now():
        return _OllamaDay()

    def strftime(self, fmt):
        return today()


def transformers_text(model, messages, **extra) -> str:
    """transformers' text, its strftime_now giving the date as Ollama's currentDate does."""
    import transformers.utils.chat_template_utils as utils

    real = utils.datetime
    utils.datetime = _OllamaDay
    try:
        return transformers_prompt(model.template, messages, model.bos, model.eos, **extra)
    finally:
        utils.datetime = real


def wanted(model, messages, **extra) -> str:
    """What Ollama must render: transformers' text with the date as currentDate gives it, less
    the BOS Ollama's tokenizer adds itself."""
    text = transformers_text(model, messages, **extra)
    if model.add_bos and model.bos and text.startswith(model.bos):
        text = text[len(model.bos) :]
    return text


def template_of(model) -> str:
    lay = ollama.layout(
        model.template, bos_token=model.bos, eos_token=model.eos, add_bos=model.add_bos
    )
    return ollama.go_template(lay)


CASES = [(name, shape) for name in REAL for shape in shapes_for(REAL[name])]


@needs_go
@pytest.mark.parametrize("name", REAL)
def test_go_renders_every_shape_as_transformers(name):
    model = REAL[name]
    template = template_of(model)
    shapes = shapes_for(model)
    cases = [{"template": template, "messages": msgs} for msgs in shapes.values()]
    for shape, out in zip(shapes, go_prompts(cases), strict=True):
        assert not out["error"], (shape, out["error"])
        assert out["prompt"] == wanted(model, shapes[shape]), shape


@pytest.mark.parametrize("name, shape", CASES)
def test_python_renderer_agrees(name, shape):
    """The same without Go, through tests/gotemplate.py's renderer."""
    model = REAL[name]
    messages = SHAPES[shape]
    template = template_of(model)
    if "currentDate" in template:
        template = template.replace("{{ currentDate }}", today())
    assert ollama_prompt(template, messages) == wanted(model, messages)


@needs_go
@pytest.mark.parametrize("name", ["qwen3", "smollm3", "qwen3.5", "gemma4-31b", "gemma4-e2b"])
def test_think_off_renders_the_templates_enable_thinking_false(name):
    """A request's think false/true renders the template's enable_thinking False/True; unset,
    the template's own default (Qwen3.5 thinks, Gemma 4 does not)."""
    model = REAL[name]
    template = template_of(model)
    for shape, messages in SHAPES.items():
        off = go_prompt(template, messages, think=False, is_think_set=True)
        assert off == wanted(model, messages, enable_thinking=False), shape
        on = go_prompt(template, messages, think=True, is_think_set=True)
        assert on == wanted(model, messages, enable_thinking=True), shape
        assert go_prompt(template, messages) == wanted(model, messages), shape


@needs_go
@pytest.mark.parametrize(
    "name", ["qwen3", "deepseek-r1-distill", "smollm3", "qwen3.5", "gemma4-31b"]
)
def test_a_continued_answer_keeps_its_thinking(name):
    model = REAL[name]
    lay = ollama.layout(
        model.template, bos_token=model.bos, eos_token=model.eos, add_bos=model.add_bos
    )
    messages = [m("user", "What is 2+2?"), {**m("assistant", "It is"), "thinking": "Add them."}]
    got = go_prompt(ollama.go_template(lay), messages)
    plain = go_prompt(ollama.go_template(lay), [messages[0], m("assistant", "It is")])
    open_, close = lay.think
    assert got.endswith(open_ + "Add them." + close + "It is")
    assert got.startswith(plain[: plain.rindex(lay.last_open) + len(lay.last_open)])


def ollama_prefers_gguf_template(jinja: str, out: dict) -> bool:
    """server/images.go's shouldPreferChatTemplate, from the Go template's variables and the
    thinking tags Ollama infers (as reported by tests/gotemplate_go)."""
    gguf = {"tools"} if ollama.has_tools(jinja) else set()
    gguf |= {"thinking"} if ollama.has_thinking(jinja) else set()
    go = {"tools"} if "tools" in out["vars"] else set()
    go |= {"thinking"} if out["think_open"] and out["think_close"] else set()
    gguf_trip = (
        ("tool_calls" in jinja or "assistant_tool_call" in jinja)
        and any(
            s in jinja
            for s in (
                "tool_response",
                "tool_results",
                "ipython",
                "role'] == 'tool'",
                'role == "tool"',
                "role == 'tool'",
            )
        )
        and "tools" in gguf
    )
    go_trip = (
        "tools" in out["vars"]
        and "toolcalls" in out["vars"]
        and 'eq .Role "tool"' in out["template"]
    )
    if len(gguf) > len(go):
        return not go_trip or gguf_trip
    if gguf != go or "tools" not in gguf:
        return False
    return gguf_trip and not go_trip


@needs_go
@pytest.mark.parametrize("name", REAL)
def test_ollama_keeps_the_template(name):
    """Every capability of the model's own template (tools, thinking, tool round trips) is in
    the TEMPLATE, so recent Ollama does not swap in the GGUF's template."""
    model = REAL[name]
    template = template_of(model)
    (out,) = go_prompts([{"template": template, "messages": SHAPES["single-turn"]}])
    out["template"] = template
    assert not ollama_prefers_gguf_template(model.template, out)
    if ollama.has_thinking(model.template):
        assert (out["think_open"], out["think_close"]) == ("<think>", "</think>")
    if model.kind == "gemma4":  # thinking on the thought channel, which Ollama infers too
        assert (out["think_open"], out["think_close"]) == ("<|channel>thought", "<channel|>")


# -- Tools ------------------------------------------------------------------------------------

CITY = {"type": "string", "description": "The city."}
PARAMETERS = {"type": "object", "required": ["city"], "properties": {"city": CITY}}
WEATHER = {"name": "get_weather", "description": "The weather in a city.", "parameters": PARAMETERS}
TOOL = {"type": "function", "function": WEATHER}
ARGS = {"city": "Paris"}


def compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def tool_conversation(with_system: bool, deepseek: bool) -> list[dict]:
    """DeepSeek-R1's template writes tool calls only for a message whose content is None, and
    concatenates their arguments as text; Mistral's wants 9-character call ids."""
    call = {
        "type": "function",
        "id": "call12345",
        "function": {"name": "get_weather", "arguments": compact(ARGS) if deepseek else ARGS},
    }
    msgs = [
        m("user", "Weather in Paris?"),
        {"role": "assistant", "content": None if deepseek else "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call12345"},
        m("assistant", "It is 21 degrees."),
        m("user", "Thanks. And tomorrow?"),
    ]
    return [m("system", "Use tools."), *msgs] if with_system else msgs


def as_transformers_writes(text: str, values=(TOOL, ARGS)) -> str:
    """The model's template's JSON (Python's spaced, or indented) as Ollama's compact JSON."""
    for value in values:
        for indent in (None, 4):
            text = text.replace(
                json.dumps(value, ensure_ascii=False, indent=indent), compact(value)
            )
    return text


@needs_go
@pytest.mark.parametrize(
    "name",
    [
        "qwen2.5",
        "qwen3",
        "llama3.1",
        "llama3.2",
        "mistral-v0.3",
        "deepseek-r1-distill",
        "llama4",
        "granite4",
        "mistral-small-3.1",
        "qwen3.5",
    ],
)
@pytest.mark.parametrize("with_system", [False, True])
def test_tool_calls_and_results_render_as_the_models_template(name, with_system):
    model = REAL[name]
    if name == "deepseek-r1-distill":  # its template concatenates the arguments as text
        with_system = False
    jinja_msgs = tool_conversation(with_system, name == "deepseek-r1-distill")
    # Mistral's template writes each tool's wrapper itself, around the parameters' JSON.
    values = (PARAMETERS, ARGS) if name == "mistral-v0.3" else (TOOL, ARGS)
    want = as_transformers_writes(transformers_text(model, jinja_msgs, tools=[TOOL]), values)
    if model.add_bos:
        want = want.removeprefix(model.bos)
    go_msgs = [
        {
            **x,
            "tool_calls": [
                {"id": "call12345", "function": {"name": "get_weather", "arguments": ARGS}}
            ],
        }
        if x.get("tool_calls")
        else x
        for x in tool_conversation(with_system, False)
    ]
    got = go_prompt(template_of(model), go_msgs, tools=[TOOL])
    assert got == want


@needs_go
@pytest.mark.parametrize("reasoning", ["", "Look it up."])
def test_qwen35_keeps_the_think_block_of_a_call_after_the_last_question(reasoning):
    """Qwen3.5's template writes the <think> block (empty or not) of every answer after the
    last user message, so an agent loop's tool call keeps it up to the next prompt."""
    model = REAL["qwen3.5"]
    call = {"function": {"name": "get_weather", "arguments": ARGS}}
    answer = {"role": "assistant", "content": "", "tool_calls": [call]}
    start = [m("system", "Use tools."), m("user", "Weather in Paris?")]
    result = {"role": "tool", "content": '{"temp": 21}'}
    jinja_msgs = [*start, {**answer, "reasoning_content": reasoning}, result]
    want = as_transformers_writes(transformers_text(model, jinja_msgs, tools=[TOOL]))
    got = go_prompt(
        template_of(model), [*start, {**answer, "thinking": reasoning}, result], tools=[TOOL]
    )
    assert got == want
    assert f"<think>\n{reasoning}\n</think>\n\n<tool_call>" in got


@needs_go
def test_tools_are_named_where_the_template_shows_none():
    """DeepSeek-R1's and SmolLM3's templates show the model no tool list (SmolLM3 reads
    xml_tools): neither does the TEMPLATE, which names .Tools so Ollama keeps it."""
    for name in ("deepseek-r1-distill", "smollm3"):
        model = REAL[name]
        messages = SHAPES["single-turn"]
        got = go_prompt(template_of(model), messages, tools=[TOOL])
        assert got == wanted(model, messages, tools=[TOOL]) == wanted(model, messages)


# -- Ollama's own expectations ------------------------------------------------------------------

# template/testdata of Ollama's repository (github.com/ollama/ollama) for its three
# conversations; its gemma3-instruct.gotmpl adds a newline after the generation prompt (the
# file's last line), which Gemma 3's own template does not write, and its gemma-instruct.gotmpl
# joins a system prompt that Gemma 2's template refuses.
OLLAMA_CASES = {
    "user": [m("user", "Hello, how are you?")],
    "user-assistant-user": [
        m("user", "Hello, how are you?"),
        m("assistant", "I'm doing great. How can I help you today?"),
        m("user", "I'd like to show off how chat templating works!"),
    ],
}
OLLAMA_CASES["system-user-assistant-user"] = [
    m("system", "You are a helpful assistant."),
    *OLLAMA_CASES["user-assistant-user"],
]
_G_TURNS = (
    "<start_of_turn>user\nHello, how are you?<end_of_turn>\n<start_of_turn>model\nI'm doing "
    "great. How can I help you today?<end_of_turn>\n<start_of_turn>user\nI'd like to show off "
    "how chat templating works!<end_of_turn>\n<start_of_turn>model\n"
)
_P_TURNS = (
    "<|user|>\nHello, how are you?<|end|>\n<|assistant|>\nI'm doing great. How can I help you "
    "today?<|end|>\n<|user|>\nI'd like to show off how chat templating works!<|end|>\n"
    "<|assistant|>\n"
)
OLLAMA_TESTDATA = {
    ("gemma3", "user"): "<start_of_turn>user\nHello, how are you?<end_of_turn>\n"
    "<start_of_turn>model\n\n",
    ("gemma3", "user-assistant-user"): _G_TURNS + "\n",
    ("gemma3", "system-user-assistant-user"): _G_TURNS.replace(
        "user\nHello", "user\nYou are a helpful assistant.\n\nHello", 1
    )
    + "\n",
    ("gemma2", "user"): "<start_of_turn>user\nHello, how are you?<end_of_turn>\n"
    "<start_of_turn>model\n",
    ("gemma2", "user-assistant-user"): _G_TURNS,
    ("phi3.5", "user"): "<|user|>\nHello, how are you?<|end|>\n<|assistant|>\n",
    ("phi3.5", "user-assistant-user"): _P_TURNS,
    ("phi3.5", "system-user-assistant-user"): "<|system|>\nYou are a helpful assistant.<|end|>\n"
    + _P_TURNS,
}


@pytest.mark.parametrize("name, case", OLLAMA_TESTDATA)
def test_ollamas_own_expected_renders(name, case):
    messages = OLLAMA_CASES[case]
    got = ollama_prompt(template_of(REAL[name]), messages)
    want = OLLAMA_TESTDATA[name, case]
    assert got == (want[:-1] if name == "gemma3" else want)
    assert got == wanted(REAL[name], messages)


# -- The export ----------------------------------------------------------------------------------


def _with_template(folder, template: str) -> None:
    """A saved model folder, its tokenizer given another chat template."""
    for f in folder.glob("chat_template.j*"):
        f.unlink()
    config = folder / "tokenizer_config.json"
    meta = json.loads(config.read_text())
    meta["chat_template"] = template
    config.write_text(json.dumps(meta))


@pytest.mark.parametrize("name", ["deepseek-r1-distill", "llama3.2", "qwen3.5", "gemma4-31b"])
def test_ollama_export_of_a_family_template_logs_what_differs(tmp_path, name):
    """A Qwen2-architecture model (as DeepSeek-R1-Distill-Qwen is) with a family's template:
    the Modelfile carries its TEMPLATE and stops, and the log says what Ollama renders
    differently and that the TEMPLATE keeps tools and thinking."""
    pytest.importorskip("gguf")
    from hf_models import make_model

    from core.use.export import export

    model = REAL[name]
    make_model(tmp_path / "base", "qwen2")
    _with_template(tmp_path / "base", model.template)
    lines = []
    out = export(tmp_path / "base", "ollama", tmp_path / "o", quant="f32", log=lines.append)
    text = (out / "Modelfile").read_text(encoding="utf-8")
    log = "\n".join(lines)
    if name == "deepseek-r1-distill":
        assert "<｜Assistant｜>" in text and 'PARAMETER stop "<｜end▁of▁sentence｜>"' in text
        assert "Modelfile with the DeepSeek-R1 template" in log
        assert "takes tools and thinking as the model's template does" in log
    elif name == "llama3.2":
        assert "{{ currentDate }}" in text and "currentDate (YYYY-MM-DD)" in log
        assert "takes tools as the model's template does" in log
    elif name == "qwen3.5":  # the TEMPLATE renders, Ollama's parser reads the XML tool calls
        assert "\nPARSER qwen3.5\n" in text and "RENDERER" not in text
        assert "Modelfile with the Qwen3.5 template, stop at <|im_end|>, <|im_start|>" in log
        assert "built-in qwen3.5 parser (PARSER); the TEMPLATE renders" in log
        assert "takes tools and thinking as the model's template does" in log
    else:  # Ollama renders Gemma 4 itself: the 26B/31B renderer, for this template
        assert "\nRENDERER gemma4-large\nPARSER gemma4\n" in text
        assert "Modelfile with the Gemma 4 template, stop at <turn|>, <|turn>" in log
        assert "built-in gemma4-large renderer (RENDERER)" in log
        assert "as the model's template does" not in log
    assert "differs from the model's template: Ollama merges consecutive messages" in log


@needs_go
def test_an_moe_models_ollama_export_carries_harmony_and_its_experts(tmp_path):
    """gpt-oss end to end: its MXFP4 experts in the GGUF, the harmony TEMPLATE under Go
    rendering what transformers renders, the answer's and the tool call's ends as stops."""
    gguf = pytest.importorskip("gguf")
    from hf_models import make_model
    from test_ollama import parse_modelfile

    from core.use.export import export

    model = REAL["gpt-oss"]
    make_model(tmp_path / "base", "gpt_oss", swiglu_limit=7.0)  # as llama.cpp clamps it
    _with_template(tmp_path / "base", model.template)
    lines = []
    out = export(tmp_path / "base", "ollama", tmp_path / "o", quant="mxfp4", log=lines.append)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out / "model.gguf")).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "MXFP4"
    commands = parse_modelfile((out / "Modelfile").read_text(encoding="utf-8"))
    stops = [value for key, value in commands if key == "stop"]
    assert stops[:2] == ["<|return|>", "<|call|>"] and "<|end|>" not in stops
    assert any("Modelfile with the gpt-oss harmony template" in line for line in lines)
    shapes = list(shapes_for(model).values())
    template = dict(commands)["template"]
    outs = go_prompts([{"template": template, "messages": msgs} for msgs in shapes])
    for msgs, got in zip(shapes, outs, strict=True):
        assert not got["error"] and got["prompt"] == wanted(model, msgs)


def test_a_template_without_a_system_turn_refuses_a_modelfile_system():
    model = REAL["gemma2"]
    with pytest.raises(ollama.OllamaError, match="no place for a system prompt"):
        ollama.modelfile("m.gguf", model.template, [], "Be brief.", bos_token="<bos>", add_bos=True)
    text = ollama.modelfile(
        "m.gguf", REAL["gemma3"].template, [], "Be brief.", bos_token="<bos>", add_bos=True
    )
    assert 'SYSTEM """Be brief."""' in text


@pytest.mark.parametrize(
    "name, says",
    [
        ("llama3.2", "currentDate (YYYY-MM-DD)"),
        ("smollm3", "/no_think flag in the system prompt is not read"),
        ("phi3.5", "an empty system message is written as an empty turn"),
        ("deepseek-r1-distill", "keeps only the last"),
        ("gemma3", "strips whitespace from it"),
        ("llama4", "strips whitespace from it"),
        ("gemma2", "a system message in a request is left out"),
        ("qwen2.5", "compact JSON"),
    ],
)
def test_differences_name_what_go_cannot_match(name, says):
    model = REAL[name]
    lay = ollama.layout(
        model.template, bos_token=model.bos, eos_token=model.eos, add_bos=model.add_bos
    )
    assert any(says in line for line in ollama.differences(lay, model.template))


@needs_go
def test_smollm3_writes_a_tool_result_as_a_user_turn_as_its_template_does():
    model = REAL["smollm3"]
    messages = [
        m("user", "Weather in Paris?"),
        m("assistant", "Let me look."),
        m("tool", '{"temp": 21}'),
    ]
    assert ollama.layout(model.template).tool_as_user
    got = go_prompt(template_of(model), messages, tools=[TOOL])
    assert got == wanted(model, messages, tools=[TOOL])
    assert '<|im_start|>user\n{"temp": 21}<|im_end|>\n<|im_start|>assistant\n' in got


def test_a_template_that_drops_system_messages_takes_no_system_prompt():
    """A made-up Phi-style template without a system branch (as Phi-3-mini's first one):
    its TEMPLATE renders the rest exactly and a Modelfile SYSTEM is refused."""
    template = (
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
        "{{ '<|user|>\\n' + message['content'] + '<|end|>\\n<|assistant|>\\n' }}"
        "{% elif message['role'] == 'assistant' %}{{ message['content'] + '<|end|>\\n' }}"
        "{% endif %}{% endfor %}"
    )
    lay = ollama.layout(template, bos_token="<s>", add_bos=True)
    assert lay.kind == "phi" and lay.system_open is None
    for messages in SHAPES.values():
        if not any(x["role"] == "system" for x in messages):
            want = transformers_prompt(template, messages, "<s>").removeprefix("<s>")
            assert ollama_prompt(ollama.go_template(lay), messages) == want
    with pytest.raises(ollama.OllamaError, match="no place for a system prompt"):
        ollama.modelfile("m.gguf", template, [], "Be brief.", bos_token="<s>", add_bos=True)


def test_a_template_dated_as_ollama_dates_has_no_date_difference():
    """Mistral Small 3.1 writes today as strftime_now("%Y-%m-%d"), Ollama's currentDate form;
    Llama 3.2 writes "26 Jul 2024", which Ollama cannot."""
    notes = {}
    for name in ("mistral-small-3.1", "llama3.2"):
        model = REAL[name]
        lay = ollama.layout(
            model.template, bos_token=model.bos, eos_token=model.eos, add_bos=model.add_bos
        )
        assert lay.dated
        notes[name] = " ".join(ollama.differences(lay, model.template))
    assert "currentDate" not in notes["mistral-small-3.1"]
    assert "currentDate (YYYY-MM-DD)" in notes["llama3.2"]


# -- gpt-oss's harmony format -------------------------------------------------------------------


def harmony_tool_conversation(keep_analysis: bool, field: str = "content") -> list[dict]:
    """A tool call and its result; keep_analysis: no final answer follows the call, so the
    template keeps the answer's text (or reasoning: field) on the analysis channel."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
    answer = {"role": "assistant", "content": "", field: "Let me look.", "tool_calls": [call]}
    msgs = [
        m("system", "Use tools."),
        m("user", "Weather in Paris?"),
        answer,
        {"role": "tool", "content": '{"temp": 21}'},
    ]
    if keep_analysis:
        return msgs
    return [*msgs, m("assistant", "It is 21 degrees."), m("user", "Thanks. And tomorrow?")]


@needs_go
@pytest.mark.parametrize("keep_analysis", [False, True])
@pytest.mark.parametrize("field", ["content", "thinking"])
def test_harmony_tool_calls_and_results_render_as_its_template(keep_analysis, field):
    """The call on the commentary channel ending in <|call|>, the result in a turn named after
    the tool as a JSON string; no tool list is given, which the TEMPLATE does not write."""
    model = REAL["gpt-oss"]
    messages = harmony_tool_conversation(keep_analysis, field)
    want = as_transformers_writes(transformers_text(model, messages), (ARGS,))
    got = go_prompt(template_of(model), messages)
    assert got == want
    assert ("<|message|>Let me look.<|end|>" in got) == keep_analysis
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary" in got


def test_harmony_names_what_it_does_not_write_and_stops_only_at_the_end_of_an_answer():
    model = REAL["gpt-oss"]
    lay = ollama.layout(model.template, eos_token=model.eos)
    assert lay.kind == "harmony" and lay.dated and lay.tools
    notes = ollama.differences(lay, model.template)
    text = " ".join(notes)
    assert "Reasoning: medium" in text and "TypeScript namespace" in text
    assert "currentDate" not in text  # the template dates as Ollama does (%Y-%m-%d)
    assert not any("shows no tool definitions" in line for line in notes)
    # <|end|> closes the analysis channel inside an answer: never a stop
    assert ollama.stop_tokens("harmony") == ["<|return|>", "<|call|>"]
