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
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

try:  # Typer >= 0.2x runs on its own vendored copy of Click: catch that one's exceptions
    from typer import _click as click
except ImportError:  # older Typer uses the click package
    import click

from bertcli import __version__, console
from bertcli.console import error as err
from bertcli.console import log
from bertcli.errors import STOP_SIGNALS, BertcliError, Interrupted, PipeClosed, RunError, UsageError

if TYPE_CHECKING:
    from bertcli.config import Config, ModelConfig

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


def preset_header(name: str) -> str:
    """The comment at the top of the config file `init` writes (and the tests and scripts write as it does)."""
    return (
        f"bertcli run configuration, preset '{name}'. Written by `bertcli init`; edit freely.\n"
        "Precedence: defaults < this file < `--set section.key=value` on the command line.\n"
        "Each comment gives the meaning, the type and the default (the value used when a key is left out)."
    )


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
    from bertcli import atomic, layout, ownership
    from bertcli.config_load import preset_config
    from bertcli.config_write import to_yaml
    from bertcli.data.prepare import check_vocab_size
    from bertcli.data.text import corpus_files
    from bertcli.resolve import KEYWORD_CORPORA, SYNTHETIC_VOCAB, check_outputs_apart, from_here, resolve

    header = preset_header(preset.value)
    overrides = from_here(overrides)  # paths typed here are relative to here, not to DIR
    if corpus in KEYWORD_CORPORA:
        # The generated corpus has no tokenizer to size the model: a vocabulary of its own (--set wins).
        overrides = (
            [f"data.corpus={corpus}"]
            + ([f"model.vocab_size={SYNTHETIC_VOCAB}"] if corpus == "synthetic" else [])
            + overrides
        )
    elif corpus is not None:
        corpus_files(Path(corpus))  # fail now, not at pretrain time, if it is missing or holds no text files
        overrides = [f"data.corpus={json.dumps(str(Path(corpus).expanduser().resolve()))}"] + overrides
    continued: dict[str, Any] = {}  # what --init-from sets, below the overrides
    if init_from is not None:
        from bertcli.adopt import continued_pretraining, source_note

        continued, note = continued_pretraining(init_from.expanduser().resolve(), preset.value, overrides)
        header = header + "\n" + note
    cfg = preset_config(preset.value, overrides, values=continued)
    # The outputs apart from the corpus, and a vocabulary size the tokenizer will not have, as pretrain will
    # check them (paths in the file: from DIR), refused now.
    resolved = resolve(cfg, directory.expanduser().absolute(), adopt_init_from=False)
    if corpus is None and resolved.data.corpus not in KEYWORD_CORPORA:
        corpus_files(Path(resolved.data.corpus))  # --set data.corpus as --corpus (trial 21 P4: written unchecked)
    check_outputs_apart(resolved)
    # (with init_from, the size is its weights', whatever model.vocab_size says: trial 18 P5)
    check_vocab_size(resolve(cfg, directory.expanduser().absolute()) if cfg.model.init_from else resolved)
    path = directory / layout.RUN_CONFIG
    if path.is_symlink():  # written through, the link's target (a shared template, any file) was replaced
        raise ownership.linked(
            path, "the run folder", "remove the link (its target is left alone), then run init again"
        )
    checkpoints = []
    if path.exists():
        ownership.check_config_replaceable(path)  # --force overwrites a bertcli config, never another file
        if not force:
            raise UsageError(f"{path} already exists; pass --force to overwrite it, or choose another folder")
        from bertcli.runlock import RunLock

        RunLock(directory, "init").check_free()  # (the config of a run that trains now was replaced under it)
        checkpoints = layout.list_checkpoints(directory)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory} exists and is not a folder")
    created = [p for p in (directory, *directory.parents) if not p.exists() and not p.is_symlink()]  # deepest first
    directory.mkdir(parents=True, exist_ok=True)
    try:  # without --force, never over one another init wrote meanwhile
        atomic.write_text(path, to_yaml(cfg, header), exclusive=not force)
    except FileExistsError:
        raise UsageError(
            f"{path} already exists (written while this init ran); pass --force to overwrite it, or choose another "
            "folder"
        ) from None
    except BaseException:  # a full disk, say: nothing half-made is left, only the folders made here are removed
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if still empty
        raise
    m = cfg.model
    sizes = f"from {m.init_from}" if init_from is not None else f"preset {preset.value}"
    if init_from is not None and layout.identify(Path(m.init_from)).kind is layout.Kind.CHECKPOINT:
        from bertcli.export import described

        sizes = f"from {described(Path(m.init_from))}"  # its step: a run's best moves (trial 21 P1)
    err(
        f"wrote {path} ({sizes}: {m.num_hidden_layers} layers, hidden {m.hidden_size}, "
        f"{m.num_attention_heads} heads, sequences of {cfg.data.max_seq_length})"
    )
    for warning in cfg.warnings():
        err(f"warning: {warning}")
    if init_from is not None and (note := source_note(Path(m.init_from))):
        err(f"note: {note}")
    if checkpoints:
        err(
            f"note: {directory} holds {len(checkpoints)} checkpoint(s) of a run: pretrain resumes the newest with "
            "these settings (and says which differ); to start afresh, init another folder"
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
    from bertcli.data.prepare import prepare as run
    from bertcli.data.prepare import prepared_lock
    from bertcli.resolve import check_outputs_apart, load_run
    from bertcli.runlock import RunLock

    cfg = load_run(config, overrides)
    check_outputs_apart(cfg)
    if cfg.data.corpus == "synthetic":
        raise UsageError("data.corpus is synthetic: there is nothing to prepare")
    # Never under the run's pretrain, which trains on the data, nor while another run prepares or reads the same
    # prepared folder (runs with other output_dirs may share it).
    with RunLock(Path(cfg.output_dir), "prepare"), prepared_lock(cfg, "prepare"):
        folder = run(cfg, quiet=quiet, force=force, workers=workers or None)
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
    from bertcli.config import DEVICE_NAMES, check_gpu_build, is_device_name
    from bertcli.resolve import check_outputs_apart, load_run

    # The config is checked before torch loads (3-4 s, 240 MB): a refusal takes a fraction of a second.
    _check_launch_env()
    if device is not None and not is_device_name(device):
        raise UsageError(f"--device {device!r}: expected {DEVICE_NAMES}")
    with console.quiet(quiet):  # (resolving may say where a gone init_from's architecture comes from)
        cfg = load_run(config, overrides + ([f"train.device={device}"] if device else []))
    check_outputs_apart(cfg)
    check_gpu_build(cfg.train.device, "--device" if device is not None else "train.device")
    from bertcli import checkpoint

    # A signal before the training loop's own handling (torch's import alone takes seconds): one line, exit 128 + N.
    # Preparing the data and the loop put their own handlers in place of this one while they run.
    try:
        with _signals_stop("nothing half-written was kept (writes are atomic)"):
            _check_pretrain_start(cfg, resume)
            from bertcli.runtime import parse_device
            from bertcli.trainer import pretrain as run

            if device is not None:
                parse_device(device, "--device")  # a GPU that is not there
            result = run(cfg, resume=resume, quiet=quiet, stop_at=stop_at)
    except checkpoint.ResumeRefused as exc:
        raise UsageError(
            f"{exc.folder} already holds {exc.count} checkpoint(s) and --resume never was given; use "
            "--resume auto to continue, or another output_dir to start fresh"
        ) from None
    except checkpoint.DamagedState as exc:
        raise RunError(
            f"{exc.reason}: resume from another checkpoint (--resume PATH) or start in a new output_dir"
        ) from None
    if not result["is_main"]:
        return  # under torchrun, rank 0 reports for everyone
    metrics = result["metrics"]
    shown = ", ".join(f"{k} {metrics[k]:.4g}" for k in ("mlm_loss", "mlm_acc", "nsp_acc") if k in metrics)
    err(f"done: step {result['step']:,}, {result['tokens_seen']:,} tokens seen{'; ' + shown if shown else ''}")
    err(f"checkpoint: {result['checkpoint']}")
    # Nothing to do from another run's checkpoint left this run as it was: that checkpoint is what to look at
    # (trial 25: its step, then `inspect` of this run, which shows another).
    foreign = checkpoint.is_foreign(Path(result["checkpoint"]), Path(cfg.output_dir))
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
    from bertcli.data.prepare import NotPrepared
    from bertcli.summary import format_report, inspect_path

    try:
        report = inspect_path(path)
    except NotPrepared as exc:  # inspect cannot prepare: say the command that does
        again = f"bertcli prepare --config {exc.config or 'CONFIG'}"
        if exc.gone:  # (trial 27 P1: the prepare advised was refused, the corpus being gone)
            raise UsageError(
                f"{exc.folder}: {exc.problem}; its corpus, {exc.gone}, is not there to prepare it from again: put the "
                f"corpus back, then run `{again}`"
            ) from None
        raise UsageError(
            f"{exc.folder}: {exc.problem}; run `{again}` (it prepares damaged or older data again; --force always does)"
        ) from None
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
    from bertcli.checkpoint import set_aside_note
    from bertcli.export import ExportExists, described
    from bertcli.export import export_checkpoint as run
    from bertcli.layout import EXPORT
    from bertcli.ownership import remove_leftover_folders

    try:
        with _signals_stop(f"{out_dir} was not written (what was there is intact)"):
            try:
                ckpt, folder = run(source, out_dir, force=force)
            except Interrupted:  # (the signal may land where atomic.folder's own cleanup does not run)
                remove_leftover_folders(out_dir, EXPORT, mine=True)
                raise
    except ExportExists as exc:
        raise UsageError(
            f"{exc.out_dir} already exists; pass --force to replace it, or choose another folder"
        ) from None
    origin = f" from {described(ckpt)}" if ckpt != source else ""  # a run folder: the checkpoint it chose
    if note := set_aside_note(ckpt):
        err(f"note: {note}")
    err(f"wrote {folder}{origin}; load it with transformers.BertForPreTraining.from_pretrained({str(folder)!r})")


class Pooling(str, Enum):
    cls = "cls"
    mean = "mean"
    max = "max"
    pooler = "pooler"


class Format(str, Enum):
    jsonl = "jsonl"
    tsv = "tsv"
    npy = "npy"


# encode's flags, declared once here so that the command reads as its steps.
_Inputs = Annotated[
    list[str], typer.Argument(metavar="FILE", help="Text files, one text per line ('-' or none: stdin).")
]
_Model = Annotated[
    Path,
    typer.Option(
        "--model",
        "-m",
        metavar="PATH",
        help="A run folder, a checkpoint folder or a Hugging Face BERT folder (a sentence-transformers folder included).",
    ),
]
_PoolingOpt = Annotated[
    Optional[Pooling],
    typer.Option(
        "--pooling",
        help="cls, mean or max (over all non-padding positions), or pooler. Default: a sentence-transformers "
        "folder's own pooling and normalisation (its embeddings), else cls.",
    ),
]
_Layer = Annotated[
    int,
    typer.Option(
        "--layer", metavar="N", help="Layer to read: 0 = embeddings, 1..L, negative from the end (-1 = last)."
    ),
]
_Normalize = Annotated[
    Optional[bool],
    typer.Option(
        "--normalize/--no-normalize",
        help="Scale each vector to unit length. Default: as a sentence-transformers folder says when --pooling is "
        "not given, else off.",
    ),
]
_FormatOpt = Annotated[
    Optional[Format],
    typer.Option(
        "--format", "-f", help="jsonl, tsv or npy. Default: from the --output suffix (.npy, .tsv), else jsonl."
    ),
]
_Output = Annotated[
    Optional[Path],
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        help="Write the rows to this file (atomically) instead of stdout (npy: not a terminal). Replaced if it exists; "
        "never an input file, nor inside bertcli's own folders.",
    ),
]
_WithText = Annotated[
    bool,
    typer.Option(
        "--with-text",
        help="Add the text to each row (tsv: as the first column, TAB and backslash escaped as \\t and \\\\).",
    ),
]
_Tokens = Annotated[bool, typer.Option("--tokens", help="Per-token vectors (JSONL): tokens and one vector each.")]
_Pairs = Annotated[
    bool,
    typer.Option(
        "--pairs",
        help="Lines are A<TAB>B sentence pairs, encoded with segment ids; a line without a TAB is encoded as one "
        "sentence (counted on stderr).",
    ),
]
_StrictPairs = Annotated[bool, typer.Option("--strict-pairs", help="With --pairs, a line without a TAB is an error.")]
_BatchSize = Annotated[
    int,
    typer.Option(
        "--batch-size",
        min=1,
        metavar="N",
        help="Texts per forward pass, at most (on a CPU fewer when they are long: 8 MiB of activations at most).",
    ),
]
_MaxLength = Annotated[
    Optional[int],
    typer.Option(
        "--max-length",
        min=2,
        metavar="N",
        help="Truncate longer texts (default: a sentence-transformers folder's max_seq_length, else the model's limit).",
    ),
]
_Device = Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N.")]
_Dtype = Annotated[str, typer.Option("--dtype", metavar="fp32|bf16|fp16", help="fp32, bf16 or fp16.")]
_Errors = Annotated[
    str,
    typer.Option(
        "--errors",
        metavar="strict|replace",
        help="strict: a line that is not UTF-8 is an error; replace: replace bad bytes.",
    ),
]


