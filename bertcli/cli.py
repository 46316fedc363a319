"""The `bertcli` command line: parse, call one function, map errors to exit codes.

Data goes to stdout; logs, progress and errors go to stderr. Exit codes: 0 success,
2 usage/config/input errors, 1 run-time errors, 130 interrupted. An error is one line
(`bertcli: error: ...`), with a traceback only under `--debug` (accepted anywhere).
"""

from __future__ import annotations

import contextlib
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
from bertcli.console import log
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


class Preset(str, Enum):
    tiny = "tiny"
    small = "small"
    base = "base"
    large = "large"


def out(text: str) -> None:
    """Write data to stdout; a closed pipe ends the command quietly with exit 0."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        raise PipeClosed from None
    except OSError as exc:  # a full disk or device under stdout: named as such (trial 18 P10)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise RunError(f"stdout: disk full ({exc.strerror}); what it holds of this output is incomplete") from None
        raise


def command_line(*args: str | Path) -> str:
    """A bertcli command to copy and paste: paths relative to the current folder when inside it,
    every argument quoted for the shell where it needs to be (spaces, quotes)."""

    def shown(arg: str | Path) -> str:
        if isinstance(arg, Path):
            try:
                return str(arg.resolve().relative_to(Path.cwd().resolve())) if arg.is_absolute() else str(arg)
            except ValueError:
                return str(arg)
        return arg

    return shlex.join(["bertcli", *map(shown, args)])


def _version(value: bool) -> None:
    if value:
        print(f"bertcli {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors (accepted anywhere on the line)."),
) -> None:
    """Pretrain BERT encoders and put them to use: init -> (prepare) -> pretrain -> inspect."""


SET = "KEY=VALUE"  # the metavar of --set
SET_HELP = "Override a config value, e.g. --set train.max_steps=200 (repeatable; values are YAML scalars)."


@app.command(short_help="Write DIR/config.yaml from a preset, every field commented.")
def init(
    directory: Path = typer.Argument(..., metavar="DIR", help="Folder to create; config.yaml is written inside it."),
    preset: Preset = typer.Option(
        Preset.tiny, "--preset", "-p", help="tiny (d2l textbook sizes), small, base (BERT-base) or large (BERT-large)."
    ),
    corpus: Optional[str] = typer.Option(
        None,
        "--corpus",
        metavar="PATH",
        help="Text/JSONL file or folder to train on, or sample (the bundled text, the default) or synthetic (a generated corpus for quick checks); ./sample for a file of that name.",
    ),
    init_from: Optional[Path] = typer.Option(
        None,
        "--init-from",
        metavar="FOLDER",
        help="Continue from a Hugging Face BERT folder or a bertcli checkpoint: its sizes, weights and tokenizer, and a learning rate for continuing (5e-5).",
    ),
    force: bool = typer.Option(
        False, "--force", help="Overwrite an existing bertcli config.yaml (nothing else in the folder is touched)."
    ),
    overrides: list[str] = typer.Option([], "--set", metavar=SET, help=SET_HELP),
) -> None:
    """Scaffold a run: write DIR/config.yaml from a preset, every field commented."""
    from bertcli import layout, preflight
    from bertcli.config_write import write_run_config

    cfg, header = preflight.init(directory, preset.value, corpus=corpus, init_from=init_from, overrides=overrides)
    path = write_run_config(directory, cfg, header, force=force)
    m = cfg.model
    sizes = f"preset {preset.value}"
    if init_from is not None:
        from bertcli.export import described

        sizes = f"from {described(Path(m.init_from))}"  # a checkpoint's step: a run's best moves
    err(
        f"wrote {path} ({sizes}: {m.num_hidden_layers} layers, hidden {m.hidden_size}, "
        f"{m.num_attention_heads} heads, sequences of {cfg.data.max_seq_length})"
    )
    for warning in cfg.warnings():
        err(f"warning: {warning}")
    if init_from is not None:
        from bertcli.adopt import source_note

        if note := source_note(Path(m.init_from)):
            err(f"note: {note}")
    if checkpoints := layout.list_checkpoints(directory):
        err(
            f"note: {directory} holds {len(checkpoints)} checkpoint(s) of a run: pretrain resumes the newest with these settings"
        )
    err(f"next: {command_line('pretrain', '--config', path)}")


@app.command(short_help="Train the tokenizer and write token shards for the corpus.")
def prepare(
    config: Path = typer.Option(..., "--config", "-c", metavar="FILE", help="The run's config.yaml."),
    overrides: list[str] = typer.Option([], "--set", metavar=SET, help=SET_HELP),
    force: bool = typer.Option(
        False,
        "--force",
        help="Prepare everything again, training a new tokenizer (unless the run's checkpoints fix it).",
    ),
    workers: int = typer.Option(
        0,
        "--workers",
        "-w",
        metavar="N",
        min=0,
        help="Processes that prepare the corpus, one core each; 0 (default): the cores available.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Train the tokenizer and write token shards for the config's corpus (pretrain does this when needed).
    Only what changed in the corpus since the last prepare is prepared again."""
    from bertcli import store
    from bertcli.data.prepare import prepare as run
    from bertcli.data.prepare import prepared_lock
    from bertcli.resolve import check_outputs_apart, load_run
    from bertcli.resume import run_tokenizer

    cfg = load_run(config, overrides)
    check_outputs_apart(cfg)
    if cfg.data.corpus == "synthetic":
        raise UsageError("data.corpus is synthetic: there is nothing to prepare")
    # Never under the run's pretrain, which trains on the data, nor while another run prepares or reads the same
    # prepared folder (runs with other output_dirs may share it).
    with store.run_lock(Path(cfg.output_dir)), prepared_lock(cfg):
        folder = run(cfg, quiet=quiet, force=force, workers=workers or None, run_tokenizer=run_tokenizer(cfg, say=True))
    again = [a for o in overrides for a in ("--set", o)]  # the same data: the same overrides
    err(f"next: {command_line('inspect', folder)}   or   {command_line('pretrain', '--config', config, *again)}")


