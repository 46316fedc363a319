"""A model's sizes from its config alone (closed forms, without torch): vocabulary rows, parameters, training
FLOPs per token, and whether its training state fits this machine's memory and a checkpoint the run's disk."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bertcli.config import Config, ModelConfig, torch_build
from bertcli.errors import RunError, UsageError

BYTES_PER_PARAMETER = 16  # fp32 weights, their gradients and AdamW's two moments: 4 x 4 bytes
CHECKPOINT_BYTES_PER_PARAMETER = 12  # a checkpoint: fp32 weights and AdamW's two moments, 3 x 4 bytes
BYTES_PER_TOKEN = 16  # a batch's token ids and segment ids (int64) alone, before masks and labels


def machine_memory() -> int:
    """This machine's total RAM in bytes (0 when the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # (no sysconf on Windows)
        return 0


@dataclass(frozen=True)
class Placement:
    """Where a run trains, as the memory checks read it (cpu_placement before torch loads, or the trainer's)."""

    half: bool  # activations in 2 bytes (autocast), else 4
    world_size: int = 1  # processes in the job
    gpu: tuple[int, str] | None = None  # the training GPU's memory in bytes and its name; None: the CPU


def cpu_placement(cfg: Config) -> Placement | None:
    """The Placement of a run of `cfg` sure to train on this CPU (device cpu, or auto with a CPU torch), else None."""
    if cfg.train.device != "cpu" and not (cfg.train.device == "auto" and (torch_build() or ("",))[0] == "cpu"):
        return None
    return Placement(half=cfg.precision.mode in ("bf16", "fp16"), world_size=int(os.environ.get("WORLD_SIZE", "1")))


def padded_vocab_size(cfg: ModelConfig) -> int:
    """Rows of the embedding and decoder matrices: vocab_size rounded up to pad_vocab_multiple (never targets)."""
    if cfg.vocab_size is None:
        raise ValueError("model.vocab_size is not resolved yet (it comes from the tokenizer)")
    return -(-cfg.vocab_size // cfg.pad_vocab_multiple) * cfg.pad_vocab_multiple


def parameter_counts(model: ModelConfig) -> dict[str, int]:
    """Parameters of BertForPreTraining(model) per part, the tied decoder once (vocab_size null: a lower bound)."""
    h, i = model.hidden_size, model.intermediate_size
    vocab = padded_vocab_size(model) if model.vocab_size is not None else model.pad_vocab_multiple
    layer = (4 * h * h + 4 * h) + (2 * h * i + i + h) + 2 * 2 * h  # Q, K, V and output; feed-forward; 2 LayerNorms
    return {
        "embeddings": (vocab + model.max_position_embeddings + model.type_vocab_size) * h + 2 * h,  # + LayerNorm
        "encoder": model.num_hidden_layers * layer,
        "pooler": h * h + h,
        "mlm_head": h * h + h + 2 * h + vocab,  # transform, its LayerNorm, the decoder bias (its weight is tied)
        "nsp_head": 2 * h + 2,
    }


def parameter_count(model: ModelConfig) -> int:
    return sum(parameter_counts(model).values())


def flops_per_token(cfg: ModelConfig, seq_len: float, pred_share: float) -> float:
    """Training FLOPs per token of the matrix products (3x forward, 2 per multiply-add), the MLM head's at `pred_share`."""
    H, L, I, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, padded_vocab_size(cfg)
    return 6 * L * (4 * H * H + 2 * H * I) + 12 * L * H * seq_len + 6 * pred_share * (H * H + V * H)


def check_memory(model: ModelConfig, where: Placement, parallel: str) -> None:
    """Refuse a model whose training state (sharded under FSDP) cannot fit the device, or its fp32 copies the host."""
    n = parameter_count(model)
    shards = where.world_size if where.world_size > 1 and parallel == "fsdp" else 1
    on_device = BYTES_PER_PARAMETER * n // shards
    # This job's processes on this machine (pretrain refuses the variable where there is no job).
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) if where.world_size > 1 else 1
    shared = f", shared by this job's {local} processes on it (LOCAL_WORLD_SIZE)," if local > 1 else ""
    host = (4 * n if where.gpu else max(4 * n, on_device)) * local
    checks = [(on_device, where.gpu[0], f"the GPU's memory ({where.gpu[1]})")] if where.gpu else []
    for need, have, memory in [*checks, (host, machine_memory(), f"this machine's memory{shared}")]:
        if have and need > have:
            gib = f"{n:,} parameters need {need / 2**30:,.1f} GiB but {memory} is {have / 2**30:,.1f} GiB"
            fix = "lower model.hidden_size, model.num_hidden_layers or model.vocab_size"
            raise UsageError(f"the model is too large to train here: {gib}: {fix}")


def free_bytes(folder: Path) -> int | None:
    """Free bytes of the disk `folder` is (or will be made) on; None where that cannot be read."""
    while not folder.exists() and folder != folder.parent:  # the disk it will be made on
        folder = folder.parent
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def check_disk(model: ModelConfig, output_dir: Path) -> None:
    """Refuse (exit 1) a run whose output disk has no room for one checkpoint (its steps would be lost)."""
    free, need = free_bytes(Path(output_dir)), CHECKPOINT_BYTES_PER_PARAMETER * parameter_count(model)
    if free is not None and free < need:
        room = f"its disk has {free / 2**20:,.1f} MiB free, and one checkpoint of this model takes about {need / 2**20:,.1f} MiB"
        raise RunError(f"{output_dir}: {room}: free space, or set output_dir to another disk")


def check_batch(cfg: Config, where: Placement) -> None:
    """Refuse batch sizes whose tensors (lower bounds: activations, a step's and the held-out set's ids) cannot fit."""
    m, t, tokens = cfg.model, cfg.train, cfg.data.max_seq_length
    device = (where.gpu[0], "the GPU's memory") if where.gpu else (machine_memory(), "this machine's memory")
    host = (machine_memory(), "this machine's memory")
    per_example = tokens * m.num_hidden_layers * (4 * m.hidden_size + m.intermediate_size) * (2 if where.half else 4)
    step = t.batch_size * t.grad_accum_steps
    activations = f"train.batch_size={t.batch_size:,} examples of data.max_seq_length={tokens:,} tokens need at least {{need}} of activations"
    accumulated = f"a step's train.batch_size x train.grad_accum_steps = {step:,} examples of {tokens:,} tokens need at least {{need}}"
    held_out = f"train.eval_examples={t.eval_examples:,} held-out examples of {tokens:,} tokens need at least {{need}}"
    smaller = "lower train.batch_size (and raise train.grad_accum_steps for the same batch per step)"
    needs = [  # (bytes, (the memory that holds them, its name), what they are, the fix)
        (t.batch_size * per_example, device, activations, smaller),
        (step * tokens * BYTES_PER_TOKEN, device, accumulated, "lower train.grad_accum_steps"),
        (t.eval_examples * tokens * BYTES_PER_TOKEN, host, held_out, "lower train.eval_examples"),
    ]
    for need, (have, memory), what, fix in needs:
        if have and need > have:
            said = what.format(need=f"{need / 2**30:,.1f} GiB")
            raise UsageError(f"{said}, but {memory} is {have / 2**30:,.1f} GiB: {fix}")
