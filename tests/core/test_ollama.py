"""Ollama Modelfiles: the Go TEMPLATE renders each conversation exactly as the model's Jinja
chat template does under transformers, the stops list the end-of-turn marks, and the Modelfile
reads back through a port of Ollama's own parser."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from chat_templates import REAL, SYS, m
from gotemplate import GoTemplateError, go_available, go_prompt, identifiers, ollama_prompt
from gotemplate import render as go_render

from core.data.chat import DEFAULT_TEMPLATE, render
from core.use import ollama
from core.use.ollama import OllamaError

# -- Real chat templates, as their models ship them ------------------------------------------

# Qwen/Qwen2.5-*-Instruct tokenizer_config.json: ChatML with a default system prompt.
QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501

# HuggingFaceTB/SmolLM2-*-Instruct: ChatML, a default system turn added in the loop.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# meta-llama/Meta-Llama-3-8B-Instruct.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# meta-llama/Llama-3.1-8B-Instruct (3.3 ships the same): a date header in every system turn.
LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""  # noqa: E501

# mistralai/Mistral-7B-Instruct-v0.3: the system prompt joins the last user message.
MISTRAL_V03 = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""  # noqa: E501

# mistralai/Mistral-7B-Instruct-v0.2 (and v0.1, Mixtral-8x7B-Instruct) as updated in 2024: the
# system prompt joins the first user message.
MISTRAL_V02 = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""  # noqa: E501

# mistralai/Mistral-7B-Instruct-v0.1 as first released: no system message at all.
MISTRAL_V01 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and "
    "assistant roles are supported!') }}{% endif %}{% endfor %}"
)

# A ChatML template whose default system prompt holds Go template delimiters and quotes.
CHATML_BRACES = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nAnswer in JSON like "
    '{"a": "{{b}}"} and end with \\"\\"\\"<|im_end|>\\n\' }}{% endif %}'
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
    "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
    "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' "
    "+ content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
    "content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# Gemma 1's first template wrote "assistant" where the model was trained on "model".
GEMMA_ASSISTANT = (
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\\n' "
    "+ message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt "
    "%}{{'<start_of_turn>model\\n'}}{% endif %}"
)
COMMAND_R = (
    "{% for message in messages %}{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + message['content'] "
    "+ '<|END_OF_TURN_TOKEN|>' }}{% endfor %}"
)


@dataclass(frozen=True)
class Model:
    template: str
    bos: str = ""
    eos: str = ""
    add_bos: bool = False  # the tokenizer (so the GGUF, so Ollama) puts BOS first itself
    system: bool = True  # takes a system message
    kind: str = "chatml"


MODELS = {
    "traindeck-eos": Model(DEFAULT_TEMPLATE, eos="<|endoftext|>"),
    "traindeck-bytes": Model(DEFAULT_TEMPLATE),
    "qwen2.5": Model(QWEN25, eos="<|im_end|>"),
    "smollm2": Model(SMOLLM2, bos="<|im_start|>", eos="<|im_end|>"),
    "chatml-braces": Model(CHATML_BRACES, eos="<|im_end|>"),
    "llama3": Model(LLAMA3, "<|begin_of_text|>", "<|eot_id|>", True, kind="llama3"),
    "llama3-bos-in-template": Model(LLAMA3, "<|begin_of_text|>", "<|eot_id|>", kind="llama3"),
    "llama3.1": Model(LLAMA31, "<|begin_of_text|>", "<|eot_id|>", True, kind="llama3"),
    "mistral-v0.3": Model(MISTRAL_V03, "<s>", "</s>", True, kind="mistral"),
    "mistral-v0.2": Model(MISTRAL_V02, "<s>", "</s>", True, kind="mistral"),
    "mistral-v0.1": Model(MISTRAL_V01, "<s>", "</s>", True, system=False, kind="mistral"),
}


CONVERSATIONS = {
    "user": [m("user", "Hello, how are you?")],
    "system-user": [m("system", SYS), m("user", "Hello, how are you?")],
    "user-assistant-user": [
        m("user", "Hello, how are you?"),
        m("assistant", "Fine, thanks.\nAnd you?"),
        m("user", "Show me {{ .Prompt }} and </s> as text."),
    ],
    "system-several-turns": [
        m("system", SYS),
        m("user", "Name a colour."),
        m("assistant", "Blue."),
        m("user", "Another?"),
        m("assistant", "Red."),
        m("user", 'One more, in JSON: {"c": ...}'),
    ],
    "user-prefill": [m("user", "Count to three."), m("assistant", "One, two")],
    "system-turns-prefill": [
        m("system", SYS),
        m("user", "Name a colour."),
        m("assistant", "Blue."),
        m("user", "Another?"),
        m("assistant", "Gre"),
    ],
}


def transformers_prompt(model: Model, messages: list[dict]) -> str:
    """The text transformers' apply_chat_template gives: the generation prompt after a user
    turn, a last assistant message continued (continue_final_message)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    cont = messages[-1]["role"] == "assistant"
    rendered, _ = render_jinja_template(
        [messages],
        chat_template=model.template,
        add_generation_prompt=not cont,
        continue_final_message=cont,
        bos_token=model.bos,
        eos_token=model.eos,
    )
    return rendered[0]


