"""sizes: the activation bytes of an example against what autograd saves, and the micro-batch a machine gets."""

from __future__ import annotations

import contextlib

import pytest
import torch

from bertcli import sizes
from bertcli.config_load import config_from_dict, debug_config, load_config, preset_config
from bertcli.errors import UsageError
from bertcli.model import BertForPreTraining
from bertcli.sizes import Placement, largest_micro_batch, split
from bertcli.trainer import pretraining_loss

GIB = 2**30


def saved_bytes(cfg, rows: int, autocast: torch.dtype | None) -> int:
    """Bytes autograd saves for the backward of `rows` examples (the loss's included), and their MLM logits."""
    torch.manual_seed(0)
    model = BertForPreTraining(cfg.model).train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if (ptr := t.untyped_storage().data_ptr()) not in weights:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    seq, p, vocab = cfg.data.max_seq_length, cfg.data.max_predictions_per_seq, cfg.model.vocab_size
    ids, segments = torch.randint(5, vocab, (rows, seq)), torch.zeros(rows, seq, dtype=torch.long)
    positions = torch.stack([torch.randperm(seq)[:p] for _ in range(rows)])  # (rows, P)
    batch = type(
        "Batch",
        (),
        {"mlm_labels": torch.randint(5, vocab, (rows, p)), "nsp_labels": torch.zeros(rows, dtype=torch.long)},
    )
    context = torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), context:
        out = model(ids, segments, None, positions)
        pretraining_loss(out, batch, mlm_weight=1.0, nsp_weight=1.0)
    return sum(storages.values()) + out.mlm_logits.nbytes  # the logits live until the backward


