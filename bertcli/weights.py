"""safetensors weights checked whoever wrote them: shapes from the header, values finite from raw words or tensors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import safetensors

from bertcli import hf_names
from bertcli.config import ModelConfig
from bertcli.errors import UsageError
from bertcli.sizes import padded_vocab_size

if TYPE_CHECKING:
    import torch
    from torch import nn

# A float is inf or NaN when its exponent bits are all set: each format's word and those bits.
EXPONENT_BITS = {
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
    "F32": (np.uint32, 0x7F80_0000),
    "F64": (np.uint64, 0x7FF0_0000_0000_0000),
}
Shapes = dict[str, tuple[int, ...]]  # a weight's name: its shape
FINITE_CHUNK = 1 << 22  # words looked at at once: the masks stay at a few MB whatever the tensor
# The sizes of a config against the tensors holding them as their shape.
SIZED = [
    (("vocab_size", "hidden_size"), "bert.embeddings.word_embeddings.weight"),
    (("max_position_embeddings", "hidden_size"), "bert.embeddings.position_embeddings.weight"),
    (("type_vocab_size", "hidden_size"), "bert.embeddings.token_type_embeddings.weight"),
    (("intermediate_size", "hidden_size"), "bert.encoder.layer.0.intermediate.dense.weight"),
]


def stored_shapes(file: Path) -> Shapes:
    """A safetensors file's shapes (bertcli's names) from its header; refused: unreadable, a weight twice, not float."""
    try:
        with safetensors.safe_open(file, "numpy") as f:  # the header only; "pt" would import torch
            header = {key: (tuple(f.get_slice(key).get_shape()), f.get_slice(key).get_dtype()) for key in f.keys()}
    except (safetensors.SafetensorError, OSError, ValueError) as exc:
        raise UsageError(f"{file}: cannot read weights ({exc}); the file is damaged: restore it") from None
    try:
        names = hf_names.our_keys(header)  # bertcli's name -> the file's key
    except ValueError as exc:
        raise UsageError(f"{file}: {exc}, and bertcli cannot tell which is the model's: remove the other") from None
    odd = [key for key in names.values() if header[key][1] not in EXPONENT_BITS]
    if odd:
        raise UsageError(f"{file}: {odd[0]} is stored as {header[odd[0]][1]}; use the model's floating-point weights")
    return {new: header[key][0] for new, key in names.items()}


def check_shapes(found: Shapes, expected: Shapes, file: Path, optional: tuple[str, ...] = ()) -> list[str]:
    """Refuse shapes `found` that do not fit `expected`; those missing under the `optional` prefixes (made fresh)."""
    missing = sorted(set(expected) - set(found))
    needed = [k for k in missing if not k.startswith(optional)]
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(k for k in set(expected) & set(found) if found[k] != expected[k])
    parts = [f"{len(needed)} missing (e.g. {needed[0]})"] if needed else []
    parts += [f"{len(unexpected)} unexpected (e.g. {unexpected[0]})"] if unexpected else []
    if wrong:
        parts.append(f"{len(wrong)} of another shape (e.g. {wrong[0]}: {found[wrong[0]]} vs {expected[wrong[0]]})")
    if parts:
        raise UsageError(f"{file}: weights do not fit this model: {'; '.join(parts)}")
    return missing


def check_file(file: Path, cfg: ModelConfig, config: Path, optional: tuple[str, ...] = ()) -> None:
    """Refuse a weights file not of the sizes `config` says (`cfg`), by its header: before anything that size exists."""
    shapes = stored_shapes(file)
    mismatch = "they do not belong together: restore the folder's files"
    layers = {int(m.group(1)) for key in shapes if (m := re.match(r"bert\.encoder\.layer\.(\d+)\.", key))}
    if len(layers) != cfg.num_hidden_layers:
        said = f"{config} says num_hidden_layers {cfg.num_hidden_layers:,}"
        raise UsageError(f"{said}, but {file.name} holds {len(layers):,} layers: {mismatch}")
    for fields, key in SIZED:
        if key not in shapes:
            raise UsageError(f"{file}: the encoder is incomplete (no {key}); restore the file")
        expected = tuple(getattr(cfg, name) for name in fields)
        rows = {expected[0], padded_vocab_size(cfg)} if fields[0] == "vocab_size" else {expected[0]}
        if len(shapes[key]) != 2 or shapes[key][0] not in rows or shapes[key][1] != expected[1]:
            said = " and ".join(f"{name} {getattr(cfg, name):,}" for name in fields)
            raise UsageError(f"{config} says {said}, but {file.name} holds {key} of shape {shapes[key]}: {mismatch}")
    for key in hf_names.VOCAB_ROWS:  # vocabulary rows as stored, padded or not
        if key in shapes and shapes[key][0] == cfg.vocab_size:
            shapes[key] = (padded_vocab_size(cfg), *shapes[key][1:])
    check_shapes(shapes, hf_names.weight_shapes(cfg), file, optional)


def refuse_non_finite(bad: list[str], file: Path, fix: str) -> None:
    if bad:
        raise UsageError(f"{file}: {len(bad)} weight tensor(s) hold NaN or inf (e.g. {bad[0]}); {fix}")


def check_finite_file(file: Path, fix: str) -> None:
    """Refuse a weights file holding NaN or inf, read as raw words (numpy: before torch loads)."""
    stored_shapes(file)  # the header checked: its offsets lie in the file, every weight a float
    with open(file, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    data = np.memmap(file, dtype=np.uint8, mode="r", offset=8 + size)
    bad = []
    for key, entry in header.items():
        if key == "__metadata__" or entry["dtype"] not in EXPONENT_BITS:
            continue
        word, bits = EXPONENT_BITS[entry["dtype"]]
        words = data[entry["data_offsets"][0] : entry["data_offsets"][1]].view(word)
        if any(((words[i : i + FINITE_CHUNK] & bits) == bits).any() for i in range(0, words.size, FINITE_CHUNK)):
            bad.append(key)
    refuse_non_finite(bad, file, fix)


def non_finite(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors holding NaN or inf (the sum first: no mask of a finite tensor)."""
    import torch

    floats = {name: t for name, t in tensors.items() if torch.is_floating_point(t)}
    return [name for name, t in floats.items() if not torch.isfinite(t.sum()) and not bool(torch.isfinite(t).all())]


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every floating-point tensor holds only finite numbers (one host sync per device)."""
    import torch

    checks: dict[Any, list[torch.Tensor]] = {}
    for t in tensors:
        if torch.is_floating_point(t):
            checks.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(per_device).all()) for per_device in checks.values())


def load(file: Path, fix: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, refused where it does not read or holds NaN or inf."""
    import safetensors.torch

    try:
        tensors = safetensors.torch.load_file(file)
    except (safetensors.SafetensorError, OSError, ValueError) as exc:
        raise UsageError(f"{file}: cannot read weights ({exc}); the file is damaged: {fix}") from None
    refuse_non_finite(non_finite(tensors), file, fix)
    return tensors


def check_fits(weights: dict[str, torch.Tensor], model: nn.Module, file: Path) -> None:
    """check_shapes of loaded `weights` against `model` (under FSDP a DTensor's shape is the whole's)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in hf_names.TIED_ALIASES}
    check_shapes({k: tuple(v.shape) for k, v in weights.items()}, expected, file)
