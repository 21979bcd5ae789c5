import dataclasses

import pytest

from core.config import presets
from core.config.spec import TrainConfig, compare_for_resume, from_dict, validate
from core.errors import ConfigError


@pytest.fixture(autouse=True)
def user_config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("batch_size", 0, "batch_size: expected an integer from 1 to 65536, got 0"),
        ("lr", "fast", "lr: expected a number from 1e-08 to 1.0"),
        ("n_layers", 2.5, "n_layers: expected an integer"),
        ("precision", "fp8", "precision: expected one of auto, bf16, fp16, fp32"),
        ("device", "gpu", "device: expected auto, cpu, cuda or cuda:N"),
        ("compile", "yes", "compile: expected true or false"),
    ],
)
def test_bad_values_name_the_field_and_the_allowed_range(field, value, expected):
    with pytest.raises(
        ConfigError, match="^" + expected.replace("(", r"\(").replace(".", r"\.")
    ) as e:
        validate(TrainConfig(**{field: value}))
    assert e.value.field == field  # what the window flags, whatever the wording


@pytest.mark.parametrize(
    "values, field",
    [
        ({"hidden_dim": 100, "n_heads": 3}, "hidden_dim"),
        ({"max_steps": None}, "max_steps"),
        ({"method": "dpo"}, "method"),
        ({"lora_alpha": 8.0}, "lora_alpha"),
        ({"base_bits": "4"}, "base_bits"),
    ],
)
def test_cross_field_checks_carry_the_field_they_blame(values, field):
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig(**values))
    assert e.value.field == field


def test_heads_must_divide_hidden_dim():
    with pytest.raises(ConfigError, match=r"hidden_dim: 100 must be divisible by n_heads \(3\)"):
        validate(TrainConfig(hidden_dim=100, n_heads=3))


def test_values_from_yaml_or_forms_are_coerced():
    cfg = validate(TrainConfig(batch_size="16", lr="0.001", data="", data_extensions="txt, .md"))
    assert cfg.batch_size == 16 and cfg.lr == 0.001
    assert cfg.data is None
    assert cfg.data_extensions == [".txt", ".md"]


def test_unknown_field_is_named():
    with pytest.raises(ConfigError, match="my.yaml: unknown field 'hidden'"):
        from_dict({"hidden": 3}, source="my.yaml")


def test_builtin_presets_have_the_documented_values():
    by_name = {p.name: presets.to_config(p) for p in presets.list_presets()}
    assert {"cpu-tiny", "cpu", "gpu-small", "gpu", "gpu-large", "gpu-80gb"} <= set(by_name)
    cpu = by_name["cpu"]
    assert (cpu.batch_size, cpu.hidden_dim, cpu.n_layers, cpu.grad_accum, cpu.precision) == (
        4,
        512,
        6,
        8,
        "fp32",
    )
    small = by_name["gpu-small"]
    assert (small.batch_size, small.hidden_dim, small.n_layers) == (8, 128, 2)
    gpu = by_name["gpu"]
    assert (gpu.batch_size, gpu.hidden_dim, gpu.n_layers, gpu.grad_accum) == (16, 256, 3, 2)
    assert gpu.precision == "auto"  # mixed precision on CUDA
    large = by_name["gpu-large"]
    assert (large.batch_size, large.hidden_dim, large.n_layers) == (32, 512, 6)
    assert by_name["cpu-tiny"].max_steps == 50


def test_broken_presets_name_the_file_and_the_field(tmp_path):
    bad_yaml = tmp_path / "broken.yaml"
    bad_yaml.write_text("batch_size: [1,\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: not valid YAML at line"):
        presets.load_preset(str(bad_yaml))
    bad_value = tmp_path / "bad.yaml"
    bad_value.write_text("batch_size: -4\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: batch_size: expected an integer from 1"):
        presets.load_preset(str(bad_value))
    with pytest.raises(ConfigError, match="unknown preset 'nope'; available: cpu-tiny"):
        presets.load_preset("nope")


def test_user_preset_round_trips_every_field():
    cfg = validate(TrainConfig(hidden_dim=96, n_heads=3, lr=0.0007, grad_checkpointing=True))
    path = presets.save_user_preset("mine", cfg, "my settings")
    loaded = presets.load_preset("mine")
    assert not loaded.builtin and loaded.description == "my settings"
    assert path.parent == presets.user_dir()
    again = presets.to_config(loaded)
    assert dataclasses.replace(again, preset=None) == dataclasses.replace(cfg, preset=None)
    assert "mine" in [p.name for p in presets.list_presets()]


