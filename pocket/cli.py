"""The `pocket` command: thin. Each command parses, calls one function, renders the result.

Heavy imports live inside the commands so `pocket --help` stays instant and `pocket infer`
on a device never loads the trainer. Exit codes: 0 ok, 1 a check failed, 2 usage, 3 bad input
or environment (one `Error:` line; the traceback only with POCKET_DEBUG=1).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys

import click

from pocket import __version__

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 3


def _debug() -> bool:
    return os.environ.get("POCKET_DEBUG", "") not in ("", "0")


def _fail(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn):
    """Turn the errors a user can cause into one line and exit 3; keep bugs distinguishable."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from pocket.errors import PocketError

        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt as e:
            click.echo(str(e) or "Interrupted.", err=True)
            sys.exit(130)
        except PocketError as e:
            if _debug():
                raise
            _fail(str(e), EXIT_BAD_INPUT)
        except FileNotFoundError as e:
            if _debug():
                raise
            _fail(f"{e.filename or e}: no such file; check the path", EXIT_BAD_INPUT)
        except (PermissionError, IsADirectoryError, NotADirectoryError) as e:
            if _debug():
                raise
            _fail(f"{e.filename or ''}: {e.strerror or e}", EXIT_BAD_INPUT)
        except MemoryError:
            if _debug():
                raise
            _fail("out of memory; try a smaller --batch-size or a --memory-budget", EXIT_BAD_INPUT)
        except Exception as e:  # noqa: BLE001 - a bug: say so in one line, trace only on request
            if _debug():
                raise
            _fail(f"unexpected {type(e).__name__}: {e} (this is a bug in pocket; rerun with "
                  "POCKET_DEBUG=1 for the traceback and report it)", EXIT_CHECK_FAILED)

    return wrapper


def emit(result: dict, as_json: bool, render) -> None:
    """--json prints exactly one JSON object on stdout; otherwise the rendered text."""
    if as_json:
        click.echo(json.dumps(result, indent=None, default=_json_default))
    else:
        click.echo(render(result))


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="pocket")
def main() -> None:
    """pocket: train a real network on a small GPU or a CPU, ship it int8 to a small device.

    \b
      pocket train examples/digits_cnn.toml        -> runs/digits_cnn/best.ckpt
      pocket export runs/digits_cnn/best.ckpt --int8 -> model.int8.bin
      pocket infer model.int8.bin digit.png         -> 7 (0.98)
      pocket compare best.ckpt --bin model.int8.bin --onnx model.int8.onnx

    Set POCKET_DEBUG=1 to see tracebacks.
    """


@main.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--data", "data", metavar="SRC",
              help="Dataset: digits, mnist[:PATH], cifar10[:PATH], csv:PATH, npz:PATH, folder:PATH, "
                   "timeseries:PATH.")
@click.option("--epochs", type=click.IntRange(min=1),
              help="Number of epochs (with --resume: extends the run).")
@click.option("--batch-size", type=click.IntRange(min=1), help="Samples per optimizer step.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), help="Peak learning rate.")
@click.option("--device", metavar="auto|cpu|cuda[:N]", help="Where to train (default auto).")
@click.option("--memory-budget", metavar="SIZE",
              help="Plan micro-batch, accumulation, checkpointing and precision to fit, e.g. 4GiB.")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]),
              help="Compute precision (fp16 keeps fp32 master weights; no bf16: NumPy/CuPy lack it).")
@click.option("--out", "out", type=click.Path(file_okay=False), metavar="RUN_DIR",
              help="Run folder for checkpoints and metrics (default runs/<config name>).")
@click.option("--resume", type=click.Path(dir_okay=False), metavar="CKPT",
              help="Continue the run this checkpoint belongs to, in its folder, with its config.")
@click.option("--force", is_flag=True,
              help="Overwrite the run folder if it already holds a run (refused otherwise).")
