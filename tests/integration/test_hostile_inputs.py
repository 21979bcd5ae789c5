"""Inputs a hostile (or unlucky) user brings. Each refusal is exit 2 and one line naming the
flag or file, with no traceback, and it happens before any work: no cache entry, start model,
run folder or export is written, and every file that was there is unchanged (hashed before
and after). The documented successes are checked for what they promise."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_config

from core.cli.eval import main as eval_main
from core.cli.export import main as export_main
from core.cli.generate import main as generate_main
from core.data import tables
from core.data.tokenizer import bytes_tokenizer
from core.data.windows import TokenData
from core.platform.atomic import temp_sibling, temps_of
from core.train import main as train_main
from core.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--preset",
    "cpu-tiny",
    "--seq-len",
    "32",
    "--hidden-dim",
    "32",
    "--max-steps",
    "2",
    "--eval-every",
    "2",
    "--ckpt-every",
    "2",
    "--sample-tokens",
    "0",
]
TEXT = "def add(a, b):\n    return a + b\n" * 200


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A working folder that holds everything a command could write: the runs, the data
    cache (start models too) and the user's settings."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("TRAINDECK_CACHE", str(tmp_path / "cache"))
    handler = signal.getsignal(signal.SIGINT)
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    yield tmp_path
    signal.signal(signal.SIGINT, handler)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny trained run, for the commands that read one."""
    root = tmp_path_factory.mktemp("hostile-run")
    data = root / "code.txt"
    data.write_text(TEXT, encoding="utf-8")
    cfg = tiny_config(data=str(data), max_steps=2, eval_every=2, ckpt_every=2, sample_tokens=0)
    Trainer(cfg, root / "run").run()
    return root / "run"


def tree(folder: Path) -> dict[str, str]:
    """Every file and folder under folder (links not followed), with its content's hash."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def refused(capsys, main, args, folder: Path, *needles, log: str | None = None, bar=None):
    """main(args) exits 2 with one line naming what is wrong, having written nothing (but,
    for a run, the refusal appended to its own log). bar: a refusal found while rendering
    comes after that phase's progress bar, which is left out."""
    before = tree(folder)
    old_log = (folder / log).read_text() if log else None
    capsys.readouterr()
    code = main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    if bar:
        err = "\n".join(ln for ln in err.splitlines() if not ln.startswith(bar + ":"))
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    after = tree(folder)
    if log:
        assert (folder / log).read_text().startswith(old_log)  # appended to, nothing lost
        before.pop(log), after.pop(log)
    assert after == before  # nothing written, nothing changed
    return err


# -- never write into what is not ours -------------------------------------------------------------


def hf_folder(path: Path) -> Path:
    """An export (or a downloaded model) a user keeps: ours to leave alone."""
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "gpt2"}')
    (path / "tokenizer.json").write_text("x" * 5000)
    (path / "model.safetensors").write_bytes(os.urandom(3000))
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "best.pt").write_bytes(os.urandom(100))
    return path


def test_train_out_that_is_an_export_folder_is_refused_before_any_work(home, capsys):
    out = hf_folder(home / "exported")
    refused(
        capsys,
        train_main,
        [*TINY, "--data", home / "data.txt", "--out", out],
        home,
        "--out",
        "not a TrainDeck run",
        "config.json",
    )
    assert not (home / "cache").exists()


def test_train_out_link_file_and_inside_a_file_are_refused(home, capsys):
    target = home / "empty"
    target.mkdir()
    (home / "link").symlink_to(target)
    (home / "afile").write_text("keep me")
    data = ["--data", home / "data.txt"]
    refused(capsys, train_main, [*TINY, *data, "--out", home / "link"], home, "symbolic link")
    refused(capsys, train_main, [*TINY, *data, "--out", home / "afile"], home, "not a folder")
    refused(
        capsys,
        train_main,
        [*TINY, *data, "--out", home / "afile" / "run"],
        home,
        "afile is not a folder",
    )


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_train_out_in_a_read_only_folder_is_refused_before_the_model_loads(home, capsys):
    locked = home / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        refused(capsys, train_main, [*TINY, "--out", locked / "run"], home, "cannot write")
    finally:
        locked.chmod(0o700)


