"""A model's sizes from its config's numbers alone, before anything is built: the rows of its
vocabulary matrices, its parameters per part, its training FLOPs per token, whether its training
state can fit on this machine, and whether one checkpoint fits on the run's disk (closed forms: an
absurd size is refused in microseconds). Torch is imported only to ask a GPU its memory, so
`inspect` and config checks stay torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bertcli.config import Config, ModelConfig
from bertcli.errors import RunError, UsageError

BYTES_PER_PARAMETER = 16  # fp32 weights, their gradients and AdamW's two moments: 4 x 4 bytes
CHECKPOINT_BYTES_PER_PARAMETER = 12  # a checkpoint: fp32 weights and AdamW's two moments, 3 x 4 bytes
BYTES_PER_TOKEN = 16  # a batch's token ids and segment ids (int64) alone, before masks and labels


def machine_memory() -> int:
    """This machine's total RAM in bytes (0 when the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass(frozen=True)
class Placement:
    """Where a run trains, as the memory checks read it: before torch loads where the run is sure to
    train on this machine's CPU (cpu_placement), and in the trainer (Runtime.placement)."""

    half: bool  # activations in 2 bytes (autocast), else 4
    world_size: int = 1  # processes in the job
    gpu: tuple[int, str] | None = None  # the training GPU's memory in bytes and its name; None: the CPU


def cpu_placement(cfg: Config) -> Placement | None:
    """The Placement of a run of `cfg`, where it is sure to train on this machine's CPU (train.device
    cpu, or auto with a CPU build of torch: config.torch_build); None where torch must tell."""
    from bertcli.config import torch_build

    if cfg.train.device != "cpu" and not (cfg.train.device == "auto" and (torch_build() or ("",))[0] == "cpu"):
        return None
    return Placement(half=cfg.precision.mode in ("bf16", "fp16"), world_size=int(os.environ.get("WORLD_SIZE", "1")))


def padded_vocab_size(cfg: ModelConfig) -> int:
    """Rows of the embedding and decoder matrices: vocab_size rounded up to pad_vocab_multiple
    (matrix units like multiples of 64). Padding rows are never looked up and never targets."""
    if cfg.vocab_size is None:
        raise ValueError("model.vocab_size is not resolved yet (it comes from the tokenizer)")
    return -(-cfg.vocab_size // cfg.pad_vocab_multiple) * cfg.pad_vocab_multiple


def parameter_counts(model: ModelConfig) -> dict[str, int]:
    """The parameters of BertForPreTraining(model) per part (bert.embeddings, bert.encoder, bert.pooler,
    cls.predictions, cls.seq_relationship), the tied decoder weight once; from the config's numbers
    alone. With vocab_size null the vocabulary counts as its padding multiple: a lower bound."""
    h, i = model.hidden_size, model.intermediate_size
    vocab = padded_vocab_size(model) if model.vocab_size is not None else model.pad_vocab_multiple
    layer = (
        (4 * h * h + 4 * h)  # query, key, value and the attention output, with biases
        + (2 * h * i + i + h)  # the feed-forward block
        + 2 * 2 * h  # two LayerNorms
    )
    return {
        "embeddings": (vocab + model.max_position_embeddings + model.type_vocab_size) * h + 2 * h,  # + LayerNorm
        "encoder": model.num_hidden_layers * layer,
        "pooler": h * h + h,
        "mlm_head": h * h + h + 2 * h + vocab,  # transform, its LayerNorm, the decoder bias (its weight is tied)
        "nsp_head": 2 * h + 2,
    }


def parameter_count(model: ModelConfig) -> int:
    """All the parameters of BertForPreTraining(model) (parameter_counts, summed)."""
    return sum(parameter_counts(model).values())


def flops_per_token(cfg: ModelConfig, seq_len: float, pred_share: float) -> float:
    """Training FLOPs (forward + backward = 3x forward, 2 per multiply-add) per token.

    Matrix products only: per layer 4H^2 (Q, K, V, output) + 2*H*I (feed-forward) weights, the
    attention scores and values 2*H*s per token, and the MLM head (H^2 + V*H) at the share of
    tokens predicted. With I = 4H this is issue #5's 72*L*H^2 + 12*L*H*s + 6*p*(H^2 + V*H).
    """
    H, L, I, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, padded_vocab_size(cfg)
    return 6 * L * (4 * H * H + 2 * H * I) + 12 * L * H * seq_len + 6 * pred_share * (H * H + V * H)


def check_memory(model: ModelConfig, where: Placement, parallel: str) -> None:
    """Refuse sizes whose training state cannot fit: parameters x 16 bytes on the training device
    (divided over the processes under FSDP) against the GPU's memory, and the fp32 model each process
    first builds on the CPU against the machine's RAM. Activations come on top: passing is no promise,
    failing is sure. With vocab_size null a lower bound: checked again once the tokenizer is known."""
    n = parameter_count(model)
    shards = where.world_size if where.world_size > 1 and parallel == "fsdp" else 1
    on_device = BYTES_PER_PARAMETER * n // shards
    # This job's processes on this machine (pretrain refuses the variable where there is no job).
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) if where.world_size > 1 else 1
    shared = f", shared by this job's {local} processes on it (LOCAL_WORLD_SIZE)," if local > 1 else ""
    checks = [
        (
            4 * n * local if where.gpu else max(4 * n, on_device) * local,
            machine_memory(),
            f"this machine's memory{shared}",
        )
    ]
    if where.gpu:
        checks.insert(0, (on_device, where.gpu[0], f"the GPU's memory ({where.gpu[1]})"))
    for need, have, memory in checks:
        if have and need > have:
            raise UsageError(
                f"the model is too large to train here: {n:,} parameters need {need / 2**30:,.1f} GiB for fp32 weights, "
                f"gradients and AdamW state ({BYTES_PER_PARAMETER} bytes each, before activations) but {memory} is "
                f"{have / 2**30:,.1f} GiB: lower model.hidden_size, model.num_hidden_layers or model.vocab_size"
            )


