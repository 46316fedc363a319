"""AdamW parameter groups, the learning-rate schedule, and the step that skips non-finite gradients.

The schedule is a pure function of the step, so resuming needs no scheduler state.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bertcli.config import OptimizerConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Biases and LayerNorm weights get no weight decay (as in Google BERT)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # tied weights appear once
        if not param.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def fused_adamw(device: torch.device) -> bool:
    """Whether AdamW runs as torch's fused kernel: on GPUs, and on CPUs, where at BERT-base size it is 6.4x the
    per-parameter loop (which allocates temporaries as large as each parameter)."""
    return device.type in ("cuda", "cpu")


def build_optimizer(model: nn.Module, cfg: OptimizerConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW; `fused`: one kernel updates every parameter in place (see fused_adamw)."""
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused or None
    )


def lr_at(step: int, cfg: OptimizerConfig, max_steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based, the update that makes step `step + 1`).

    Warm-up: lr * (step + 1) / warmup_steps, so the first update already learns (Hugging Face's step /
    warmup_steps spends it at lr 0). Decay: Hugging Face's, with progress from 0 after warm-up towards 1 at
    max_steps, one past the last update, so the last update still learns.
    """
    warmup = cfg.warmup_steps
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    if cfg.schedule == "constant" or max_steps <= warmup:
        return cfg.lr
    progress = min(1.0, (step - warmup) / (max_steps - warmup))  # 0 -> 1 (at max_steps)
    if cfg.schedule == "linear":
        factor = 1.0 - progress
    else:  # cosine
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * factor)


def step_if_finite(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, finite: torch.Tensor) -> None:
    """Apply the optimizer step unless the gradients are not finite (`finite`, a () bool tensor): a skipped
    step changes neither the weights nor Adam's moments and step count. With fp16 the grad scaler decides; a
    fused optimizer skips in its kernel (its `found_inf` input), so the host never waits for the check."""
    if scaler.is_enabled():
        scaler.step(optimizer)
    elif optimizer.defaults.get("fused"):
        optimizer.found_inf = (~finite).float()  # read by the fused kernel; it also undoes the step count
        optimizer.step()
    elif bool(finite):
        optimizer.step()