@click.option("--seed", type=int, help="Random seed (weights, shuffling, dropout).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or epoch lines on stderr.")
@click.option("-v", "--verbose", is_flag=True,
              help="More per epoch on stderr: every validation metric, peak memory.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object on stdout; progress still goes to stderr.")
@handle_errors
def train(config, as_json, quiet, verbose, **flags):
    """Train the model described by CONFIG (TOML, or YAML: .yaml/.yml); flags override the file.

    Writes RUN_DIR/best.ckpt, RUN_DIR/last.ckpt (before the first step and after every
    epoch), RUN_DIR/metrics.jsonl (one line per epoch) and summary.json, then prints the final
    metrics and the memory report by category. TensorBoard event files go to
    RUN_DIR/tensorboard when tensorboardX is installed (pip install 'pocketnn[tensorboard]').

    \b
    A new run refuses a RUN_DIR that already holds a run: resume it, choose
    another --out, or pass --force to overwrite it.
    \b
    pocket train --resume RUN_DIR/last.ckpt continues that run exactly (bitwise
    on the CPU): config, epochs, schedule and folder come from the checkpoint;
    CONFIG is then optional, --epochs extends the run, --device moves it, and
    other flags must repeat the run's values. Ctrl-C prints the resume command.

    Early stopping and the run's result: [train] patience, min_delta, monitor
    (auto, val_loss, val_accuracy, val_r2, ...) and keep = "best" | "last".
    Curves: pocket plot RUN_DIR writes RUN_DIR/plot.png.
    """
    from pocket.train.run import render, train_from_config

    if quiet and verbose:
        raise click.UsageError("choose one of --quiet and --verbose")
    if config is None and not flags.get("resume"):
        raise click.UsageError("give a CONFIG file (or --resume RUN_DIR/last.ckpt)")
    overrides = {k: v for k, v in flags.items() if v is not None and v is not False}
    result = train_from_config(config, overrides, quiet=quiet, verbose=verbose)
    emit(result, as_json, render)


