"""Before Qt starts on Linux: can its xcb platform plugin load? If not, say what to install.

Without libxcb-cursor0 and friends (minimal Ubuntu, WSL) Qt aborts with several lines about
"could not load the Qt platform plugin xcb"; one apt line fixes it, so print that line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# library file -> Debian/Ubuntu package
PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb-xinput.so.0": "libxcb-xinput0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libxcb.so.1": "libxcb1",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libdbus-1.so.3": "libdbus-1-3",
}


def xcb_plugin() -> Path | None:
    try:
        import PySide6
    except ImportError:
        return None
    path = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return path if path.is_file() else None


def ldd_missing(library: Path) -> list[str]:
    """Shared libraries that `ldd` reports as not found (nothing when ldd is absent)."""
    if shutil.which("ldd") is None:
        return []
    try:
        out = subprocess.run(
            ["ldd", str(library)], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return re.findall(r"^\s*(\S+) => not found", out, flags=re.M)


def uses_xcb() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.startswith("xcb")
    return bool(os.environ.get("DISPLAY")) and not os.environ.get("WAYLAND_DISPLAY")


def xcb_problem(find_missing=ldd_missing) -> str | None:
    """One line naming the missing libraries and the apt command, or None if xcb can load."""
    if not uses_xcb():
        return None
    plugin = xcb_plugin()
    if plugin is None:
        return None
    # ldd names a library once per library that needs it: list each (and its package) once
    missing = sorted(set(find_missing(plugin)))
    if not missing:
        return None
    packages = sorted({PACKAGES.get(lib, lib) for lib in missing})
    return (
        f"error: the window cannot start: Qt's xcb platform plugin is missing "
        f"{', '.join(missing)}; install with: sudo apt install {' '.join(packages)} "
        "(or train headless: ./train_gpu.sh --preset cpu-tiny --max-steps 200)"
    )
