"""Every command in README.md runs as shown: the shell commands of its code blocks (but those
on the skip list below, each with its reason) run in order in a temporary folder that holds
what a reader would have at that point (a trained digits run, a digit image, a few arrays),
and the Python block runs after them. A failure names the command and shows its output."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

# first words that make a code-block line a shell command (other lines are TOML, diagrams...)
COMMANDS = {"pocket", "pip", "head", "scp", "python", "cat", "ls", "tensorboard"}
SKIP = {  # command prefix -> why the test does not run it
    "pocket train": "trains for minutes or downloads a dataset (tests/train and tests/e2e train "
                    "for real; the digits run here comes from the suite's digits_ckpt fixture)",
    "pip install": "needs the network; tests/test_wheel.py installs the wheel with [images] in a "
                   "fresh venv",
    "scp ": "copies to another machine",
    "./scripts/": "sets up .venv and runs the whole main job / test suite",
    "python bench/": "benchmarks run for minutes",
    "python scripts/arm64_check.py": "builds the ARM check's models, then verified under emulation "
                                     "(minutes; by hand, see the README's ARM section)",
    "tensorboard": "starts a server that does not exit",
}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """[(language, body)]: fenced blocks with their language, indented blocks as 'sh'."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^```(\w*)", line)
        if fence:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            blocks.append((fence.group(1) or "sh", "\n".join(lines[i + 1:j])))
            i = j + 1
            continue
        if line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            blocks.append(("sh", "\n".join(x[4:] for x in lines[i:j]).strip("\n")))
            i = j
            continue
        i += 1
    return blocks


def shell_commands(text: str) -> list[str]:
    out = []
    for lang, body in code_blocks(text):
        if lang not in ("sh", "bash", "console", "shell"):
            continue
        rows = body.replace("\\\n", " ").splitlines()
        prompted = [r[2:] for r in rows if r.startswith("$ ")]
        for r in prompted or rows:
            r = r.strip()
            if r and (r.split()[0] in COMMANDS or r.startswith("./scripts/")):
                out.append(r)
    return out


def python_blocks(text: str) -> list[str]:
    return [body for lang, body in code_blocks(text) if lang == "python"]


# an all-caps word that is not an environment variable being set: CONFIG, RUN/last.ckpt, ...
PLACEHOLDER = re.compile(r"(?<![\w$=-])[A-Z][A-Z_]{2,}(?![\w=])")


def skip_reason(command: str) -> str | None:
    why = next((why for prefix, why in SKIP.items() if command.startswith(prefix)), None)
    if why is None and PLACEHOLDER.search(command.split("#")[0]):
        why = "has a placeholder to fill in (an all-caps word), not a command to run as is"
    return why


def test_the_extractor_finds_the_readme_commands():
    cmds = shell_commands(README.read_text())
    assert "pocket infer model.int8.bin digit.png         # -> digit.png: 7 (0.98)" in cmds
    assert any(c.startswith("pocket compare") for c in cmds)
    assert any(c.startswith("pocket train examples/digits_cnn.toml --memory-budget") for c in cmds)
    assert not any(c.startswith(("[model]", "layers", "memory plan", "pocket/")) for c in cmds)
    assert python_blocks(README.read_text())
    assert skip_reason("pocket plot RUN") and skip_reason("pocket train CONFIG --resume RUN/last.ckpt")
    assert not skip_reason("POCKET_DEBUG=1 pocket infer model.bin x.npy --bench 200  # LOUD")


def _digits_folder(root: Path, ckpt: str) -> Path:
    from PIL import Image
    from sklearn.datasets import load_digits

    from pocket.train.data import load_dataset

    d = root / "digits"
    shutil.copytree(Path(ckpt).parent, d / "runs" / "digits_cnn")
    images = load_digits().images
    for i, name in enumerate(["digit.png", "photos/a.png", "photos/b.png", "photos/c.png"]):
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.round(images[i] * 255 / 16).astype(np.uint8)).save(d / name)
    np.save(d / "x.npy", load_dataset("digits", seed=0).test.x[:32])
    return d


def _table_folder(root: Path) -> Path:
    from pocket.export.app import export
    from pocket.train.run import train_from_config

    d = root / "table"
    d.mkdir()
    csv = REPO / "examples" / "data" / "diabetes.csv"
    r = train_from_config(str(REPO / "examples" / "tabular_regression.toml"),
                          {"out": str(d / "run"), "epochs": 1, "data": f"csv:{csv}"}, quiet=True)
    export(r["best_checkpoint"], str(d / "model.int8.bin"), int8=True)
    (d / "rows.csv").write_text("".join(csv.read_text().splitlines(keepends=True)[:6]))
    return d


def _env(root: Path) -> dict:
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "pocket"  # `pocket` as this checkout's code, whatever is installed
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pocket.cli "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("POCKET_DEBUG", "POCKET_DEVICE"):
        env.pop(k, None)
    return env


@pytest.mark.slow
def test_every_readme_command_runs_as_shown(digits_ckpt, tmp_path):
    pytest.importorskip("PIL")
    pytest.importorskip("onnxruntime")
    text = README.read_text()
    digits = _digits_folder(tmp_path, digits_ckpt)
    table = None
    env = _env(tmp_path)
    failures, ran, skipped = [], [], []
    for cmd in shell_commands(text):
        why = skip_reason(cmd)
        if why:
            skipped.append((cmd, why))
            continue
        if "rows.csv" in cmd:  # the tabular example needs a tabular model of that name
            table = table or _table_folder(tmp_path)
        cwd = table if "rows.csv" in cmd else digits
        t = time.perf_counter()
        r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=300)
        took = time.perf_counter() - t
        ran.append((cmd, took))
        # NOTE: no wall-clock bound: one int8 export took 70 s in a full parallel run on two
        # busy cores; they take 2-4 s each when this test runs alone (85 s for 24, load ~6)
        if r.returncode != 0:
            failures.append(f"$ {cmd}\n(exit {r.returncode}, {took:.1f} s)\n{r.stdout[-2000:]}"
                            f"{r.stderr[-2000:]}")
    for code in python_blocks(text):
        r = subprocess.run([sys.executable, "-c", code], cwd=digits, env=env, capture_output=True,
                           text=True, timeout=300)
        ran.append(("python block", 0.0))
        if r.returncode != 0:
            failures.append(f"README python block:\n{code}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    assert len(ran) >= 15, ran
    by_time = sorted(ran, key=lambda r: -r[1])[:3]
    slowest = ", ".join(f"{c.split('#')[0].strip()} {t:.1f} s" for c, t in by_time)
    assert not failures, "\n\n".join(failures) + f"\n\nslowest: {slowest}"