@main.command()
@click.argument("run_dir", metavar="RUN", type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="OUT.png",
              help="Where to write the PNG (default RUN/plot.png).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handle_errors
def plot(run_dir, output, as_json):
    """Draw a run's loss, metrics, learning rate and memory per epoch as a PNG.

    RUN is a run folder (or its metrics.jsonl). Needs matplotlib: pip install 'pocketnn[plot]'.
    """
    from pocket.plot import plot_run, render

    emit(plot_run(run_dir, output), as_json, render)


@main.command()
@click.argument("ckpt", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Output file (default next to the checkpoint: model[.int8].bin|onnx).")
@click.option("--format", "fmt", type=click.Choice(["bin", "onnx"]),
              help="pocket container for the edge engine, or ONNX (default: from -o, else bin).")
@click.option("--int8", is_flag=True, help="Quantize weights (per channel) and activations to int8.")
@click.option("--calib-samples", type=click.IntRange(min=1), metavar="N",
              help="Calibration samples for int8 activation scales (from the checkpoint).")
@click.option("--calib", "calib_path", type=click.Path(dir_okay=False), metavar="X.npz",
              help="Calibrate on array `x` of this .npz instead of the checkpoint's samples.")
@click.option("--max-layer-error", type=click.FloatRange(min=0, min_open=True), metavar="F",
              help="int8 accuracy guard: layers whose relative output error exceeds F stay "
                   "fp32 (default 0.2).")
@click.option("--calibration", "calib_method",
              type=click.Choice(["minmax", "percentile", "mse", "entropy"]),
              help="How int8 activation ranges are chosen: the observed min/max (default), a "
                   "percentile, or the clip with the least squared error or KL divergence.")
@click.option("--percentile", type=click.FloatRange(min=50, max=100, min_open=True),
              metavar="P", help="Percentile for --calibration percentile (default 99.99).")
@click.option("--int8-target", type=float, metavar="SQNR_DB",
              help="Keep the most sensitive layers fp32 until the int8 model's output SQNR "
                   "against fp32 reaches this (on the sensitivity samples).")
@click.option("--sensitivity-samples", type=click.IntRange(min=0), metavar="N",
              help="Report each layer's int8 sensitivity (the output SQNR with it alone in "
                   "int8), measured on N calibration samples (default: only with --int8-target, "
                   "on 16).")
@click.option("--json", "as_json", is_flag=True, help="Print the export report as one JSON object.")
@handle_errors
def export(ckpt, output, fmt, int8, calib_samples, calib_path, max_layer_error, calib_method,
           percentile, int8_target, sensitivity_samples, as_json):
    """Turn a training checkpoint into a deployable model (.bin or .onnx).

    Folds batchnorm, fuses activations, drops dropout; with --int8 quantizes weights per
    channel and activations with scales calibrated on the checkpoint's training samples.
    """
    from pocket.export.app import export as run_export
    from pocket.export.app import render
    from pocket.formats.sniff import check_file

    check_file(ckpt, "checkpoint")
    report = run_export(ckpt, output, fmt=fmt, int8=int8, calib_samples=calib_samples,
                        calib_path=calib_path, max_layer_error=max_layer_error,
                        calib_method=calib_method, percentile=percentile,
                        int8_target=int8_target, sensitivity_samples=sensitivity_samples)
    emit(report, as_json, render)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("inputs", nargs=-1)
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Largest batch the engine plans its memory for; a folder's images run in "
                   "batches of this size.")
@click.option("--top-k", type=click.IntRange(min=1), default=1, show_default=True,
              help="Classes to show per input.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="OUT.npy",
              help="Also save the raw outputs as .npy.")
@click.option("--bench", type=click.IntRange(min=0), default=0, metavar="N",
              help="Time N runs and report the median latency.")
@click.option("--warmup", is_flag=True,
              help="Compile every kernel now (into NUMBA_CACHE_DIR) so later starts are fast.")
@click.option("--sep", metavar="CHAR",
              help="CSV separator (default: the most frequent of , ; and tab in the header).")
@click.option("--similarity", is_flag=True,
              help="Embedding models: the cosine similarity of two inputs and the verdict "
                   "(same / different) at the threshold stored in the model.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handle_errors
def infer(model, inputs, threads, batch_size, top_k, output, bench, warmup, sep, similarity,
          as_json):
    """Run MODEL (.bin) on INPUT files: .npy/.npz arrays, images or folders of them, CSV rows,
    or - for standard input (any of those, told apart by content).

    Without INPUT, --warmup and --bench run on a synthetic sample of the model's shape.

    A short run answers from the NumPy reference interpreter while it is quicker than starting
    Numba (about 0.4 s on a desktop, more on a Pi); after 0.25 s of such calls, or for a batch
    of more than 8, the engine switches to its compiled kernels. --warmup and --bench start
    with the kernels.
    """
    from pocket.infer.app import infer as run_infer
    from pocket.infer.app import render

    if not inputs and not warmup and not bench:
        raise click.UsageError("give at least one INPUT (or --warmup / --bench)")
    with _model_file(model) as path:
        result = run_infer(path, list(inputs), threads=threads, batch_size=batch_size,
                           top_k=top_k, output=output, bench=bench, warmup=warmup, sep=sep,
                           similarity=similarity)
    result["model"] = str(model)
    emit(result, as_json, render)


@main.command()
@click.argument("ckpt", type=click.Path(dir_okay=False))
@click.option("--bin", "bin_path", type=click.Path(dir_okay=False), metavar="MODEL.bin",
              help="A .bin export to check with the edge engine.")
@click.option("--onnx", "onnx_path", type=click.Path(dir_okay=False), metavar="MODEL.onnx",
              help="An ONNX export to check with onnxruntime.")
@click.option("--data", "data", metavar="SRC", help="Labelled dataset (its test split).")
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False), metavar="X.npy",
              help="Model-ready inputs.")
@click.option("--random", "random_n", type=click.IntRange(min=1), metavar="N",
              help="N random inputs of the model's shape.")