def free_bytes(folder: Path) -> int | None:
    """Free bytes of the disk `folder` is (or will be made) on; None where that cannot be read (writing
    there is then refused on its own)."""
    while not folder.exists() and folder != folder.parent:  # the disk it will be made on
        folder = folder.parent
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def check_disk(model: ModelConfig, output_dir: Path) -> None:
    """Refuse (exit 1) a run whose output disk has no room for one checkpoint (fp32 weights and AdamW's
    two moments): every step before the first save would be trained for nothing. With vocab_size null
    the size is a lower bound; `pretrain` asks before the data, and again once the tokenizer is known."""
    free, need = free_bytes(Path(output_dir)), CHECKPOINT_BYTES_PER_PARAMETER * parameter_count(model)
    if free is not None and free < need:
        raise RunError(
            f"{output_dir}: its disk has {free / 2**20:,.1f} MiB free, and one checkpoint of this model takes about "
            f"{need / 2**20:,.1f} MiB (fp32 weights and AdamW's state): free space, or set output_dir to another disk"
        )


def check_batch(cfg: Config, where: Placement) -> None:
    """Refuse batch sizes whose tensors cannot fit, before any is built (train.batch_size=1e9 would
    grow to the machine's memory and then fail, or be killed): lower bounds, each against the memory
    that holds it. One micro-batch's activations, kept for the backward pass: per token and layer at
    least the attention's input and output, query, key and value (4 x hidden_size) and the
    feed-forward's inner values (intermediate_size), 2 bytes each under autocast, else 4. A step's
    micro-batches, moved to the device together (its loss denominators are counted first):
    BYTES_PER_TOKEN a token. The held-out examples, built once and kept: BYTES_PER_TOKEN a token."""
    m, t, tokens = cfg.model, cfg.train, cfg.data.max_seq_length
    itemsize = 2 if where.half else 4
    device = (where.gpu[0], "the GPU's memory") if where.gpu else (machine_memory(), "this machine's memory")
    host = (machine_memory(), "this machine's memory")
    per_example = tokens * m.num_hidden_layers * (4 * m.hidden_size + m.intermediate_size) * itemsize
    needs = [
        (
            t.batch_size * per_example,
            device,
            f"train.batch_size={t.batch_size:,} examples of data.max_seq_length={tokens:,} tokens need at least "
            "{need} of activations",
            "lower train.batch_size (and raise train.grad_accum_steps for the same batch per step)",
        ),
        (
            t.batch_size * t.grad_accum_steps * tokens * BYTES_PER_TOKEN,
            device,
            f"a step's train.batch_size x train.grad_accum_steps = {t.batch_size * t.grad_accum_steps:,} examples of "
            f"{tokens:,} tokens need at least {{need}}",
            "lower train.grad_accum_steps",
        ),
        (
            t.eval_examples * tokens * BYTES_PER_TOKEN,
            host,
            f"train.eval_examples={t.eval_examples:,} held-out examples of {tokens:,} tokens need at least {{need}}",
            "lower train.eval_examples",
        ),
    ]
    for need, (have, where), what, fix in needs:
        if have and need > have:
            raise UsageError(
                f"{what.format(need=f'{need / 2**30:,.1f} GiB')}, but {where} is {have / 2**30:,.1f} GiB: {fix}"
            )