@app.command(short_help="Pretrain BERT (MLM + NSP), resuming from the newest checkpoint.")
def pretrain(
    config: Path = typer.Option(
        ..., "--config", "-c", metavar="FILE", help="The run's config.yaml (see `bertcli init`)."
    ),
    overrides: list[str] = typer.Option([], "--set", metavar=SET, help=SET_HELP),
    resume: str = typer.Option(
        "auto",
        "--resume",
        metavar="auto|never|PATH",
        help="auto (newest checkpoint in output_dir, if any), never, or a checkpoint folder.",
    ),
    device: Optional[str] = typer.Option(
        None, "--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N (overrides train.device)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output; errors and the final summary only."),
    stop_at: Optional[int] = typer.Option(
        None,
        "--stop-at",
        min=1,
        metavar="N",
        help="Stop after this step with a checkpoint (the schedule still follows train.max_steps); rerun to continue.",
    ),
) -> None:
    """Pretrain BERT (MLM + NSP) as the config says, resuming from the newest checkpoint."""
    from bertcli import preflight
    from bertcli.resolve import load_run
    from bertcli.resume import is_foreign
    from bertcli.stopping import stopping

    preflight.launch_env()
    if device is not None:
        preflight.check_device(device, "--device")
    with console.quiet(quiet):  # (resolving may say where a gone init_from's architecture comes from)
        cfg = load_run(config, overrides + ([f"train.device={device}"] if device else []))
    with stopping("nothing half-written was kept (writes are atomic)"):
        preflight.pretrain(cfg, resume, device_flag=device is not None)
        from bertcli.trainer import pretrain as run

        result = run(cfg, resume=resume, quiet=quiet, stop_at=stop_at)
    if not result["is_main"]:
        return  # under torchrun, rank 0 reports for everyone
    metrics = result["metrics"]
    shown = ", ".join(f"{k} {metrics[k]:.4g}" for k in ("mlm_loss", "mlm_acc", "nsp_acc") if k in metrics)
    err(f"done: step {result['step']:,}, {result['tokens_seen']:,} tokens seen{'; ' + shown if shown else ''}")
    err(f"checkpoint: {result['checkpoint']}")
    # Nothing to do from another run's checkpoint left this run as it was: that checkpoint is what to look at.
    foreign = is_foreign(Path(result["checkpoint"]), Path(cfg.output_dir))
    err(f"next: {command_line('inspect', Path(result['checkpoint']) if foreign else Path(cfg.output_dir))}")