@click.option("--limit", type=click.IntRange(min=1), help="Use at most this many samples.")
@click.option("--atol", type=float, help="Gate: max abs error (default by precision).")
@click.option("--rtol", type=float, help="Gate: max error relative to the output range.")
@click.option("--min-agreement", type=click.FloatRange(0, 1), help="Gate: top-1 agreement.")
@click.option("--max-count-mismatch", type=click.FloatRange(0, 1),
              help="Gate (spike-count models): share of samples whose counts may differ.")
@click.option("--min-cosine", type=click.FloatRange(-1, 1),
              help="Gate (embedding models): the least per-sample cosine similarity; "
                   "--min-agreement is then retrieval (nearest-neighbour) agreement.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handle_errors
def compare(ckpt, bin_path, onnx_path, data, inputs_path, random_n, limit, atol, rtol,
            min_agreement, max_count_mismatch, min_cosine, as_json):
    """Prove the exports compute what the training model computes; exit 1 when a gate fails."""
    from pocket.compare import compare as run_compare
    from pocket.compare import render
    from pocket.formats.sniff import check_file

    if check_file(ckpt, "checkpoint", allow_onnx=True):
        # An ONNX model from elsewhere: onnxruntime against its import, no checkpoint.
        from pocket.compare import compare_onnx

        if bin_path:
            check_file(bin_path, "model file")
        if onnx_path or data:
            raise click.UsageError("comparing an ONNX model takes --bin, --inputs or --random; "
                                   "not --onnx or --data")
        result = compare_onnx(ckpt, bin_path=bin_path, inputs_path=inputs_path,
                              random_n=random_n, limit=limit, atol=atol, rtol=rtol,
                              min_agreement=min_agreement)
        emit(result, as_json, render)
        if not result["passed"]:
            sys.exit(EXIT_CHECK_FAILED)
        return
    if bin_path:
        check_file(bin_path, "model file")
    if not bin_path and not onnx_path:
        raise click.UsageError("give --bin and/or --onnx to compare against the checkpoint")
    if sum(x is not None for x in (data, inputs_path, random_n)) > 1:
        raise click.UsageError("choose one of --data, --inputs, --random")
    result = run_compare(ckpt, bin_path=bin_path, onnx_path=onnx_path, data=data,
                         inputs_path=inputs_path, random_n=random_n, limit=limit, atol=atol,
                         rtol=rtol, min_agreement=min_agreement,
                         max_count_mismatch=max_count_mismatch, min_cosine=min_cosine)
    emit(result, as_json, render)
    if not result["passed"]:
        sys.exit(EXIT_CHECK_FAILED)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--routes", "routes", is_flag=True,
              help="Plan the model and show each conv/linear's engine route on this machine.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handle_errors
def inspect(file, routes, as_json):
    """Show a .bin or .ckpt: header, graph, tensors, metadata. Checks every byte.

    With --routes (a model .bin): per conv2d/linear layer, the geometry that decided, the route
    the engine takes on this machine (POCKET_ROUTE forces one), its scratch bytes and the bytes
    of weights it keeps in another layout (prepared once, at batch 1 and max_batch here)."""
    with _model_file(file) as path:
        if routes:
            from pocket.infer.engine import Engine
            from pocket.infer.plan import Cpu

            with Engine(path) as eng:
                for n in sorted({1, eng.max_batch}):
                    eng.bind(n)
                result = {"file": str(file), "max_batch": eng.max_batch,
                          "cpu": vars(Cpu.host()), "routes": eng.routes(),
                          "arena_bytes": eng.arena_bytes, "prepared_bytes": eng.prepared_bytes}
            emit(result, as_json, _render_routes)
            return
        from pocket.formats.describe import describe, render

        result = describe(path)
    if path != file:
        result = {**result, "path": str(file)}
    emit(result, as_json, render)


def _model_file(path: str):
    """The .bin to open for MODEL: itself, or an ONNX file imported for the command's run."""
    from pocket.formats.sniff import check_file

    if check_file(path, "model file", allow_onnx=True):
        from pocket.importer.app import as_bin

        return as_bin(path)
    return contextlib.nullcontext(path)


@main.command("import")
@click.argument("model", metavar="MODEL.onnx", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="OUT.bin",
              help="Where to write (default: MODEL.bin, or MODEL.int8.bin with --int8).")
@click.option("--int8", is_flag=True, help="Quantize the fp32 import with pocket's calibration.")
@click.option("--calib", "calib_path", type=click.Path(dir_okay=False), metavar="X.npz",
              help="Calibration inputs for --int8: an .npz with an array `x`.")
@click.option("--calib-samples", type=click.IntRange(min=1), metavar="N",
              help="Use at most N calibration samples (default 256).")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="[NAME=]D1,D2,...",
              help="Fix an input's shape (N keeps the batch dynamic); repeat per input.")