def ollama_wants(model: Model, messages: list[dict]) -> str:
    """What Ollama must render: the Jinja text, less the BOS its tokenizer adds itself."""
    text = transformers_prompt(model, messages)
    if model.add_bos:
        assert text.startswith(model.bos)
        text = text[len(model.bos) :]
    return text


def layout_of(model: Model):
    return ollama.layout(
        model.template, bos_token=model.bos, eos_token=model.eos, add_bos=model.add_bos
    )


def modelfile_of(model: Model, stops=("<|stop|>",), system=None) -> str:
    return ollama.modelfile(
        "model.gguf",
        model.template,
        list(stops),
        system,
        bos_token=model.bos,
        eos_token=model.eos,
        add_bos=model.add_bos,
    )


# -- A port of Ollama's Modelfile parser (parser/parser.go ParseFile) ------------------------

_NIL, _NAME, _VALUE, _PARAM, _COMMENT = range(5)
_COMMANDS = {"from", "license", "template", "system", "adapter", "draft", "renderer", "parser"}
_COMMANDS |= {"parameter", "message", "requires"}


def _unquote(s: str):
    if s.startswith('"""'):
        return s[3:-3] if len(s) >= 6 and s.endswith('"""') else None
    if s.startswith('"'):
        return s[1:-1] if len(s) >= 2 and s.endswith('"') else None
    return s


def _next_state(r: str, state: int):
    """(next state, the character to keep or None), as parseRuneForState."""
    if state == _NIL:
        if r == "#":
            return _COMMENT, None
        return (_NIL, None) if r in " \t\r\n" else (_NAME, r)
    if state == _NAME:
        if r.isascii() and r.isalpha():
            return _NAME, r
        if r in " \t":
            return _VALUE, None
        raise ValueError("command must be one of ...")
    if state == _VALUE:
        return (_NIL, r) if r in " \t\r\n" else (_VALUE, r)
    if state == _PARAM:
        if r.isascii() and (r.isalnum() or r == "_"):
            return _PARAM, r
        if r in " \t":
            return _VALUE, None
        raise ValueError("unexpected EOF")
    return (_NIL, None) if r in "\r\n" else (_COMMENT, None)


def parse_modelfile(text: str) -> list[tuple[str, str]]:
    commands, buf, state, name = [], [], _NIL, ""
    for r in text:
        nxt, keep = _next_state(r, state)
        if nxt != state:
            word = "".join(buf)
            if state == _NAME:
                if word.lower() not in _COMMANDS:
                    raise ValueError(f"command must be one of ...: {word!r}")
                if word.lower() == "parameter":
                    nxt = _PARAM
                name = "model" if word.lower() == "from" else word.lower()
            elif state == _PARAM:
                name = word
            elif state == _VALUE:
                value = _unquote(word.strip())
                if value is None or r in " \t":
                    buf.append(r)
                    continue
                commands.append((name, value))
            buf, state = [], nxt
        if keep is not None and keep.isprintable():
            buf.append(keep)
    if state == _VALUE:
        value = _unquote("".join(buf).strip())
        assert value is not None, "unexpected EOF"
        commands.append((name, value))
    else:
        assert state in (_NIL, _COMMENT), "unexpected EOF"
    return commands