@pytest.mark.parametrize("autocast", [None, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(
    "shape",
    [
        ["model.hidden_size=64", "model.num_attention_heads=2", "model.intermediate_size=256"],
        [
            "model.hidden_size=96",
            "model.num_attention_heads=4",
            "model.attention_probs_dropout_prob=0",
            "data.max_seq_length=64",
        ],
    ],
    ids=["dropout", "no-attention-dropout"],
)
def test_activation_bytes_bound_what_autograd_saves_closely(shape, autocast):
    cfg = debug_config(
        ["model.vocab_size=512", "model.max_position_embeddings=64", "data.max_predictions_per_seq=9", *shape]
    )
    measured = (saved_bytes(cfg, 6, autocast) - saved_bytes(cfg, 2, autocast)) / 4  # per example: no weights' casts
    estimate = sizes.activation_bytes(cfg, Placement(half=autocast is not None, fp16=autocast == torch.float16))
    assert measured <= estimate <= 1.1 * measured, (measured, estimate)


def test_the_largest_divisor_that_fits_is_the_micro_batch():
    assert largest_micro_batch(256, 10, 640) == 64
    assert largest_micro_batch(256, 10, 639) == 32
    assert largest_micro_batch(256, 10, 10**9) == 256  # never more than the share
    assert largest_micro_batch(250, 10, 730) == 50  # divisors of 250 below 73
    assert largest_micro_batch(7, 10**9, 0) == 1  # nothing fits: one example (check_batch refuses it)


def test_the_base_preset_takes_the_whole_step_on_a_gpu_and_splits_it_on_a_small_one():
    cfg = preset_config("base", ["model.vocab_size=30522"])
    h100 = split(cfg, Placement(half=True, gpu=(80 * GIB, "H100")))
    assert (h100.micro, h100.accum) == (256, 1) and "H100" in h100.why
    small = split(cfg, Placement(half=True, gpu=(8 * GIB, "small")))
    per_example = sizes.activation_bytes(cfg, Placement(half=True, gpu=(8 * GIB, "small")))
    budget = sizes.GPU_SHARE * (8 * GIB - sizes.BYTES_PER_PARAMETER * sizes.parameter_count(cfg.model))
    assert small.micro * per_example <= budget < 2 * small.micro * per_example and small.micro * small.accum == 256
    two = split(cfg, Placement(half=True, world_size=2, gpu=(80 * GIB, "H100")))
    assert (two.micro, two.accum) == (128, 1), "each of 2 processes takes half the step"


def test_a_fixed_micro_batch_must_divide_a_process_share():
    cfg = debug_config(["train.batch_size=24", "train.micro_batch_size=6"])
    assert (split(cfg, Placement(half=False)).accum, split(cfg, Placement(half=False, world_size=2)).accum) == (4, 2)
    with pytest.raises(UsageError, match="train.micro_batch_size=6 does not divide the 8 examples"):
        split(cfg, Placement(half=False, world_size=3))
    with pytest.raises(UsageError, match="train.batch_size=24 is not a multiple of the 5 processes"):
        split(cfg, Placement(half=False, world_size=5))


def test_processes_on_one_cpu_machine_share_its_memory(monkeypatch):
    cfg = preset_config("base", ["model.vocab_size=30522"])
    monkeypatch.setattr(sizes, "machine_memory", lambda: 64 * GIB)
    alone = split(cfg, Placement(half=False, world_size=4))  # 4 machines of 64 GiB
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    shared = split(cfg, Placement(half=False, world_size=4))  # 4 processes on this one
    per_example, state = sizes.activation_bytes(cfg, Placement(half=False)), 16 * sizes.parameter_count(cfg.model)
    assert 4 * (shared.micro * per_example + state) <= 64 * GIB * sizes.CPU_SHARE + 4 * state
    assert shared.micro < alone.micro and shared.micro * shared.accum == alone.micro * alone.accum == 64


def test_a_config_of_bertcli_0_1_keeps_its_step(monkeypatch, tmp_path):
    """Its train.batch_size was the micro-batch and train.grad_accum_steps their count, per process; --set on it
    means what it means today."""
    old = {"train": {"batch_size": 64, "grad_accum_steps": 4}}
    cfg = config_from_dict(old, "old.yaml")
    assert (cfg.train.batch_size, cfg.train.micro_batch_size) == (256, 64)
    (tmp_path / "old.yaml").write_text("train:\n  batch_size: 64\n  grad_accum_steps: 4\n")
    assert load_config(tmp_path / "old.yaml", ["train.batch_size=512"]).train.batch_size == 512
    with pytest.raises(UsageError, match="must be positive integers, got 64, 0"):
        config_from_dict({"train": {"batch_size": 64, "grad_accum_steps": 0}}, "old.yaml")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert config_from_dict(old, "old.yaml").train.batch_size == 512
    with pytest.raises(
        UsageError, match=r"train.grad_accum_steps \(bertcli 0.1.s\): replaced by train.micro_batch_size"
    ):
        config_from_dict({"train": {"grad_accum_steps": 4, "micro_batch_size": None}}, "mixed.yaml")
    assert preset_config("base").train.batch_size == 256 and preset_config("base").train.micro_batch_size is None


@pytest.mark.parametrize(
    "preset, seq, predictions, rows, peak_gib",  # benchmarks/gpu-2026-11-26-h100/final/bench_{base,large}.txt
    [("base", 128, 19, 256, 18.9), ("large", 512, 77, 32, 22.1)],
)
def test_the_gpu_budget_covers_the_peaks_measured_on_an_h100(preset, seq, predictions, rows, peak_gib):
    """A micro-batch the budget admits needs at most state + its activation_bytes / GPU_SHARE: the peaks measured in
    bf16 on an H100 (the backward's temporaries and weight copies included) stay below that."""
    sets = ["model.vocab_size=30522", f"data.max_seq_length={seq}", f"data.max_predictions_per_seq={predictions}"]
    cfg = preset_config(preset, sets)
    state = sizes.BYTES_PER_PARAMETER * sizes.parameter_count(cfg.model)
    admitted = (
        state + rows * sizes.activation_bytes(cfg, Placement(half=True, gpu=(80 * GIB, "H100"))) / sizes.GPU_SHARE
    )
    assert peak_gib * GIB <= admitted
