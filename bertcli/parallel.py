"""How the model runs over the job's processes: compiled layers, DDP or FSDP2, and when gradients are reduced."""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from bertcli.model import BertForPreTraining
from bertcli.runtime import Runtime

COMPILE_BACKEND = "inductor"  # tests use "aot_eager": the same graph capture without minutes of code generation


def parallelize(
    model: BertForPreTraining, rt: Runtime, *, parallel: str, every_parameter_used: bool, compile: bool = False
) -> nn.Module:
    """`model` on the device; what the step calls: itself, DDP-wrapped or FSDP2-sharded (then build the optimizer)."""
    if compile:
        for block in model.blocks:
            block.compile(backend=COMPILE_BACKEND)
    if rt.distributed and parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard  # a second to import: only when used

        # The MLM logits are a view (the vocabulary padding sliced off), which nothing writes to in place.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        for block in model.blocks:  # shards go to this process's device
            fully_shard(block)
        fully_shard(model)  # embeddings, pooler and heads (with the tied decoder) as one group
        return model
    model.to(rt.device)
    if not rt.distributed:
        return model
    ids = [rt.device.index] if rt.device.type == "cuda" else None
    # Without NSP the pooler and NSP head get no gradient: DDP must be told to expect that.
    return DDP(model, device_ids=ids, find_unused_parameters=not every_parameter_used)


def gradient_sync(train_model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Turn the gradient reduction (DDP, FSDP) off for all but a step's last micro-batch (`enabled`)."""
    if hasattr(train_model, "set_requires_gradient_sync"):  # an FSDPModule
        train_model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()
    return train_model.no_sync() if isinstance(train_model, DDP) and not enabled else contextlib.nullcontext()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a replicated DTensor (FSDP's gradient norm); other tensors as they are."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
