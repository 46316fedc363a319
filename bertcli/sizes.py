"""A model's sizes from its config alone (closed forms, without torch): vocabulary rows, parameters, training
FLOPs per token, activation bytes per example and the micro-batch they allow here, and whether its training state
fits this machine's memory and a checkpoint the run's disk."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from bertcli.config import Config, ModelConfig, torch_build
from bertcli.errors import RunError, UsageError

BYTES_PER_PARAMETER = 16  # fp32 weights, their gradients and AdamW's two moments: 4 x 4 bytes
CHECKPOINT_BYTES_PER_PARAMETER = 12  # a checkpoint: fp32 weights and AdamW's two moments, 3 x 4 bytes
BYTES_PER_TOKEN = 16  # a batch's token ids and segment ids (int64) alone, before masks and labels
# Of a GPU's memory after the training state, what the saved activations may take: on an H100 the step's peak less
# the state was 1.62x activation_bytes at base/128 x 256 and 1.27x at large/512 x 32 (the backward's temporaries,
# bf16 copies of the weights; benchmarks/gpu-2026-11-26-h100/final/bench_*.txt), and the allocator fragments.
GPU_SHARE = 0.5
CPU_SHARE = 0.25  # of this machine's memory: it also holds the corpus, data workers and whatever else it runs


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
    fp16: bool = False  # fp16 autocast: LayerNorm outputs stay fp32 (model.LayerNorm), so the residual stream too


def cpu_placement(cfg: Config) -> Placement | None:
    """The Placement of a run of `cfg` sure to train on this CPU (device cpu, or auto with a CPU torch), else None."""
    if cfg.train.device != "cpu" and not (cfg.train.device == "auto" and (torch_build() or ("",))[0] == "cpu"):
        return None
    world_size, mode = int(os.environ.get("WORLD_SIZE", "1")), cfg.precision.mode
    return Placement(half=mode in ("bf16", "fp16"), world_size=world_size, fp16=mode == "fp16")


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


def local_processes(where: Placement) -> int:
    """This job's processes on this machine (pretrain refuses the variable where there is no job)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) if where.world_size > 1 else 1


def check_memory(model: ModelConfig, where: Placement, parallel: str) -> None:
    """Refuse a model whose training state (sharded under FSDP) cannot fit the device, or its fp32 copies the host."""
    n = parameter_count(model)
    shards = where.world_size if where.world_size > 1 and parallel == "fsdp" else 1
    on_device = BYTES_PER_PARAMETER * n // shards
    local = local_processes(where)
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


@dataclass(frozen=True)
class Split:
    """How a step's train.batch_size examples run here: `accum` micro-batches of `micro` examples on each process."""

    micro: int
    accum: int
    why: str  # how `micro` was chosen, in words


def activation_bytes(cfg: Config, where: Placement) -> int:
    """Bytes one example of data.max_seq_length tokens keeps from the forward pass to the backward: what autograd
    saves (tests/unit/test_sizes.py measures it with saved-tensor hooks) and its MLM logits."""
    m, seq, e = cfg.model, cfg.data.max_seq_length, 2 if where.half else 4
    h, vocab = m.hidden_size, m.vocab_size or m.pad_vocab_multiple
    # Per token and layer: 8.5 H + 2 I elements (Q, K, V, the context, LayerNorm inputs, the FFN's two I-wide tensors,
    # dropout masks), LayerNorm statistics; autocast keeps LayerNorm inputs in fp32 as well.
    layer = e * (8.5 * h + 2 * m.intermediate_size) + 16 + (1.25 * h if where.half else 0)
    if where.gpu is None and m.attention_probs_dropout_prob > 0:  # dropout.attention keeps (nh, T, T) weights
        layer += (2 * e + 1) * m.num_attention_heads * seq  # scores, dropped weights, the bool mask
    rest = (3 * e + (3 if where.half else 0)) * h + 144  # embeddings and heads, per token (144: int64 ids, masks)
    if where.fp16:  # the fp32 residual stream: two more bytes for each H-wide tensor it carries
        layer, rest = layer + 4 * h + 8, rest + 2 * h + 8
    logits = cfg.data.max_predictions_per_seq * vocab * (e + 4)  # (P, V) logits and their fp32 log-softmax
    return int(seq * (m.num_hidden_layers * layer + rest) + logits)