def test_user_preset_cannot_shadow_a_builtin_or_use_odd_names():
    with pytest.raises(ConfigError, match="built-in"):
        presets.save_user_preset("gpu", TrainConfig())
    with pytest.raises(ConfigError, match="preset name"):
        presets.save_user_preset("../evil", TrainConfig())


def test_a_broken_user_preset_does_not_hide_the_others():
    presets.user_dir().mkdir(parents=True)
    (presets.user_dir() / "bad.yaml").write_text("n_layers: zero\n")
    names = [p.name for p in presets.list_presets()]
    assert "cpu-tiny" in names and "bad" not in names


def test_resume_comparison_refuses_architecture_and_allows_schedule_changes():
    saved = validate(TrainConfig())
    refused, allowed = compare_for_resume(
        saved, dataclasses.replace(saved, hidden_dim=256, max_steps=900, eval_every=7)
    )
    assert refused == ["hidden_dim 128 -> 256 (architecture)"]
    assert "max_steps 500 -> 900" in allowed and "eval_every 100 -> 7" in allowed
    same_effective = dataclasses.replace(saved, batch_size=4, grad_accum=2)
    assert compare_for_resume(saved, same_effective)[0] == []
    other_effective = dataclasses.replace(saved, batch_size=4)
    assert "effective batch changes" in compare_for_resume(saved, other_effective)[0][0]
    assert "data stream" in compare_for_resume(saved, dataclasses.replace(saved, seed=1))[0][0]


def test_a_config_saved_before_versions_keeps_its_meaning():
    """Version 1 mappings (no config_version) trained with biases and betas (0.9, 0.95)."""
    old = {"hidden_dim": 64, "n_heads": 4, "max_steps": 10}
    base = TrainConfig(bias=False, beta1=0.8, beta2=0.99)  # later defaults must not leak in
    cfg = from_dict(old, base, source="old.yaml")
    assert (cfg.bias, cfg.beta1, cfg.beta2) == (True, 0.9, 0.95)
    saved = TrainConfig(bias=False).to_dict()
    assert saved["config_version"] >= 2
    assert from_dict(saved, base).bias is False  # a current mapping is taken as written


def test_a_saved_compile_false_becomes_the_new_default_which_compiles_on_a_gpu():
    """Version 3's compile false was its default: version 4's unset (on a GPU, not the CPU)."""
    assert TrainConfig().compile is None
    assert from_dict({"compile": False, "config_version": 3}).compile is None
    assert from_dict({"compile": True, "config_version": 3}).compile is True
    assert from_dict({"compile": False, "config_version": 4}).compile is False  # as written
    assert validate(TrainConfig(compile=None)).compile is None
    with pytest.raises(ConfigError, match=r"compile_mode: expected one of default, "):
        validate(TrainConfig(compile_mode="fast"))


def test_a_config_from_a_newer_traindeck_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"^new\.yaml: config_version 99 is newer"):
        from_dict({"config_version": 99}, source="new.yaml")
    with pytest.raises(ConfigError, match=r"config_version: expected a whole number"):
        from_dict({"config_version": "two"}, source="x.yaml")


def test_user_presets_carry_the_config_version(tmp_path):
    path = presets.save_user_preset("mine", TrainConfig(bias=False, max_steps=7))
    assert "config_version: " in path.read_text()
    cfg = presets.to_config(presets.load_preset("mine"))
    assert cfg.bias is False and cfg.max_steps == 7


def test_every_field_is_declared_once_and_reaches_the_cli():
    """The CLI flags, ranges and bool/choice handling all come from the field declarations."""
    from core.cli.train import _overrides, build_parser
    from core.config.spec import KINDS, LIMITS, SPECS

    parser = build_parser()
    flags = {o for a in parser._actions for o in a.option_strings}
    for name, spec in SPECS.items():
        if not spec.cli:
            continue
        flag = "--" + name.replace("_", "-")
        if KINDS[name] is bool and getattr(TrainConfig(), name):
            flag = "--no-" + flag[2:]
        assert flag in flags, name
        if name in LIMITS:
            assert (LIMITS[name][1], LIMITS[name][2]) == (spec.low, spec.high)
    args = parser.parse_args(["--min-lr-ratio", "0.2", "--no-bias", "--compile"])
    assert _overrides(args) == {"min_lr_ratio": 0.2, "bias": False, "compile": True}
    assert _overrides(parser.parse_args(["--no-compile"])) == {"compile": False}
    assert "compile" not in _overrides(parser.parse_args([]))  # unset: decided by the device
