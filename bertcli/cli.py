"""The `bertcli` command line: parse flags, run the command (checks before torch loads: preflight.py), and turn
every error into one line on stderr and its exit code: 2 usage, config or input, 1 run-time, 128 + N signal N."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shlex
import sys
import threading
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

try:  # Typer >= 0.2x runs on its own vendored copy of Click: catch that one's exceptions
    from typer import _click as click
except ImportError:  # older Typer uses the click package
    import click

from bertcli import __version__, console
from bertcli.console import error as err
from bertcli.errors import BertcliError, Interrupted, PipeClosed, RunError, UsageError

app = typer.Typer(
    name="bertcli",
    help="Pretrain BERT encoders and put them to use.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # Click's plain help: wrapped, never cut with "…" at 80 columns, flags without <bool>
)
Preset = Enum("Preset", {name: name for name in ("tiny", "small", "base", "large")}, type=str)
SET = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a config value, e.g. --set train.max_steps=200.")
CONFIG = typer.Option(..., "--config", "-c", metavar="FILE", help="The run's config.yaml (see `bertcli init`).")


def out(text: str) -> None:
    """Write data to stdout; a closed pipe ends the command quietly with exit 0."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        raise PipeClosed from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise RunError(f"stdout: disk full ({exc.strerror}); what it holds of this output is incomplete") from None
        raise


def command_line(*args: str | Path) -> str:
    """A bertcli command to copy and paste: paths relative to the current folder when inside it, quoted."""

    def shown(arg: str | Path) -> str:
        if isinstance(arg, Path) and arg.is_absolute():
            with contextlib.suppress(ValueError):
                return str(arg.resolve().relative_to(Path.cwd().resolve()))
        return str(arg)

    return shlex.join(["bertcli", *map(shown, args)])


def _version(value: bool) -> None:
    if value:
        print(f"bertcli {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors (accepted anywhere on the line)."),
) -> None:
    """Pretrain BERT encoders and put them to use: init -> (prepare) -> pretrain -> inspect."""