def test_train_out_holding_a_run_is_refused_and_an_empty_folder_is_used(home, capsys, run):
    data = ["--data", home / "data.txt"]
    refused(capsys, train_main, [*TINY, *data, "--out", run], home, "already holds a run")
    empty = home / "empty"
    empty.mkdir()
    assert train_main([*map(str, TINY), *map(str, data), "--out", str(empty)]) == 0
    assert (empty / "checkpoints" / "latest.pt").is_file()


def test_init_from_a_run_into_a_foreign_out_writes_no_start_model(home, capsys, run):
    out = hf_folder(home / "exported")
    args = [*TINY, "--init-from", run, "--data", home / "data.txt", "--out", out]
    refused(capsys, train_main, args, home, "not a TrainDeck run")
    assert not (home / "cache").exists()  # no start model merged, no data prepared


def test_export_out_that_is_a_link_is_refused(home, capsys, run):
    target = home / "empty"
    target.mkdir()
    (home / "link").symlink_to(target)
    refused(
        capsys, export_main, [run, "--format", "hf", "--out", home / "link"], home, "symbolic link"
    )


# -- damaged files given to the commands that load them ----------------------------------------


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


DAMAGE = {
    "random": lambda raw: np.random.default_rng(0).bytes(4096),
    "truncated": lambda raw: raw[: len(raw) // 2],
    "empty": lambda raw: b"",
    "pickle": lambda raw: b"\x80\x02.",  # was IndexError: pop from empty list (exit 1)
    "no-model": lambda raw: _saved({"format_version": 1, "step": 3}),  # was KeyError
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_refused_by_export_generate_and_eval(home, capsys, run, damage):
    good = (run / "checkpoints" / "best.pt").read_bytes()
    bad = home / "bad.pt"
    bad.write_bytes(DAMAGE[damage](good))
    (home / "q.txt").write_text(TEXT)
    refused(capsys, export_main, [bad, "--format", "hf", "--out", home / "x"], home, "bad.pt")
    refused(capsys, generate_main, [bad, "--max-new-tokens", "2"], home, "bad.pt")
    refused(capsys, eval_main, [bad, "--text", home / "q.txt"], home, "bad.pt")


# -- data files: bounded reads, one line naming the file -------------------------------------------


def test_a_csv_header_field_over_128_kb_is_read(home, capsys):
    big = home / "big.csv"
    big.write_text("text," + "h" * 200_000 + "\nhello,x\n", encoding="utf-8")
    assert tables.csv_header(big)[1] == "h" * 200_000
    assert [r["text"] for _, r in tables.iter_records(big)] == ["hello"]


def test_a_csv_with_a_duplicated_column_name_is_refused_naming_it(home, capsys):
    dup = home / "dup.csv"
    dup.write_text("text,text\na,b\n", encoding="utf-8")
    refused(
        capsys,
        train_main,
        [*TINY, "--data", dup, "--out", home / "r"],
        home,
        "dup.csv",
        "'text' twice",
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_line_over_the_record_limit_is_refused_without_reading_it_whole(
    home, capsys, monkeypatch, suffix
):
    monkeypatch.setattr(tables, "MAX_RECORD_CHARS", 10_000)
    huge = home / f"huge{suffix}"
    head = '{"text": "' if suffix == ".jsonl" else 'text\n"'
    huge.write_text(head + "a" * 50_000, encoding="utf-8")  # no line break anywhere
    refused(
        capsys,
        train_main,
        [*TINY, "--data", huge, "--out", home / "r"],
        home,
        f"huge{suffix}",
        "is longer than 10,000 characters",
    )


def test_a_json_array_over_the_whole_file_limit_asks_for_json_lines(home, capsys, monkeypatch):
    monkeypatch.setattr(tables, "MAX_JSON_BYTES", 1000)
    big = home / "big.json"
    big.write_text("[" + ",".join(['{"text": "hello world"}'] * 100) + "]", encoding="utf-8")
    refused(
        capsys,
        train_main,
        [*TINY, "--data", big, "--out", home / "r"],
        home,
        "big.json",
        "JSON Lines",
    )


def test_a_single_json_object_holding_a_list_is_still_one_table(home):
    f = home / "one.json"
    f.write_text('{"data": [{"text": "a"}, {"text": "b"}]}', encoding="utf-8")
    assert [r["text"] for _, r in tables.iter_records(f)] == ["a", "b"]


def test_data_weights_whose_sum_overflows_mix_evenly():
    from core.data.mix import weights_of

    class Part:
        train_tokens = 10

    cfg = tiny_config(data_weights="1e308,1e308", extra_data=["x"])
    assert weights_of(cfg, [Part(), Part()]) == [0.5, 0.5]


def test_preference_pairs_in_a_mix_are_refused_before_anything_is_prepared(home, capsys, run):
    for name in ("pairs.jsonl", "more.jsonl"):
        (home / name).write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n' * 20)
    args = [
        *TINY,
        "--method",
        "dpo",
        "--init-from",
        run,
        "--data",
        home / "pairs.jsonl",
        "--data",
        home / "more.jsonl",
        "--out",
        home / "r",
    ]
    refused(capsys, train_main, args, home, "pairs.jsonl", "train alone")
    assert not (home / "cache").exists()


# -- the second validation set ---------------------------------------------------------------------


def test_eval_data_shorter_than_one_window_is_refused_before_the_data_is_tokenized(home, capsys):
    short = home / "short.txt"
    short.write_text("tiny")
    args = [*TINY, "--data", home / "data.txt", "--eval-data", short, "--out", home / "r"]
    refused(capsys, train_main, args, home, "eval_data", "short.txt", "one window")
    assert not (home / "cache").exists()


def test_eval_data_reads_a_tables_text_column_not_its_bytes(home):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from core.data.windows import text_windows

    pq.write_table(pa.table({"text": [TEXT], "n": [1]}), home / "t.parquet")
    tok = bytes_tokenizer()
    w = text_windows(str(home / "t.parquet"), tok, 32, 4)
    assert tok.decode(w.x[0].tolist()) == TEXT[:32]
    pq.write_table(pa.table({"body": [TEXT]}), home / "nocol.parquet")
    with pytest.raises(Exception, match="nocol.parquet.*no text column"):
        text_windows(str(home / "nocol.parquet"), tok, 32, 4)


def test_eval_data_reads_only_what_it_uses(home, monkeypatch):
    from core.data import windows

    big = home / "big.txt"
    with open(big, "wb") as f:  # sparse: 64 MiB on paper, nothing on disk
        f.truncate(64 << 20)
    reads = []
    real_open = open

    def counting_open(path, mode="r", *a, **k):
        handle = real_open(path, mode, *a, **k)
        if Path(path) == big:
            real_read = handle.read

            def read(n=-1):
                reads.append(n)
                return real_read(n)

            handle.read = read
        return handle

    monkeypatch.setattr("builtins.open", counting_open)
    windows.text_windows(str(big), bytes_tokenizer(), 32, 4)
    assert reads and all(0 < n <= windows.EVAL_TEXT_BYTES for n in reads)


# -- index arithmetic past 2^24 --------------------------------------------------------------------


def test_validation_windows_of_more_than_2_24_held_out_tokens(tmp_path):
    """A float32 linspace rounded the last window's start past the end (a short window:
    `all input arrays must have the same shape`). The token file is sparse: 34 MB on paper."""
    seq_len, n_train, n_val = 32, 1000, (1 << 24) + 12_380
    folder = tmp_path / "entry"
    folder.mkdir()
    with open(folder / "tokens.bin", "wb") as f:
        f.truncate((n_train + n_val) * 2)
        f.seek((n_train + n_val) * 2 - 2)
        f.write(np.array([7], dtype=np.uint16).tobytes())  # the very last token
    bytes_tokenizer().save(folder / "tokenizer.json")
    manifest = {
        "source": "sparse",
        "train_tokens": n_train,
        "val_tokens": n_val,
        "dtype": "uint16",
        "val_bytes": n_val,
    }
    data = TokenData(folder, manifest, seq_len, seed=0)
    high = n_val - seq_len - 1
    assert torch.linspace(0, high, 2).long()[-1] > high  # where float32 starts ran past the end
    for n_windows in (2, 3, 7, 1000):
        batches = list(data.val_batches(n_windows, 64))
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        assert x.shape == (n_windows, seq_len) and y.shape == (n_windows, seq_len)
        assert y[-1, -1] == 7  # the last window ends exactly at the last token
    from core.data.windows import evenly_spaced

    starts = evenly_spaced(high, 1000)
    assert starts.dtype == torch.int64 and starts[0] == 0 and starts[-1] == high
    assert bool((starts[1:] > starts[:-1]).all())
    assert os.stat(folder / "tokens.bin").st_blocks * 512 < 1 << 20  # it stayed sparse


# -- temporaries: owned, cleaned after a kill, never stolen from a live writer -------------------

KILLED_EXPORT = """
import os, signal, sys
from core.use.export import export
def die(done, total):
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9 halfway through writing the GGUF
export(sys.argv[1], "gguf", sys.argv[2], progress=die)
"""


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_an_export_killed_with_kill_9_is_cleaned_up_by_the_next_one(tmp_path, run, capsys):
    pytest.importorskip("gguf")
    out = tmp_path / "model"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run([sys.executable, "-c", KILLED_EXPORT, str(run), str(out)], env=env)
    assert child.returncode == -signal.SIGKILL
    left = temps_of(out)
    assert len(left) == 1 and any(left[0].iterdir())  # the partial GGUF, hidden beside out
    assert not out.exists()
    assert export_main([str(run), "--format", "gguf", "--out", str(out)]) == 0
    assert temps_of(out) == [] and any(out.glob("*.gguf"))


def test_a_second_export_into_the_same_out_while_one_writes_is_refused(tmp_path, run, capsys):
    out = tmp_path / "model"
    live = temp_sibling(out)  # this process is alive: it is "writing"
    err = refused(
        capsys,
        export_main,
        [run, "--format", "hf", "--out", out],
        tmp_path,
        "another export is writing",
    )
    assert live.name in err and live.is_dir()


# -- every loader, fed random bytes, a truncated copy and an empty file --------------------------


def _good_files(folder: Path, run: Path) -> dict[str, Path]:
    """One intact file for each loader a user's file reaches."""
    from safetensors.torch import save_file

    files = {"checkpoint": run / "checkpoints" / "best.pt"}
    tok = folder / "tokenizer.json"
    bytes_tokenizer().save(tok)
    files["tokenizer"] = tok
    st = folder / "model.safetensors"
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(st))
    files["safetensors"] = st
    rows = [{"text": f"row {i} " * 20} for i in range(50)]
    (folder / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "t.json").write_text(json.dumps(rows))
    (folder / "t.csv").write_text("text\n" + "".join(f"{r['text']}\n" for r in rows))
    files.update({s: folder / f"t.{s}" for s in ("jsonl", "json", "csv")})
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [r["text"] for r in rows]}), folder / "t.parquet")
    files["parquet"] = folder / "t.parquet"
    return files


