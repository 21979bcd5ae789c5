"""python -m core.eval RUN|CHECKPOINT|MODEL_FOLDER|HUB_ID [--text FILE] [--choices FILE]
[--tasks NAME[,NAME]] [--report [N]]"""

from __future__ import annotations

import json
import sys

from tqdm import tqdm

from core.cli.base import Parser, UsageError, non_negative, run_main
from core.errors import EXIT_OK
from core.use import evaluate, report


def build_parser() -> Parser:
    p = Parser(
        prog="python -m core.eval",
        description="Evaluate a model on text, questions or lm-evaluation-harness tasks, with "
        "lm_eval's definitions; show a chat fine-tune's answers before and after.",
    )
    p.add_argument("target", help="a run folder, a checkpoint file, a model folder or hub id")
    p.add_argument(
        "--text",
        metavar="FILE",
        help="word/byte perplexity and bits per byte (lm_eval's rolling log-likelihood) of a "
        "text file, or of each row of a .jsonl/.csv/.parquet table's text column",
    )
    p.add_argument(
        "--text-column",
        default="text",
        metavar="NAME",
        help="with a table as --text: the column holding the text",
    )
    p.add_argument(
        "--choices",
        metavar="FILE",
        help="multiple-choice accuracy (acc, acc_norm, acc_bytes) on .jsonl, .csv or .parquet "
        "questions",
    )
    p.add_argument(
        "--tasks",
        metavar="NAME[,NAME]",
        help="lm-evaluation-harness tasks (names, or paths of task YAML files) run on this "
        "model; needs the eval extra",
    )
    p.add_argument(
        "--fewshot",
        type=non_negative(int),
        default=None,
        metavar="K",
        help="K answered examples before each question, drawn as lm_eval draws "
        "them (seeded); for --tasks: the task's own when not given",
    )
    p.add_argument(
        "--fewshot-seed",
        type=int,
        default=evaluate.FEWSHOT_SEED,
        metavar="N",
        help="the few-shot sampler's seed (lm_eval's fewshot_random_seed, 1234)",
    )
    p.add_argument(
        "--template",
        metavar="JINJA",
        help="the prompt of a question (lm_eval's doc_to_text): a Jinja template over the "
        "file's columns, e.g. '{{question}}\\nAnswer:', or a column name; default: the context "
        "column as is, else 'Question: {question}\\nAnswer:'",
    )
    p.add_argument(
        "--target-delimiter",
        default=" ",
        metavar="TEXT",
        help="what goes between a prompt and its answer (default a space)",
    )
    p.add_argument(
        "--description",
        default="",
        metavar="TEXT",
        help="a line shown before the examples (lm_eval's description)",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="questions or tasks in the model's chat template, the few-shot examples as "
        "turns (lm_eval's apply_chat_template with fewshot_as_multiturn)",
    )
    p.add_argument(
        "--single-turn",
        action="store_true",
        help="with --chat: the examples and the question in one user message",
    )
    p.add_argument(
        "--limit",
        type=non_negative(int),
        default=None,
        metavar="N",
        help="score at most N questions (per task)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="a fine-tune: also evaluate the model it started from, side by side",
    )
    p.add_argument(
        "--report",
        type=non_negative(int),
        nargs="?",
        const=report.DEFAULT_EXAMPLES,
        metavar="N",
        help="a chat fine-tune: its first N (default 5) held-out prompts answered by the start "
        "model and the fine-tuned one, side by side in RUN/eval/report.md",
    )
    p.add_argument(
        "--max-new-tokens",
        type=non_negative(int),
        default=report.DEFAULT_NEW_TOKENS,
        metavar="N",
        help="with --report: the longest answer, in tokens",
    )
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    p.add_argument(
        "--device",
        default="auto",
        metavar="auto|cpu|cuda[:N]",
        help="where the model runs (default auto: the GPU where there is one)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def check_files(args) -> None:
    """Every file named exists and is a file, before any model is loaded."""
    for name in ("text", "choices"):
        if getattr(args, name):
            evaluate.input_file(getattr(args, name), f"--{name}")
    if args.tasks:
        from core.use import harness

        harness.check_tasks(args.tasks)  # known, and their data loads


def question_format(args) -> evaluate.QuestionFormat:
    return evaluate.QuestionFormat(
        template=evaluate.unescape(args.template),
        target_delimiter=evaluate.unescape(args.target_delimiter),
        description=evaluate.unescape(args.description),
        fewshot=args.fewshot or 0,
        seed=args.fewshot_seed,
        chat=args.chat,
        multiturn=not args.single_turn,
    )


def run_cli(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.text and not args.choices and not args.tasks and args.report is None:
        raise UsageError("give --text FILE, --choices FILE, --tasks NAME or --report")
    if args.report == 0:
        raise UsageError("--report: N must be at least 1")
    if args.single_turn and not args.chat:
        raise UsageError("--single-turn: only with --chat")
    check_files(args)
    if args.device != "auto":
        from core.platform.device import resolve_device

        resolve_device(args.device)  # a missing GPU is one line before any loading
    bar = tqdm(unit="request", file=sys.stderr, disable=not sys.stderr.isatty())
    out = {}
    if args.text or args.choices:
        out = evaluate.evaluate_files(
            args.target,
            args.text,
            args.choices,
            0,
            args.limit,
            args.compare,
            args.checkpoint,
            bar.update,
            question_format(args),
            args.text_column,
            args.device,
        )
    if args.tasks:
        ran = evaluate.evaluate_tasks(
            args.target,
            args.tasks,
            args.fewshot,
            args.limit,
            args.chat,
            not args.single_turn,
            args.compare,
            args.checkpoint,
            bar.update,
            args.device,
        )
        out["tasks"] = ran["tasks"]
        if "start" in ran:
            out.setdefault("start", {})["tasks"] = ran["start"]["tasks"]
    made = None
    if args.report is not None:
        made = report.make_report(
            args.target, args.report, args.max_new_tokens, args.checkpoint, bar.update
        )
        out["report"] = {"path": made["path"], "examples": made["examples"]}
    bar.close()
    if args.json:
        print(json.dumps(out))
        return EXIT_OK
    table = evaluate.format_table(out)
    if table:
        print(table)
    if made:
        print(made["path"])
    return EXIT_OK


def main(argv=None) -> int:
    return run_main(run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
