"""Every runtime decision in one place: device, precision, processes and parallelism, seeding.

The model and the data code never look at devices or dtypes; the trainer and encode ask this
module (device names are parsed by `parse_device`, precisions mapped to dtypes by `AUTOCAST_DTYPES`,
and `Runtime.autocast` is the one mixed-precision context).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from bertcli import console
from bertcli.config import ModelConfig, PrecisionConfig, is_device_name
from bertcli.errors import UsageError
from bertcli.model import BertForPreTraining, padded_vocab_size


PRECISIONS = ("fp32", "bf16", "fp16")  # resolved precisions; config's precision.mode adds auto
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # fp32: no autocast
DEVICE_NAMES = "auto, cpu, cuda or cuda:N"  # the grammar is config.is_device_name (the schema's, torch-free)


@dataclass
class Runtime:
    device: torch.device
    precision: str  # resolved: fp32, bf16 or fp16
    rank: int = 0  # this process among all (torchrun's RANK)
    world_size: int = 1  # processes in the job (torchrun's WORLD_SIZE)

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that logs, writes metrics and checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over all processes, in place (a no-op in a single process)."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return AUTOCAST_DTYPES.get(self.precision)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass; weights, optimizer and loss stay fp32."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def grad_scaler(self, cfg: PrecisionConfig) -> torch.amp.GradScaler:
        """Loss scaling for fp16 only (bf16 has fp32's range); a disabled scaler is a no-op."""
        return torch.amp.GradScaler(self.device.type, init_scale=cfg.fp16_init_scale, enabled=self.precision == "fp16")

    def describe(self) -> str:
        if self.device.type == "cuda":
            where = f"cuda ({torch.cuda.get_device_name(self.device)})"
        else:
            where = f"cpu ({torch.get_num_threads()} threads)"
        return f"device {where}, precision {self.precision}, torch {torch.__version__}"


def parse_device(name: str, what: str = "device") -> torch.device:
    """The torch.device for a device name (auto, cpu, cuda or cuda:N); auto is CUDA when a GPU
    is visible. UsageError for another name or a GPU that is not there, naming the value as
    `what` (the CLI passes its flag, the trainer train.device)."""
    if not is_device_name(name):
        raise UsageError(f"{what} {name!r}: expected {DEVICE_NAMES}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"{what} {name!r}: no CUDA GPU is visible to PyTorch; use {what} cpu (or auto)")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"{what} {name!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        return device
    return torch.device(name)


def resolve_precision(mode: str, device: torch.device) -> str:
    """auto: bf16 on GPUs that support it, fp16 (with loss scaling) on older GPUs, fp32 on CPU."""
    if mode == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if mode == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("precision.mode=bf16: this GPU has no bf16 support; use fp16 or auto")
    return mode


def setup(device: str, precision: PrecisionConfig) -> Runtime:
    """Device and precision; under torchrun (WORLD_SIZE > 1) also the process group: NCCL on
    GPUs (one per local rank), gloo on CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = parse_device(device, "train.device")
    if dev.type == "cuda" and dev.index is None:  # set_device and DDP want an index: one GPU per local rank
        dev = torch.device("cuda", local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = precision.allow_tf32
        torch.backends.cudnn.allow_tf32 = precision.allow_tf32
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    console.speak(rank == 0)  # one process speaks for the job
    return Runtime(device=dev, precision=resolve_precision(precision.mode, dev), rank=rank, world_size=world_size)


BYTES_PER_PARAMETER = 16  # fp32 weights, their gradients and AdamW's two moments: 4 x 4 bytes


def machine_memory() -> int:
    """This machine's total RAM in bytes (0 when the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def parameter_count(model: ModelConfig) -> int:
    """The parameters of BertForPreTraining(model), from the config's numbers alone (no model is
    built: a million layers are counted at once); tests check it against built models. With
    vocab_size null (the tokenizer not trained yet) the vocabulary counts as its padding multiple:
    a lower bound, enough to refuse sizes that fail whatever the vocabulary."""
    h, i, layers = model.hidden_size, model.intermediate_size, model.num_hidden_layers
    vocab = padded_vocab_size(model) if model.vocab_size is not None else model.pad_vocab_multiple
    embeddings = (vocab + model.max_position_embeddings + model.type_vocab_size) * h + 2 * h  # + LayerNorm
    layer = (4 * h * h + 4 * h  # query, key, value and the attention output, with biases
             + 2 * h * i + i + h  # the feed-forward block
             + 2 * 2 * h)  # two LayerNorms
    pooler = h * h + h
    heads = (h * h + h + 2 * h + vocab  # MLM transform, its LayerNorm, the decoder bias (its weight is tied)
             + 2 * h + 2)  # NSP
    return embeddings + layers * layer + pooler + heads


def check_memory(model: ModelConfig, rt: Runtime, parallel: str) -> None:
    """Refuse sizes whose training state cannot fit, before anything is built: parameters x 16 bytes
    on the training device (divided over the processes under FSDP), against the GPU's memory, and
    the fp32 model each process first builds on the CPU, against the machine's RAM (times the
    processes on this machine). Activations come on top, so passing is no promise; failing is sure.
    The count is closed-form (parameter_count), so an absurd size is refused in microseconds; with
    vocab_size null it is a lower bound, and the check runs again once the tokenizer is known."""
    n = parameter_count(model)
    shards = rt.world_size if rt.distributed and parallel == "fsdp" else 1
    on_device = BYTES_PER_PARAMETER * n // shards
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # this job's processes on this machine
    h, hidden = model.hidden_size, f"model.hidden_size={model.hidden_size:,}"
    layers = n - parameter_count(dataclasses.replace(model, num_hidden_layers=0))
    parts = {  # the terms that can dominate, each named by the values that make it
        f"model.vocab_size={model.vocab_size or 0:,} x {hidden}": (padded_vocab_size(model) if model.vocab_size else 0) * h,
        f"model.max_position_embeddings={model.max_position_embeddings:,} x {hidden}": model.max_position_embeddings * h,
        f"model.type_vocab_size={model.type_vocab_size:,} x {hidden}": model.type_vocab_size * h,
        f"model.num_hidden_layers={model.num_hidden_layers:,} x {layers // model.num_hidden_layers:,} per layer (from "
        f"{hidden} and model.intermediate_size={model.intermediate_size:,})": layers,
    }
    named, biggest = max(parts.items(), key=lambda kv: kv[1])
    culprit = (f"{named} alone makes {biggest:,} of them" if biggest > n // 2 else
               "model.hidden_size, model.intermediate_size and model.num_hidden_layers decide most of them")
    checks = [(4 * n * local if rt.device.type == "cuda" else max(4 * n, on_device) * local, machine_memory(),
               "this machine's memory")]
    if rt.device.type == "cuda":
        checks.insert(0, (on_device, torch.cuda.get_device_properties(rt.device).total_memory,
                          f"the GPU's memory ({torch.cuda.get_device_name(rt.device)})"))
    for need, have, where in checks:
        if have and need > have:
            raise UsageError(f"the model is too large to train here: {n:,} parameters need {need / 2**30:,.1f} GiB "
                             f"for fp32 weights, gradients and AdamW state ({BYTES_PER_PARAMETER} bytes each, before "
                             f"activations) but {where} is {have / 2**30:,.1f} GiB; {culprit}: choose smaller sizes")


COMPILE_BACKEND = "inductor"  # tests use "aot_eager": the same graph capture without minutes of code generation


def parallelize(model: BertForPreTraining, rt: Runtime, parallel: str, every_parameter_used: bool,
                compile: bool = False) -> nn.Module:
    """Put `model` on the device and return what the training step calls: the model itself in
    one process; under torchrun a DistributedDataParallel wrapper (`ddp`: a whole model on each
    process, gradients all-reduced), or the model sharded in place by FSDP2 (`fsdp`: each
    encoder layer, then the rest, keeps 1/world of its parameters, gradients and optimizer state
    on each process; a layer is gathered for its forward and backward only). Build the
    optimizer after this: FSDP2 turns parameters into DTensor shards.

    `compile` compiles each encoder layer in place (as torchtitan does, before sharding): the
    layers are alike, so one compiled graph serves them all, and the hooks of DDP and FSDP stay
    outside the graphs. A new sequence length recompiles once, then shapes are dynamic.
    """
    if compile:
        for block in model.blocks:
            block.compile(backend=COMPILE_BACKEND)
    if rt.distributed and parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard  # a second to import: only when used

        # The MLM logits are a view (the vocabulary padding sliced off); FSDP2 warns that an
        # in-place op on a view would skip its hook. Nothing writes to them in place.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        for block in model.blocks:  # shards go to this process's device
            fully_shard(block)
        fully_shard(model)  # embeddings, pooler and heads (with the tied decoder) as one group
        return model
    model.to(rt.device)
    if not rt.distributed:
        return model
    # Without NSP the pooler and NSP head get no gradient: DDP must be told to expect that.
    return DDP(model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
               find_unused_parameters=not every_parameter_used)


def gradient_sync(train_model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Turn the gradient all-reduce (DDP) or reduce-scatter (FSDP) off for accumulation
    micro-batches; gradients are then reduced once, on the step's last micro-batch."""
    if hasattr(train_model, "set_requires_gradient_sync"):  # an FSDPModule
        train_model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()
    if isinstance(train_model, DDP) and not enabled:
        return train_model.no_sync()
    return contextlib.nullcontext()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a replicated DTensor (FSDP's gradient norm); other tensors as they are."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


# Token slots per micro-batch (batch_size x max_seq_length) from which unpadding pays on a GPU.
# Measured on an H100 at BERT-base (bench_pretrain --lengths real --unpad, pretrain 60 steps):
# +6% at 256 x 128 and 32 x 512 (the padding share saved), -10% at 64 x 128, where the step is bound
# by kernel launches and the packing's few extra kernels cost more than the padding.
UNPAD_MIN_TOKENS = 16_384


def unpadded(setting: bool | None, device: torch.device, attention_dropout: float, micro_batch_tokens: int,
             precision: str = "bf16") -> tuple[bool, str | None]:
    """Whether the encoder runs on the real tokens only (train.unpad), and why not when asked for.
    Its attention (FlashAttention's variable-length kernel on GPUs, a padded reference on CPUs)
    has no attention dropout, so it applies only without; null (automatic) takes it on GPUs for
    micro-batches large enough for it to pay (on CPUs it computes the same, no faster)."""
    if setting is False:
        return False, None
    if setting is None:
        from bertcli.model import varlen_attention_available  # FlashAttention's kernel: half precision, recent torch

        return (device.type == "cuda" and attention_dropout == 0 and micro_batch_tokens >= UNPAD_MIN_TOKENS
                and precision in ("bf16", "fp16") and varlen_attention_available()), None
    if attention_dropout > 0:
        return False, (f"train.unpad is true but model.attention_probs_dropout_prob is {attention_dropout}, and the "
                       "unpadded attention has no dropout: training padded (set it to 0 to train unpadded)")
    return True, None


def fused_adamw(device: torch.device) -> bool:
    """Whether AdamW runs as torch's fused kernel here: on GPUs, and on CPUs too, where at BERT-base
    size it measured 6.4x the default per-parameter loop (81 ms against 524 ms a step, 2 threads):
    the loop allocates temporaries (sqrt, div) as large as each parameter, the fused kernel none."""
    return device.type in ("cuda", "cpu")


def data_workers(device: torch.device, configured: int | None) -> int:
    """Example-building processes: on a GPU four keep the step fed (a BERT-base batch of 256 takes
    about 40 ms to build on one core, longer than an H100 step); on a CPU they would take cores
    from training, so examples are built in the training process."""
    if configured is not None:
        return configured
    return 4 if device.type == "cuda" else 0


def loader(dataset: torch.utils.data.Dataset, workers: int, pin_memory: bool) -> torch.utils.data.DataLoader:
    """Items in order, built by `workers` forked processes (which share the memory-mapped corpus)
    a few items ahead, and pinned for asynchronous copies to the GPU."""
    fork = "fork" if workers and "fork" in multiprocessing.get_all_start_methods() else None
    return torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False, num_workers=workers,
                                       pin_memory=pin_memory, prefetch_factor=4 if workers else None,
                                       multiprocessing_context=fork, worker_init_fn=_ignore_stop_signals)


def _ignore_stop_signals(worker_id: int) -> None:
    """Ctrl-C and a scheduler's SIGTERM reach the whole process group: the workers leave the
    graceful stop to the training process (which still needs batches to finish its step) and
    end when it shuts the loader down, or when it dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def seed_step(seed: int, step: int, rank: int = 0) -> None:
    """Seed torch (dropout) for one step from (seed, step, rank): the step's randomness is then a
    pure function of them, so resuming restores it without saved generator states."""
    torch.manual_seed(int(np.random.SeedSequence([seed, step, rank]).generate_state(1, dtype=np.uint64)[0] >> 1))


# Dense bf16 matrix peak of known GPUs, TFLOP/s, for MFU (logging.peak_tflops overrides).
PEAK_BF16_TFLOPS = {"H100 SXM": 989.0, "H100 80GB HBM3": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0,
                    "H200": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 125.0}


def peak_tflops(device: torch.device, override: float) -> float | None:
    """The device's dense bf16 peak (TFLOP/s), None when unknown (CPUs, unlisted GPUs)."""
    if override > 0:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
