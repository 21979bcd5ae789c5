"""Hardware presets: YAML files of config values, built-in or saved by the user."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import yaml

from core.config.spec import TrainConfig, from_dict, validate
from core.errors import ConfigError
from core.platform.atomic import write_text

BUILTIN_DIR = Path(__file__).resolve().parents[2] / "presets"
META_KEYS = ("description", "hardware")  # plus min_vram_gb: GPU presets only, tier_gb


def user_dir() -> Path:
    return Path(platformdirs.user_config_dir("TrainDeck", appauthor=False)) / "presets"


@dataclass
class Preset:
    name: str
    path: Path
    builtin: bool
    description: str
    hardware: str
    values: dict
    min_vram_gb: float | None = None  # None: a CPU preset
    tier_gb: int | None = None  # a VRAM tier preset (core.training.tiers): the card's GB

    @property
    def for_gpu(self) -> bool:
        return self.min_vram_gb is not None


def _read(path: Path, builtin: bool) -> Preset:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read preset ({e.strerror})") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        raise ConfigError(f"{path}: not valid YAML{line}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a preset must be a mapping of field: value")
    meta = {k: str(data.pop(k, "") or "") for k in META_KEYS}
    vram = data.pop("min_vram_gb", None)
    if vram is not None and (isinstance(vram, bool) or not isinstance(vram, (int, float))):
        raise ConfigError(f"{path}: min_vram_gb: expected a number of GB, got {vram!r}")
    tier = data.pop("tier_gb", None)
    if tier is not None and (isinstance(tier, bool) or not isinstance(tier, int) or tier < 1):
        raise ConfigError(f"{path}: tier_gb: expected a whole number of GB, got {tier!r}")
    preset = Preset(
        path.stem, path, builtin, meta["description"], meta["hardware"], data, vram, tier
    )
    to_config(preset)  # validate now so a bad file is named when it is listed
    return preset


def to_config(preset: Preset, base: TrainConfig | None = None) -> TrainConfig:
    try:
        cfg = from_dict(preset.values, base, source=str(preset.path))
        cfg.preset = preset.name
        return validate(cfg)
    except ConfigError as e:
        msg = str(e)
        if not msg.startswith(str(preset.path)):
            msg = f"{preset.path}: {msg}"
        raise ConfigError(msg) from None


def _natural(path: Path) -> list:
    """gpu-8gb before gpu-12gb: numbers in a name compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]


def list_presets() -> list[Preset]:
    """Built-in presets, then user presets. A broken user file is skipped, not fatal."""
    found = [_read(p, True) for p in sorted(BUILTIN_DIR.glob("*.yaml"), key=_natural)]
    names = {p.name for p in found}
    udir = user_dir()
    if udir.is_dir():
        for p in sorted(udir.glob("*.yaml")):
            if p.stem in names:
                continue
            try:
                found.append(_read(p, False))
            except ConfigError:
                continue
    return found


def load_preset(name_or_path: str) -> Preset:
    """A built-in or user preset by name, or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"preset: file {path} not found", field="preset")
        return _read(path, False)
    for folder, builtin in ((BUILTIN_DIR, True), (user_dir(), False)):
        candidate = folder / f"{name_or_path}.yaml"
        if candidate.is_file():
            return _read(candidate, builtin)
    names = ", ".join(p.name for p in list_presets())
    raise ConfigError(
        f"preset: unknown preset {name_or_path!r}; available: {names}", field="preset"
    )


def save_user_preset(name: str, cfg: TrainConfig, description: str = "") -> Path:
    """Write the config's trainable values as a user preset; built-in names are refused."""
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ConfigError(f"preset name: use letters, digits, - and _ only, got {name!r}")
    if (BUILTIN_DIR / f"{name}.yaml").exists():
        raise ConfigError(f"preset name: {name!r} is a built-in preset; choose another name")
    values = validate(cfg).to_dict()
    for key in ("preset", "data", "device"):
        values.pop(key, None)
    folder = user_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    body = {"description": description or f"User preset {name}", **values}
    write_text(path, yaml.safe_dump(body, sort_keys=False))
    return path
