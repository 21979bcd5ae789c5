"""The whole chat chain for each newer family: a tiny random model saved with its family's real
chat template, chat-fine-tuned with LoRA by the trainer, exported for Ollama. The Modelfile's
TEMPLATE rendered by Go's own text/template equals transformers' apply_chat_template of the
exported tokenizer, its stops hold the family's end of turn, and the GGUF beside it runs in
llama.cpp with TrainDeck's greedy text and carries the model's chat template."""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch
from chat_templates import REAL, shapes_for
from gotemplate import go_available, go_prompts
from helpers import llama_greedy, tiny_config
from hf_models import TEXT, make_config

from core.data.chat import chat_ids, render, special_tokens
from core.training.trainer import Trainer
from core.use import ollama
from core.use.export import export
from core.use.generate import generate_ids
from core.use.gguf_export import chat_bos
from core.weights import families
from core.weights.loader import load

pytest.importorskip("transformers")

# chain: (family, the real template's model in tests/chat_templates.REAL, its marker tokens)
CHAINS = {
    "gemma2": ("gemma2", "gemma2", ["<start_of_turn>", "<end_of_turn>"]),
    "gemma3": ("gemma3", "gemma3", ["<start_of_turn>", "<end_of_turn>"]),
    "phi3.5": ("phi3", "phi3.5", ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]),
    "phi4-mini": ("phi3", "phi4-mini", ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]),
    "smollm3": ("smollm3", "smollm3", ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]),
    "deepseek-r1-distill-qwen": (
        "qwen2",
        "deepseek-r1-distill",
        ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"],
    ),
}
CHAT = [
    [
        {"role": "user", "content": f"Add {i} and {i + 1}."},
        {"role": "assistant", "content": f"The sum is {2 * i + 1}."},
    ]
    for i in range(12)
]
# SmolLM3's template writes a ~1,200-token reasoning prompt without a system message: its
# examples carry a short one (/no_think), and its context is longer.
SMOL_SYSTEM = {"role": "system", "content": "Be brief. /no_think"}
LONG = {"smollm3": 320}


def make_chat_model(folder: Path, family: str, real, markers: list[str], end=True) -> None:
    """A tiny random model of the family whose tokenizer has the real template's markers, BOS
    and EOS (BOS put first by the tokenizer where the real one does) and its chat template."""
    from tokenizers import processors
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    from core.data.tokenizer import train_bpe

    hf = train_bpe([TEXT], 512).hf
    hf.add_special_tokens(list(dict.fromkeys(t for t in [real.bos, real.eos, *markers] if t)))
    if real.add_bos:
        bos = hf.token_to_id(real.bos)
        hf.post_processor = processors.TemplateProcessing(
            single=f"{real.bos} $A",
            pair=f"{real.bos} $A {real.bos} $B",
            special_tokens=[(real.bos, bos)],
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=hf,
        bos_token=real.bos or None,
        eos_token=real.eos,
        chat_template=real.template,
    )
    folder.mkdir(parents=True)
    tok.save_pretrained(folder)
    ids = {"eos_token_id": tok.eos_token_id}
    if real.add_bos:
        ids["bos_token_id"] = tok.bos_token_id
    torch.manual_seed(0)
    long = {"max_position_embeddings": LONG[family]} if family in LONG else {}
    model = AutoModelForCausalLM.from_config(
        make_config(family, len(tok) + 3, **ids, **long)
    ).float()
    # As the real models ship it: the end of turn beside the EOS the generation stops at.
    end_of_turn = ollama.formats.get(ollama.template_kind(real.template)).stops[0]
    stops = list(dict.fromkeys([tok.convert_tokens_to_ids(end_of_turn), tok.eos_token_id]))
    stops = stops if end else [tok.eos_token_id]
    model.generation_config = GenerationConfig(
        eos_token_id=stops, **{k: v for k, v in ids.items() if k == "bos_token_id"}
    )
    model.save_pretrained(folder)


def modelfile_commands(text: str) -> list[tuple[str, str]]:
    """The Modelfile as Ollama's parser reads it (tests/core/test_ollama.py's port)."""
    path = Path(__file__).parents[1] / "core" / "test_ollama.py"
    spec = importlib.util.spec_from_file_location("_ollama_modelfile_parser", path)
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    if not hasattr(module, "parse_modelfile"):
        spec.loader.exec_module(module)
    return module.parse_modelfile(text)


