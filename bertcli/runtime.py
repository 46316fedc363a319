"""Every runtime decision in one place: device, precision, seeding.

The model and the data code never look at devices or dtypes; the trainer asks this module.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from bertcli.config import PrecisionConfig
from bertcli.errors import UsageError


@dataclass
class Runtime:
    device: torch.device
    precision: str  # resolved: fp32, bf16 or fp16

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)

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


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"device {name!r}: no CUDA GPU is visible to PyTorch; use --device cpu (or auto)")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
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
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = precision.allow_tf32
        torch.backends.cudnn.allow_tf32 = precision.allow_tf32
    return Runtime(device=dev, precision=resolve_precision(precision.mode, dev))


def seed_step(seed: int, step: int) -> None:
    """Seed torch (dropout) for one step from (seed, step): the step's randomness is then a
    pure function of them, so resuming restores it without saved generator states."""
    torch.manual_seed(int(np.random.SeedSequence([seed, step]).generate_state(1, dtype=np.uint64)[0] >> 1))