@app.command(short_help="Turn lines of text into vectors, one row per line, streamed.")
def encode(
    model: _Model,
    inputs: _Inputs = None,
    pooling: _PoolingOpt = None,
    layer: _Layer = -1,
    normalize: _Normalize = None,
    fmt: _FormatOpt = None,
    output: _Output = None,
    with_text: _WithText = False,
    tokens: _Tokens = False,
    pairs: _Pairs = False,
    strict_pairs: _StrictPairs = False,
    batch_size: _BatchSize = 32,
    max_length: _MaxLength = None,
    device: _Device = "auto",
    dtype: _Dtype = "fp32",
    errors: _Errors = "strict",
) -> None:
    """Turn lines of text into vectors: one row per input line, in input order, streamed."""
    # What needs no model is refused before torch is imported (3-4 s, 240 MB).
    _check_encode_flags(
        device=device, dtype=dtype, errors=errors, pairs=pairs, strict_pairs=strict_pairs, max_length=max_length
    )
    fmt = _encode_format(fmt, output, with_text, tokens)
    if tokens and pooling is not None:  # (trial 19 P3: accepted, and ignored without a word)
        raise UsageError(f"--tokens gives a vector per token, which no pooling makes: drop --pooling {pooling.value}")
    named, output = output, _check_encode_files(inputs or [], model=model, output=output)
    suffix = named.suffix.lower() if named is not None else ""
    if (
        suffix in (".npy", ".tsv", ".jsonl") and suffix != f".{fmt.value}"
    ) or suffix in OTHER_FORMATS:  # --format given
        err(f"warning: --format {fmt.value} writes {fmt.value} into {named}, whose {suffix} name says otherwise")
    from bertcli import hf_import
    from bertcli.export import check_model_path
    from bertcli.sbert import refuse_a_module

    refuse_a_module(model, "encode --model")
    hf = hf_import.read_encoder_folder(model)  # a Hugging Face folder's config and tokenizer, checked torch-free
    check_model_path(model, hf)
    st = hf.sentence if hf is not None else None
    problem = st.problem() if st is not None and pooling is None and not tokens else None
    if problem:  # the folder's own pooling or modules, which bertcli cannot run: said before torch loads
        raise _not_reproducible(st.folder, problem)
    model_cfg = hf.config if hf is not None else _checkpoint_model(model)
    if model_cfg is not None:
        try:
            index = model_cfg.layer_index(layer)
        except IndexError:
            raise _no_such_layer(layer, model_cfg.num_hidden_layers) from None
        if pooling is not None and pooling.value == "pooler" and index != model_cfg.num_hidden_layers:
            raise _pooler_not_last()  # (trial 19 U1: refused after the model loaded, 4.2-5.7 s)
    with _signals_stop("nothing was written"):  # (torch's import and the model's load take seconds)
        from bertcli import encode as enc_mod
        from bertcli.runtime import parse_device, slow_autocast

        encoder = enc_mod.load_encoder(model, parse_device(device, "--device"), dtype, hf=hf)
    if slow := slow_autocast(encoder.rt):
        err(f"warning: --dtype {slow}; use --dtype fp32 on this CPU")
    try:
        settings = enc_mod.resolve(
            encoder,
            pooling=pooling.value if pooling else None,
            layer=layer,
            normalize=normalize,
            max_length=max_length,
            per_token=tokens,
            pairs=pairs,
            strict_pairs=strict_pairs,
            batch_size=batch_size,
        )
    except UsageError as exc:
        worded = _encode_error(exc)
        if worded is None:
            raise
        raise worded from None
    _say_encode_settings(settings, model=model, max_length=max_length, trained_length=encoder.trained_length)
    from bertcli.checkpoint import set_aside_note

    if note := set_aside_note(encoder.source):
        err(f"bertcli encode: note: {note}")
    with _signals_stop(_encode_stop_words(output)) as hold_signals:
        writer = enc_mod.Writer(fmt.value, sys.stdout, output, with_text)
        try:
            counts = enc_mod.encode(
                encoder,
                enc_mod.read_lines(inputs or [], errors),
                writer,
                settings,
                input_may_stall=enc_mod.may_stall(inputs or []),
            )
            hold_signals()  # the output goes into place whole: a signal now waits until it is there
            writer.close(encoder.model.config.hidden_size)
        except BaseException as exc:
            writer.abort()
            worded = _encode_error(exc) or _stream_full(exc, output)
            if worded is not None:
                raise worded from None
            raise
    from bertcli import layout

    if counts["lines"] and layout.identify(Path(model)).kind is layout.Kind.RUN:  # which checkpoint the run gave
        from bertcli.export import described

        how = "a vector per token" if settings.per_token else f"{settings.pooling} pooling"
        norm = ", normalized" if settings.normalize else ""
        err(f"bertcli encode: the vectors of {described(encoder.source)}: {how}{norm} (--pooling chooses)")
        if pooling is None and normalize is None and not tokens:
            _say_sentence_source(encoder.source, settings)
    if counts["truncated"]:
        trained = (
            ", the length the model was trained at (its positions past it were never trained; --max-length chooses)"
            if max_length is None and settings.max_length == encoder.trained_length and not settings.from_folder
            else ""
        )
        err(
            f"bertcli encode: {counts['truncated']:,} of {counts['lines']:,} lines were truncated to the length limit, "
            f"{settings.max_length} tokens{trained}"
        )
    if counts["unpaired"]:
        err(
            f"bertcli encode: {counts['unpaired']:,} of {counts['lines']:,} lines had no TAB and were encoded as one "
            "sentence each (--strict-pairs makes that an error)"
        )
    if counts["inner_cr"]:  # (trial 22 P1: a CR-only file gave one row for three texts, unsaid; prepare warned)
        err(
            f"warning: {counts['inner_cr']:,} of {counts['lines']:,} lines hold a carriage return (CR) inside, as "
            "classic Mac OS text ends its lines: a line ends at LF, so each was encoded as one text; if CR ends "
            "your lines, convert them first (tr '\\r' '\\n' < FILE | bertcli encode ...)"
        )