# -- The Go template renders as the Jinja template -------------------------------------------


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("name", MODELS)
def test_go_template_renders_as_jinja(name, conversation):
    model, messages = MODELS[name], CONVERSATIONS[conversation]
    if not model.system and any(x["role"] == "system" for x in messages):
        pytest.skip("this template takes no system message")
    assert ollama.template_kind(model.template) == model.kind
    commands = parse_modelfile(modelfile_of(model))
    template = dict(commands)["template"]
    assert template == ollama.go_template(layout_of(model))
    assert ollama_prompt(template, messages) == ollama_wants(model, messages)
    if go_available():  # and by Go's own text/template
        assert go_prompt(template, messages) == ollama_wants(model, messages)


@pytest.mark.parametrize("conversation", ["user", "user-assistant-user", "user-prefill"])
@pytest.mark.parametrize("name", [n for n in MODELS if MODELS[n].system])
def test_modelfile_system_is_a_first_system_message(name, conversation):
    """Ollama puts the Modelfile's SYSTEM first when a conversation has no system message."""
    model, messages = MODELS[name], CONVERSATIONS[conversation]
    commands = dict(parse_modelfile(modelfile_of(model, system=SYS)))
    assert commands["system"] == SYS
    got = ollama_prompt(commands["template"], messages, system=commands["system"])
    assert got == ollama_wants(model, [m("system", SYS), *messages])
    # A conversation's own system message wins over the Modelfile's.
    own = CONVERSATIONS["system-user"]
    got = ollama_prompt(commands["template"], own, system="ignored")
    assert got == ollama_wants(model, own)


@pytest.mark.parametrize("name", MODELS)
def test_traindeck_renders_as_transformers(name):
    """Layouts are read with core.data.chat.render: it must give transformers' text."""
    model = MODELS[name]
    for messages in CONVERSATIONS.values():
        if not model.system and any(x["role"] == "system" for x in messages):
            continue
        tokens = {"bos_token": model.bos, "eos_token": model.eos}
        assert ollama.jinja_prompt(model.template, messages, **tokens) == transformers_prompt(
            model, messages
        )
        if messages[-1]["role"] == "user":
            text = render(model.template, messages, True, **tokens)
            assert text == transformers_prompt(model, messages)


@pytest.mark.parametrize("name", MODELS)
def test_expected_prompt_is_the_go_template(name):
    lay = layout_of(MODELS[name])
    for messages in CONVERSATIONS.values():
        if lay.system_at is None and any(x["role"] == "system" for x in messages):
            continue
        assert ollama.expected_prompt(lay, messages) == ollama_prompt(
            ollama.go_template(lay), messages
        )