class _OllamaDay:
    """Stands for datetime in transformers' strftime_now: the date as Ollama's currentDate
    gives it (YYYY-MM-DD, whatever the format: a documented difference, SmolLM3)."""

    @staticmethod
    def now():
        return _OllamaDay()

    def strftime(self, fmt):
        return datetime.now().strftime("%Y-%m-%d")


def transformers_text(folder: Path, messages: list[dict]) -> str:
    import transformers.utils.chat_template_utils as utils
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    cont = messages[-1]["role"] == "assistant"
    real, utils.datetime = utils.datetime, _OllamaDay
    try:
        return tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=not cont, continue_final_message=cont
        )
    finally:
        utils.datetime = real


@pytest.fixture(scope="module", params=list(CHAINS))
def chain(request, tmp_path_factory):
    """The chain's model, its LoRA chat fine-tune, and the fine-tune's hf and ollama exports."""
    family, name, markers = CHAINS[request.param]
    real = REAL[name]
    root = tmp_path_factory.mktemp(request.param.replace(".", "_"))
    make_chat_model(root / "base", family, real, markers)
    data = root / "chat.jsonl"
    chats = [[SMOL_SYSTEM, *c] for c in CHAT] if family in LONG else CHAT
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats), encoding="utf-8")
    cfg = tiny_config(
        init_from=str(root / "base"),
        tokenizer="model",
        data=str(data),
        data_format="chat",
        lora_rank=4,
        lora_alpha=8.0,
        lr=3e-2,
        max_steps=4,
        seq_len=LONG.get(family, 48),
        batch_size=2,
        eval_every=4,
        ckpt_every=4,
        dropout=0.0,
        sample_tokens=0,
        val_fraction=0.2,
        warmup_steps=1,
    )
    Trainer(cfg, root / "run").run()
    lines = []
    export(root / "run", "hf", root / "hf")
    export(root / "run", "ollama", root / "ollama", quant="f32", log=lines.append)
    return request.param, family, real, root, lines


def test_the_ollama_template_under_go_equals_transformers_of_the_exported_tokenizer(chain):
    if not go_available():
        pytest.skip("go is not installed (golang-go)")
    name, family, real, root, _ = chain
    commands = modelfile_commands((root / "ollama" / "Modelfile").read_text(encoding="utf-8"))
    template = dict(commands)["template"]
    # The exported tokenizer carries the real template unchanged.
    loaded = load(root / "run")
    assert loaded.tokenizer.chat_template == real.template
    shapes = {
        k: v
        for k, v in shapes_for(real).items()
        if k in ("single-turn", "system", "multi-turn", "assistant-last")
    }
    assert ("system" in shapes) == real.system
    outs = go_prompts([{"template": template, "messages": msgs} for msgs in shapes.values()])
    for shape, out in zip(shapes, outs, strict=True):
        assert not out["error"], (shape, out["error"])
        wanted = transformers_text(root / "hf", shapes[shape])
        if chat_bos(loaded.tokenizer):  # Ollama's tokenizer puts BOS first itself
            assert wanted.startswith(real.bos)
            wanted = wanted[len(real.bos) :]
        assert out["prompt"] == wanted, shape


def test_the_modelfile_stops_at_the_familys_end_of_turn(chain):
    name, family, real, root, lines = chain
    commands = modelfile_commands((root / "ollama" / "Modelfile").read_text(encoding="utf-8"))
    stops = [value for key, value in commands if key == "stop"]
    kind = ollama.template_kind(real.template)
    if family != "qwen2":  # the family's chat format is its real template's (R1: its own)
        assert families.get(family).chat_format == kind
    end_of_turn = ollama.formats.get(kind).stops[0]
    assert end_of_turn in stops
    assert any(end_of_turn in line for line in lines if "stop at" in line)
    # The family's own end-of-turn tokens, where its template writes them, are stops too.
    vocab = load(root / "run").tokenizer.hf.get_vocab()
    own = [s for s in families.get(family).stops if s in vocab and s in real.template]
    assert set(own) <= set(stops)  # DeepSeek-R1 on Qwen2: its template ends turns otherwise