@app.command("inspect", short_help="Explain a config, a run, a checkpoint, prepared data or a model.")
def inspect_command(
    path: Path = typer.Argument(
        ..., metavar="PATH", help="A config file, a run folder, a checkpoint folder or a prepared-data folder."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Explain a config, a run, a checkpoint or prepared data: sizes, parameters, FLOPs, progress, corpus statistics."""
    if path.is_file():  # a config: checked before summary loads torch (3-4 s), so that a bad one is refused at once
        from bertcli.resolve import load_run

        load_run(path, adopt_init_from=False)
    from bertcli.summary import format_report, inspect_path

    report = inspect_path(path)
    out(json.dumps(report) if as_json else format_report(report))


@app.command(short_help="Write a checkpoint as a Hugging Face folder (BertForPreTraining).")
def export(
    source: Path = typer.Argument(
        ...,
        metavar="CHECKPOINT_OR_RUN",
        help="A checkpoint folder, or a run folder (its best checkpoint, else the newest).",
    ),
    out_dir: Path = typer.Argument(
        ..., metavar="OUT_DIR", help="Folder to write: config.json, model.safetensors and the tokenizer files."
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace OUT_DIR if it holds an earlier export (an empty one is used as it is)."
    ),
) -> None:
    """Write a checkpoint as a Hugging Face folder (BertForPreTraining, loads with no custom code)."""
    from bertcli.export import described, export_checkpoint
    from bertcli.resume import set_aside_note
    from bertcli.stopping import stopping

    with stopping(f"{out_dir} was not written (what was there is intact)"):
        ckpt, folder = export_checkpoint(source, out_dir, force=force)
    origin = f" from {described(ckpt)}" if ckpt != source else ""  # a run folder: the checkpoint it chose
    if note := set_aside_note(ckpt):
        err(f"note: {note}")
    err(f"wrote {folder}{origin}; load it with transformers.BertForPreTraining.from_pretrained({str(folder)!r})")


@app.command(short_help="Turn lines of text into vectors, one row per line, streamed.")
def encode(
    model: Path = typer.Option(
        ...,
        "--model",
        "-m",
        metavar="PATH",
        help="A run folder, a checkpoint folder or a Hugging Face BERT folder (sentence-transformers too).",
    ),
    inputs: list[str] = typer.Argument(
        None, metavar="FILE", help="Text files, one text per line ('-' or none: stdin)."
    ),
    pooling: Optional[str] = typer.Option(
        None,
        "--pooling",
        metavar="cls|mean|max|pooler",
        help="How a line's vectors become one (mean and max over its non-padding positions). Default: a sentence-transformers folder's own, else cls.",
    ),
    layer: int = typer.Option(
        -1, "--layer", metavar="N", help="Layer to read: 0 = embeddings, 1..L, negative from the end (-1 = last)."
    ),
    normalize: Optional[bool] = typer.Option(
        None,
        "--normalize/--no-normalize",
        help="Scale each vector to unit length. Default: as a sentence-transformers folder says, else off.",
    ),
    fmt: Optional[str] = typer.Option(
        None, "--format", "-f", metavar="jsonl|tsv|npy", help="Default: from the --output suffix, else jsonl."
    ),
    output: Optional[Path] = typer.Option(
        None,
        "--output",
        "-o",
        metavar="FILE",
        help="Write the rows to this file, whole or not at all, instead of stdout; never an input, nor inside bertcli's own folders.",
    ),
    with_text: bool = typer.Option(
        False, "--with-text", help="Add the text to each row (tsv: the first column, TAB and backslash escaped)."
    ),
    tokens: bool = typer.Option(False, "--tokens", help="Per-token vectors (JSONL): tokens and one vector each."),
    pairs: bool = typer.Option(
        False,
        "--pairs",
        help="Lines are A<TAB>B sentence pairs, encoded with segment ids; a line without a TAB is one sentence.",
    ),
    strict_pairs: bool = typer.Option(False, "--strict-pairs", help="With --pairs, a line without a TAB is an error."),
    batch_size: int = typer.Option(
        32, "--batch-size", min=1, metavar="N", help="Texts per forward pass, at most (on a CPU fewer when long)."
    ),
    max_length: Optional[int] = typer.Option(
        None,
        "--max-length",
        min=2,
        metavar="N",
        help="Truncate longer texts (default: the folder's max_seq_length, else the length the model was trained at).",
    ),
    device: str = typer.Option("auto", "--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N."),
    dtype: str = typer.Option("fp32", "--dtype", metavar="fp32|bf16|fp16", help="fp32, bf16 or fp16."),
    errors: str = typer.Option(
        "strict",
        "--errors",
        metavar="strict|replace",
        help="strict: a line that is not UTF-8 is an error; replace: replace bad bytes.",
    ),
) -> None:
    """Turn lines of text into vectors: one row per input line, in input order, streamed."""
    from bertcli import preflight
    from bertcli.stopping import stopping

    fmt_name, output, hf = preflight.encode(
        model=model,
        inputs=inputs or [],
        output=output,
        fmt=fmt,
        with_text=with_text,
        tokens=tokens,
        pooling=pooling,
        layer=layer,
        device=device,
        dtype=dtype,
        errors=errors,
        pairs=pairs,
        strict_pairs=strict_pairs,
        max_length=max_length,
    )
    with stopping("nothing was written") as stopper:  # (torch's import and the model's load take seconds)
        from bertcli import encode as enc_mod

        enc_mod.run(
            model,
            hf=hf,
            inputs=inputs or [],
            writer=lambda: enc_mod.Writer(fmt_name, sys.stdout, output, with_text),
            output=output,
            stopper=stopper,
            device=device,
            dtype=dtype,
            errors=errors,
            pooling=pooling,
            layer=layer,
            normalize=normalize,
            max_length=max_length,
            per_token=tokens,
            pairs=pairs,
            strict_pairs=strict_pairs,
            batch_size=batch_size,
        )


# Per command: what a failed write leaves intact, and the setting that writes elsewhere.
WRITES = {
    "pretrain": ("earlier checkpoints are intact", "output_dir, data.prepared_dir"),
    "prepare": ("earlier prepared data is intact", "data.prepared_dir"),
    "export": ("nothing at OUT_DIR was changed", "OUT_DIR"),
    "encode": ("nothing at --output was changed", "--output"),
    "init": ("an existing config is intact", "DIR"),
}


def os_error_message(exc: OSError, command: str = "") -> str:
    """One line for a failed read or write, worded for `command`; every write is atomic, so what was
    there before is intact. A write fails inside a temporary name: the final one is named."""
    from bertcli.layout import TEMPORARY

    parts = str(exc.filename).split("/")
    where = "/".join(m.group(2) if (m := TEMPORARY.fullmatch(p)) else p for p in parts) + ": " if exc.filename else ""
    intact, setting = WRITES.get(command, ("what was there is intact", "another folder"))
    if exc.errno == errno.EFBIG:
        return (
            f"{where}file too large ({exc.strerror}: past ulimit -f or the file system's largest); nothing "
            f"half-written was kept and {intact}: raise the limit, or write elsewhere ({setting})"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"{where}disk full ({exc.strerror}); nothing half-written was kept and {intact}: free space, or write to "
            f"another disk ({setting}), then run the same command"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{where}{exc.strerror}; choose a folder you can write to ({setting})"
    return f"{where}{exc.strerror or exc}"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or bool(os.environ.get("BERTCLI_DEBUG"))
    args = [a for a in args if a != "--debug"]
    command = typer.main.get_command(app)
    try:
        code = command.main(args, prog_name="bertcli", standalone_mode=False)
        if code == 130:  # Typer turns a KeyboardInterrupt (a second Ctrl-C) into exit code 130, silently
            raise KeyboardInterrupt
    except click.exceptions.NoArgsIsHelpError as exc:
        err(exc.ctx.get_help() if exc.ctx else "usage: bertcli COMMAND --help")
        code = 2
    except click.exceptions.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        err(f"bertcli: error: {exc.format_message()}{hint}")
        code = 2
    except click.exceptions.ClickException as exc:
        err(f"bertcli: error: {exc.format_message()}")
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt) as exc:
        if isinstance(exc.__cause__, EOFError):  # Click turns an EOFError into Abort: a failure, not a Ctrl-C
            if debug:
                raise exc.__cause__ from None
            err(f"bertcli: error: EOFError: {exc.__cause__} (run again with --debug for the traceback)")
            code = 1
        else:
            err(
                "bertcli: interrupted; nothing half-written was kept (writes are atomic): run the same command "
                "again to continue"
            )
            code = 130
    except BertcliError as exc:
        if debug:
            raise
        interrupted = isinstance(exc, Interrupted)
        for problem in exc.problems:  # a stop is the job's: under torchrun rank 0 says it, errors any process
            line = problem.replace("\r", "\\r").replace("\n", "\\n")  # one line, whatever a path holds
            (log if interrupted else err)(f"{'bertcli: ' if interrupted else 'bertcli: error: '}{line}")
        code = exc.exit_code
    except PipeClosed:
        # The reader of our stdout went away: not an error. Point stdout at /dev/null so the
        # interpreter's final flush does not complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    except OSError as exc:  # the disk, not the program: full, read-only, forbidden, missing
        if debug:
            raise
        err(f"bertcli: error: {os_error_message(exc, next((a for a in args if not a.startswith('-')), ''))}")
        code = 1
    except Exception as exc:  # noqa: BLE001  a bug or an unexpected failure: still one line
        if debug:
            raise
        err(
            f"bertcli: error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
            "(run again with --debug for the traceback)"
        )
        code = 1
    code = code if isinstance(code, int) else 0
    if argv is None and any(t.name == "bertcli-encode-input" and t.is_alive() for t in threading.enumerate()):
        # encode stopped while its input thread is blocked reading stdin (a signal, a refusal): that
        # thread holds stdin's lock, and the interpreter's shutdown would abort on it ("could not
        # acquire lock for <stdin> at interpreter shutdown"). Everything is written: end the process.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)
