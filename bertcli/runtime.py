"""Where this process runs: its device, its precision and its place in the job (rank, world size)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bertcli import console
from bertcli.config import PrecisionConfig
from bertcli.errors import UsageError
from bertcli.sizes import Placement
from bertcli.stopping import exit_on_signal

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # fp32: no autocast
# torch.cpu's probes of the instructions that run each autocast dtype natively on a CPU.
NATIVE_ON_CPU = {"bf16": ("_is_avx512_bf16_supported", "_is_amx_tile_supported"), "fp16": ("_is_amx_fp16_supported",)}
# Token slots per micro-batch from which unpadding pays (H100, BERT-base: +6% at 256 x 128, -10% at 64 x 128).
UNPAD_MIN_TOKENS = 16_384


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

    def placement(self) -> Placement:
        props = torch.cuda.get_device_properties(self.device) if self.device.type == "cuda" else None
        gpu = (props.total_memory, props.name) if props else None
        half, fp16 = self.autocast_dtype is not None, self.autocast_dtype == torch.float16
        return Placement(half=half, world_size=self.world_size, gpu=gpu, fp16=fp16)

    def describe(self) -> str:
        threads = f"cpu ({torch.get_num_threads()} threads)"
        where = f"cuda ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else threads
        return f"device {where}, precision {self.precision}, torch {torch.__version__}"


def parse_device(name: str, what: str = "device") -> torch.device:
    """The torch.device of a device name (its form checked by its owner); UsageError for a GPU not there."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{what} {name!r}: no CUDA GPU is visible to PyTorch; use {what} cpu (or auto)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"{what} {name!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return device


def resolve_precision(mode: str, device: torch.device) -> str:
    """auto: bf16 on GPUs that support it, fp16 (with loss scaling) on older GPUs, fp32 on CPU."""
    if mode == "auto":
        return "fp32" if device.type != "cuda" else "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if mode == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("precision.mode=bf16: this GPU has no bf16 support; use fp16 or auto")
    return mode


def slow_autocast(rt: Runtime) -> str | None:
    """A warning for half precision on a CPU without its instructions (emulated, ~10x slower); else None."""
    if rt.device.type != "cpu" or rt.autocast_dtype is None:
        return None
    if any(getattr(torch.cpu, probe, lambda: True)() for probe in NATIVE_ON_CPU[rt.precision]):
        return None
    without = f"a CPU without {rt.precision} instructions ({torch.backends.cpu.get_cpu_capability()})"
    return f"{rt.precision} on {without}: torch emulates it, several times slower than fp32 here"


def setup(device: str, precision: PrecisionConfig) -> Runtime:
    """Device and precision; under torchrun also the process group (NCCL on GPUs, one per local rank; gloo on CPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = parse_device(device, "train.device")
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank) if dev.index is None else dev  # DDP wants an index: a GPU per local rank
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = precision.allow_tf32
        torch.backends.cudnn.allow_tf32 = precision.allow_tf32
    if world_size > 1 and not dist.is_initialized():
        if "TORCHELASTIC_RUN_ID" not in os.environ:  # another launcher, or the variables set by mistake
            where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            waiting = f"waiting for the job's other processes at {where}; if set by mistake, Ctrl-C and unset them"
            console.log(f"RANK={rank} and WORLD_SIZE={world_size} are set, not by torchrun: {waiting}")
        with exit_on_signal("while waiting for the job's other processes; nothing was written"):
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    console.speak(rank == 0)  # one process speaks for the job
    return Runtime(device=dev, precision=resolve_precision(precision.mode, dev), rank=rank, world_size=world_size)


def unpadded(
    setting: bool | None, *, device: torch.device, precision: str, attention_dropout: float, micro_batch_tokens: int
) -> tuple[bool, str | None]:
    """Whether the encoder runs on the real tokens only (train.unpad; null: where it pays), and why not if asked for."""
    if setting is False:
        return False, None
    if setting is None:
        from bertcli.model import varlen_attn

        fits = device.type == "cuda" and precision in ("bf16", "fp16") and micro_batch_tokens >= UNPAD_MIN_TOKENS
        return fits and attention_dropout == 0 and varlen_attn() is not None, None
    if attention_dropout > 0:
        return False, f"train.unpad: model.attention_probs_dropout_prob is {attention_dropout}, so training padded"
    return True, None
