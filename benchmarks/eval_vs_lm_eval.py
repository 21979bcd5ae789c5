"""core.eval's measures beside lm-evaluation-harness's own (its hf backend), on a small Llama
built with transformers' config class and a LoRA fine-tune of it trained by TrainDeck (lm_eval
reads the fine-tune's merged hf export; TrainDeck keeps the adapters on, unmerged).

python benchmarks/eval_vs_lm_eval.py [--steps 60]
Prints a Markdown table: each measure by lm_eval (hf), by core.eval's own code (--text,
--choices) and by lm_eval with TrainDeck's model behind its LM interface (--tasks).
Needs the test extras (transformers, lm_eval). CPU, about a minute.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def questions() -> list[dict]:
    rnd, rows = random.Random(0), []
    for i in range(12):
        right = f"{i + 3}"
        choices = [right, f"{i + 7}", "fox", "Ünï"]
        rnd.shuffle(choices)
        rows.append(
            {
                "question": f"Numbers: {i} {i + 1} {i + 2}",
                "context": f"{i} {i + 1} {i + 2}",
                "choices": choices,
                "answer": choices.index(right),
            }
        )
    for word, right, wrong in [
        ("The quick brown fox jumps over the", "lazy dog", "moon"),
        ("def add(a, b):\n    return", "a + b", "hello"),
        ("Hello world, hello", "model", "Ünïcödé"),
        ("and emoji \u2603 stay", "whole", "half"),
    ]:
        choices = [right, wrong]
        rnd.shuffle(choices)
        rows.append(
            {"question": word, "context": word, "choices": choices, "answer": choices.index(right)}
        )
    return rows


PPL = """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def yaml_task(folder: Path, name: str, rows: list[dict], body: str) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"test_split: test\nfewshot_split: test\n{body}",
        encoding="utf-8",
    )


# (task, fewshot, chat, core.eval's QuestionFormat fields)
SETS = [
    ("frame", 0, False, {"template": "Question: {{question}}\nAnswer:"}),
    ("context", 2, False, {"template": "context", "description": "Continue.\n\n"}),
    ("chat", 2, True, {"template": "question", "description": "Be brief."}),
]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    import lm_eval
    from helpers import LM_EVAL_MC, tiny_config
    from hf_models import TEXT, make_model
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from core.training.trainer import Trainer
    from core.use import evaluate, harness
    from core.use.export import export
    from core.weights.loader import load

    tmp = Path(tempfile.mkdtemp())
    base = tmp / "llama"
    make_model(base, "llama", hidden_size=64, intermediate_size=128)
    (tmp / "t.txt").write_text(TEXT, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(base),
        tokenizer="model",
        data=str(tmp / "t.txt"),
        lr=3e-3,
        lora_rank=8,
        max_steps=args.steps,
        eval_every=args.steps,
        ckpt_every=args.steps,
        hidden_dim=64,
        n_heads=4,
        bias=False,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(cfg, tmp / "run").run()
    export(tmp / "run", "hf", tmp / "merged", log=lambda _: None)
    rows = questions()
    docs = [TEXT[:900], TEXT[900:2400], "Hello world, hello model.", "Ünïcödé \u2603  stays"]
    tasks = tmp / "tasks"
    tasks.mkdir()
    text = {
        "frame": '"Question: {{question}}\\nAnswer:"',
        "context": '"{{context}}"',
        "chat": '"{{question}}"',
    }
    for name, _, _, fields in SETS:
        desc = fields.get("description")
        extra = f"description: {json.dumps(desc)}\n" if desc else ""
        yaml_task(tasks, f"q_{name}", rows, f"doc_to_text: {text[name]}\n{extra}{LM_EVAL_MC}")
    yaml_task(tasks, "ppl", [{"text": d} for d in docs], PPL)
    (tmp / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    manager = TaskManager(include_path=str(tasks), include_defaults=False)

    def lm_eval_run(lm, name, fewshot, chat):
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=[name],
            num_fewshot=fewshot,
            task_manager=manager,
            apply_chat_template=chat,
            bootstrap_iters=0,
        )
        return {k.split(",")[0]: v for k, v in out["results"][name].items() if "," in k}

    table = []
    for label, hf_path, ours_path in [
        ("start model", base, base),
        (f"LoRA fine-tune ({args.steps} steps)", tmp / "merged", tmp / "run"),
    ]:
        hf = HFLM(pretrained=str(hf_path), batch_size=1, device="cpu", dtype="float32")
        loaded = load(ours_path)
        wrapped = harness.make_lm(loaded)
        items = evaluate.read_choices(tmp / "q.jsonl")
        for name, fewshot, chat, fields in SETS:
            theirs = lm_eval_run(hf, f"q_{name}", fewshot, chat)
            via = lm_eval_run(wrapped, f"q_{name}", fewshot, chat)
            fmt = evaluate.QuestionFormat(fewshot=fewshot, chat=chat, **fields)
            own = evaluate.choice_metrics(loaded, items, fmt)
            for m in ("acc", "acc_norm", "acc_bytes"):
                table.append(
                    (
                        label,
                        f"q_{name} ({fewshot}-shot{', chat' if chat else ''})",
                        m,
                        theirs[m],
                        own[m],
                        via[m],
                    )
                )
        theirs = lm_eval_run(hf, "ppl", 0, False)
        via = lm_eval_run(wrapped, "ppl", 0, False)
        own = evaluate.text_metrics(loaded, docs)
        for m in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
            table.append((label, "ppl (4 documents)", m, theirs[m], own[m], via[m]))
    print(
        "| model | task | measure | lm_eval (hf) | core.eval | lm_eval + TrainDeck LM | "
        "largest difference |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, task, m, a, b, c in table:
        diff = max(abs(a - b), abs(a - c))
        print(f"| {label} | {task} | {m} | {a:.6f} | {b:.6f} | {c:.6f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