@click.option("--json", "as_json", is_flag=True, help="Print the import report as one JSON object.")
@handle_errors
def import_(model, output, int8, calib_path, calib_samples, input_shapes, as_json):
    """Turn an ONNX model trained elsewhere (PyTorch, Keras...) into a pocket .bin.

    Folds constants, BatchNormalization, Identity, Dropout and shape arithmetic; QDQ models
    (onnxruntime's quantize_static) become int8 layers. An unsupported node is an error that
    lists every one of them, and nothing is written."""
    from pocket.importer.app import render, run

    if calib_path and not int8:
        raise click.UsageError("--calib goes with --int8")
    report = run(model, output, int8=int8, calib_path=calib_path, calib_samples=calib_samples,
                 input_shapes=list(input_shapes))
    emit(report, as_json, render)


def _render_routes(r: dict) -> str:
    cpu = ", ".join(k for k, on in r["cpu"].items() if on) or "portable kernels"
    lines = [f"{r['file']}: routes at max_batch {r['max_batch']} on this CPU ({cpu})"]
    for row in r["routes"]:
        g = row["geometry"]
        if row["op"] == "conv2d":
            geo = (f"{'x'.join(map(str, g['input']))} -> {'x'.join(map(str, g['output']))} "
                   f"k{'x'.join(map(str, g['kernel']))} s{'x'.join(map(str, g['stride']))} "
                   f"p{'x'.join(map(str, g['padding']))} d{'x'.join(map(str, g['dilation']))} g{g['groups']}")
        else:
            geo = f"{g['rows']} rows, {g['k']} -> {g['o']}"
        small = f" (batch 1: {row['batch_1']})" if "batch_1" in row else ""
        lines.append(f"  {row['node']:<16} {row['op']:<7} {row['dtype']:<4} {geo:<44} "
                     f"{row['route']}{small}  scratch {row['scratch_bytes']} B"
                     + (f", prepared {row['prepared_bytes']} B" if row.get("prepared_bytes") else ""))
    if "arena_bytes" in r:
        lines.append(f"  arena {r['arena_bytes']} B; weights prepared in another layout "
                     f"{r['prepared_bytes']} B (beyond the file's mmap)")
    return "\n".join(lines)


@main.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (fields: README).")
@handle_errors
def doctor(model, as_json):
    """Say what this machine offers pocket: CPU features and the engine routes they give, the
    Numba cache, installed extras, CuPy/CUDA and each GPU; with MODEL, whether it runs here.
    Exit 1 when MODEL will not run here."""
    from pocket.doctor import doctor as run_doctor
    from pocket.doctor import render

    with _model_file(model) if model is not None else contextlib.nullcontext() as path:
        result = run_doctor(path)
    if result["model"] is not None and path != model:
        result["model"] = {**result["model"], "path": str(model)}
    emit(result, as_json, render)
    if result["model"] is not None and not result["model"]["runs_here"]:
        sys.exit(EXIT_CHECK_FAILED)


if __name__ == "__main__":
    main()
