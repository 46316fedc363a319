"""What each command refuses before torch is imported (3-4 s, 250 MB): one function per command,
listing its checks once, so that a refusal takes a fraction of a second. Each check is defined by
the module that owns what it checks; the command's own code does not check it again."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertcli import console, layout
from bertcli.errors import UsageError

if TYPE_CHECKING:
    from bertcli.config import Config


def check_writable(folder: Path, named: Path) -> None:
    """A folder that takes no file (read-only, forbidden) is an OSError naming `named`, now rather than
    at the first write: a probe file is made and removed there, or in its nearest existing parent."""
    folder = Path(folder).expanduser().absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        fd, probe = tempfile.mkstemp(prefix=layout.TMP_PREFIX, dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(named)) from None


def check_device(device: str, flag: str) -> None:
    from bertcli.config import DEVICE_NAMES, check_gpu_build, is_device_name

    if not is_device_name(device):
        raise UsageError(f"{flag} {device!r}: expected {DEVICE_NAMES}")
    check_gpu_build(device, flag)


def init(
    directory: Path, preset: str, *, corpus: str | None, init_from: Path | None, overrides: list[str]
) -> tuple[Config, str]:
    """The config `init` writes (a preset, the corpus, what --init-from sets for continued pretraining,
    then the overrides) and its header, checked as pretrain will check it (paths in it: from DIR)."""
    import json

    from bertcli.config_load import preset_config
    from bertcli.config_write import preset_header
    from bertcli.data.prepare import check_vocab_size
    from bertcli.data.text import corpus_files
    from bertcli.resolve import KEYWORD_CORPORA, SYNTHETIC_VOCAB, check_outputs_apart, from_here, resolve

    header = preset_header(preset)
    overrides = from_here(overrides)  # paths typed here are relative to here, not to DIR
    if corpus in KEYWORD_CORPORA:  # the generated corpus has no tokenizer to size the model (--set wins)
        overrides = (
            [f"data.corpus={corpus}"]
            + ([f"model.vocab_size={SYNTHETIC_VOCAB}"] if corpus == "synthetic" else [])
            + overrides
        )
    elif corpus is not None:
        overrides = [f"data.corpus={json.dumps(str(Path(corpus).expanduser().resolve()))}"] + overrides
    continued: dict[str, Any] = {}  # what --init-from sets, below the overrides
    if init_from is not None:
        from bertcli.adopt import continued_pretraining

        continued, note = continued_pretraining(init_from.expanduser().resolve(), preset, overrides)
        header = header + "\n" + note
    cfg = preset_config(preset, overrides, values=continued)
    resolved = resolve(cfg, directory.expanduser().absolute(), adopt_init_from=False)
    if resolved.data.corpus not in KEYWORD_CORPORA:
        corpus_files(Path(resolved.data.corpus))
    check_outputs_apart(resolved)
    # with init_from, the vocabulary is its weights', whatever model.vocab_size says
    check_vocab_size(resolve(cfg, directory.expanduser().absolute()) if cfg.model.init_from else resolved)
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
    """encode's flags, inputs, output and model, checked; returns the format, the output path (resolved)
    and the Hugging Face folder read (None: a bertcli checkpoint or run)."""
    from bertcli import encode_io, hf_import, sniff
    from bertcli.config import PRECISIONS
    from bertcli.export import check_model_path, read_checkpoint
    from bertcli.sbert import NotReproducible, refuse_a_module

    check_device(device, "--device")
    if dtype not in PRECISIONS:
        raise UsageError(f"--dtype {dtype!r}: expected {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}")
    if errors not in ("strict", "replace"):
        raise UsageError(f"--errors {errors!r}: expected strict or replace")
    if strict_pairs and not pairs:
        raise UsageError("--strict-pairs checks --pairs input: add --pairs, or drop --strict-pairs")
    if pairs and max_length is not None and max_length < 4:  # [CLS] A [SEP] B [SEP] and a token of text
        raise UsageError(f"--max-length {max_length} with --pairs: a pair takes 3 special tokens; use 4 or more")
    if pooling not in (None, *encode_io.POOLINGS):
        raise UsageError(f"--pooling {pooling!r}: expected {', '.join(encode_io.POOLINGS)}")
    if tokens and pooling is not None:
        raise UsageError(f"--tokens gives a vector per token, which no pooling makes: drop --pooling {pooling}")
    fmt = encode_io.output_format(fmt, output, with_text=with_text, tokens=tokens)
    encode_io.check_inputs(inputs)
    if output is not None:
        named, output = output, encode_io.check_output(output, inputs, model)
        if not sniff.is_stream(output):
            check_writable(output.parent, output)
        by_name = next((n for n, rows in encode_io.FORMATS.items() if rows.suffix == named.suffix.lower()), fmt)
        if fmt != by_name or named.suffix.lower() in encode_io.OTHER_FORMATS:
            console.error(
                f"warning: --format {fmt} writes {fmt} into {named}, whose {named.suffix} name says otherwise"
            )
    if not model.exists():
        raise UsageError(
            f"--model {model}: no such folder; pass a run folder, a checkpoint folder or a Hugging Face BERT folder"
        )
    refuse_a_module(model, "encode --model")
    hf = hf_import.read_encoder_folder(model)
    check_model_path(model, hf)
    st = hf.sentence if hf is not None else None
    if st is not None and pooling is None and not tokens and (problem := st.problem()):
        raise NotReproducible(st.folder, problem)
    if hf is not None:
        model_cfg = hf.config
    elif layout.identify(model).kind in (layout.Kind.RUN, layout.Kind.CHECKPOINT):
        from bertcli import checkpoint

        with console.silent():  # (what it says of the checkpoint chosen, loading says)
            model_cfg = read_checkpoint(model, checkpoint.check_readable)[1].model
    else:
        model_cfg = None
    if model_cfg is not None:
        encode_io.check_layer(model_cfg, layer, pooling)
    return fmt, output, hf


def launch_env() -> None:
    """Refuse torchrun's variables where they cannot make a job: a number that is none, a rank past the
    world size, or WORLD_SIZE > 1 without where to meet; left in a shell by mistake, they gave a
    library's error after torch's import, or a rank other than 0 that trained and wrote nothing."""
    values = {name: os.environ.get(name) for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    for name, value in values.items():
        if value is not None and not re.fullmatch(r"\s*[0-9]+\s*", value):  # (not str.isdigit: '²' is a digit)
            raise UsageError(
                f"{name}={value!r} in the environment: a process count or index, as torchrun sets it; unset it"
            )
    world = int(values["WORLD_SIZE"] or 1)
    if values["WORLD_SIZE"] is not None and world < 1:
        raise UsageError("WORLD_SIZE=0 in the environment: a job has at least one process; unset it")
    if world <= 1:
        stray = [f"{n}={values[n].strip()}" for n in ("RANK", "LOCAL_RANK") if values[n] and int(values[n])]
        if (local := values["LOCAL_WORLD_SIZE"]) and int(local) != 1:
            stray.append(f"LOCAL_WORLD_SIZE={local.strip()}")
        if stray:
            raise UsageError(
                f"{' and '.join(stray)} in the environment, with no WORLD_SIZE above 1: torchrun's variables without "
                "a job; unset them, or run under torchrun"
            )
        return
    port = os.environ.get("MASTER_PORT")
    if port and not (re.fullmatch(r"\s*[0-9]+\s*", port) and 0 < int(port) < 65536):
        raise UsageError(f"MASTER_PORT={port!r} in the environment: a TCP port (1 to 65535), as torchrun sets it")
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
    if missing or int(values["RANK"] or 0) >= world:
        what = f"{' and '.join(missing)} not set" if missing else f"RANK={values['RANK']} is past it"
        raise UsageError(
            f"WORLD_SIZE={world} is set in the environment (a distributed job's), but {what}: run under torchrun "
            "(torchrun --nproc-per-node N --no-python bertcli pretrain ...), or unset WORLD_SIZE and RANK"
        )


def pretrain(cfg: Config, resume_arg: str, *, device_flag: bool) -> None:
    """What pretrain refuses from files alone: outputs that overlap the corpus; a CUDA device with a CPU
    build of torch; a run another command holds; a model or batch too large for this machine's memory
    where it trains on its CPU, or a checkpoint for its disk; a --resume PATH that is no whole
    checkpoint, one its run set aside, or damaged; --resume never over checkpoints; a checkpoint to
    resume of another model or tokenizer; a model.init_from with NaN weights; an output folder that
    takes no file, or holds what is in the run's way; a corpus that is not there or too small; a
    vocabulary size the tokenizer will not have."""
    from bertcli import checkpoint, resume, store
    from bertcli.config import check_gpu_build
    from bertcli.data.prepare import check_before_training, fixed_tokenizer
    from bertcli.resolve import check_outputs_apart
    from bertcli.sizes import (
        BYTES_PER_PARAMETER,
        check_batch,
        check_disk,
        check_memory,
        cpu_placement,
        machine_memory,
        parameter_count,
    )

    check_outputs_apart(cfg)
    check_gpu_build(cfg.train.device, "--device" if device_flag else "train.device")
    output_dir, main = Path(cfg.output_dir), os.environ.get("RANK", "0") == "0"  # rank 0 locks and writes
    if main:
        store.check_free(output_dir)
    if (where := cpu_placement(cfg)) is not None:
        check_memory(cfg.model, where, cfg.train.parallel)
        check_batch(cfg, where)
    found, path = layout.list_checkpoints(output_dir), None
    if resume_arg == "never" and found:
        raise resume.ResumeRefused(layout.checkpoints_dir(output_dir), len(found))
    if resume_arg not in ("auto", "never"):
        path = Path(resume_arg)
        if problem := resume_problem(path):
            raise UsageError(f"--resume {resume_arg}: {problem}")
        resume.check_not_set_aside(path, output_dir)
        if change := checkpoint.change(path):
            raise checkpoint.DamagedState(f"{path} is damaged ({change[0]}: {change[1]})")
    elif resume_arg == "auto" and found:
        path = found[-1][1]
    run_tokenizer = resume.run_tokenizer(cfg, path)
    if path is not None and not checkpoint.change(path):  # (a damaged newest one: the trainer sets it aside)
        resume.check_same_model(path, cfg, vocab=False)  # another architecture first: no tokenizer fixes it
        used = fixed_tokenizer(cfg, run_tokenizer)
        if used is not None and used[0] != path / layout.TOKENIZER_JSON:
            resume.check_same_tokenizer(path, used[0], used[1].to_str().encode())
        resume.check_same_model(path, cfg)
    start_from = Path(cfg.model.init_from) if cfg.model.init_from and path is None and not found else None
    if start_from is not None and layout.identify(start_from).kind is not layout.Kind.CHECKPOINT:
        from bertcli.hf_import import check_finite_weights

        check_finite_weights(start_from)
    check_writable(output_dir, output_dir)
    if main:
        checkpoint.check_run_folder(output_dir, cfg.train.max_steps)
        if BYTES_PER_PARAMETER * parameter_count(cfg.model) <= machine_memory():  # (too large: refused as such)
            check_disk(cfg.model, output_dir)
    if cfg.data.corpus != "synthetic":
        check_before_training(cfg, run_tokenizer)


def resume_problem(path: Path) -> str | None:
    """Why --resume PATH names no checkpoint to resume from, and what to pass where a run or a model
    folder was given; None: a complete checkpoint."""
    from bertcli import layout

    problem = layout.incomplete(path)
    if problem is None:
        return None
    found = layout.identify(path)
    if path.name == layout.CHECKPOINTS and layout.identify(path.parent).kind is layout.Kind.RUN:
        found = layout.identify(path.parent)  # a run's checkpoints/ (tab-completed): its run's answer
    if found.kind is layout.Kind.RUN and found.checkpoints:
        return f"a run folder, not a checkpoint: name one of its checkpoints ({found.checkpoints[-1][1]}, its newest)"
    if found.kind in (layout.Kind.HF, layout.Kind.SENTENCE):
        return (
            f"{found.kind.value}, not a checkpoint (a checkpoint holds the optimizer's state too): to start from its "
            "weights, set model.init_from to it, or write the run's config with bertcli init --init-from"
        )
    return problem