def _load(kind: str, path: Path):
    from core.data.tokenizer import Tokenizer
    from core.runs import checkpoint as ckpt
    from core.weights.loader import map_safetensors

    if kind == "checkpoint":
        return ckpt.load_model_state(path)
    if kind == "tokenizer":
        return Tokenizer.load(path)
    if kind == "safetensors":
        return {k: v.clone() for k, v in map_safetensors(path).items()}
    return list(tables.iter_records(path))


@pytest.mark.parametrize("damage", ["random", "truncated", "empty"])
def test_every_loader_refuses_damaged_files_in_one_line_naming_them(tmp_path, run, damage):
    from core.errors import UserError

    good = _good_files(tmp_path, run)
    for kind, path in good.items():
        _load(kind, path)  # the intact file loads
        bad = tmp_path / "bad" / kind / path.name
        bad.parent.mkdir(parents=True)
        raw = path.read_bytes()
        cut = {
            "random": np.random.default_rng(len(raw)).bytes(len(raw)),
            "truncated": raw[: len(raw) // 2],
            "empty": b"",
        }[damage]
        bad.write_bytes(cut)
        try:
            loaded = _load(kind, bad)
        except UserError as e:
            assert str(bad) in str(e) and "\n" not in str(e), (kind, str(e))
            continue
        # What still loads is whole data: a table cut at a row boundary, an empty table.
        assert kind in ("jsonl", "csv", "json") and isinstance(loaded, list), (kind, damage)


def test_a_disk_that_fills_during_an_export_leaves_nothing_and_says_so(
    tmp_path, run, capsys, monkeypatch
):
    import errno

    from core.use import export as export_mod

    def fill_up(fmt, loaded, folder, *rest):
        (folder / "model.safetensors").write_bytes(b"x" * 1000)  # a part, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_mod, "_write", fill_up)
    out = tmp_path / "model"
    before = tree(tmp_path)
    assert export_main([str(run), "--format", "hf", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "disk full" in err and "nothing was written" in err
    assert tree(tmp_path) == before and temps_of(out) == []


# -- messages ---------------------------------------------------------------------------------


def test_text_column_beside_a_chat_column_is_refused_not_ignored(home, capsys):
    table = home / "t.jsonl"
    table.write_text('{"body": "x", "q": "a", "a": "b"}\n' * 30)
    args = [
        *TINY,
        "--data",
        table,
        "--text-column",
        "body",
        "--prompt-column",
        "q",
        "--completion-column",
        "a",
        "--out",
        home / "r",
    ]
    refused(capsys, train_main, args, home, "text_column", "prompt_column")


def test_a_bad_chat_line_is_labelled_data_once(home, capsys):
    chat = home / "chat.jsonl"
    good = (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    )
    chat.write_text(good + "\n" + "{not json\n" + good + "\n")
    err = refused(
        capsys,
        train_main,
        [*TINY, "--data", chat, "--out", home / "r"],
        home,
        "chat.jsonl",
        "line 2",
    )
    assert err.count("data:") == 1, err


def test_resume_with_changed_data_is_refused_before_it_is_tokenized(home, capsys):
    data = home / "d"
    data.mkdir()
    (data / "a.txt").write_text(TEXT)
    assert train_main([*TINY, "--data", str(data), "--out", str(home / "r")]) == 0
    (data / "a.txt").write_text(TEXT + "one more line\n")
    (data / "b.txt").write_text(TEXT)
    args = ["--resume", home / "r", "--max-steps", "4"]
    refused(
        capsys,
        train_main,
        args,
        home,
        "data changed",
        "a.txt",
        "--allow-data-change",
        log="r/train.log",
    )


def test_the_cli_prints_the_windows_data_line_computed_in_core(home, capsys):
    from core.data.describe import data_line

    chat = home / "chat.jsonl"
    turn = (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    )
    chat.write_text((turn + "\n") * 30)
    args = [*TINY, "--seq-len", "128", "--data", str(chat), "--out", str(home / "r")]
    assert train_main(args) == 0
    out = capsys.readouterr().out
    line = data_line(tiny_config(data=str(chat), seq_len=128))
    assert line.startswith("Chat data: 30 examples") and line in out.splitlines()
    assert train_main([*TINY, "--data", str(home / "data.txt"), "--out", str(home / "t")]) == 0
    assert f"Data: {home / 'data.txt'}: 0.0 MB, used whole" in capsys.readouterr().out


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_endless_devices_are_never_read(home, capsys):
    zero = "/dev/zero"
    refused(capsys, train_main, [*TINY, "--data", zero, "--out", home / "r"], home, "data:", zero)
    args = [*TINY, "--data", home / "data.txt", "--eval-data", zero, "--out", home / "r"]
    refused(capsys, train_main, args, home, "eval_data", zero)
    refused(
        capsys,
        generate_main,
        ["no-such-run", "--prompt-file", zero],
        home,
        "--prompt-file",
        "not a file",
    )


def test_a_data_cache_that_is_a_file_is_refused_before_any_work(home, capsys):
    (home / "cachefile").write_text("mine")
    args = [
        *TINY,
        "--data",
        home / "data.txt",
        "--data-cache",
        home / "cachefile",
        "--out",
        home / "r",
    ]
    refused(capsys, train_main, args, home, "--data-cache", "not a folder")


SLOW_EXPORT = """
import sys, time
from core.use.export import export
def slow(done, total):
    if done == 1:
        print("writing", flush=True)
        time.sleep(4)
export(sys.argv[1], "gguf", sys.argv[2], progress=slow)
"""


def test_two_processes_exporting_into_one_out_one_wins_one_is_told(tmp_path, run, capsys):
    pytest.importorskip("gguf")
    out = tmp_path / "model"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(
        [sys.executable, "-c", SLOW_EXPORT, str(run), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        while (line := first.stdout.readline()) and line.strip() != "writing":
            pass  # the export's own log lines
        assert line.strip() == "writing"
        refused(
            capsys,
            export_main,
            [run, "--format", "gguf", "--out", out],
            tmp_path,
            "another export is writing",
            str(out),
        )
    finally:
        assert first.wait(timeout=120) == 0
    assert any(out.glob("*.gguf")) and temps_of(out) == []


def test_an_out_held_open_by_another_program_is_one_line(tmp_path, run, capsys, monkeypatch):
    """Windows refuses to rename onto a folder another program holds (Ollama reading a GGUF
    there): PermissionError, as raised here, becomes one line, and nothing is left."""
    from core.platform import atomic

    def held(src, dst):
        raise PermissionError(13, "Access is denied", str(dst))

    monkeypatch.setattr(atomic.os, "rename", held)
    out = tmp_path / "model"
    before = tree(tmp_path)
    assert export_main([str(run), "--format", "hf", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hold it open" in err, err
    assert tree(tmp_path) == before


def test_resume_keeps_working_in_a_run_folder_holding_the_users_notes(home, capsys):
    assert train_main([*TINY, "--data", str(home / "data.txt"), "--out", str(home / "r")]) == 0
    (home / "r" / "notes.txt").write_text("lr 3e-3 looked good")
    assert train_main(["--resume", str(home / "r"), "--max-steps", "3"]) == 0
    assert (home / "r" / "notes.txt").read_text() == "lr 3e-3 looked good"


def test_a_chat_template_that_refuses_system_messages_names_the_file_and_line(home, capsys):
    """Gemma 2's own template raises on a system message: the one line names the data file,
    the example's line, what the template said and what to do; nothing is cached."""
    from chat_templates import REAL, m
    from hf_models import make_model

    base = home / "base"
    make_model(base, "qwen2", max_position_embeddings=64)
    for f in base.glob("chat_template.j*"):
        f.unlink()
    config = base / "tokenizer_config.json"
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "chat_template": REAL["gemma2"].template})
    )
    turn = {"messages": [m("user", "2+2?"), m("assistant", "4")]}
    system = {"messages": [m("system", "Be brief."), *turn["messages"]]}
    chat = home / "chat.jsonl"
    chat.write_text("\n".join(json.dumps(r) for r in [turn] * 3 + [system] + [turn] * 4) + "\n")
    args = [
        "--data",
        chat,
        "--out",
        home / "r",
        "--device",
        "cpu",
        "--max-steps",
        "1",
        "--seq-len",
        "64",
        "--batch-size",
        "2",
        "--grad-accum",
        "1",
        "--precision",
        "fp32",
        "--sample-tokens",
        "0",
        "--init-from",
        base,
    ]
    refused(
        capsys,
        train_main,
        args,
        home,
        f"{chat} line 4",
        "System role not supported",
        "no system message",
        bar="rendering chat",
    )


def _same_size_edit(path: Path) -> None:
    """path's text changed without changing its size, its time moved on."""
    old = path.read_text()
    new = old.replace("add", "sub")
    assert len(new) == len(old) and new != old
    path.write_text(new)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_resume_with_data_edited_to_the_same_size_is_refused_before_it_is_tokenized(home, capsys):
    data = home / "d"
    data.mkdir()
    (data / "a.txt").write_text(TEXT)
    assert train_main([*TINY, "--data", str(data), "--out", str(home / "r")]) == 0
    _same_size_edit(data / "a.txt")
    args = ["--resume", home / "r", "--max-steps", "4"]
    # the tree unchanged: no new cache entry, the edited file never tokenized
    refused(
        capsys,
        train_main,
        args,
        home,
        "data changed",
        "a.txt",
        "--allow-data-change",
        log="r/train.log",
    )


def test_resume_with_data_only_touched_goes_on(home, capsys):
    assert train_main([*TINY, "--data", str(home / "data.txt"), "--out", str(home / "r")]) == 0
    st = (home / "data.txt").stat()
    os.utime(home / "data.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert train_main(["--resume", str(home / "r"), "--max-steps", "4"]) == 0, capsys.readouterr()
    assert "data changed" not in (home / "r" / "train.log").read_text()


def test_a_listing_kept_before_hashes_tells_only_sizes(tmp_path):
    """A checkpoint whose cache entry kept no content hashes: a same-size file with a new
    time is left to the tokens to judge, as before."""
    from core.data.sources import content_hash, sure_changes

    f = tmp_path / "a.txt"
    f.write_text("abc")
    old = {"path": str(f), "size": 3, "mtime_ns": 1}
    new = {**old, "mtime_ns": 2}
    assert sure_changes([old], [new]) == []
    assert sure_changes([{**old, "blake2b": content_hash(f)}], [new]) == []
    assert sure_changes([{**old, "blake2b": "0" * 32}], [new]) == [f"modified {f}"]


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--method", "dpo", "--base-bits", "4"], ("base_bits", "lora_rank")),
        (["--base-bits", "8", "--lora-alpha", "16"], ("base_bits", "lora_rank")),
        (["--hidden-dim", "0"], ("hidden_dim",)),
        (
            ["--method", "grpo", "--reward", "missing.py:score", "--max-completion-tokens", "8"],
            ("reward", "missing.py"),
        ),
        (["--method", "grpo", "--reward", "regex"], ("reward: regex needs", "--reward-regex")),
    ],
)
def test_init_from_a_run_refuses_what_the_flags_decide_before_writing_its_start_model(
    home, capsys, run, flags, needles
):
    (home / "pairs.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n' * 20)
    (home / "prompts.jsonl").write_text('{"prompt": "1 + 1 ="}\n' * 20)
    data = home / ("prompts.jsonl" if "grpo" in flags else "pairs.jsonl")
    args = [*TINY, *flags, "--init-from", run, "--data", data]
    refused(capsys, train_main, [*args, "--out", home / "r"], home, *needles)
    assert not (home / "cache").exists()  # no start model written, no data prepared