def test_layouts_read_off_the_templates():
    qwen, smol = layout_of(MODELS["qwen2.5"]), layout_of(MODELS["smollm2"])
    assert qwen.default_turn == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n"
    )
    assert "You are a helpful AI assistant named SmolLM" in smol.default_turn
    assert layout_of(MODELS["traindeck-eos"]).answer_close == "<|im_end|><|endoftext|>\n"
    assert layout_of(MODELS["traindeck-bytes"]) == ollama.formats.get("chatml").canonical
    llama3 = layout_of(MODELS["llama3"])
    assert replace(llama3, system_open=None, system_close="") == replace(
        ollama.formats.get("llama3").canonical, system_open=None, system_close=""
    )
    assert layout_of(MODELS["llama3-bos-in-template"]).lead == "<|begin_of_text|>"
    l31 = layout_of(MODELS["llama3.1"])
    header = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
    assert l31.system_open == "<|start_header_id|>system<|end_header_id|>\n\n" + header
    assert l31.default_turn == l31.system_open + "<|eot_id|>"
    assert l31.tools and l31.tool_calls == "llama3" and not l31.dated
    v03 = layout_of(MODELS["mistral-v0.3"])
    assert (v03.tools, v03.tool_calls) == (True, "mistral")  # [AVAILABLE_TOOLS] and calls
    assert replace(v03, tools=False, tool_calls=None) == ollama.formats.get("mistral").canonical
    v02 = layout_of(MODELS["mistral-v0.2"])
    assert (v02.system_at, v02.inst_open, v02.inst_close) == ("first", " [INST] ", " [/INST]")
    v01 = layout_of(MODELS["mistral-v0.1"])
    assert (v01.system_at, v01.answer_open, v01.answer_end) == (None, "", "</s> ")
    # The template text keeps BOS out where Ollama's tokenizer adds it.
    assert "<|begin_of_text|>" not in ollama.go_template(layout_of(MODELS["llama3.1"]))
    assert "<s>" not in ollama.go_template(layout_of(MODELS["mistral-v0.3"]))


def test_canonical_templates_render_as_their_models():
    """go_template(kind) alone: TrainDeck's default (no EOS), Llama 3.0, Mistral v0.3."""
    for kind, name in [
        ("chatml", "traindeck-bytes"),
        ("llama3", "llama3"),
        ("mistral", "mistral-v0.3"),
    ]:
        for messages in CONVERSATIONS.values():
            got = ollama_prompt(ollama.go_template(kind), messages)
            assert got == ollama_wants(MODELS[name], messages)


def test_known_differences():
    """What a Go template cannot do, pinned: Llama 3 strips the whitespace around a message;
    Ollama merges consecutive messages of one role before the template sees them."""
    model = MODELS["llama3"]
    template = ollama.go_template(layout_of(model))
    padded = [m("user", "  hi  \n")]
    assert ollama_prompt(template, padded) != ollama_wants(model, padded)
    assert ollama_prompt(template, padded) == ollama_wants(model, [m("user", "hi")]).replace(
        "hi", "  hi  \n"
    )
    twice = [m("user", "a"), m("user", "b")]
    assert ollama_prompt(template, twice) == ollama_wants(model, [m("user", "a\n\nb")])


# -- Kinds, plain models, errors ---------------------------------------------------------------


def test_plain():
    assert ollama.template_kind(None) == "plain"
    assert ollama.template_kind("  ") == "plain"
    assert ollama.go_template("plain") == "{{ .Prompt }}"
    assert go_render("{{ .Prompt }}", {"Prompt": "Once upon a time"}) == "Once upon a time"
    assert ollama_prompt("{{ .Prompt }}", [m("user", "Once upon a time")]) == "Once upon a time"
    text = ollama.modelfile("base.gguf", None, ["<|endoftext|>"])
    assert parse_modelfile(text) == [
        ("model", "./base.gguf"),
        ("template", "{{ .Prompt }}"),
        ("stop", "<|endoftext|>"),
    ]
    with pytest.raises(OllamaError, match="no place for a system prompt"):
        ollama.modelfile("base.gguf", None, [], "Be nice.")
    with pytest.raises(OllamaError, match="no place for a system prompt"):
        modelfile_of(MODELS["mistral-v0.1"], system="Be nice.")


@pytest.mark.parametrize(
    "template, found",
    [
        (LLAMA2, "<<SYS>>"),
        (COMMAND_R, "<|START_OF_TURN_TOKEN|>"),
        ("{{ messages[0]['content'] }}", "no turn"),
    ],
)
def test_unknown_templates_are_refused(template, found):
    with pytest.raises(OllamaError, match="none TrainDeck can write") as err:
        ollama.template_kind(template)
    assert found in str(err.value)
    assert "\n" not in str(err.value)