def largest_micro_batch(share: int, per_example: int, budget: float) -> int:
    """The largest divisor of `share` whose examples of `per_example` bytes fit `budget` bytes (1 at least)."""
    fits = max(1, int(budget // max(per_example, 1)))
    return max(d for d in range(1, min(share, fits) + 1) if share % d == 0)


def split(cfg: Config, where: Placement) -> Split:
    """The micro-batch of this machine: train.micro_batch_size, else the largest that fits `where`'s memory
    (GPU_SHARE of a GPU's, CPU_SHARE of this machine's, after the training state); refuses a split that cannot be."""
    t, processes = cfg.train, where.world_size
    if t.batch_size % processes:
        raise UsageError(
            f"train.batch_size={t.batch_size:,} is not a multiple of the {processes} processes: change either"
        )
    share, per_example = t.batch_size // processes, activation_bytes(cfg, where)
    if t.micro_batch_size is not None:
        if share % t.micro_batch_size:
            fix = "set a divisor of it, or null to choose one"
            raise UsageError(
                f"train.micro_batch_size={t.micro_batch_size:,} does not divide the {share:,} examples each process takes a step: {fix}"
            )
        return Split(t.micro_batch_size, share // t.micro_batch_size, "train.micro_batch_size")
    memory, fraction = (where.gpu[0], GPU_SHARE) if where.gpu else (machine_memory(), CPU_SHARE)
    if not memory:
        return Split(share, 1, "the whole share: this machine's memory is unknown")
    shards = processes if processes > 1 and t.parallel == "fsdp" else 1
    sharing = 1 if where.gpu else local_processes(where)  # a GPU each, or this machine's memory for them all
    budget = fraction * (memory / sharing - BYTES_PER_PARAMETER * parameter_count(cfg.model) // shards)
    micro = largest_micro_batch(share, per_example, budget)
    where_ = f"the GPU's ({where.gpu[1]})" if where.gpu else "this machine's"
    why = f"the largest divisor of {share:,} fitting {fraction:.0%} of {where_} memory left by the training state, at {per_example / 2**20:,.1f} MiB an example"
    return Split(micro, share // micro, why)


def planned(cfg: Config) -> Split:
    """The Split of a one-process run of `cfg`: this CPU's where it trains here, else its GPU's (its largest)."""
    if (where := cpu_placement(cfg)) is not None:
        return split(cfg, dataclasses.replace(where, world_size=1))
    if cfg.train.micro_batch_size is not None:
        return split(cfg, Placement(half=True))
    mode = cfg.precision.mode
    mib = activation_bytes(cfg, Placement(half=mode != "fp32", gpu=(0, ""), fp16=mode == "fp16")) / 2**20
    why = f"chosen when pretrain starts: the largest fitting {GPU_SHARE:.0%} of the GPU's memory left, at {mib:,.1f} MiB an example"
    return Split(cfg.train.batch_size, 1, why)


def check_batch(cfg: Config, where: Placement) -> Split:
    """This machine's Split; refuses batches whose tensors (activations, a step's and the held-out set's ids) cannot fit."""
    t, tokens = cfg.train, cfg.data.max_seq_length
    device = (where.gpu[0], "the GPU's memory") if where.gpu else (machine_memory(), "this machine's memory")
    host = (machine_memory(), "this machine's memory")
    chosen = split(cfg, where)
    share = t.batch_size // where.world_size
    activations = f"micro-batches of {chosen.micro:,} examples of data.max_seq_length={tokens:,} tokens need about {{need}} of activations"
    accumulated = f"train.batch_size={t.batch_size:,}: a process's {share:,} examples a step of {tokens:,} tokens need at least {{need}}"
    held_out = f"train.eval_examples={t.eval_examples:,} held-out examples of {tokens:,} tokens need at least {{need}}"
    smaller = (
        "lower train.micro_batch_size (or set it null)"
        if t.micro_batch_size
        else "lower data.max_seq_length or the model's size"
    )
    needs = [  # (bytes, (the memory that holds them, its name), what they are, the fix)
        (chosen.micro * activation_bytes(cfg, where), device, activations, smaller),
        (share * tokens * BYTES_PER_TOKEN, device, accumulated, "lower train.batch_size"),
        (t.eval_examples * tokens * BYTES_PER_TOKEN, host, held_out, "lower train.eval_examples"),
    ]
    for need, (have, memory), what, fix in needs:
        if have and need > have:
            said = what.format(need=f"{need / 2**30:,.1f} GiB")
            raise UsageError(f"{said}, but {memory} is {have / 2**30:,.1f} GiB: {fix}")
    return chosen
