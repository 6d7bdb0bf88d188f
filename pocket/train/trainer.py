"""The training loop: data, model, optimizer, memory savers, metrics and checkpoints.

Resume is exact because everything random is a pure function of saved state: the batch order
and augmentation come from (seed, epoch), dropout from the backend RNG whose state each
checkpoint stores, and the model, optimizer, schedule and loss scaler are restored in full.
A checkpoint is written before the first step and at the end of every epoch, so a run killed
anywhere restarts from the last finished epoch and replays the rest identically.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from pocket import __version__
from pocket.errors import PocketError
from pocket.formats.ir import make_metadata
from pocket.train import backend, lora, memory, nn_spiking, optim, task_embed
from pocket.train import functional as F
from pocket.train.checkpoint import (
    DERIVED_PREFIX,
    CheckpointError,
    check_trainer_state,
    load_checkpoint,
    save_checkpoint,
)
from pocket.train.config import ConfigError, parse_size
from pocket.train.data import Loader, load_dataset
from pocket.train.models import build_model
from pocket.train.progress import Progress
from pocket.train.tensor import Tensor, no_grad
from pocket.train.trace import trace

# What a run folder holds; a new run refuses a folder with any of these unless forced.
RUN_FILES = ("best.ckpt", "last.ckpt", "metrics.jsonl", "summary.json")
TENSORBOARD_DIR = "tensorboard"
TENSORBOARD_EXTRA = "pip install 'pocketnn[tensorboard]'"
# Monitors where higher is better; the rest (losses, errors) are minimized.
_MAXIMIZED = ("val_accuracy", "val_r2")


class RunExistsError(PocketError):
    """A new run would overwrite an existing run folder."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training; the message says what last.ckpt holds and how to resume."""


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Trainer:
    """Train per a complete config (see config.py). `callbacks` get (trainer, epoch, step)
    after every optimizer step; tests use them to interrupt a run at a chosen point."""

    def __init__(self, cfg: dict, *, quiet: bool = False, verbose: bool = False, callbacks=()):
        self.cfg = cfg
        self.quiet = quiet
        self.verbose = verbose and not quiet
        self.callbacks = list(callbacks)
        run, data_cfg, tr, mem = cfg["run"], cfg["data"], cfg["train"], cfg["memory"]
        self.device = backend.get_device(run["device"])
        backend.use_device(self.device)
        self.seed = int(run["seed"])
        backend.manual_seed(self.seed)
        self.out = Path(run["out"] or Path("runs") / run["name"])
        self.data = load_dataset(
            data_cfg["source"], target=data_cfg["target"], task=data_cfg["task"],
            val_fraction=data_cfg["val_fraction"], test_fraction=data_cfg["test_fraction"],
            cache_dir=data_cfg["cache_dir"], seed=self.seed, limit=data_cfg["limit"],
            test=data_cfg["test"], validation=data_cfg["validation"], holdout=data_cfg["holdout"],
            **{k: data_cfg[k] for k in ("window", "horizon", "stride", "season", "time_column",
                                         "relative", "layout", "classes")},
            **({"image_size": data_cfg["image_size"]} if data_cfg["image_size"] else {}))
        self.task = self.data.task
        self.loss_name = tr["loss"] or {"classification": "cross_entropy",
                                        task_embed.TASK: "arcface"}.get(self.task, "mse")
        self._check_task_choices()
        self.batch_size = tr["batch_size"]
        self._init_rng = np.random.default_rng(self.seed)
        self.model = self._build_model()
        self.plan = None
        self.micro_batch = self.batch_size // mem["accumulation"]
        self.segments = int(mem["checkpointing"])
        self.fp16_activations = bool(mem["fp16_activations"])
        self.precision = mem["precision"]
        if mem["budget"] is not None:
            self._apply_budget(parse_size(mem["budget"]))
        if self.device.kind == "cpu" and (self.plan or self.segments > 1
                                          or self.fp16_activations):
            backend.return_freed_host_memory()
        # NOTE: the model moves first: the fp16 masters (and through them the optimizer state)
        # are created where the weights are, or every step would write host arrays into
        # device arrays.
        self.model.to(self.device)
        self._setup_precision()
        self.train_loader = Loader(self.data.train, self.batch_size, shuffle=True,
                                   drop_last=tr["drop_last"] and len(self.data.train) >= self.batch_size,
                                   seed=self.seed, augment=data_cfg["augment"] or None,
                                   prefetch=data_cfg["prefetch"])
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch == 0:
            raise PocketError(f"the training split has {len(self.data.train)} samples, fewer than "
                              f"one batch of {self.batch_size}; lower --batch-size")
        self.optimizer = self._build_optimizer()
        self.schedule = self._build_schedule()
        self.epoch = 0  # epochs finished
        self.step = 0
        self.history: list[dict] = []
        self.best: dict | None = None
        self.skipped_steps = 0
        self.stopped: dict | None = None  # why early stopping ended the run, once it has
        self._saved_epoch: int | None = None  # what last.ckpt holds on disk
        self.resume_notes: list[str] = []  # said once the checkpoint has been restored

    # ------------------------------------------------------------------ setup

    def _check_task_choices(self) -> None:
        """Loss and monitor that fit the data's task, refused before any training."""
        tr = self.cfg["train"]
        if self.task == task_embed.TASK:
            return task_embed.check(self)
        cls = self.task == "classification"
        if cls != (self.loss_name == "cross_entropy"):
            want = "cross_entropy" if cls else "mse, l1 or huber"
            raise ConfigError(f"[train] loss = {self.loss_name!r} does not fit {self.data.name}, "
                              f"a {self.task} set; use {want} (or leave loss out)")
        mon = tr["monitor"]
        if mon in ("val_accuracy",) and not cls or mon in ("val_r2", "val_mae", "val_rmse") and cls:
            raise ConfigError(f"[train] monitor = {mon!r} is not measured on {self.task}; use "
                              + ("val_loss or val_accuracy" if cls else
                                 "val_loss, val_r2, val_mae or val_rmse"))
        if mon.startswith("val_") and len(self.data.val) == 0:
            raise ConfigError(f"[train] monitor = {mon!r} needs validation data, and the "
                              "validation split is empty; raise [data] val_fraction, give "
                              "[data] validation, or monitor train_loss")
        if tr["patience"] and mon == "auto" and len(self.data.val) == 0:
            _log(self.quiet, "early stopping watches train_loss: there is no validation split")

    def _build_model(self):
        if self.task == task_embed.TASK:
            return task_embed.build(self, self._init_rng)
        model = build_model(self.cfg["model"], self.data.input_shape, self.data.num_outputs,
                            self._init_rng)
        lora.apply_config(model, self.cfg, self._init_rng)
        return model

    def _load_lora_base(self) -> None:
        """A new LoRA run starts from its [lora] base checkpoint's weights (fp16 masters too)."""
        path = self.cfg["lora"]["base"]
        if path is None:
            return
        state = self.amp.fp32_state_dict()
        state.update(lora.base_state(path, self.cfg, state))
        self.amp.load_fp32_state_dict(state)
        _log(self.quiet, f"LoRA: starting from {path}")

    def _apply_budget(self, budget: int) -> None:
        from pocket.train.planner import plan_memory

        def fresh():
            rng = np.random.default_rng(self.seed)
            model = build_model(self.cfg["model"], self.data.input_shape, self.data.num_outputs,
                                rng)
            lora.apply_config(model, self.cfg, rng)
            return model

        # NOTE: on the GPU the plan must fit the pool cap, which leaves room for the CUDA
        # context and library workspaces, so that a run planned for a 4 GiB budget fits a
        # 4 GiB card.
        pool_budget = backend.gpu_pool_limit(budget) if self.device.kind == "cuda" else budget
        self.plan = plan_memory(fresh, tuple(self.data.input_shape), self.data.num_outputs,
                                self.task, self.batch_size, pool_budget, device=self.device,
                                optimizer=self.cfg["train"]["optimizer"],
                                allow_fp16=self.device.kind == "cuda")
        self.micro_batch = self.plan.micro_batch
        self.segments = self.plan.checkpoint_segments
        self.fp16_activations = self.plan.fp16_activations
        if self.plan.precision != "fp32":
            self.precision = self.plan.precision
        _log(self.quiet, self.plan.describe())
        if self.device.kind == "cuda":
            backend.cap_gpu_pool(budget, self.device)

    def _setup_precision(self) -> None:
        from pocket.train.amp import LossScaler, MixedPrecision

        mem = self.cfg["memory"]
        self.amp = MixedPrecision(self.model, self.precision)
        self.scaler = LossScaler(init_scale=mem["loss_scale"],
                                 growth_interval=mem["growth_interval"],
                                 enabled=self.precision == "fp16")

    def _build_optimizer(self):
        tr = self.cfg["train"]
        params = self.amp.master_params()
        if tr["optimizer"] == "sgd":
            return optim.SGD(params, tr["lr"], momentum=tr["momentum"], nesterov=tr["nesterov"],
                             weight_decay=tr["weight_decay"])
        cls = optim.Adam if tr["optimizer"] == "adam" else optim.AdamW
        return cls(params, tr["lr"], betas=tuple(tr["betas"]), eps=tr["eps"],
                   weight_decay=tr["weight_decay"])

    def _build_schedule(self):
        tr = self.cfg["train"]
        total = tr["epochs"] * self.steps_per_epoch
        if tr["schedule"] == "cosine":
            return optim.WarmupCosine(self.optimizer, total,
                                      min(total - 1, tr["warmup_epochs"] * self.steps_per_epoch))
        if tr["schedule"] == "step":
            return optim.StepDecay(self.optimizer, tr["step_size"] * self.steps_per_epoch,
                                   tr["gamma"])
        return optim.StepDecay(self.optimizer, 1 << 62, 1.0)

    # ------------------------------------------------------------------ one step

    def _loss(self, out: Tensor, y) -> Tensor:
        out = F.astype(out, np.float32) if out.dtype != np.float32 else out
        if self.task == task_embed.TASK:
            return task_embed.loss(self, out, y)
        if self.loss_name == "cross_entropy":
            return F.cross_entropy(out, y, label_smoothing=self.cfg["train"]["label_smoothing"])
        target = Tensor(y.reshape(out.shape) if y.size == out.size else y)
        return {"mse": F.mse_loss, "l1": F.l1_loss, "huber": F.huber_loss}[self.loss_name](
            out, target)

    def _forward(self, x: Tensor) -> Tensor:
        if self.segments > 1:
            from pocket.train.recompute import checkpoint_sequential

            return checkpoint_sequential(self.model, x, self.segments)
        return self.model(x)

    def _saved_fp16(self):
        if not self.fp16_activations:
            return contextlib.nullcontext()
        from pocket.train.tensor import saved_activations_fp16

        return saved_activations_fp16(True)

    def train_step(self, xb: np.ndarray, yb: np.ndarray) -> tuple[float, int]:
        """One optimizer step over a batch, in micro-batches; returns (mean loss, correct).

        The step waits on the device once: the loss, the correct count and the finite check
        of every gradient (which feeds both the loss scaler and the optimizer's guard) are
        accumulated on the device and read together at the end."""
        xp = self.device.xp
        k = max(1, math.ceil(len(xb) / self.micro_batch))
        self.amp.before_step()
        total_loss, correct = 0.0, 0.0
        for i in range(k):
            xs = xb[i * self.micro_batch:(i + 1) * self.micro_batch]
            ys = yb[i * self.micro_batch:(i + 1) * self.micro_batch]
            x = Tensor(self.amp.cast_input(backend.to_device(xs, self.device)))
            y = backend.to_device(ys, self.device)
            # NOTE: an fp16 overflow is expected now and then; the scaler sees the inf and
            # skips the step, so the warnings NumPy raises on the way are noise.
            quiet_fp16 = (np.errstate(over="ignore", invalid="ignore")
                          if self.precision == "fp16" else contextlib.nullcontext())
            with self._saved_fp16(), quiet_fp16:
                out = self._forward(x)
                # NOTE: loss / k over equal micro-batches gives the batch-mean gradient exactly;
                # a short last micro-batch is weighted by its share of the batch instead.
                loss = self._loss(out, y)
                weight = len(xs) / len(xb)
                scaled = self.scaler.scale_loss(loss * weight)
                scaled.backward()
            total_loss = total_loss + loss.data.astype(np.float64) * weight
            if self.task == "classification":
                correct = correct + (xp.argmax(out.data, axis=1) == y).sum()
            del out, loss, scaled
        with np.errstate(over="ignore", invalid="ignore"):
            flag = self.amp.grads_to_master(self.scaler.scale, sync=False)
        # the step's one host sync
        if xp is np:
            got = (float(flag), float(total_loss), float(correct))
        else:
            got = tuple(xp.stack([xp.asarray(v, dtype=xp.float64)
                                  for v in (flag, total_loss, correct)]).get().tolist())
        nonfinite = not math.isfinite(got[0])
        skip = self.scaler.update(nonfinite)
        if not skip:
            clip = self.cfg["train"]["clip_grad_norm"]
            if clip:
                optim.clip_grad_norm(self.optimizer.params, clip, sync=False)
            result = self.optimizer.step(nonfinite=False)
            if not result:
                skip = True
                _log(self.quiet, f"step {self.step}: {result.reason}")
        elif not self.scaler.enabled:
            # fp32: no scaler to back off, so the guard names the bad gradients and skips
            result = self.optimizer.step(nonfinite=True)
            _log(self.quiet, f"step {self.step}: {result.reason}")
        if skip:
            self.skipped_steps += 1
        self.optimizer.zero_grad()
        self.amp.zero_model_grads()
        self.schedule.step()
        self.step += 1
        return got[1], int(got[2])

    # ------------------------------------------------------------------ evaluation

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Eval-mode outputs (float32 NumPy) for model-ready inputs."""
        was = self.model.training
        self.model.eval()
        outs = []
        bs = self.cfg["train"]["eval_batch_size"]
        if self.plan is not None:
            bs = min(bs, self.micro_batch)  # what fits training fits evaluation
        with no_grad():
            for i in range(0, len(x), bs):
                xb = Tensor(self.amp.cast_input(backend.to_device(x[i:i + bs], self.device)))
                outs.append(backend.to_numpy(self.model(xb).data).astype(np.float32))
        self.model.train(was)
        return np.concatenate(outs) if outs else np.zeros((0, self.data.num_outputs), np.float32)

    def evaluate(self, split) -> dict:
        if len(split) == 0:
            return {}
        nn_spiking.firing_rates(self.model)  # start the count for this split
        out = self.predict(split.x)
        spikes = {}
        for k, v in nn_spiking.firing_rates(self.model).items():
            spikes.update({f"fire_rate.{k}": v, f"sparsity.{k}": 1.0 - v})
        if self.task == "classification":
            z = out.astype(np.float64)
            z -= z.max(axis=1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            loss = float(-logp[np.arange(len(out)), split.y].mean())
            return {"loss": loss, "accuracy": float((out.argmax(axis=1) == split.y).mean()),
                    **spikes}
        if self.task == task_embed.TASK:
            return {**task_embed.evaluate(self, split, out), **spikes}
        y = split.y.reshape(out.shape).astype(np.float64)
        pred = out
        err = out.astype(np.float64) - y
        std = self.data.preprocessing.get("target", {}).get("std", 1.0)
        std = np.asarray(std, np.float64)
        # R² per target column, then averaged (as scikit-learn's "uniform_average"); the
        # standardization cancels in the ratio. A constant target has no R² to speak of.
        ss_res = (err**2).reshape(len(y), -1).sum(axis=0)
        ss_tot = ((y - y.mean(axis=0)) ** 2).reshape(len(y), -1).sum(axis=0)
        r2 = float(np.mean(1.0 - ss_res / ss_tot)) if len(y) > 1 and np.all(ss_tot > 0) else None
        out = {"loss": float((err**2).mean()), "mae": float(np.abs(err * std).mean()),
               "rmse": float(np.sqrt(((err * std) ** 2).mean()))}
        if r2 is not None:
            out["r2"] = r2
        if split.baseline is not None:  # a forecast: MASE, and the seasonal-naive baseline's
            from pocket.train.data.timeseries import forecast_metrics

            out.update(forecast_metrics(pred, y, split.baseline, self.data.preprocessing))
        return {**out, **spikes}

    # ------------------------------------------------------------------ checkpoints

    def _metadata(self, metrics: dict | None) -> dict:
        meta = make_metadata(task=self.task, labels=self.data.labels,
                             preprocessing=self.data.preprocessing, dataset=self.data.name,
                             metrics=metrics, version=__version__)
        if self.task == task_embed.TASK:
            meta.update(task_embed.metadata(self, metrics))
        return meta

    def _calibration(self) -> tuple[np.ndarray, np.ndarray]:
        n = min(self.cfg["run"]["calib_samples"], len(self.data.train))
        idx = np.random.default_rng([self.seed, 7]).permutation(len(self.data.train))[:n]
        idx.sort()
        return self.data.train.x[idx], self.data.train.y[idx]

    def save(self, path: Path, metrics: dict | None = None) -> None:
        state = self.amp.fp32_state_dict()
        self.model.eval()
        graph, params = trace(self.model, self.data.input_shape, self._metadata(metrics),
                              state=state)
        self.model.train()
        state.update({k: v for k, v in params.items() if k.startswith(DERIVED_PREFIX)})
        calib_x, calib_y = self._calibration()
        meta = {
            "config": self.cfg,
            "trainer": {"epoch": self.epoch, "step": self.step, "rng": backend.get_rng_state(),
                        "skipped_steps": self.skipped_steps, "best": self.best,
                        "schedule": self.schedule.state_dict(),
                        "scaler": self.scaler.state_dict(), "stopped": self.stopped},
            "history": self.history,
            "dataset": {"name": self.data.name, "task": self.task, "labels": self.data.labels,
                        "input_shape": list(self.data.input_shape)},
            "producer": {"name": "pocket", "version": __version__},
        }
        save_checkpoint(path, graph=graph, state=state, optimizer_state=self.optimizer.state_dict(),
                        meta=meta, calib_x=calib_x, calib_y=calib_y)

    def resume(self, path: str | Path) -> None:
        ck = load_checkpoint(path)
        check_trainer_state(ck["meta"], path)
        saved_cfg = ck["meta"]["config"]
        for section, key in (("model", None), ("data", "source"), ("train", "optimizer")):
            a = saved_cfg.get(section) if key is None else saved_cfg.get(section, {}).get(key)
            b = self.cfg[section] if key is None else self.cfg[section][key]
            if a != b:
                what = f"[{section}]" + (f" {key}" if key else "")
                raise CheckpointError(f"{path}: was trained with a different {what}; resume "
                                      "with the run's own config")
        try:
            self.amp.load_fp32_state_dict(ck["state"])
            self.optimizer.load_state_dict(ck["optimizer"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{path}: does not fit this model: {e}") from None
        t = ck["meta"]["trainer"]
        try:
            self.epoch, self.step = int(t["epoch"]), int(t["step"])
            self.skipped_steps = int(t.get("skipped_steps", 0))
            self.best = t.get("best")
            self.stopped = t.get("stopped")
            fresh = self.schedule.state_dict()
            self.schedule.load_state_dict(t["schedule"])
            self.scaler.load_state_dict(t["scaler"])
            backend.set_rng_state(t["rng"])
        except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError,
                OverflowError) as e:
            raise CheckpointError(f"{path}: trainer state is malformed ({type(e).__name__}: "
                                  f"{e}); resume from another checkpoint or start a new run"
                                  ) from None
        self.history = list(ck["meta"].get("history", []))
        for note in self.resume_notes:
            _log(self.quiet, note)
        epochs, saved_epochs = self.cfg["train"]["epochs"], int(saved_cfg["train"]["epochs"])
        if epochs != saved_epochs:
            self._extend_schedule(fresh, saved_epochs)
        if self.epoch >= epochs:
            _log(self.quiet, f"checkpoint already finished {plural(self.epoch, 'epoch')}; "
                             "nothing to train (raise --epochs to continue)")

    def _extend_schedule(self, fresh: dict, saved_epochs: int) -> None:
        """--epochs on resume: the schedule's horizon follows the new epoch count, said in the
        log. A cosine then continues from where it stands on the longer curve."""
        epochs = self.cfg["train"]["epochs"]
        before = self.optimizer.lr
        if "total_steps" in fresh:
            self.schedule.total_steps = fresh["total_steps"]
            self.schedule.warmup_steps = fresh["warmup_steps"]
            self.schedule.load_state_dict(self.schedule.state_dict())
        _log(self.quiet, f"resuming at epoch {self.epoch} with {plural(epochs, 'epoch')} in all "
                         f"(the run was for {saved_epochs}); lr {before:.3g} -> "
                         f"{self.optimizer.lr:.3g} on the {self.cfg['train']['schedule']} "
                         f"schedule for {plural(epochs, 'epoch')}")

    # ------------------------------------------------------------------ the run folder

    def _prepare_out(self, resume, force: bool) -> None:
        """Refuse to overwrite another run; clear what a killed run left half-written."""
        self.out.mkdir(parents=True, exist_ok=True)
        if not resume:
            found = [n for n in RUN_FILES if (self.out / n).exists()]
            if found and not force:
                raise RunExistsError(
                    f"run folder {self.out} already holds a run ({', '.join(found)}); resume it "
                    f"with `pocket train --resume {shlex.quote(str(self.out / 'last.ckpt'))}`, "
                    "choose another --out, or add --force to overwrite it")
            for n in found:
                (self.out / n).unlink()
            tb = self.out / TENSORBOARD_DIR
            if tb.is_dir():
                for f in tb.glob("events.out.tfevents.*"):
                    f.unlink()
        # NOTE: names the container writer (.NAME.<hex>.tmp) and _atomic_write_text
        # (.NAME.tmp<pid>) give their temporary files; only a killed writer leaves one.
        for n in RUN_FILES:
            for f in self.out.glob(f".{n}.*.tmp"):
                f.unlink(missing_ok=True)
            for f in self.out.glob(f".{n}.tmp*"):
                f.unlink(missing_ok=True)
        (self.out / "summary.json.tmp").unlink(missing_ok=True)

    def _tensorboard(self):
        """A TensorBoard writer under RUN/tensorboard when the extra is installed (config
        `[run] tensorboard`: unset = when available, true = required, false = never)."""
        want = self.cfg["run"]["tensorboard"]
        if want is False:
            return None
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            if want:
                raise ConfigError(f"[run] tensorboard = true needs tensorboardX: "
                                  f"{TENSORBOARD_EXTRA}") from None
            if self.verbose:
                _log(False, f"no TensorBoard logs ({TENSORBOARD_EXTRA} to have them)")
            return None
        # purge_step drops events a killed run logged past the epoch it resumes from.
        return SummaryWriter(str(self.out / TENSORBOARD_DIR), purge_step=self.epoch + 1,
                             flush_secs=30)

    # ------------------------------------------------------------------ the loop

    def fit(self, resume: str | Path | None = None, *, force: bool = False) -> dict:
        tracker = memory.get_tracker()
        tracker.reset_peak()
        self._start_gpu_peak()
        if not resume:
            self._load_lora_base()
        if self.device.reason and self.cfg["run"]["device"] == "auto":
            _log(self.quiet, f"device: {self.device} ({self.device.reason})")
        self._prepare_out(resume, force)
        if resume:
            self.resume(resume)
        metrics_path = self.out / "metrics.jsonl"
        _atomic_write_text(metrics_path, "".join(json.dumps(h) + "\n" for h in self.history))
        if not resume:
            # A checkpoint from the start: a run interrupted in its first epoch resumes too.
            self.save(self.out / "last.ckpt")
            self._saved_epoch = 0
        else:
            self._saved_epoch = self.epoch
        tb = self._tensorboard()
        t_start = time.monotonic()
        self._progress = Progress(not self.quiet)
        try:
            self._loop(tracker, metrics_path, tb)
        except KeyboardInterrupt as e:
            self._progress.finish()
            if isinstance(e, TrainingInterrupted):
                raise
            raise TrainingInterrupted(self._interrupted_message()) from None
        finally:
            if tb is not None:
                tb.close()
        return self._finish(time.monotonic() - t_start, tracker)

    def _interrupted_message(self) -> str:
        last = self.out / "last.ckpt"
        epochs = self.cfg["train"]["epochs"]
        held = self._saved_epoch or 0
        what = (f"holds epoch {held} of {epochs}" if held else
                "holds the start of the run (no epoch finished)")
        return (f"Interrupted in epoch {self.epoch + 1} of {epochs}; {last} {what}. Resume with: "
                f"pocket train --resume {shlex.quote(str(last))}")

    def _loop(self, tracker, metrics_path: Path, tb) -> None:
        epochs = self.cfg["train"]["epochs"]
        progress = self._progress
        is_cls = self.task == "classification"
        if self.stopped is not None:
            _log(self.quiet, f"this run stopped early at epoch {self.stopped['epoch']}: "
                             f"{self.stopped['reason']}; nothing to train")
            return
        first_epoch, t_loop = self.epoch, time.monotonic()
        while self.epoch < epochs:
            self.model.train()
            t0 = time.monotonic()
            done = self.epoch - first_epoch
            per_epoch = (t0 - t_loop) / done if done else None
            run_left = per_epoch * (epochs - self.epoch - 1) if per_epoch is not None else None
            loss_sum, correct, seen = 0.0, 0, 0
            for i, (xb, yb) in enumerate(self.train_loader.epoch(self.epoch)):
                loss, ok = self.train_step(xb, yb)
                loss_sum += loss * len(xb)
                correct += ok
                seen += len(xb)
                text = f"epoch {self.epoch + 1}/{epochs} loss {loss_sum / seen:.4f}"
                progress.update(text, i + 1, self.steps_per_epoch, time.monotonic() - t0,
                                run_left)
                for cb in self.callbacks:
                    cb(self, self.epoch, i)
            progress.clear()
            self.epoch += 1
            fired = nn_spiking.firing_rates(self.model)  # this epoch's training steps
            val = self.evaluate(self.data.val)
            row = {"epoch": self.epoch, "step": self.step, "train_loss": loss_sum / max(seen, 1),
                   "lr": self.optimizer.lr, "time_s": round(time.monotonic() - t0, 3),
                   "skipped_steps": self.skipped_steps,
                   "peak_bytes": tracker.total_peak}
            if self.gpu_peak is not None:
                row["gpu_peak_bytes"] = self.gpu_peak.peak
            if is_cls:
                row["train_accuracy"] = correct / max(seen, 1)
            if self.precision == "fp16":
                row["loss_scale"] = self.scaler.scale
            row.update({f"train_fire_rate.{k}": v for k, v in fired.items()})
            row.update({f"val_{k}": v for k, v in val.items()})
            row = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                   for k, v in row.items()}
            self.history.append(row)
            key, rank = self._rank(row)
            better = self._improves(rank)
            if better:
                self.best = {"epoch": self.epoch, "metric": key, "score": row[key],
                             "rank": list(rank)}
            self.stopped = self._early_stop()
            # NOTE: best before last. A kill between the two writes then resumes from the
            # previous last.ckpt and replays this epoch; the other order would resume believing
            # this epoch's best.ckpt was written when it was not.
            if better:
                self.save(self.out / "best.ckpt", self._summary_metrics(row))
            self.save(self.out / "last.ckpt", self._summary_metrics(row))
            self._saved_epoch = self.epoch
            with open(metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            if tb is not None:
                for k, v in row.items():
                    if k != "epoch" and isinstance(v, int | float) and not isinstance(v, bool):
                        tb.add_scalar(k, v, self.epoch)
            _log(self.quiet, self._epoch_line(row))
            if self.stopped is not None:
                _log(self.quiet, f"early stop after epoch {self.epoch}: "
                                 f"{self.stopped['reason']}; best epoch "
                                 f"{self.stopped['best_epoch']}")
                break

    def _start_gpu_peak(self) -> None:
        # the true GPU peak (a pool memory hook) of this fit; _finish closes it, and a fit that
        # raised has its hook closed by the next one
        old = getattr(self, "gpu_peak", None)
        if old is not None:
            old.close()
        self.gpu_peak = backend.GpuPeak(self.device) if self.device.kind == "cuda" else None

    def _rank(self, row: dict) -> tuple[str, tuple]:
        """What "best" means, higher rank first. `monitor = "auto"`: higher validation accuracy,
        ties broken by lower validation loss (so a later, better-fitted epoch wins a tie);
        without labels for accuracy, the lowest validation (else training) loss. A chosen
        monitor ranks by itself alone. Non-finite values rank last."""
        def val(k):
            v = row.get(k)
            return v if isinstance(v, float) and math.isfinite(v) else None

        # NOTE: -1e308, not -inf, so the rank stays writable as JSON in the checkpoint.
        worst = -1e308
        mon = self.cfg["train"]["monitor"]
        if mon != "auto":
            v = val(mon)
            return mon, ((v if mon in _MAXIMIZED else -v) if v is not None else worst,)
        if val("val_accuracy") is not None:
            loss = val("val_loss")
            return "val_accuracy", (row["val_accuracy"], -loss if loss is not None else worst)
        key = "val_loss" if "val_loss" in row else "train_loss"
        return key, ((-val(key)) if val(key) is not None else worst,)

    def _improves(self, rank: tuple) -> bool:
        if self.best is None:
            return True
        best = tuple(self.best["rank"])
        delta = self.cfg["train"]["min_delta"]
        if delta > 0:
            return rank[0] > best[0] + delta
        return rank > best

    def _early_stop(self) -> dict | None:
        patience = self.cfg["train"]["patience"]
        if not patience or self.best is None:
            return None
        waited = self.epoch - int(self.best["epoch"])
        if waited < patience:
            return None
        delta = self.cfg["train"]["min_delta"]
        return {"epoch": self.epoch, "best_epoch": int(self.best["epoch"]),
                "reason": f"{self.best['metric']} has not improved"
                          + (f" by more than {delta:g}" if delta else "")
                          + f" for {plural(waited, 'epoch')} (patience {patience})"}

    def _summary_metrics(self, row: dict) -> dict:
        return {k: v for k, v in row.items() if k.startswith("val_") or k == "epoch"}

    def _epoch_line(self, row: dict) -> str:
        def num(v, spec):
            return format(v, spec) if isinstance(v, float) else str(v)

        parts = [f"epoch {row['epoch']:>3}", f"loss {num(row['train_loss'], '.4f')}"]
        if "val_accuracy" in row:
            parts.append(f"val acc {row['val_accuracy'] * 100:.2f}%")
        if "val_loss" in row and ("val_accuracy" not in row or self.verbose):
            parts.append(f"val loss {num(row['val_loss'], '.4f')}")
        if "val_r2" in row:
            parts.append(f"val R² {num(row['val_r2'], '.4f')}")
        if "val_tar_far1e-2" in row:  # an embedding: open-set verification on validation
            parts.append(f"val TAR@FAR1e-2 {num(row['val_tar_far1e-2'], '.4f')}")
        if self.verbose:
            parts.extend(f"{k[4:]} {num(v, '.4g')}" for k, v in row.items()
                         if k in ("val_mae", "val_rmse"))
            parts.append(f"peak {row['peak_bytes'] / 2**20:.1f} MiB")
        parts.append(f"lr {row['lr']:.2e}")
        parts.append(f"{row['time_s']:.1f}s")
        rates = [v for k, v in row.items() if k.startswith("val_fire_rate.")]
        if rates:
            parts.append(f"fire {100 * sum(rates) / len(rates):.1f}%")
        if row.get("skipped_steps"):
            parts.append(f"skipped {row['skipped_steps']}")
        return "  ".join(parts)

    def _finish(self, seconds: float, tracker) -> dict:
        best_path = self.out / "best.ckpt"
        keep = self.cfg["train"]["keep"]
        result_path = best_path if keep == "best" else self.out / "last.ckpt"
        test = {}
        if keep == "best" and best_path.exists() and self.best is not None:
            ck = load_checkpoint(best_path)
            current = self.amp.fp32_state_dict()
            self.amp.load_fp32_state_dict(ck["state"])
            test = self.evaluate(self.data.test)
            # The best checkpoint carries its final test metrics for the exported model.
            metrics = {**self._summary_metrics(self.history[self.best["epoch"] - 1]),
                       **{f"test_{k}": v for k, v in test.items()}}
            self._rewrite_metadata(best_path, metrics)
            self.amp.load_fp32_state_dict(current)
        elif keep == "last" and self.history:
            test = self.evaluate(self.data.test)
            metrics = {**self._summary_metrics(self.history[-1]),
                       **{f"test_{k}": v for k, v in test.items()}}
            self._rewrite_metadata(result_path, metrics)
        report = tracker.report()
        gpu = backend.gpu_pool_stats(self.device) if self.device.kind == "cuda" else None
        if self.gpu_peak is not None:
            self.gpu_peak.close()
        result = {
            "run_dir": str(self.out),
            "best_checkpoint": str(best_path),
            "last_checkpoint": str(self.out / "last.ckpt"),
            "result_checkpoint": str(result_path),
            "keep": keep,
            "stopped_early": self.stopped,
            "epochs": self.epoch,
            "steps": self.step,
            "seconds": round(seconds, 2),
            "device": str(self.device),
            "precision": self.precision,
            "micro_batch": self.micro_batch,
            "accumulation": math.ceil(self.batch_size / self.micro_batch),
            "checkpoint_segments": self.segments,
            "fp16_activations": self.fp16_activations,
            "best": self.best,
            "test": test,
            "final": self.history[-1] if self.history else {},
            "memory": {k: v for k, v in report.items() if k != "table"},
            "memory_table": report["table"],
            "gpu_pool": gpu,
            "gpu_memory": self.gpu_peak.report() if self.gpu_peak is not None else None,
            "plan": self.plan.describe() if self.plan else None,
            "spiking": nn_spiking.summary(self.model, self.data.input_shape, self.precision),
            "trainable": memory.trainable_summary(
                self.amp.master_params(), self._slots(),
                [(n, p) for n, p in self.amp.master_params() if not lora.is_adapter(n)]),
        }
        with open(self.out / "summary.json.tmp", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, default=str)
        os.replace(self.out / "summary.json.tmp", self.out / "summary.json")
        return result

    def _slots(self) -> int:
        h = self.optimizer.hyper  # state arrays per trained parameter
        return 2 if h["adaptive"] else 1 if h["momentum"] else 0

    def _rewrite_metadata(self, path: Path, metrics: dict) -> None:
        from pocket.formats.container import read_container, write_container

        with read_container(path, expect_kind="checkpoint") as c:
            graph = c.graph
            graph.metadata = {**graph.metadata, "metrics": metrics}
            if self.task == task_embed.TASK:
                graph.metadata.update(task_embed.metadata(self, metrics))
            tensors = {k: np.array(v) for k, v in c.tensors.items()}
            meta = c.meta
        write_container(path, kind="checkpoint", tensors=tensors, graph=graph, meta=meta)