def test_a_template_in_another_layout_is_refused():
    """Gemma's markers, but answers under "assistant" where the model says "model"."""
    assert ollama.template_kind(GEMMA_ASSISTANT) == "gemma"
    with pytest.raises(OllamaError, match="Gemma markers but not in the Gemma layout") as err:
        ollama.layout(GEMMA_ASSISTANT, bos_token="<bos>")
    assert "\n" not in str(err.value)


def test_turn_text_is_read_off_the_template_not_assumed():
    """ChatML with "role: " headers renders exactly: each turn's text comes from the template."""
    odd = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ': ' + "
        "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant: ' }}{% endif %}"
    )
    template = ollama.go_template(ollama.layout(odd))
    for messages in CONVERSATIONS.values():
        assert ollama_prompt(template, messages) == ollama_wants(Model(odd), messages)


# -- Stops and the Modelfile -----------------------------------------------------------------


def _tokenizer(specials: list[str], bos, eos, stops, template, add_bos=False):
    from tokenizers import Tokenizer as HF
    from tokenizers import models

    from core.data.tokenizer import Tokenizer

    hf = HF(models.WordLevel({"<unk>": 0, "hello": 1}, unk_token="<unk>"))
    hf.add_special_tokens(specials)
    ids = {t: hf.token_to_id(t) for t in specials}
    meta = {
        "kind": "model",
        "bos_id": ids.get(bos),
        "eos_id": ids.get(eos),
        "add_bos": add_bos,
        "stop_ids": [ids[s] for s in stops],
        "bos_token": bos,
        "eos_token": eos,
        "chat_template": template,
    }
    return Tokenizer(hf, "model", meta)


def test_stop_tokens():
    llama = _tokenizer(
        ["<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
        ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
        LLAMA31,
        add_bos=True,
    )
    assert ollama.stop_tokens("llama3", llama) == [
        "<|eot_id|>",
        "<|start_header_id|>",
        "<|end_of_text|>",
        "<|eom_id|>",
    ]
    qwen = _tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        None,
        "<|im_end|>",
        ["<|im_end|>", "<|endoftext|>"],
        QWEN25,
    )
    assert ollama.stop_tokens("chatml", qwen) == ["<|im_end|>", "<|im_start|>", "<|endoftext|>"]

    from core.data.tokenizer import Tokenizer, bytes_tokenizer

    meta = {"chat_template": DEFAULT_TEMPLATE, "stop_strings": ["<|im_end|>"]}
    chat_bytes = Tokenizer(bytes_tokenizer().hf, "bytes", meta)
    assert ollama.stop_tokens("chatml", chat_bytes) == ["<|im_end|>", "<|im_start|>"]
    assert ollama.stop_tokens("mistral") == ["</s>", "[INST]"]
    assert ollama.stop_tokens("plain") == []
    assert ollama.stop_tokens("plain", extra=["<|endoftext|>", ""]) == ["<|endoftext|>"]
    assert ollama.stop_tokens("gemma") == ["<end_of_turn>", "<start_of_turn>"]
    with pytest.raises(ValueError):
        ollama.stop_tokens("llama2")


def test_modelfile_of_a_tokenizer():
    llama = _tokenizer(
        ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
        ["<|end_of_text|>", "<|eot_id|>"],
        LLAMA31,
        add_bos=True,
    )
    commands = parse_modelfile(ollama.modelfile_of(llama, "out.gguf", system="Be brief."))
    names = [c for c, _ in commands]
    assert names == ["model", "template", "stop", "stop", "stop", "system"]
    values = dict(commands)
    assert values["model"] == "./out.gguf"
    assert [v for c, v in commands if c == "stop"] == [
        "<|eot_id|>",
        "<|start_header_id|>",
        "<|end_of_text|>",
    ]
    messages = CONVERSATIONS["user-assistant-user"]
    got = ollama_prompt(values["template"], messages, system=values["system"])
    assert got == ollama_wants(MODELS["llama3.1"], [m("system", "Be brief."), *messages])


