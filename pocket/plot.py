"""`pocket plot RUN`: one PNG of a run's curves per epoch, from RUN/metrics.jsonl.

Four panels, always in this order so a reader (or a test) knows what it is looking at: loss
(training and validation), metrics (accuracy, or R² for regression; MAE/RMSE without R²),
learning rate, and peak tracked memory. matplotlib is imported here only, and only its Agg
canvas: no pyplot, no display, no global state (the `plot` extra).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from pocket.errors import PocketError

PLOT_EXTRA = "pip install 'pocketnn[plot]'"
PANELS = ("loss", "metrics", "lr", "memory")


class PlotError(PocketError):
    """A run folder without metrics, or no matplotlib."""


def read_metrics(run: str | Path) -> tuple[Path, list[dict]]:
    """(metrics file, rows) of a run folder or of a metrics.jsonl given directly."""
    p = Path(run)
    path = p / "metrics.jsonl" if p.is_dir() else p
    if not path.is_file():
        raise PlotError(f"{run}: no metrics.jsonl; give a run folder that `pocket train` wrote")
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise PlotError(f"{path}: line {n} is not JSON; was the file edited?") from None
            if not isinstance(row, dict) or not isinstance(row.get("epoch"), int):
                raise PlotError(f"{path}: line {n} is not an epoch record")
            rows.append(row)
    if not rows:
        raise PlotError(f"{path}: no epochs yet; plot a run after its first epoch")
    return path, rows


def _series(rows: list[dict], key: str, scale: float = 1.0) -> list[float] | None:
    if not any(key in r for r in rows):
        return None
    out = []
    for r in rows:
        v = r.get(key)
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        out.append(v * scale if ok else math.nan)
    return out


def plot_run(run: str | Path, output: str | Path | None = None) -> dict:
    """Write the PNG; returns {"output", "epochs", "panels", "series"}."""
    path, rows = read_metrics(run)  # a wrong folder fails before matplotlib's import
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise PlotError(f"pocket plot needs matplotlib: {PLOT_EXTRA}") from None
    out = Path(output) if output else path.parent / "plot.png"
    epochs = [r["epoch"] for r in rows]
    metric_keys = (("train_accuracy", "val_accuracy") if any("val_accuracy" in r or
                                                              "train_accuracy" in r for r in rows)
                   else ("val_r2",) if any("val_r2" in r for r in rows)
                   else ("val_mae", "val_rmse"))
    panels = {
        "loss": [("train_loss", 1.0), ("val_loss", 1.0)],
        "metrics": [(k, 1.0) for k in metric_keys],
        "lr": [("lr", 1.0)],
        "memory": [("peak_bytes", 1 / 2**20)],
    }
    titles = {"loss": "loss", "metrics": "metrics", "lr": "learning rate",
              "memory": "peak tracked memory (MiB)"}
    fig = Figure(figsize=(10, 7), dpi=100)
    FigureCanvasAgg(fig)
    drawn = {}
    for i, name in enumerate(PANELS):
        ax = fig.add_subplot(2, 2, i + 1)
        ax.set_title(titles[name])
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        drawn[name] = []
        for key, scale in panels[name]:
            ys = _series(rows, key, scale)
            if ys is None:
                continue
            ax.plot(epochs, ys, marker="o" if len(epochs) < 30 else None, markersize=3,
                    label=key)
            drawn[name].append(key)
        if name == "lr" and drawn[name]:
            ax.set_yscale("log" if all(v > 0 for v in _series(rows, "lr") if v == v) else "linear")
        if drawn[name]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not measured in this run", ha="center", va="center",
                    transform=ax.transAxes)
    fig.suptitle(f"{path.parent.name}: {len(rows)} epoch{'s' if len(rows) != 1 else ''}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        fig.savefig(tmp, format="png",
                    metadata={"Description": f"pocket plot panels: {', '.join(PANELS)}"})
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return {"output": str(out), "epochs": len(rows), "panels": list(PANELS), "series": drawn}


def render(r: dict) -> str:
    return (f"wrote {r['output']}: {', '.join(r['panels'])} over "
            f"{r['epochs']} epoch{'s' if r['epochs'] != 1 else ''}")
