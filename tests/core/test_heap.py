"""The C heap setting (core.platform.heap): after it, freed large tensors go back to the
system; without it glibc keeps them once a large free has raised its mmap threshold."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
import torch
from core.platform import heap

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

if sys.argv[1] == "fixed":
    assert heap.return_large_frees()
big = torch.ones(4 * 2**20)
del big  # 16 MB freed: glibc raises its threshold past the next tensors
before = rss_mb()
kept, small = [torch.ones(2**20) for _ in range(50)], []  # 50 x 4 MB
for t in kept:
    small.append(torch.ones(25_000))  # 100 kB after each: blocks a step leaves behind
del kept
print(rss_mb() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_large_tensors_go_back_to_the_system():
    def held(mode: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
        )
        return float(out.stdout.split()[-1])

    assert held("default") > 150  # of the 200 MB freed
    assert held("fixed") < 20


def test_a_run_keeps_the_lean_heap_only_where_memory_is_tight(monkeypatch):
    """The fixed threshold costs a page fault per fresh page (30-45% of a CPU fine-tune's
    step): taken where ROOM (3) x the estimated peak would not fit the room, or when asked. The
    fast heap held up to 2.24x the estimate (docs/performance.md): 3x leaves it room."""
    from core.errors import ConfigError
    from core.platform import heap

    assert heap.ROOM >= heap.FAST_HOLDS
    eight = heap.Room(8 * 2**30, "free")
    monkeypatch.delenv("TRAINDECK_HEAP", raising=False)
    fast = heap.choose(2 * 2**30, eight)  # room: glibc's own (fast) heap
    assert not fast.lean and fast.why == "3 x the 2.00 GiB estimated peak fits the 8.0 GiB free"
    tight = heap.choose(3 * 2**30, eight)  # three times the peak would not fit: lean
    assert tight.lean and tight.why.startswith("memory is tight: 3 x the 3.00 GiB")
    assert heap.choose(None, eight).lean  # no estimate: lean
    monkeypatch.setenv("TRAINDECK_HEAP", "lean")
    assert heap.choose(1, eight) == heap.Choice(True, "TRAINDECK_HEAP=lean")
    monkeypatch.setenv("TRAINDECK_HEAP", "fast")
    assert not heap.choose(7 * 2**30, eight).lean
    monkeypatch.setenv("TRAINDECK_HEAP", "small")
    with pytest.raises(ConfigError, match="TRAINDECK_HEAP: expected one of auto, lean, fast"):
        heap.choose(1, eight)
    from helpers import tiny_config

    from core.training.planner import heap_line

    # the window's Details and --estimate name the bad value instead of failing
    assert "TRAINDECK_HEAP: expected one of auto" in heap_line(tiny_config(), eight)


GIB = 2**30


def fake_cgroup(tmp_path, membership: str, groups: dict) -> tuple:
    """A cgroup file system under tmp_path: groups maps a folder to its files' contents."""
    for folder, files in groups.items():
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (tmp_path / folder / name).write_text(text)
    (tmp_path / "self-cgroup").write_text(membership)
    return tmp_path, tmp_path / "self-cgroup"


def test_the_room_is_what_the_processs_cgroup_still_allows(tmp_path):
    """cgroup v2: the tightest memory.max over the process's group and those above it, less
    what that group uses (its droppable page cache not counted); v1: memory.limit_in_bytes."""
    from core.platform import heap

    v2 = {
        ".": {"cgroup.controllers": "memory"},  # the root sets no limit
        "job": {"memory.max": str(3 * GIB), "memory.current": str(GIB)},
        "job/step": {"memory.max": "max", "memory.current": str(GIB // 2)},
    }
    v2["job"]["memory.stat"] = f"anon {GIB // 2}\ninactive_file {GIB // 2}\n"
    root, me = fake_cgroup(tmp_path / "v2", "0::/job/step\n", v2)
    got = heap.cgroup_room(root, me)
    assert got.bytes == 3 * GIB - GIB // 2  # the limit less anon memory, not the cache
    assert "3.0 GiB memory limit of cgroup /job (memory.max)" in got.source
    assert heap.room(root, me) == got  # under the machine's free memory here
    nothing = {".": {"cgroup.controllers": "memory"}, "job": {"memory.max": "max"}}
    assert heap.cgroup_room(*fake_cgroup(tmp_path / "none", "0::/job\n", nothing)) is None
    free = heap.room(tmp_path / "none", tmp_path / "none" / "self-cgroup")
    assert free.source == "free" and free.bytes > 0
    # v1 (and a container that mounts its own group as the root: the host's path is not there)
    v1 = {"memory": {"memory.limit_in_bytes": str(2 * GIB), "memory.usage_in_bytes": "0"}}
    root, me = fake_cgroup(tmp_path / "v1", "5:cpu:/\n4:memory:/docker/abc\n", v1)
    got = heap.cgroup_room(root, me)
    assert got.bytes == 2 * GIB and "(memory.limit_in_bytes)" in got.source
    unlimited = {"memory": {"memory.limit_in_bytes": "9223372036854771712"}}
    assert heap.cgroup_room(*fake_cgroup(tmp_path / "u", "4:memory:/\n", unlimited)) is None


def test_a_run_under_a_cgroup_limit_below_twice_its_estimate_keeps_the_lean_heap(
    tmp_path, monkeypatch
):
    from helpers import tiny_config

    from core.platform import heap
    from core.training.estimate import estimate
    from core.training.trainer import Trainer

    cfg = tiny_config(max_steps=1, eval_every=10**9, ckpt_every=10**9, sample_tokens=0)
    peak = estimate(cfg, on_gpu=False).device_total
    monkeypatch.delenv("TRAINDECK_HEAP", raising=False)
    set_lean = []  # the test process keeps its heap: the setting is recorded, not made
    monkeypatch.setattr(heap, "return_large_frees", lambda: set_lean.append(True))
    logs = {}
    for name, limit in (("tight", int(1.9 * peak)), ("roomy", 4 * peak)):  # under twice; over
        files = {"memory.max": str(limit), "memory.current": "0"}
        root, me = fake_cgroup(tmp_path / name, "0::/run\n", {"run": files})
        monkeypatch.setattr(heap, "CGROUP_ROOT", root)
        monkeypatch.setattr(heap, "PROC_CGROUP", me)
        Trainer(cfg, tmp_path / name / "out").run()
        logs[name] = (tmp_path / name / "out" / "train.log").read_text()
        if name == "tight":
            assert set_lean == [True]
    assert set_lean == [True]  # the roomy run kept glibc's own heap
    why = f"memory is tight: 3 x the {peak / GIB:.2f} GiB estimated peak is over the"
    assert "the lean C heap (less memory, steps up to 45% slower): " + why in logs["tight"]
    assert "memory limit of cgroup /run (memory.max)" in logs["tight"]
    assert "the fast C heap: 3 x the" in logs["roomy"] and "cgroup /run" in logs["roomy"]