def test_modelfile_lines_and_quoting():
    stops = ["<|im_end|>", 'say "stop"', " padded ", '"']
    system = 'First line "quoted".\nA """ inside, {{ .System }} and a tab\there.'
    text = modelfile_of(MODELS["qwen2.5"], stops, system)
    lines = text.splitlines()
    assert lines[0] == "FROM ./model.gguf"
    assert lines[1].startswith('TEMPLATE """')
    assert [ln for ln in lines if ln.startswith("PARAMETER ")] == [
        *(f'PARAMETER stop "{s}"' for s in stops[:3]),
        'PARAMETER stop """""""',  # '"""' would open a triple-quoted value
    ]
    assert lines[-2].startswith('SYSTEM """') and lines[-1].endswith('."""')
    commands = parse_modelfile(text)
    assert [c for c, _ in commands] == ["model", "template", *["stop"] * len(stops), "system"]
    assert [v for c, v in commands if c == "stop"] == stops
    assert dict(commands)["system"] == system
    assert text.endswith("\n")


@pytest.mark.parametrize(
    "name, renderer, parser",
    [
        ("qwen3", None, None),
        ("qwen3.5", None, "qwen3.5"),
        ("gemma4-31b", "gemma4-large", "gemma4"),
        ("gemma4-e2b", "gemma4-small", "gemma4"),
    ],
)
def test_modelfile_names_ollamas_own_renderer_and_parser(name, renderer, parser):
    """Ollama renders Gemma 4 with its own code (set on create for a gemma4 GGUF, the wrong
    size's without a RENDERER line: 26B/31B end the prompt with an empty thought channel,
    E2B/E4B do not), and reads Qwen3.5's XML tool calls only with its qwen3.5 parser."""
    model = REAL[name]
    stops = ollama.stop_tokens(ollama.template_kind(model.template))
    text = ollama.modelfile(
        "model.gguf", model.template, stops, bos_token=model.bos, add_bos=model.add_bos
    )
    commands = dict(parse_modelfile(text))
    assert commands.get("renderer") == renderer and commands.get("parser") == parser
    assert [v for c, v in parse_modelfile(text) if c == "stop"] == stops


@pytest.mark.parametrize(
    "system, why",
    [('ends with three quotes """\nnext line', "cannot be quoted"), ("a bell \x07", "unprintable")],
)
def test_modelfile_refuses_what_it_cannot_carry(system, why):
    with pytest.raises(OllamaError, match=why):
        modelfile_of(MODELS["qwen2.5"], system=system)


def test_modelfile_paths_and_create_command(tmp_path):
    text = ollama.modelfile("my model.gguf", DEFAULT_TEMPLATE, ["<|im_end|>"])
    assert parse_modelfile(text)[0] == ("model", "./my model.gguf")
    text = ollama.modelfile("/abs/dir/model.gguf", DEFAULT_TEMPLATE, [])
    assert parse_modelfile(text)[0] == ("model", "/abs/dir/model.gguf")
    assert ollama.create_command("my-model", tmp_path) == [
        "ollama",
        "create",
        "my-model",
        "-f",
        str(tmp_path / "Modelfile"),
    ]


# -- The Go template renderer itself ---------------------------------------------------------

