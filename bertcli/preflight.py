"""What each command refuses before torch is imported (3-4 s, 250 MB), one function per command; each
check is defined by the module that owns what it checks, and the command's own code does not repeat it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertcli import console, layout
from bertcli.errors import UsageError

if TYPE_CHECKING:
    from bertcli.config import Config


def check_device(device: str, flag: str) -> None:
    from bertcli.config import DEVICE_NAMES, check_gpu_build, is_device_name

    if not is_device_name(device):
        raise UsageError(f"{flag} {device!r}: expected {DEVICE_NAMES}")
    check_gpu_build(device, flag)


def init(
    directory: Path, preset: str, *, corpus: str | None, init_from: Path | None, overrides: list[str]
) -> tuple[Config, str]:
    """The config `init` writes (preset < corpus < --init-from's < overrides), checked as pretrain will; its header."""
    import json

    from bertcli.config_load import preset_config
    from bertcli.config_write import preset_header
    from bertcli.data.prepare import check_vocab_size
    from bertcli.data.scan import corpus_files
    from bertcli.resolve import KEYWORD_CORPORA, SYNTHETIC_VOCAB, check_outputs_apart, from_here, resolve

    header = preset_header(preset)
    overrides = from_here(overrides)  # paths typed here are relative to here, not to DIR
    if corpus in KEYWORD_CORPORA:  # the generated corpus has no tokenizer to size the model (--set wins)
        vocab = [f"model.vocab_size={SYNTHETIC_VOCAB}"] if corpus == "synthetic" else []
        overrides = [f"data.corpus={corpus}", *vocab, *overrides]
    elif corpus is not None:
        overrides = [f"data.corpus={json.dumps(str(Path(corpus).expanduser().resolve()))}"] + overrides
    continued: dict[str, Any] = {}  # what --init-from sets, below the overrides
    if init_from is not None:
        from bertcli.adopt import continued_pretraining

        continued, note = continued_pretraining(init_from.expanduser().resolve(), preset, overrides)
        header = header + "\n" + note
    cfg = preset_config(preset, overrides, values=continued)
    base = directory.expanduser().absolute()  # paths in the config: from DIR
    resolved = resolve(cfg, base, adopt_init_from=False)
    if resolved.data.corpus not in KEYWORD_CORPORA:
        corpus_files(Path(resolved.data.corpus), resolved.data.include, resolved.data.exclude)
    check_outputs_apart(resolved)
    # with init_from, the vocabulary is its weights', whatever model.vocab_size says
    check_vocab_size(resolve(cfg, base) if cfg.model.init_from else resolved)
    return cfg, header


def encode(
    *,
    model: Path,
    inputs: list[str],
    output: Path | None,
    fmt: str | None,
    with_text: bool,
    tokens: bool,
    pooling: str | None,
    layer: int,
    device: str,
    dtype: str,
    errors: str,
    pairs: bool,
    strict_pairs: bool,
    max_length: int | None,
) -> tuple[str, Path | None, Any]:
    """encode's flags, inputs, output and model, checked: (format, output path, Hugging Face folder or None)."""
    from bertcli import encode_io
    from bertcli.config import PRECISIONS

    check_device(device, "--device")
    pooled = f"--tokens gives a vector per token, which no pooling makes: drop --pooling {pooling}"
    short = f"--max-length {max_length} with --pairs: a pair takes 3 special tokens; use 4 or more"
    poolings = f"--pooling {pooling!r}: expected {', '.join(encode_io.POOLINGS)}"
    refused = [  # what Typer does not check itself, or flags that contradict each other
        (dtype not in PRECISIONS, f"--dtype {dtype!r}: expected fp32, bf16 or fp16"),
        (errors not in ("strict", "replace"), f"--errors {errors!r}: expected strict or replace"),
        (strict_pairs and not pairs, "--strict-pairs checks --pairs input: add --pairs, or drop --strict-pairs"),
        (pairs and (max_length or 4) < 4, short),  # [CLS] A [SEP] B [SEP] and a token of text
        (pooling not in (None, *encode_io.POOLINGS), poolings),
        (tokens and pooling is not None, pooled),
    ]
    if line := next((line for bad, line in refused if bad), None):
        raise UsageError(line)
    fmt = encode_io.output_format(fmt, output, with_text=with_text, tokens=tokens)
    encode_io.check_inputs(inputs)
    output = encode_io.check_output(output, inputs, model) if output is not None else None
    return fmt, output, _encode_model(model, layer=layer, pooling=pooling, tokens=tokens)


def _encode_model(model: Path, *, layer: int, pooling: str | None, tokens: bool) -> Any:
    """The Hugging Face folder `model` is (None: a bertcli checkpoint or run), its layer checked."""
    from bertcli import checkpoint, encode_io, hf_import
    from bertcli.export import check_model_path, read_checkpoint
    from bertcli.sbert import NotReproducible, refuse_a_module

    refuse_a_module(model, "encode --model")  # (a missing model: check_model_path)
    hf = hf_import.read_encoder_folder(model)
    check_model_path(model, hf)
    st = hf.sentence if hf is not None else None
    if st is not None and pooling is None and not tokens and (problem := st.problem()):
        raise NotReproducible(st.folder, problem)
    model_cfg = hf.config if hf is not None else None
    if hf is None and layout.identify(model).kind in (layout.Kind.RUN, layout.Kind.CHECKPOINT):
        with console.silent():  # (what it says of the checkpoint chosen, loading says)
            model_cfg = read_checkpoint(model, checkpoint.check_readable)[1].model
    if model_cfg is not None:
        encode_io.check_layer(model_cfg, layer, pooling)
    return hf


def evaluate(
    model: Path, text: list[str], *, probe: Path | None, probe_test: Path | None, device: str
) -> tuple[Any, list[Path], Any, Any]:
    """eval's flags, model and inputs, checked: (Hugging Face folder or None, the text files, TRAIN and TEST read)."""
    from bertcli.data.scan import corpus_files
    from bertcli.labeled import read_labeled

    check_device(device, "--device")
    if not text and probe is None:
        raise UsageError("nothing to score: give TEXT files (masked-LM figures), --probe TRAIN, or both")
    if probe_test is not None and probe is None:
        raise UsageError("--probe-test scores a probe: add --probe TRAIN, or drop --probe-test")
    hf = _encode_model(model, layer=-1, pooling=None, tokens=False)
    if missing := next((t for t in text if not Path(t).expanduser().exists()), None):
        raise UsageError(f"{missing}: no such file or folder; TEXT is a text or JSONL file, or a folder of them")
    files = [file for t in text for file in corpus_files(Path(t))]
    train = read_labeled(probe, flag="--probe") if probe is not None else None
    test = read_labeled(probe_test, flag="--probe-test") if probe_test is not None else None
    return hf, files, train, test


def launch_env() -> None:
    """Refuse torchrun's variables where they make no job (left in a shell, a rank other than 0 writes nothing)."""
    values = {name: os.environ.get(name) for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    for name, value in values.items():
        if value is not None and not re.fullmatch(r"\s*[0-9]+\s*", value):  # (not str.isdigit: '²' is a digit)
            raise UsageError(f"{name}={value!r} in the environment is no process count or index; unset it")
    world = int(values["WORLD_SIZE"] or 1)
    if world < 1:
        raise UsageError("WORLD_SIZE=0 in the environment: a job has at least one process; unset it")
    if world == 1:
        lone = {"RANK": 0, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1}  # a process with no job: rank 0 of 1
        stray = [f"{n}={values[n].strip()}" for n, value in lone.items() if values[n] and int(values[n]) != value]
        if stray:
            raise UsageError(f"{' and '.join(stray)} in the environment, with no WORLD_SIZE above 1: unset them")
        return
    port = os.environ.get("MASTER_PORT")
    if port and not (re.fullmatch(r"\s*[0-9]+\s*", port) and 0 < int(port) < 65536):
        raise UsageError(f"MASTER_PORT={port!r} in the environment: a TCP port (1 to 65535), as torchrun sets it")
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
    if missing or int(values["RANK"] or 0) >= world:
        what = f"{' and '.join(missing)} not set" if missing else f"RANK={values['RANK']} is past it"
        fix = "run under torchrun, or unset WORLD_SIZE and RANK"
        raise UsageError(f"WORLD_SIZE={world} is set in the environment, but {what}: {fix}")


def pretrain(cfg: Config, resume_arg: str, *, device_flag: bool) -> None:
    """What pretrain refuses from files alone, before torch loads (each check is its owner's)."""
    from bertcli import checkpoint, hf_import, labeled, resume, sizes, store
    from bertcli.config import check_gpu_build
    from bertcli.data.prepare import check_before_training
    from bertcli.resolve import check_outputs_apart

    check_outputs_apart(cfg)
    check_gpu_build(cfg.train.device, "--device" if device_flag else "train.device")
    output_dir, main = Path(cfg.output_dir), os.environ.get("RANK", "0") == "0"  # rank 0 locks and writes
    if main:
        store.check_free(output_dir)
    if (where := sizes.cpu_placement(cfg)) is not None:
        sizes.check_memory(cfg.model, where, cfg.train.parallel)
        sizes.check_batch(cfg, where)
    run_tokenizer = resume.check_before(cfg, resume_arg)
    fresh = resume_arg in ("auto", "never") and not layout.list_checkpoints(output_dir)  # starts from init_from
    if cfg.model.init_from and fresh and layout.identify(Path(cfg.model.init_from)).kind is not layout.Kind.CHECKPOINT:
        hf_import.check_finite_weights(Path(cfg.model.init_from))
    store.check_writable(output_dir, output_dir)
    if main:
        checkpoint.check_run_folder(output_dir, cfg.train.max_steps)
        # (a model too large for this machine's memory is refused as such, where it trains)
        if sizes.BYTES_PER_PARAMETER * sizes.parameter_count(cfg.model) <= sizes.machine_memory():
            sizes.check_disk(cfg.model, output_dir)
    if cfg.data.corpus != "synthetic":
        check_before_training(cfg, run_tokenizer)
    for key, path in (("eval.probe", cfg.eval.probe), ("eval.probe_test", cfg.eval.probe_test)):
        if path:
            labeled.read_labeled(Path(path), flag=key)
