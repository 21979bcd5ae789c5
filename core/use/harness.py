"""lm-evaluation-harness itself on a TrainDeck model: `python -m core.eval RUN --tasks NAME`.

The model stays TrainDeck's (a LoRA run with its adapters on, unmerged; a 4-bit base as it
trained) behind lm_eval's LM interface; every request is answered by core.use.scoring, which
follows the harness's hf backend. lm_eval is optional (the `eval` extra) and imported only here,
inside the functions that need it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from core.errors import DataError
from core.use import scoring
from core.weights.loader import Loaded

INSTALL = 'pip install "traindeck[eval]" (or pip install "lm_eval>=0.4.13,<0.5")'


def require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise DataError(f"--tasks: lm-evaluation-harness is not installed; {INSTALL}") from None


def make_lm(loaded: Loaded, progress=None):
    """A TrainDeck model as an lm_eval LM (a TemplateLM: lm_eval's own encode_pair and
    empty-context handling sit on top of the methods below)."""
    require_lm_eval()
    from lm_eval.api.model import TemplateLM

    tok = loaded.tokenizer

    class TrainDeckLM(TemplateLM):
        def __init__(self):
            super().__init__()
            self.loaded = loaded

        @property
        def eot_token_id(self) -> int:
            return tok.eos_id if tok.eos_id is not None else scoring.prefix_token_id(tok)

        @property
        def prefix_token_id(self) -> int:
            return scoring.prefix_token_id(tok)

        @property
        def max_length(self) -> int:
            return scoring.max_length(loaded)

        def tok_encode(self, string, add_special_tokens=None, **kwargs):
            return scoring.tok_encode(tok, string, add_special_tokens)

        def tok_decode(self, tokens, **kwargs):
            return scoring.tok_decode(tok, tokens)

        def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
            pairs = [(ctx, cont) for _, ctx, cont in requests]
            return scoring.loglikelihood_tokens(loaded, pairs, progress)

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            texts = [req.args[0] for req in requests]
            return [r["ll"] for r in scoring.loglikelihood_rolling(loaded, texts, progress)]

        def generate_until(self, requests, disable_tqdm=False):
            out = []
            for req in requests:
                context, kwargs = req.args[0], dict(req.args[1] or {})
                if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0) > 0:
                    raise DataError(
                        "--tasks: TrainDeck answers generate_until greedily; this "
                        "task asks for sampling (do_sample)"
                    )
                most = kwargs.get("max_gen_toks") or kwargs.get("max_new_tokens") or 256
                out.append(scoring.generate_until(loaded, context, kwargs.get("until"), most))
                if progress:
                    progress(1)
            return out

        def apply_chat_template(self, chat_history, add_generation_prompt=True):
            return scoring.render_chat(loaded, list(chat_history))

        @property
        def tokenizer_name(self) -> str:
            return f"traindeck-{tok.fingerprint()}"

        def chat_template(self, chat_template=False):
            return tok.chat_template or ""

    return TrainDeckLM()


def task_names(tasks: str) -> tuple[list[str], list[str], bool]:
    """(task names, folders with task YAMLs, whether lm_eval's own tasks are named): a name,
    or the path of a task YAML (its folder is searched and its `task:` named)."""
    import yaml

    names, folders, yamls = [], [], []
    for part in (p.strip() for p in tasks.split(",")):
        if not part:
            continue
        path = Path(part)
        if path.suffix in (".yaml", ".yml") or path.exists():
            if not path.is_file():
                raise DataError(f"--tasks: {path} not found (a task name or a task YAML file)")
            try:
                spec = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError) as e:
                raise DataError(f"--tasks: {path} is not a task YAML ({e})") from None
            if not isinstance(spec, dict) or not isinstance(spec.get("task"), str):
                raise DataError(f"--tasks: {path} names no task (a `task:` line)")
            names.append(spec["task"])
            yamls.append(spec["task"])
            folders.append(str(path.resolve().parent))
        else:
            names.append(part)
    if not names:
        raise DataError("--tasks: give one or more task names or task YAML files")
    return names, sorted(set(folders)), len(yamls) < len(names)


def _flatten(results: dict) -> dict:
    """{"task": {"acc": .., "acc_stderr": ..}}: lm_eval's "acc,none" keys without the default
    filter's name (other filters kept: "exact_match,strict-match" -> "exact_match/strict-match")."""
    out = {}
    for task, measures in results.items():
        flat = {}
        for key, value in measures.items():
            if "," not in key:
                continue
            name, filt = key.split(",", 1)
            flat[name if filt == "none" else f"{name}/{filt}"] = value
        out[task] = flat
    return out


def _manager(folders: list[str], builtin: bool):
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    # lm_eval's own ~10,000 task YAMLs take seconds to index: only when one is named
    return TaskManager(include_path=folders or None, include_defaults=builtin)


def _data_errors() -> tuple[type[BaseException], ...]:
    """What a task's data raises when it is missing, unreachable or damaged: the file and
    network errors, and the datasets library's own."""
    from datasets.exceptions import DatasetsError

    return (OSError, DatasetsError)


def check_tasks(tasks: str) -> None:
    """Every task is known and its data loads (the datasets cache keeps it for the run),
    before any model is loaded; one line naming what is wrong."""
    require_lm_eval()
    names, folders, builtin = task_names(tasks)
    manager = _manager(folders, builtin)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise DataError(
            f"--tasks: no task named {unknown[0]} (lm_eval --tasks list shows them; "
            "or give the path of a task YAML)"
        )
    try:
        manager.load(names)
    except _data_errors() as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"--tasks: the data of {tasks} cannot be read: {first}") from None


def run_tasks(
    loaded: Loaded,
    tasks: str,
    fewshot: int | None = None,
    limit=None,
    chat: bool = False,
    multiturn: bool = True,
    progress=None,
) -> dict:
    """lm_eval's simple_evaluate on the loaded model: {"tasks": {task: measures}, "n": {task:
    samples}, "config": what ran}."""
    require_lm_eval()
    names, folders, builtin = task_names(tasks)
    from lm_eval import simple_evaluate

    manager = _manager(folders, builtin)
    result = simple_evaluate(
        model=make_lm(loaded, progress),
        tasks=names,
        num_fewshot=fewshot,
        limit=limit,
        task_manager=manager,
        apply_chat_template=chat,
        fewshot_as_multiturn=multiturn,
        log_samples=False,
        bootstrap_iters=1000,
    )
    return {
        "tasks": _flatten(result["results"]),
        "n": {
            k: v.get("effective", v.get("original")) for k, v in result.get("n-samples", {}).items()
        },
        "versions": {k: v for k, v in result.get("versions", {}).items()},
    }