def _say_sentence_source(ckpt: Path, settings: Any) -> None:
    """A run continued from a sentence-transformers model encodes as any checkpoint (cls pooling): say
    the pooling that model's embeddings take where it differs (trial 19 P4: its mean pooling and
    normalisation were left for the user to know)."""
    from bertcli import checkpoint
    from bertcli.sbert import continued_sentence_model

    try:
        st = continued_sentence_model(checkpoint.read_config(ckpt).model.init_from)
    except (BertcliError, OSError):
        return
    if st is None or (st.pooling, st.normalize) == (settings.pooling, settings.normalize):
        return
    flags = f"--pooling {st.pooling}{' --normalize' if st.normalize else ''}"
    err(
        f"bertcli encode: this run continued {st.folder}, a sentence-transformers model of {st.pooling} pooling"
        f"{', normalized' if st.normalize else ''}"
        + (f": {flags} gives vectors of its kind" if st.pooling in Pooling.__members__ else "")
    )


def _check_encode_flags(
    *, device: str, dtype: str, errors: str, pairs: bool, strict_pairs: bool, max_length: int | None
) -> None:
    """Refuse values of encode's flags that Typer does not check itself (torch-free: a CPU build of
    torch is read from its files, a GPU that is not there is found when the device is made)."""
    from bertcli.config import DEVICE_NAMES, PRECISIONS, check_gpu_build, is_device_name

    if not is_device_name(device):
        raise UsageError(f"--device {device!r}: expected {DEVICE_NAMES}")
    check_gpu_build(device, "--device")
    if dtype not in PRECISIONS:
        raise UsageError(f"--dtype {dtype!r}: expected {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}")
    if errors not in ("strict", "replace"):
        raise UsageError(f"--errors {errors!r}: expected strict or replace")
    if strict_pairs and not pairs:
        raise UsageError("--strict-pairs checks --pairs input: add --pairs, or drop --strict-pairs")
    if pairs and max_length is not None and max_length < 4:
        # (below, nothing was truncated: a long pair ran past the model's positions, exit 1)
        raise UsageError(
            f"--max-length {max_length} with --pairs: a pair takes 3 special tokens ([CLS] A [SEP] B [SEP]) "
            "and needs a token of text: use --max-length 4 or more"
        )