@app.command(short_help="Write DIR/config.yaml from a preset, every field commented.")
def init(
    directory: Path = typer.Argument(..., metavar="DIR", help="Folder to create; config.yaml is written inside it."),
    preset: Preset = typer.Option(Preset("tiny"), "--preset", "-p", help="tiny (d2l's sizes), small, base, large."),
    corpus: Optional[str] = typer.Option(
        None, "--corpus", metavar="PATH", help="Text/JSONL file or folder, or sample (the default) or synthetic."
    ),
    init_from: Optional[Path] = typer.Option(
        None, "--init-from", metavar="FOLDER", help="Continue from a Hugging Face BERT folder or a bertcli checkpoint."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite a bertcli config.yaml (nothing else is touched)."),
    overrides: list[str] = SET,
) -> None:
    """Scaffold a run: write DIR/config.yaml from a preset, every field commented."""
    from bertcli import preflight
    from bertcli.config_write import write_run_config

    cfg, header = preflight.init(directory, preset.value, corpus=corpus, init_from=init_from, overrides=overrides)
    path, m = write_run_config(directory, cfg, header, force=force), cfg.model
    if init_from is not None:
        from bertcli.export import described
        from bertcli.resume import set_aside_note

        origin, note = f"from {described(Path(m.init_from))}", set_aside_note(Path(m.init_from))
    else:
        origin, note = f"preset {preset.value}", None
    shape = f"{m.num_hidden_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads"
    err(f"wrote {path} ({origin}: {shape}, sequences of {cfg.data.max_seq_length})")
    for line in [f"warning: {w}" for w in cfg.warnings()] + ([f"note: {note}"] if note else []):
        err(line)
    err(f"next: {command_line('pretrain', '--config', path)}")


@app.command(short_help="Train the tokenizer and write token shards for the corpus.")
def prepare(
    config: Path = CONFIG,
    overrides: list[str] = SET,
    force: bool = typer.Option(False, "--force", help="Prepare everything again, with a new tokenizer."),
    workers: int = typer.Option(0, "--workers", "-w", metavar="N", min=0, help="Processes (0: the cores available)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Train the tokenizer and write token shards for the config's corpus (pretrain does this when needed)."""
    from bertcli import store
    from bertcli.data.prepare import prepare as run
    from bertcli.data.prepare import prepared_lock
    from bertcli.resolve import check_outputs_apart, load_run
    from bertcli.resume import run_tokenizer

    cfg = load_run(config, overrides)
    check_outputs_apart(cfg)
    if cfg.data.corpus == "synthetic":
        raise UsageError("data.corpus is synthetic: there is nothing to prepare")
    # Never under the run's pretrain, nor while another run prepares or reads the same prepared folder.
    with store.run_lock(Path(cfg.output_dir)), prepared_lock(cfg):
        folder = run(cfg, quiet=quiet, force=force, workers=workers or None, run_tokenizer=run_tokenizer(cfg, say=True))
    again = [a for o in overrides for a in ("--set", o)]  # the same data: the same overrides
    err(f"next: {command_line('inspect', folder)}   or   {command_line('pretrain', '--config', config, *again)}")


@app.command(short_help="Pretrain BERT (MLM + NSP), resuming from the newest checkpoint.")
def pretrain(
    config: Path = CONFIG,
    overrides: list[str] = SET,
    resume: str = typer.Option("auto", "--resume", metavar="auto|never|PATH", help="Or a checkpoint folder."),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output: errors, warnings, the summary only."),
    stop_at: Optional[int] = typer.Option(None, "--stop-at", min=1, metavar="N", help="Save and stop after step N."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print the whole resolved config at the start too."),
) -> None:
    """Pretrain BERT (MLM + NSP), resuming from the newest checkpoint with the run's --set values (until given again)."""
    from bertcli import preflight
    from bertcli.resume import is_foreign, run_config
    from bertcli.stopping import stopping

    preflight.launch_env()
    if device is not None:
        preflight.check_device(device, "--device")
    with console.quiet(quiet):  # (resolving may say where a gone init_from's architecture comes from)
        cfg, kept_and_given = run_config(config, overrides, resume)
    if device is not None:  # this machine's, not the run's: never recorded
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device=device))
    with stopping("nothing half-written was kept (writes are atomic)"):
        preflight.pretrain(cfg, resume, device_flag=device is not None)
        from bertcli.trainer import Start
        from bertcli.trainer import pretrain as run

        start = Start(quiet=quiet, verbose=verbose, overrides=kept_and_given)
        result = run(cfg, resume=resume, quiet=quiet, stop_at=stop_at, start=start)
    if not result["is_main"]:
        return  # under torchrun, rank 0 reports for everyone
    metrics, ckpt = result["metrics"], Path(result["checkpoint"])
    shown = "".join(f", {k} {metrics[k]:.4g}" for k in ("mlm_loss", "mlm_acc", "nsp_acc") if k in metrics)
    err(f"done: step {result['step']:,}, {result['tokens_seen']:,} tokens seen{shown}")
    err(f"checkpoint: {ckpt}")
    # Nothing to do from another run's checkpoint left this run as it was: that checkpoint is what to look at.
    err(f"next: {command_line('inspect', ckpt if is_foreign(ckpt, Path(cfg.output_dir)) else Path(cfg.output_dir))}")


@app.command("inspect", short_help="Explain a config, a run, a checkpoint, prepared data or a model.")
def inspect_command(
    path: Path = typer.Argument(..., metavar="PATH", help="A config file, or a run, checkpoint, data or model folder."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Explain a config, a run, a checkpoint, prepared data or a model: sizes, parameters, FLOPs, progress, data."""
    from bertcli.summary import format_report, inspect_path

    report = inspect_path(path)
    out(json.dumps(report) if as_json else format_report(report))


@app.command(short_help="Write a checkpoint as a Hugging Face folder (BertForPreTraining).")
def export(
    source: Path = typer.Argument(..., metavar="CHECKPOINT_OR_RUN", help="A checkpoint, or a run (best, else newest)."),
    out_dir: Path = typer.Argument(..., metavar="OUT_DIR", help="Folder to write: config.json, weights, tokenizer."),
    force: bool = typer.Option(False, "--force", help="Replace OUT_DIR if it holds an earlier export."),
) -> None:
    """Write a checkpoint as a Hugging Face folder (BertForPreTraining, loads with no custom code)."""
    from bertcli.export import described, export_checkpoint
    from bertcli.resume import set_aside_note
    from bertcli.stopping import stopping

    with stopping(f"{out_dir} was not written (what was there is intact)"):
        ckpt, folder = export_checkpoint(source, out_dir, force=force)
    if note := set_aside_note(ckpt):
        err(f"note: {note}")
    origin = f" from {described(ckpt)}" if ckpt != source else ""  # a run folder: the checkpoint it chose
    err(f"wrote {folder}{origin}; load it with transformers.BertForPreTraining.from_pretrained({str(folder)!r})")


POOLING = typer.Option(None, "--pooling", metavar="cls|mean|max|pooler", help="Default: the folder's own, else mean.")
NORMALIZE = typer.Option(None, "--normalize/--no-normalize", help="Unit-length vectors (default: the folder's).")
BATCH = typer.Option(32, "--batch-size", min=1, metavar="N", help="Texts per forward pass, at most.")
DEVICE = typer.Option("auto", "--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N.")


@app.command(short_help="Turn lines of text into vectors, one row per line, streamed.")
def encode(
    model: Path = typer.Option(..., "--model", "-m", metavar="PATH", help="A run, checkpoint or Hugging Face folder."),
    inputs: list[str] = typer.Argument(None, metavar="FILE", help="Text files, one text a line ('-' or none: stdin)."),
    pooling: Optional[str] = POOLING,
    layer: int = typer.Option(-1, "--layer", metavar="N", help="0 = embeddings, 1..L, or from the end (-1 = last)."),
    normalize: Optional[bool] = NORMALIZE,
    fmt: Optional[str] = typer.Option(None, "--format", "-f", metavar="jsonl|tsv|npy", help="Default: from --output."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE", help="Written whole or not at all."),
    with_text: bool = typer.Option(False, "--with-text", help="Add the text to each row (tsv: escaped, first)."),
    tokens: bool = typer.Option(False, "--tokens", help="Per-token vectors (JSONL): tokens and one vector each."),
    pairs: bool = typer.Option(False, "--pairs", help="Lines are A<TAB>B sentence pairs (segment ids 0 and 1)."),
    strict_pairs: bool = typer.Option(False, "--strict-pairs", help="With --pairs, a line without a TAB is an error."),
    batch_size: int = BATCH,
    max_length: Optional[int] = typer.Option(None, "--max-length", min=2, metavar="N", help="Most tokens per text."),
    device: str = DEVICE,
    dtype: str = typer.Option("fp32", "--dtype", metavar="fp32|bf16|fp16", help="fp32, bf16 or fp16."),
    errors: str = typer.Option("strict", "--errors", metavar="strict|replace", help="Invalid UTF-8: error or replace."),
) -> None:
    """Turn lines of text into vectors: one row per input line, in input order, streamed."""
    from bertcli import preflight
    from bertcli.stopping import stopping

    flags = {"pooling": pooling, "layer": layer, "pairs": pairs, "strict_pairs": strict_pairs, "max_length": max_length}
    given = {"inputs": inputs or [], "device": device, "dtype": dtype, "errors": errors, **flags}
    fmt, output, hf = preflight.encode(model=model, output=output, fmt=fmt, with_text=with_text, tokens=tokens, **given)
    given |= {"output": output, "normalize": normalize, "per_token": tokens, "batch_size": batch_size}
    with stopping("nothing was written") as stopper:  # (torch's import and the model's load take seconds)
        from bertcli.encode import Writer, run

        run(model, hf=hf, writer=lambda: Writer(fmt, sys.stdout, output, with_text), stopper=stopper, **given)


@app.command("eval", short_help="Score a model: masked-LM figures on text, a linear probe on labeled texts.")
def eval_command(
    model: Path = typer.Argument(..., metavar="MODEL", help="A run, checkpoint or Hugging Face BERT folder."),
    text: list[str] = typer.Argument(None, metavar="TEXT", help="Text or JSONL files or folders (as prepare reads)."),
    probe: Optional[Path] = typer.Option(
        None, "--probe", metavar="TRAIN", help="Labeled texts for a linear probe: JSONL (text, label) or TSV."
    ),
    probe_test: Optional[Path] = typer.Option(
        None, "--probe-test", metavar="TEST", help="Score the probe on these (default: a seeded fifth of TRAIN)."
    ),
    seed: int = typer.Option(0, "--seed", min=0, metavar="N", help="Draws the masks, the probe's fold and split."),
    batch_size: int = BATCH,
    device: str = DEVICE,
) -> None:
    """Score a model: masked-LM figures on TEXT (fixed masks), a linear probe on labeled texts; JSON on stdout."""
    from bertcli import preflight
    from bertcli.stopping import stopping

    hf, files, train, test = preflight.evaluate(model, text or [], probe=probe, probe_test=probe_test, device=device)
    with stopping("nothing was written"):  # (torch's import and the model's load take seconds)
        from bertcli.evaluation import run, summary

        result = run(model, hf=hf, files=files, train=train, test=test, seed=seed, device=device, batch_size=batch_size)
    for line in summary(result):
        err(line)
    out(json.dumps(result))


# Per command: what a failed write leaves intact, and the setting that writes elsewhere.
WRITES = {
    "pretrain": ("earlier checkpoints are intact", "output_dir, data.prepared_dir"),
    "prepare": ("earlier prepared data is intact", "data.prepared_dir"),
    "export": ("nothing at OUT_DIR was changed", "OUT_DIR"),
    "encode": ("nothing at --output was changed", "--output"),
    "init": ("an existing config is intact", "DIR"),
}


def os_error_message(exc: OSError, command: str = "") -> str:
    """One line for a failed read or write of `command`, naming the final path where a temporary name failed."""
    from bertcli.layout import TEMPORARY

    parts = str(exc.filename).split("/")
    where = "/".join(m.group(2) if (m := TEMPORARY.fullmatch(p)) else p for p in parts) + ": " if exc.filename else ""
    intact, setting = WRITES.get(command, ("what was there is intact", "another folder"))
    kept = f"nothing half-written was kept and {intact}"
    if exc.errno == errno.EFBIG:
        return f"{where}file too large ({exc.strerror}: ulimit -f or the file system's largest); {kept}: raise the limit, or write elsewhere ({setting})"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{where}disk full ({exc.strerror}); {kept}: free space, or write to another disk ({setting}), then run the same command"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{where}{exc.strerror}; choose a folder you can write to ({setting})"
    return f"{where}{exc.strerror or exc}"


INTERRUPTED = "bertcli: interrupted; nothing half-written was kept (writes are atomic): run the same command again"


def error_lines(exc: BaseException, command: str, debug: bool) -> tuple[list[str], int]:
    """The lines to print for what ended the command, and its exit code (re-raised under --debug)."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        return [exc.ctx.get_help() if exc.ctx else "usage: bertcli COMMAND --help"], 2
    if isinstance(exc, click.exceptions.UsageError):
        see = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        return [f"bertcli: error: {exc.format_message()}{see}"], 2
    if isinstance(exc, click.exceptions.ClickException):
        return [f"bertcli: error: {exc.format_message()}"], exc.exit_code
    if isinstance(exc, (typer.Abort, KeyboardInterrupt)):
        if not isinstance(exc.__cause__, EOFError):  # Click turns an EOFError into Abort: a failure, not a Ctrl-C
            return [INTERRUPTED], 130
        exc = exc.__cause__
    if debug and not isinstance(exc, PipeClosed):
        raise exc
    if isinstance(exc, BertcliError):  # one line each, whatever a path holds
        prefix = "bertcli: " if isinstance(exc, Interrupted) else "bertcli: error: "
        return [prefix + p.replace("\r", "\\r").replace("\n", "\\n") for p in exc.problems], exc.exit_code
    if isinstance(exc, OSError):  # the disk, not the program: full, read-only, forbidden, missing
        return [f"bertcli: error: {os_error_message(exc, command)}"], 1
    first = str(exc).splitlines()[0] if str(exc) else ""
    return [f"bertcli: error: {type(exc).__name__}: {first} (run again with --debug for the traceback)"], 1


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or bool(os.environ.get("BERTCLI_DEBUG"))
    args = [a for a in args if a != "--debug"]
    try:
        code = typer.main.get_command(app).main(args, prog_name="bertcli", standalone_mode=False)
        if code == 130:  # Typer turns a KeyboardInterrupt (a second Ctrl-C) into exit code 130, silently
            raise KeyboardInterrupt
    except PipeClosed:  # the reader of stdout went away: not an error (stdout to /dev/null for the final flush)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    except BaseException as exc:  # noqa: BLE001  every failure is one line and an exit code
        if isinstance(exc, SystemExit):
            raise
        lines, code = error_lines(exc, next((a for a in args if not a.startswith("-")), ""), debug)
        # A stop is the job's: under torchrun rank 0 says it; an error is said by any process.
        for line in lines:
            (console.log if isinstance(exc, Interrupted) else err)(line)
    code = code if isinstance(code, int) else 0
    if argv is None and any(t.name == "bertcli-encode-input" and t.is_alive() for t in threading.enumerate()):
        # encode's input thread, blocked reading stdin, holds a lock that shutdown would abort on.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)