# Ollama's own templates (template/*.gotmpl) and its expected renders (template/testdata).
OLLAMA_TEMPLATES = {
    "chatml": "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end "
    "}}<|im_start|>assistant\n",
    "llama3-instruct": "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>"
    "\n\n{{ .Content }}<|eot_id|>\n{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral-instruct": '[INST] {{ range $index, $_ := .Messages }}\n{{- if eq .Role "system" '
    '}}{{ .Content }}\n\n{{ else if eq .Role "user" }}{{ .Content }}[/INST]\n{{- else if eq '
    '.Role "assistant" }} {{ .Content }}</s>[INST] {{ end }}\n{{- end }}',
}
OLLAMA_CASE = [
    m("system", "You are a helpful assistant."),
    m("user", "Hello, how are you?"),
    m("assistant", "I'm doing great. How can I help you today?"),
    m("user", "I'd like to show off how chat templating works!"),
]
OLLAMA_EXPECTED = {
    "chatml": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Hello, how are you?<|im_end|>\n<|im_start|>assistant\nI'm doing great. How can I help "
    "you today?<|im_end|>\n<|im_start|>user\nI'd like to show off how chat templating works!"
    "<|im_end|>\n<|im_start|>assistant\n",
    "llama3-instruct": "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
    "assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello, how are you?"
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI'm doing great. How can I "
    "help you today?<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nI'd like to show "
    "off how chat templating works!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral-instruct": "[INST] You are a helpful assistant.\n\nHello, how are you?[/INST] I'm "
    "doing great. How can I help you today?</s>[INST] I'd like to show off how chat templating "
    "works![/INST]",
}


@pytest.mark.parametrize("name", OLLAMA_TEMPLATES)
def test_renderer_matches_ollamas_testdata(name):
    assert ollama_prompt(OLLAMA_TEMPLATES[name], OLLAMA_CASE) == OLLAMA_EXPECTED[name]


def test_renderer_basics():
    data = {"A": "x", "N": 0, "L": [{"Role": "u"}, {"Role": "a"}], "S": "héllo", "T": ["p", "q"]}
    assert go_render("a  {{- .A -}}  b", data) == "axb"
    assert go_render('{{ if .N }}1{{ else if eq .A "y" }}2{{ else }}3{{ end }}', data) == "3"
    assert go_render("{{ range $i, $m := .L }}{{ $i }}{{ $m.Role }}{{ end }}", data) == "0u1a"
    assert go_render("{{ range .N }}{{ else }}empty{{ end }}", {"N": []}) == "empty"
    assert (
        go_render("{{ len .S }} {{ slice .S 0 1 }} {{ index .T 1 }} {{ len .L }}", data)
        == "6 h q 2"
    )
    assert go_render('{{ and 1 0 }}{{ or 0 "z" }}{{ not .N }}', data) == "0ztrue"
    last = "{{ range $i, $_ := .L }}{{ $last := eq (len (slice $.L $i)) 1 }}{{ $last }}{{ end }}"
    assert go_render(last, data) == "falsetrue"
    assert go_render('{{ "{" }}{{ "a\\"b" }}', data) == '{a"b'
    assert identifiers("{{ range $.Messages }}{{ .Content }}{{ end }}") >= {"messages", "content"}


@pytest.mark.parametrize(
    "source",
    [
        "{{ .A | printf }}",
        "{{ with .A }}{{ end }}",
        "{{/* note */}}",
        "{{ .Missing }}",
        "{{ printf .A }}",
        "{{ if .A }}",
        "{{ end }}",
        "{{ $x = 1 }}",
        "{{ eq .A 1 }}",
        "{{ `raw` }}",
        "{{-.A }}",
    ],
)
def test_renderer_refuses_what_it_does_not_know(source):
    with pytest.raises(GoTemplateError):
        go_render(source, {"A": "x"})


def test_every_family_names_a_registered_chat_format():
    """A family names its usual chat format; core.weights sits below core.use, so the name
    is checked here against the formats registry."""
    from core.weights import families

    for family in families.FAMILIES.values():
        assert family.chat_format in ollama.formats.FORMATS, family.name
    stops = {f.name: f.stops for f in ollama.formats.FORMATS.values()}
    assert stops["plain"] == () and all(s for name, s in stops.items() if name != "plain")


def test_only_a_format_module_names_its_format():
    """The Ollama package's stages and its export name no format: a format's differences are
    its module's data and methods (core/use/ollama/formats), so a new format is one module.
    (Families name their usual format as data: Family.chat_format.)"""
    import ast
    from pathlib import Path

    import core.use.ollama as package

    names = set(ollama.formats.FORMATS)
    here = Path(package.__file__).parent
    found = []
    for path in [*here.glob("*.py"), here.parent / "ollama_export.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert found == []