def _check_writable(folder: Path, named: Path) -> None:
    """A folder that takes no file (read-only, forbidden) is said before torch loads (seconds), as an
    OSError naming `named` (what the command writes there), not at the first write: a probe file is
    made and removed in `folder`, or in its nearest existing parent (the command makes the rest)."""
    import tempfile

    folder = Path(folder).expanduser().absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        fd, probe = tempfile.mkstemp(prefix=".tmp-bertcli-probe.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(named)) from None


def _check_encode_files(inputs: list[str], *, model: Path, output: Path | None) -> Path | None:
    """Check encode's input files, --output (returned resolved: a link is written through) and --model,
    before the model loads (seconds) rather than when a file's turn comes."""
    from bertcli.ownership import check_input, check_output_file, check_stdin, is_stream

    for source in inputs:
        if source != "-":
            check_input(source)
    if not inputs or "-" in inputs:
        check_stdin()  # (trial 20: gzip on stdin was "line 1 is not valid UTF-8" after the model loaded)
    if output is not None:  # never a folder, an input file or a file of the model
        output = check_output_file(output, [i for i in inputs if i != "-"], model)
        if not is_stream(output):
            _check_writable(output.parent, output)
    if not model.exists():
        raise UsageError(
            f"--model {model}: no such folder; pass a run folder, a checkpoint folder or a Hugging Face BERT folder"
        )
    return output


def _say_encode_settings(settings: Any, *, model: Path, max_length: int | None, trained_length: int | None) -> None:
    """The lines encode says about its settings (encode.Settings) before it starts. `trained_length`: the
    longest sequences the model was trained on, where shorter than its positions (None: all of them)."""
    if max_length is not None and max_length > settings.max_length:
        err(
            f"bertcli encode: --max-length {max_length} is past the model's {settings.max_length} positions; texts are "
            f"truncated at {settings.max_length}"
        )
    if max_length is not None and trained_length is not None and settings.max_length > trained_length:
        # (trial 26 P9: said without --max-length, unsaid with one)
        err(
            f"warning: texts are encoded up to {settings.max_length} tokens (--max-length), past the length the model "
            f"was trained at, {trained_length}: its positions past it were never trained, so texts longer than that "
            "get vectors that depend on untrained weights"
        )
    if settings.from_folder:
        err(
            f"bertcli encode: {model} is a sentence-transformers model: {settings.pooling} pooling, "
            f"{'normalized' if settings.normalize else 'not normalized'}, up to {settings.max_length} tokens (its own "
            "settings; --pooling, --normalize/--no-normalize and --max-length choose otherwise)"
        )


def _encode_stop_words(output: Path | None) -> str:
    """What a stopped encode leaves, in words (for _signals_stop)."""
    from bertcli.ownership import is_stream

    return (
        f"{output} was not written (what was there is intact)"
        if output is not None and not is_stream(output)
        else f"the rows on {output or 'stdout'} so far are those of the first lines only"
    )


@contextlib.contextmanager
def _signals_stop(where: str) -> Iterator[Callable[[], None]]:
    """Ctrl-C, SIGTERM and SIGHUP end encode or export: the temporary output is removed, one line
    (saying `where`: what is left), exit 128 + N; not where the process was started to ignore one
    (nohup). Yields `hold`: from its call on they wait while the output is put in place (stopped
    there, the command would leave its temporary files, or call a finished output unwritten). On the
    way out the previous handlers come back first, then what was held is raised again for them."""
    holding, held = False, []  # held: signals that came while holding, raised again at the end

    def stop(signum: int, frame: object) -> None:
        if holding:
            held.append(signum)
            return
        raise Interrupted(f"stopped by {signal.Signals(signum).name}; {where}: run the same command again", signum)

    def hold() -> None:
        nonlocal holding
        holding = True

    # (A signal mask would not do: torch's threads take a process's signals where the main thread blocks them.)
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN and (signum != signal.SIGINT or handler is signal.default_int_handler):
            signal.signal(signum, stop)
    try:
        yield hold
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in held:
            signal.raise_signal(signum)


# Output names of data formats encode does not write, and what each is (their readers would fail on its rows).
OTHER_FORMATS = {
    ".npz": "a NumPy archive",
    ".csv": "comma-separated values",
    ".json": "one JSON document",
    ".pt": "a PyTorch pickle",
    ".pth": "a PyTorch pickle",
    ".pkl": "a pickle",
    ".pickle": "a pickle",
    ".h5": "HDF5",
    ".hdf5": "HDF5",
    ".parquet": "Parquet",
    ".arrow": "Arrow",
    ".feather": "Feather",
    ".safetensors": "safetensors",
}


def _encode_format(fmt: Format | None, output: Path | None, with_text: bool, tokens: bool) -> Format:
    """--format, or the one the --output suffix implies; refused where the other flags cannot have it."""
    from bertcli.ownership import COMPRESSED_SUFFIXES, is_stream

    by_suffix = fmt is None
    suffix = output.suffix.lower() if output is not None else ""
    if suffix in COMPRESSED_SUFFIXES and not is_stream(output):  # (trial 21 P8: plain JSONL under a .gz name)
        kind = COMPRESSED_SUFFIXES[suffix]
        inner = Path(output.stem).suffix.lower()  # v.npy.gz: the format asked for, which stdout needs said
        flag = f" --format {(fmt.value if fmt else inner[1:])}" if fmt or inner in (".npy", ".tsv") else ""
        raise UsageError(
            f"--output {output}: a {suffix} name, and encode writes plain rows: pipe them through {kind} "
            f"(bertcli encode ...{flag} | {kind} > {output}), or name a file without {suffix}"
        )
    if fmt is None and suffix in OTHER_FORMATS:  # (trial 22 S1: JSON Lines under v.npz or v.csv, exit 0)
        raise UsageError(
            f"--output {output}: a {suffix} name asks for {OTHER_FORMATS[suffix]}, which encode does not write: name a "
            ".jsonl, .tsv or .npy file (the name chooses the format), or pass --format to write one under this name"
        )
    if fmt is None:
        fmt = Format.npy if suffix == ".npy" else Format.tsv if suffix == ".tsv" else Format.jsonl
    if tokens and fmt != Format.jsonl:
        fix = (
            f"--output {output} asks for {fmt.value}: name a .jsonl file"
            if by_suffix
            else "drop --format or use --format jsonl"
        )
        raise UsageError(f"--tokens writes JSONL: {fix}")
    if fmt == Format.npy and output is None and sys.stdout.isatty():  # (`> FILE.npy` is fine: trial 16 P9)
        raise UsageError(
            "--format npy is binary, not for a terminal: redirect stdout (> FILE.npy) or pass --output FILE.npy"
        )
    if fmt == Format.npy and with_text:
        raise UsageError("--with-text: npy holds numbers only; use --format jsonl or tsv for the text")
    return fmt


def _pooler_not_last() -> UsageError:
    return UsageError("--pooling pooler reads the last layer; drop --layer or pick another pooling")


def _stream_full(exc: BaseException, output: Path | None) -> RunError | None:
    """A full disk under encode's rows on stdout (or a device or pipe -o names): what was written
    stays there, unlike a file of --output (written whole or not at all); None: another error."""
    from bertcli.atomic import is_disk_full
    from bertcli.ownership import is_stream

    if not (isinstance(exc, OSError) and is_disk_full(exc)) or (output is not None and not is_stream(output)):
        return None
    fix = (
        "free space"
        if output is not None
        else "free space, or write with --output FILE, which keeps nothing half-written"
    )
    return RunError(
        f"{output or 'stdout'}: disk full ({exc.strerror}); the rows written there so far are incomplete (the last "
        f"one may be cut): {fix}"
    )


def _check_launch_env() -> None:
    """Refuse the variables of a distributed job (torchrun's) that cannot start one: a number that is
    none, a rank past the world size, or WORLD_SIZE > 1 without where to meet (MASTER_ADDR,
    MASTER_PORT). Left in a shell by mistake, they gave a library's error after torch's import (trial
    23 C1: 3.4-4.2 s, "environment variable MASTER_ADDR expected")."""
    values = {name: os.environ.get(name) for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    for name, value in values.items():
        if value is not None and not re.fullmatch(r"\s*[0-9]+\s*", value):  # (not str.isdigit: '²' is a digit)
            raise UsageError(
                f"{name}={value!r} in the environment: a process count or index, as torchrun sets it; unset it"
            )
    world = int(values["WORLD_SIZE"] or 1)
    if values["WORLD_SIZE"] is not None and world < 1:  # (trial 24 C2: a division by zero after 9.7 s)
        raise UsageError("WORLD_SIZE=0 in the environment: a job has at least one process; unset it")
    if world <= 1:
        # A rank other than 0 in a job of one process: it trained without writing anything, exit 0 (trial 24 S1).
        stray = [
            f"{name}={values[name].strip()}" for name in ("RANK", "LOCAL_RANK") if values[name] and int(values[name])
        ]
        local = values["LOCAL_WORLD_SIZE"]  # (trial 25 P1: 100,000 of them made the tiny model "too large")
        stray += [f"LOCAL_WORLD_SIZE={local.strip()}"] if local and int(local) != 1 else []
        if stray:
            raise UsageError(
                f"{' and '.join(stray)} in the environment, with no WORLD_SIZE above 1: torchrun's variables without "
                "a job (a rank other than 0 trains and writes nothing); unset them, or run under torchrun"
            )
        return
    port = os.environ.get("MASTER_PORT")
    if port and not (re.fullmatch(r"\s*[0-9]+\s*", port) and 0 < int(port) < 65536):  # (trial 24 C3: after torch)
        raise UsageError(f"MASTER_PORT={port!r} in the environment: a TCP port (1 to 65535), as torchrun sets it")
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
    rank = int(values["RANK"] or 0)
    if missing or rank >= world:
        what = (
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not"
            if missing
            else f"RANK={rank} is past it"
        )
        raise UsageError(
            f"WORLD_SIZE={world} is set in the environment (a distributed job's, as torchrun sets it), but {what}: "
            "run under torchrun (torchrun --nproc-per-node N -m bertcli pretrain ...), or unset WORLD_SIZE and RANK"
        )


def _check_pretrain_start(cfg: Config, resume: str) -> None:
    """What pretrain refuses from files alone, before torch is imported (3-4 s, 250 MB): a run another
    command holds, a --resume PATH that is no checkpoint, --resume never over checkpoints, a corpus
    that is not there or too small, a given tokenizer of another size than the model's vocabulary, a
    checkpoint to resume of another tokenizer than the run's, a model.init_from with NaN weights, a
    model or batch too large for this machine's memory where the run trains on its CPU.
    (The trainer checks them again where it acts on them.)"""
    from bertcli import checkpoint, layout
    from bertcli.data.prepare import (
        check_before_training,
        corpus_path,
        fixed_tokenizer,
        stands_in,
        unchanged_tokenizer,
    )
    from bertcli.data.text import corpus_root
    from bertcli.hf_import import check_finite_weights
    from bertcli.runlock import RunLock
    from bertcli.sizes import (
        BYTES_PER_PARAMETER,
        check_batch,
        check_disk,
        check_memory,
        cpu_placement,
        machine_memory,
        parameter_count,
    )

    if os.environ.get("RANK", "0") == "0":  # only rank 0 takes the lock: the others would find it held
        RunLock(Path(cfg.output_dir), "pretrain").check_free()
    if (where := cpu_placement(cfg)) is not None:  # (trial 21 U1: after torch, 3.6 s and 250 MB)
        check_memory(cfg.model, where, cfg.train.parallel)
        check_batch(cfg, where)
    problem = _resume_problem(Path(resume)) if resume not in ("auto", "never") else None
    if problem:
        raise UsageError(f"--resume {resume}: {problem}")
    if resume not in ("auto", "never"):
        checkpoint.check_not_set_aside(Path(resume), Path(cfg.output_dir))
    try:  # its files' SHA-256 against their record (trial 17 U4: after torch, 4.2-4.7 s)
        change = (
            checkpoint.tokenizer_change(Path(resume)) or checkpoint.file_change(Path(resume))
            if resume not in ("auto", "never")
            else None
        )
    except (OSError, ValueError, BertcliError):  # an unreadable record: the trainer's checks name it
        change = None
    if change:
        raise checkpoint.DamagedState(f"{resume} is damaged ({change[0]}: {change[1]})")
    found = layout.list_checkpoints(Path(cfg.output_dir))
    if resume == "never" and found:
        raise checkpoint.ResumeRefused(layout.checkpoints_dir(Path(cfg.output_dir)), len(found))
    resumed = Path(resume) if resume not in ("auto", "never") else found[-1][1] if found and resume == "auto" else None
    if resumed is not None:
        try:
            checkpoint.read_config(resumed)
        except (BertcliError, OSError):  # a damaged checkpoint: the trainer says so, and sets it aside
            resumed = None
    # Another architecture first: no tokenizer makes it resumable (trial 26 C6: the tokenizer's advice led nowhere).
    # Then the tokenizer: another one's size is a model.vocab_size that differs, whose fix is the tokenizer's.
    if resumed is not None:
        checkpoint.check_same_model(resumed, cfg, Path(cfg.output_dir), vocab=False)
    if resumed is not None and unchanged_tokenizer(resumed):  # (an edited one: the trainer sets it aside)
        used = fixed_tokenizer(cfg, resumed)  # (trial 16 U8: refused after torch, 6.2 s)
        if used is not None and used[0] != resumed / layout.TOKENIZER_JSON:
            checkpoint.check_same_tokenizer(resumed, used[0], used[1].to_str().encode())
    if resumed is not None:
        checkpoint.check_same_model(resumed, cfg, Path(cfg.output_dir))
    start_from = Path(cfg.model.init_from) if cfg.model.init_from and resumed is None and not found else None
    if start_from is not None and layout.identify(start_from).kind is not layout.Kind.CHECKPOINT:
        check_finite_weights(start_from)  # (trial 16 U7: refused after the corpus was prepared, 11 s)
    _check_writable(Path(cfg.output_dir), Path(cfg.output_dir))
    checkpoint.check_run_outputs(Path(cfg.output_dir))
    if os.environ.get("RANK", "0") == "0":  # (rank 0 replaces checkpoints)
        checkpoint.check_replaceable(Path(cfg.output_dir), cfg.train.max_steps)
    # One checkpoint's room (a lower bound while the vocabulary is still to come); a model too large for
    # this machine is refused as such (exit 2) where memory is checked, not as one too large for the disk.
    if os.environ.get("RANK", "0") == "0" and BYTES_PER_PARAMETER * parameter_count(cfg.model) <= machine_memory():
        check_disk(cfg.model, Path(cfg.output_dir))
    if cfg.data.corpus != "synthetic":
        if not stands_in(cfg):  # (a corpus that is not here, whose prepared data may stand in: prepare decides)
            corpus_root(corpus_path(cfg))
        check_before_training(cfg)


def _resume_problem(path: Path) -> str | None:
    """Why --resume PATH names no checkpoint to resume from, and what to pass where a run or a model
    folder was given (trial 16 P13); None: a complete checkpoint."""
    from bertcli import layout

    problem = layout.incomplete(path)
    if problem is None:
        return None
    found = layout.identify(path)
    if path.name == layout.CHECKPOINTS and layout.identify(path.parent).kind is layout.Kind.RUN:
        found = layout.identify(path.parent)  # a run's checkpoints/ (tab-completed): its run's answer (trial 18 P1)
    if found.kind is layout.Kind.RUN and found.checkpoints:
        return f"a run folder, not a checkpoint: name one of its checkpoints ({found.checkpoints[-1][1]}, its newest)"
    if found.kind in (layout.Kind.HF, layout.Kind.SENTENCE):
        return (
            f"{found.kind.value}, not a checkpoint (a checkpoint holds the optimizer's state too): to start from its "
            "weights, set model.init_from to it, or write the run's config with bertcli init --init-from"
        )
    return problem


def _checkpoint_model(path: Path) -> ModelConfig | None:
    """The model config of the checkpoint `path` names (a run's best or newest), checked torch-free as
    export checks it (checkpoint.check_readable); None where `path` is no run or checkpoint."""
    from bertcli import checkpoint, layout
    from bertcli.export import read_checkpoint

    if layout.identify(path).kind not in (layout.Kind.RUN, layout.Kind.CHECKPOINT):
        return None
    with console.silent():  # (what it says of the checkpoint chosen, loading says)
        return read_checkpoint(path, checkpoint.check_readable)[1].model


def _no_such_layer(layer: int, last: int) -> UsageError:
    return UsageError(
        f"--layer {layer}: this model has layers 0 (embeddings) to {last} (-1 to -{last + 1} from the end)"
    )


def _not_reproducible(folder: Path, problem: str) -> UsageError:
    return UsageError(
        f"--model {folder}: {problem}, so its embeddings cannot be reproduced; pass --pooling cls, mean or max for "
        "vectors of the BERT encoder itself"
    )


def _encode_error(exc: BaseException) -> UsageError | None:
    """A setting or an input line encode refused, worded with the flag that changes it (None: another error)."""
    from bertcli.sbert import NotReproducible

    if isinstance(exc, NotReproducible):
        return _not_reproducible(exc.folder, exc.problem)
    from bertcli import encode as enc_mod

    if isinstance(exc, enc_mod.NoSuchLayer):
        return _no_such_layer(exc.layer, exc.last)
    if isinstance(exc, enc_mod.PoolerNotLast):
        return _pooler_not_last()
    if isinstance(exc, enc_mod.NotUtf8):
        return UsageError(
            f"{exc.source}: line {exc.line} is not valid UTF-8 (byte {exc.byte} of the line); fix the "
            "input or pass --errors replace"
        )
    if isinstance(exc, enc_mod.Unpaired):
        return UsageError(
            f"{exc.where}: no TAB between the two sentences (--strict-pairs); write A<TAB>B, "
            "or drop --strict-pairs to encode such lines alone"
        )
    return None


# Per command: what a full disk leaves intact, and where else to write (for os_error_message).
DISK_FULL_ADVICE = {
    "pretrain": (
        "earlier checkpoints are intact",
        "set output_dir to another disk, then run the same command to resume",
    ),
    "prepare": ("earlier prepared data is intact", "set data.prepared_dir to another disk, then run the same command"),
    "export": ("nothing at OUT_DIR was changed", "choose an OUT_DIR on another disk, then run the same command"),
    "encode": ("nothing at --output was changed", "write --output to another disk, then run the same command"),
    "init": ("an existing config is intact", "choose a DIR on another disk, then run the same command"),
}
WRITABLE = {
    "pretrain": "output_dir, data.prepared_dir",
    "prepare": "data.prepared_dir",
    "export": "OUT_DIR",
    "encode": "--output",
    "init": "DIR",
}


TEMPORARY = re.compile(r"(?<![^/])[.]tmp-(.+?)[.][0-9]+(?=/|$)")  # atomic.py's temporary names


def os_error_message(exc: OSError, command: str = "") -> str:
    """One line for a failed read or write, worded for `command`. Every write is atomic (temporary
    name, then rename), so what was there before is intact."""
    # A write fails inside its temporary name (.tmp-NAME.PID), gone by now: name what was being written.
    where = TEMPORARY.sub(r"\1", str(exc.filename)) + ": " if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        intact, fix = DISK_FULL_ADVICE.get(
            command, ("what was there is intact", "write to another disk, then try again")
        )
        if exc.errno == errno.EFBIG:  # (trial 17 C3: "File too large" alone, no file named)
            return (
                f"{where}file too large ({exc.strerror}: past the size this process may write, ulimit -f, or the file "
                f"system's largest); nothing half-written was kept and {intact}: raise the limit or {fix}"
            )
        return f"{where}disk full ({exc.strerror}); nothing half-written was kept and {intact}: free space or {fix}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        folders = f" ({WRITABLE[command]})" if command in WRITABLE else ""
        return f"{where}{exc.strerror}; choose a folder you can write to{folders}"
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
