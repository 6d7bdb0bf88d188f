"""Training config: flags over the TOML file over DEFAULTS, every key typed and checked, and
memory sizes read exactly."""

from __future__ import annotations

import pytest

from pocket.train.config import DEFAULTS, ConfigError, format_size, load_config, merge, parse_size


def _toml(tmp_path, text: str, name: str = "exp.toml"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_flags_beat_the_file_and_the_file_beats_defaults(tmp_path):
    p = _toml(tmp_path, '[train]\nepochs = 5\nlr = 0.01\n[data]\nsource = "npz:a.npz"\n'
                        '[memory]\nbudget = "2GiB"\n')
    cfg = load_config(p, {"epochs": 7, "data": "csv:b.csv", "memory_budget": "1GB",
                          "batch_size": None, "seed": 4})
    assert cfg["train"]["epochs"] == 7            # flag over file
    assert cfg["data"]["source"] == "csv:b.csv"    # flag over file
    assert cfg["memory"]["budget"] == "1GB"        # flag over file
    assert cfg["train"]["lr"] == 0.01              # file over default
    assert cfg["train"]["batch_size"] == DEFAULTS["train"]["batch_size"]  # None flag: no change
    assert cfg["run"]["seed"] == 4                 # flag over default
    assert cfg["train"]["optimizer"] == DEFAULTS["train"]["optimizer"]
    assert cfg["run"]["name"] == "exp"             # from the file name
    assert set(cfg) == set(DEFAULTS)
    assert all(set(cfg[s]) == set(DEFAULTS[s]) for s in DEFAULTS)


def test_defaults_are_never_mutated(tmp_path):
    a = load_config(None)
    a["data"]["augment"].append("flip")
    a["train"]["betas"][0] = 0.5
    b = load_config(None)
    assert b["data"]["augment"] == [] and b["train"]["betas"] == [0.9, 0.999]
    assert DEFAULTS["data"]["augment"] == []
    assert b["run"]["name"] == "run"


def test_ints_widen_to_floats_but_not_the_other_way(tmp_path):
    cfg = load_config(_toml(tmp_path, "[train]\nlr = 1\nweight_decay = 0\n"))
    assert cfg["train"]["lr"] == 1.0 and isinstance(cfg["train"]["lr"], float)
    with pytest.raises(ConfigError, match=r"\[train\] epochs must be an int, got 2.5"):
        load_config(_toml(tmp_path, "[train]\nepochs = 2.5\n"))


@pytest.mark.parametrize("text, words", [
    ('[train]\nepochs = "ten"\n', ["[train] epochs", "int", "'ten'"]),
    ("[train]\nepochs = true\n", ["[train] epochs", "int", "True"]),
    ("[train]\nlr = \"fast\"\n", ["[train] lr", "float"]),
    ("[model]\nbatchnorm = 1\n", ["[model] batchnorm", "bool"]),
    ("[data]\nsource = 5\n", ["[data] source", "str"]),
    ('[data]\naugment = "flip"\n', ["[data] augment", "list"]),
    ("[train]\nepocs = 3\n", ["unknown key 'epocs'", "[train]", "did you mean 'epochs'"]),
    ("[trian]\nepochs = 3\n", ["unknown section [trian]", "did you mean 'train'"]),
    ("train = 3\n", ["[train] must be a table"]),
    ('[train]\noptimizer = "adamm"\n', ["optimizer", "'adamm'", "sgd, adam, adamw"]),
    ('[train]\nschedule = "linear"\n', ["schedule", "cosine, step, constant"]),
    ('[train]\nloss = "hinge"\n', ["loss", "cross_entropy, mse, l1, huber"]),
    ('[memory]\nprecision = "fp8"\n', ["precision", "fp32, fp16"]),
    ('[data]\ntask = "ranking"\n', ["task", "classification, regression"]),
    ("[train]\nepochs = 0\n", ["epochs must be at least 1"]),
    ("[memory]\naccumulation = 0\n", ["accumulation must be at least 1"]),
    ("[train]\nlr = -0.1\n", ["lr must be positive"]),
    ("[train]\nbatch_size = 30\n[memory]\naccumulation = 4\n", ["batch_size 30", "multiple",
                                                                "accumulation 4"]),
    ('[memory]\nbudget = "4 lightyears"\n', ["[memory] budget", "'4 lightyears'", "4GiB"]),
    ("[train]\neval_batch_size = 0\n", ["eval_batch_size must be at least 1"]),
    ('[train]\nschedule = "step"\nstep_size = 0\n', ["step_size must be at least 1"]),
    ("[run]\nseed = -1\n", ["seed must not be negative"]),
    ("[train]\nwarmup_epochs = -1\n", ["warmup_epochs must not be negative"]),
    ("[train]\nclip_grad_norm = 0\n", ["clip_grad_norm must be positive"]),
    ("[train]\nlabel_smoothing = 1.5\n", ["label_smoothing must be in [0, 1)"]),
    ("[train]\nbetas = [0.9]\n", ["betas must be two numbers"]),
    ('[train]\noptimizer = "sgd"\nnesterov = true\nmomentum = 0\n', ["nesterov", "momentum"]),
    ("[memory]\nloss_scale = 0\n", ["loss_scale must be positive"]),
])
def test_file_values_are_checked(tmp_path, text, words):
    with pytest.raises(ConfigError) as e:
        load_config(_toml(tmp_path, text))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(str(tmp_path / "exp.toml"))
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("overrides, words", [
    ({"epochs": "3"}, ["flags", "[train] epochs", "int"]),
    ({"precision": "fp8"}, ["flags", "precision"]),
    ({"memory_budget": "lots"}, ["'lots'"]),
    ({"epoch": 3}, ["unknown option 'epoch'", "did you mean 'epochs'"]),
])
def test_flag_values_are_checked(overrides, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_toml(tmp_path, "[train\n"))
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[run]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_merge_fills_every_default():
    cfg = merge({"model": {"name": "mlp"}})
    assert cfg["model"]["name"] == "mlp"
    assert cfg["train"] == DEFAULTS["train"]


@pytest.mark.parametrize("text, expected", [
    ("4GiB", 4 * 1024**3),
    ("512MB", 512 * 1000**2),
    ("512MiB", 512 * 1024**2),
    ("1.5G", 1_500_000_000),
    ("1.5GiB", 1_610_612_736),
    ("8.2MB", 8_200_000),          # 8.2 * 10**6 in binary floating point is 8199999.99...
    ("2kb", 2000),
    (" 3 KiB ", 3072),
    (".5KiB", 512),
    ("1T", 10**12),
    ("1TiB", 2**40),
    ("1000", 1000),
    ("64B", 64),
    (1_000_000, 1_000_000),
    (1, 1),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["4 lightyears", "", "GiB", "-1GB", "0", "0MB", 0, -5,
                                  "4 G i B", "1e9", "4GiB4", "0.0001B"])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError):
        parse_size(text)


def test_format_size():
    assert format_size(512) == "512 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(4 * 1024**3) == "4.0 GiB"
