"""`pocket train`: config + flags -> Trainer -> result dict, and its text rendering.

A new run takes its config from the file and the flags. A resumed run takes everything from
its checkpoint (config, epochs, schedule, run folder): repeating a flag with the value the run
already has is fine, `--epochs` may extend the run (said in the log), `--device` may move it;
any other flag that would change what is trained is refused, since the result would be neither
the old run nor a new one.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from pocket.train.config import FLAGS, ConfigError, format_size, load_config, merge


def train_from_config(config_path: str | None, overrides: dict, *, quiet: bool = False,
                      verbose: bool = False, callbacks=()) -> dict:
    """Run a training job as the CLI does; returns the JSON-able result. `overrides` are the
    flags by name (`epochs`, `lr`, ..., plus `resume` and `force`)."""
    from pocket.train.trainer import Trainer

    overrides = dict(overrides)
    resume = overrides.pop("resume", None)
    force = bool(overrides.pop("force", False))
    if resume:
        if force:
            raise ConfigError("--force starts a new run and --resume continues one; give one")
        cfg, notes = resume_config(resume, config_path, overrides)
    else:
        if config_path is None:
            raise ConfigError("give a CONFIG file for a new run (or --resume RUN/last.ckpt)")
        cfg = load_config(config_path, overrides)
        notes = []
    trainer = Trainer(cfg, quiet=quiet, verbose=verbose, callbacks=callbacks)
    trainer.resume_notes = notes
    return trainer.fit(resume=resume, force=force)


def _same_folder(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def resume_config(ckpt: str | Path, config_path: str | None, overrides: dict
                  ) -> tuple[dict, list[str]]:
    """The config a resumed run continues with, and what the log should say about it."""
    from pocket.train.checkpoint import check_trainer_state, load_checkpoint

    ck = load_checkpoint(ckpt)
    saved = check_trainer_state(ck["meta"], ckpt)
    cfg = copy.deepcopy(saved)
    run_dir = Path(ckpt).parent
    done = int(ck["meta"]["trainer"]["epoch"])
    notes = []
    for flag, value in overrides.items():
        if value is None:
            continue
        if flag not in FLAGS:
            raise ConfigError(f"unknown option '{flag}'")
        section, key = FLAGS[flag]
        have = saved[section][key]
        if flag == "out":
            if not _same_folder(value, run_dir):
                raise ConfigError(f"--out {value} is not the folder of the checkpoint "
                                  f"({run_dir}); a resumed run continues in its own folder "
                                  "(drop --out, or start a new run there)")
            continue
        if flag == "epochs":
            if value < done or (value == done and value != have):
                raise ConfigError(f"--epochs {value}: the checkpoint has already finished "
                                  f"{done} epoch{'s' if done != 1 else ''}; give more to continue")
            cfg[section][key] = value
            continue
        if flag == "device":
            if value != have:
                notes.append(f"resuming on --device {value} (the run was started with {have})")
            cfg[section][key] = value
            continue
        if value != have:
            raise ConfigError(f"--{flag.replace('_', '-')} {value} differs from the run's "
                              f"{have!r}; a resumed run keeps its own config (drop the flag to "
                              "continue it, or start a new run)")
    if config_path is not None:
        file_cfg = load_config(config_path)
        differ = [f"[{s}] {k}" for s in saved for k in saved[s]
                  if (s, k) not in (("run", "name"), ("run", "out"))
                  and file_cfg[s][k] != saved[s][k]]
        if differ:
            notes.append(f"{config_path} differs from the checkpoint's config in "
                         f"{', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}; the "
                         "checkpoint's config is used (pass --epochs to extend the run)")
    cfg["run"]["out"] = str(run_dir)
    notes.insert(0, f"resuming {run_dir} from epoch {done} of {cfg['train']['epochs']}")
    return merge(cfg, "checkpoint"), notes


def render(r: dict) -> str:
    lines = []  # the memory plan, if any, was printed (stderr) before training began
    best = r.get("best") or {}
    n = r["epochs"]
    lines.append(f"trained {n} epoch{'s' if n != 1 else ''} ({r['steps']} steps) in "
                 f"{r['seconds']:.1f}s on "
                 f"{r['device']}, {r['precision']}, micro-batch {r['micro_batch']} x "
                 f"{r['accumulation']}" + (f", {r['checkpoint_segments']} checkpoint segments"
                                           if r["checkpoint_segments"] > 1 else "")
                 + (", fp16 saved activations" if r["fp16_activations"] else ""))
    if r.get("stopped_early"):
        s = r["stopped_early"]
        lines.append(f"stopped early after epoch {s['epoch']}: {s['reason']}")
    if best:
        score = best["score"]
        shown = f"{score:.4f}" if isinstance(score, float) else str(score)
        lines.append(f"best epoch {best['epoch']}: {best['metric']} {shown}")
    test = r.get("test") or {}
    which = f" ({r.get('keep', 'best')} checkpoint)"
    if "accuracy" in test:
        lines.append(f"test accuracy {test['accuracy'] * 100:.2f}%  (loss {test['loss']:.4f})"
                     + which)
    elif test:
        lines.append("test " + "  ".join(f"{k} {v:.4g}" for k, v in test.items()
                                         if not k.startswith("baseline_")) + which)
    if "baseline_mase" in test:  # a forecast, beside the seasonal-naive forecast
        lines.append(f"seasonal-naive baseline on test: mase {test['baseline_mase']:.4g}  "
                     f"mae {test['baseline_mae']:.4g}  rmse {test['baseline_rmse']:.4g}  "
                     f"({'beaten' if test['mase'] < test['baseline_mase'] else 'NOT beaten'})")
    rates = {k[len("fire_rate."):]: v for k, v in test.items() if k.startswith("fire_rate.")}
    if rates:
        lines.append("test firing rate (sparsity) per layer: " + ", ".join(
            f"{k} {v:.1%} ({1 - v:.1%})" for k, v in rates.items()))
    lines.append("")
    lines.append("memory by category (bytes held by arrays pocket tracks):")
    lines.append(r["memory_table"])
    if r.get("trainable") and r["trainable"]["fraction"] < 1:
        from pocket.train.memory import trainable_lines

        lines += trainable_lines(r["trainable"])
    if r.get("spiking"):
        from pocket.train.nn_spiking import render_summary

        lines += render_summary(r["spiking"])
    if r.get("gpu_pool"):
        g = r["gpu_pool"]
        lines.append(f"GPU memory pool: used {format_size(g['used_bytes'])}, held "
                     f"{format_size(g['total_bytes'])}")
    if r.get("gpu_memory"):
        m = r["gpu_memory"]
        parts = ", ".join(f"{k} {format_size(v)}" for k, v in m["at_peak"].items() if v)
        lines.append(f"GPU peak (pool, measured): {format_size(m['peak_bytes'])}"
                     + (f" = {parts}, untracked {format_size(m['unattributed_bytes'])}"
                        if parts else ""))
    lines.append("")
    lines.append(f"checkpoints: {r['best_checkpoint']} (best), {r['last_checkpoint']} (last); "
                 f"the run's result: {r.get('result_checkpoint', r['best_checkpoint'])}")
    lines.append(f"metrics:     {r['run_dir']}/metrics.jsonl  (pocket plot {r['run_dir']})")
    return "\n".join(lines)