@pytest.mark.parametrize("name", list(CHAINS))
def test_the_end_of_turn_stops_generation_without_generation_config_naming_it(tmp_path, name):
    """A folder whose generation_config.json lists only the EOS (Gemma's <eos>, Phi's
    <|endoftext|>): TrainDeck still stops at the template's end of turn, and the GGUF names it
    as its end-of-turn token for llama.cpp, as the Modelfile's stops do for Ollama."""
    import gguf

    family, key, markers = CHAINS[name]
    real = REAL[key]
    make_chat_model(tmp_path / "m", family, real, markers, end=False)
    tok = load(tmp_path / "m").tokenizer
    kind = ollama.template_kind(real.template)
    end_of_turn = tok.hf.token_to_id(ollama.formats.get(kind).stops[0])
    assert end_of_turn in tok.stop_ids
    export(tmp_path / "m", "gguf", tmp_path / "gguf", quant="f32", log=lambda line: None)
    fields = gguf.GGUFReader(str(tmp_path / "gguf" / "model.gguf")).fields
    ends = [
        int(fields[k].parts[-1][0])
        for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
        if k in fields
    ]
    assert end_of_turn in ends


def test_the_gguf_runs_in_llama_cpp_with_traindecks_greedy_chat_text(chain):
    llama_cpp = pytest.importorskip("llama_cpp")
    name, family, real, root, _ = chain
    loaded = load(root / "run")
    tok = loaded.tokenizer
    system = SMOL_SYSTEM if family in LONG else {"role": "system", "content": "Be brief."}
    messages = [system] * real.system + [{"role": "user", "content": "Add 2 and 3."}]
    text = render(tok.chat_template, messages, True, **special_tokens(tok))
    ids = chat_ids(tok, messages)
    llm = llama_cpp.Llama(
        str(root / "ollama" / "model.gguf"),
        n_ctx=loaded.model.config.seq_len,
        n_threads=1,
        verbose=False,
    )
    assert llm.metadata["tokenizer.chat_template"] == real.template
    # As Ollama and llama.cpp's chat prompt it: the template's text, less a BOS it writes
    # where the GGUF has the tokenizer add one, tokenized with special tokens and BOS added.
    add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token") == "true"
    if add_bos and real.bos and text.startswith(real.bos):
        text = text[len(real.bos) :]
    assert llm.tokenize(text.encode(), add_bos=True, special=True) == ids
    n = 6
    expected = list(generate_ids(loaded.model, ids, n, temperature=0))
    got = llama_greedy(llm, ids, n)
    assert got == expected
    assert llm.detokenize(got, special=True).decode(errors="replace") == tok.decode(expected)


# Chat formats no family ships, each one module in core/use/ollama/formats: (the real template's
# model in tests/chat_templates.REAL, a family TrainDeck builds to carry it, its marker tokens).
NEW_FORMATS = {
    "llama4": ("llama", ["<|header_start|>", "<|header_end|>", "<|eot|>", "<|python_start|>"]),
    "granite4": ("llama", ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"]),
    "mistral-small-3.1": (
        "mistral",
        ["[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]"],
    ),
    # gpt-oss's harmony format on a Llama model (the gpt-oss family reads its weights)
    "gpt-oss": (
        "llama",
        ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"],
    ),
    # Qwen3.5's and Gemma 4's, until their families are built (issue 50)
    "qwen3.5": ("llama", ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]),
    "gemma4-31b": ("llama", ["<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>"]),
}


@pytest.mark.parametrize("name", list(NEW_FORMATS))
def test_a_new_chat_format_exports_for_ollama_as_transformers_renders_it(tmp_path, name):
    """A tiny model carrying Llama 4's, Granite 4.0's or Mistral Small 3.1's real template
    exports for Ollama: its Modelfile's TEMPLATE under Go renders every conversation shape as
    transformers renders the saved tokenizer's template, and it stops at the end of turn."""
    if not go_available():
        pytest.skip("go is not installed (golang-go)")
    family, markers = NEW_FORMATS[name]
    real = REAL[name]
    make_chat_model(tmp_path / "base", family, real, markers)
    lines = []
    export(tmp_path / "base", "ollama", tmp_path / "o", quant="f32", log=lines.append)
    commands = modelfile_commands((tmp_path / "o" / "Modelfile").read_text(encoding="utf-8"))
    fmt = ollama.formats.get(ollama.template_kind(real.template))
    assert any(f"Modelfile with the {fmt.display} template" in line for line in lines)
    assert fmt.stops[0] in [value for key, value in commands if key == "stop"]
    shapes = shapes_for(real)
    template = dict(commands)["template"]
    outs = go_prompts([{"template": template, "messages": msgs} for msgs in shapes.values()])
    for shape, out in zip(shapes, outs, strict=True):
        assert not out["error"], (shape, out["error"])
        wanted = transformers_text(tmp_path / "base", shapes[shape])
        if real.add_bos:  # Ollama's tokenizer puts BOS first itself
            wanted = wanted.removeprefix(real.bos)
        assert out["prompt"] == wanted, shape
