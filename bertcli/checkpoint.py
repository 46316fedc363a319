"""Checkpoints: the `CheckpointManager` saves and restores the named parts of the training state.

A checkpoint is a folder `output_dir/checkpoints/step-NNNNNNN/` (layout.py names its files) holding
  model.safetensors    part "model": the weights under Hugging Face BertForPreTraining key names
                       (tied aliases left out)
  training_state.pt    every other part under its name ("optimizer": its state keyed by parameter
                       name; "scaler": the fp16 grad scaler's) and the step; loads with
                       torch.load(weights_only=True)
  trainer_state.json   step, tokens seen, training time, last metrics (what `inspect` reads, no torch)
  config.yaml          the resolved run config
  tokenizer.json, vocab.txt   the tokenizer the run trains with, as read when it started
As in torchtitan's CheckpointManager, the parts are objects with state_dict() and load_state_dict()
(`Stateful`): `CheckpointManager.save(step)` and `.load(...)` go through them, so a part passed to
`load` is saved and restored with the others, with no other change. WRITERS says how each file is
written. The RNG needs no saved state: every step reseeds from (seed, step), and the data position
is the step (a batch is a function of (seed, step)).
It is written into a temporary folder and renamed into place, so a folder named step-* is
always complete. Its files are read as bertcli's own: one that is a symbolic link is refused (or,
resuming, the checkpoint is set aside as damaged), never followed out of the folder, and weights
holding NaN or inf are refused wherever they are loaded.
Weights and optimizer state are saved whole (gathered from FSDP shards), so a checkpoint resumes
on any number of processes, with or without FSDP.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pickle  # only for its exception type: nothing is unpickled here
import re
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from bertcli import __version__, atomic, console, layout, ownership
from bertcli.config import Config, to_dict
from bertcli.config_load import config_from_dict
from bertcli.config_write import to_yaml
from bertcli.data.tokenizer import TOKENIZER_SHA256, tokenizer_change
from bertcli.errors import BertcliError, DamagedFile, RunError, UsageError
from bertcli.hf_names import TIED_ALIASES, weight_keys
from bertcli.ownership import linked, must_record_hashes, read_own, read_own_json, sha256_of
from bertcli.resolve import PATH_KEYS

if TYPE_CHECKING:  # torch is imported by the functions that handle tensors: inspect reads checkpoints without it
    import torch
    from torch import nn

# 3: trainer_state.json always records the SHA-256 of the files (ownership.HASHES_RECORDED_FROM);
# 2: optimizer state keyed by parameter name (1: by position)
FORMAT_VERSION = 3


def own_file(path: Path) -> Path:
    """`path`, a file of a checkpoint folder; refused (exit 2) if it is a symbolic link."""
    if Path(path).is_symlink():
        raise linked(path)
    return Path(path)


def check_own_files(folder: Path) -> None:
    """Refuse (exit 2) a checkpoint folder one of whose files is a symbolic link."""
    for name in sorted(layout.CHECKPOINT.paths):
        own_file(Path(folder) / name)


def guard(target: Path) -> None:
    """Refuse (exit 2) to replace checkpoint folder `target` (step-NNNNNNN or best) unless bertcli
    wrote it and nobody added to it (see ownership.py). A symbolic link there is refused, not
    followed: bertcli makes none, and through one a new best replaced another checkpoint (a step of
    this run, or of another run) that kept its name."""
    if Path(target).is_symlink():
        raise ownership.linked(
            target, "checkpoints/", f"remove the link (rm {target}), or set output_dir to a new folder"
        )
    ownership.check_replaceable(
        target, layout.CHECKPOINT, f"move it out of {Path(target).parent}, or set output_dir to a new folder"
    )


def check_no_links(output_dir: Path, fix: str) -> None:
    """Refuse (exit 2) a run folder whose checkpoints/, best or a step folder is a symbolic link:
    bertcli makes none, and through one another run's checkpoint would be read as this run's
    (encoded, exported: published) or replaced by its saves."""
    root = layout.checkpoints_dir(output_dir)
    if root.is_symlink():
        raise ownership.linked(root, "a run folder", fix)
    for child in sorted(root.iterdir()) if root.is_dir() else ():
        if child.is_symlink() and (child.name == layout.BEST or layout.STEP_DIR.match(child.name)):
            raise ownership.linked(child, "checkpoints/", fix)


METRICS_START = b'{"step": '  # how every line of metrics.jsonl starts (metrics.MetricsLogger)


def check_run_outputs(output_dir: Path) -> None:
    """Refuse (exit 2) what lies in the way of a run's own outputs in output_dir and is not bertcli's:
    a file (not a folder) named checkpoints or tensorboard (trial 18 U2: refused after training, "File
    exists", exit 1), and, where the run starts fresh (no checkpoint), a metrics.jsonl with no record
    of a run in it (trial 18 S1: its lines were dropped as damaged, the file rewritten). Torch-free:
    `pretrain` asks before torch, and again where the run starts (check_start)."""
    fix = "move it away, or set output_dir to another folder"
    for name, what in ((layout.CHECKPOINTS, "its checkpoints"), (layout.TENSORBOARD, "its TensorBoard logs")):
        path = Path(output_dir) / name
        if (path.exists() or path.is_symlink()) and not path.is_dir():
            raise UsageError(f"{path}: a file bertcli did not write, where the run keeps {what} folder: {fix}")
    metrics = Path(output_dir) / layout.METRICS
    left = Path(output_dir) / layout.METRICS_LEFT  # (trial 24 S2: not bertcli's, so the records left out went unsaid)
    for path in (metrics, left):  # (trial 23 P3: a linked metrics.jsonl was replaced by a file, the link gone unsaid)
        if path.is_symlink():
            raise ownership.linked(
                path, "a run folder", f"remove the link (rm {path}), or set output_dir to another folder"
            )
    if left.exists():
        from bertcli.metrics import read_metrics_checked

        if not left.is_file() or read_metrics_checked(left)[1]:
            raise UsageError(
                f"{left}: not a file of records bertcli wrote, where a run keeps those it leaves out: {fix}"
            )
    if (
        metrics.is_file()
        and not layout.list_step_folders(output_dir)
        and not (layout.checkpoints_dir(output_dir) / layout.BEST).exists()
    ):
        from bertcli.metrics import read_metrics_checked

        records, bad = read_metrics_checked(metrics)
        with open(metrics, "rb") as fh:  # (a record's first bytes: a line cut by a crash keeps them)
            start = fh.read(len(METRICS_START))
        if not records and (bad or start and start != METRICS_START):
            raise UsageError(f"{metrics}: not a metrics file bertcli wrote (no line is a record of a run): {fix}")


def check_start(output_dir: Path, max_steps: int) -> None:
    """Before a run trains (rank 0): remove what a killed run was writing in checkpoints/, and
    refuse a folder there that bertcli did not write and could replace or delete: `best`, a
    complete step-NNNNNNN folder (pruning), or one of a step it may save (<= max_steps). An
    incomplete folder of a later step is never touched, so it stays. Refused now, not at a save
    hours later; and what check_run_outputs refuses."""
    check_run_outputs(output_dir)
    remove_leftovers(layout.checkpoints_dir(output_dir))  # (not through a link: check_replaceable refuses it)
    check_replaceable(output_dir, max_steps)


def check_replaceable(output_dir: Path, max_steps: int) -> None:
    """Refuse what check_start refuses in checkpoints/ (a link, a folder bertcli may replace that it did
    not write), from the files alone: `pretrain` asks before torch is imported too (trial 22 U1: a
    user's step-N folder was refused after 3.4 s and 252 MB)."""
    root = layout.checkpoints_dir(output_dir)
    if root.is_symlink():  # through it, this run pruned and replaced another run's checkpoints
        raise ownership.linked(root, "a run folder", f"remove the link (rm {root}), or set output_dir to a new folder")
    if root.is_dir():
        for child in sorted(root.iterdir()):
            match = layout.STEP_DIR.match(child.name)
            replaceable = match and (layout.is_checkpoint(child) or int(match.group(1)) <= max_steps)
            if child.name == layout.BEST or replaceable:
                guard(child)


# The temporary names atomic.folder gives a checkpoint (NAME being written, moved aside, being deleted).
_LEFTOVER = re.compile(
    rf"^{re.escape(atomic.TMP_PREFIX)}(?:old-|del-)?({layout.BEST}|{layout.STEP_PREFIX}\d+)\.\d{{1,9}}$"
)


def remove_leftovers(root: Path) -> None:
    """Remove what a killed writer of checkpoints left in `root` (checkpoints/): the temporary folders of
    a process that is gone, holding nothing but checkpoint files, and put back a folder moved aside
    whose replacement never came (ownership.remove_leftover_folders). Anything else of a temporary
    name is left alone (trial 21 S4: every .tmp-* there was deleted, whatever it held)."""
    if not root.is_dir() or root.is_symlink():
        return
    names = {match.group(1) for child in root.iterdir() if (match := _LEFTOVER.match(child.name))}
    for name in sorted(names):
        ownership.remove_leftover_folders(root / name, layout.CHECKPOINT)


def umask() -> int:
    """The process's umask, read without changing it (Linux says it in /proc; elsewhere set and restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """safetensors.torch.save_file, then the mode every other file gets (0666 less the umask):
    safetensors writes through a temporary file of its own, created 0600."""
    import safetensors.torch

    with atomic.writing(path):
        safetensors.torch.save_file(tensors, path, metadata=metadata)
    os.chmod(path, 0o666 & ~umask())


class ResumeRefused(UsageError):
    """Resuming is off (resume='never') but output_dir already holds checkpoints."""

    def __init__(self, folder: Path, count: int) -> None:
        super().__init__(
            f"{folder} already holds {count} checkpoint(s) and resume is 'never'; resume 'auto' to "
            "continue, or use another output_dir to start fresh"
        )
        self.folder, self.count = folder, count


class DamagedState(RunError):
    """A checkpoint's training_state.pt that cannot be loaded; `reason` says what and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}: resume from another checkpoint or start in a new output_dir")
        self.reason = reason


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every floating-point tensor holds only finite numbers (one host sync per device)."""
    import torch

    checks: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if torch.is_floating_point(t):
            checks.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(per_device).all()) for per_device in checks.values())


def non_finite(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors that hold NaN or inf. A tensor whose sum is finite holds
    only finite values; isfinite (which allocates a mask as large as the tensor) runs only where
    the sum is not (NaN, inf, or finite values so large that the sum overflows)."""
    import torch

    return [
        name
        for name, t in tensors.items()
        if torch.is_floating_point(t) and not torch.isfinite(t.sum()) and not bool(torch.isfinite(t).all())
    ]


def check_finite(tensors: dict[str, torch.Tensor], file: Path, fix: str = "use another checkpoint") -> None:
    """Refuse (exit 2) weights that hold NaN or inf: no model computes anything with them."""
    refuse_non_finite(non_finite(tensors), file, fix)


def refuse_non_finite(bad: list[str], file: Path, fix: str) -> None:
    """Refuse (exit 2) the weights of `file` if `bad` names any (those holding NaN or inf)."""
    if bad:
        raise UsageError(
            f"{file}: {len(bad)} weight tensor(s) hold NaN or inf (e.g. {bad[0]}); the file is damaged: {fix}"
        )


class Stateful(Protocol):
    """A part of the training state (torch.distributed.checkpoint's Stateful): what it holds now, and
    how it takes back what it held."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


MODEL = "model"  # the part written as model.safetensors; every other part goes into training_state.pt by name


def _full(**options: bool) -> Any:
    """StateDictOptions for whole (gathered, unsharded) state dicts."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions  # a few seconds to import: only when used

    return StateDictOptions(full_state_dict=True, **options)


class ModelPart:
    """The weights of `model` as a part: whole and on the CPU (gathered from the FSDP shards: every
    process calls state_dict, and only rank 0 gets them), without the tied aliases (their targets
    carry them); loaded back whole into whatever the model is now (sharded or not), once
    `check_fits` has checked them."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        weights = get_model_state_dict(self.model, options=_full(cpu_offload=True))
        # contiguous: what safetensors needs
        return {k: v.detach().contiguous() for k, v in weights.items() if k not in TIED_ALIASES}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        # strict=False: the tied aliases are not saved, they follow their targets (check_fits checked the rest)
        set_model_state_dict(self.model, dict(state), options=_full(strict=False))


class OptimizerPart:
    """The optimizer's state as a part, keyed by parameter name (not by position), whole and on the
    CPU as the weights are; loaded back, each process keeping its own shards."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer, options=_full(cpu_offload=True))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=_full())


@dataclass(frozen=True)
class Snapshot:
    """One checkpoint's contents, gathered: its step, the parts' states by name, what the trainer
    records in trainer_state.json (tokens seen, training time, metrics), the resolved config and
    the tokenizer files (name: bytes, as the run read them when it started)."""

    step: int
    states: dict[str, Any]
    trainer_state: dict[str, Any]
    cfg: Config
    tokenizer: dict[str, bytes]


def _write_weights(tmp: Path, snap: Snapshot) -> None:
    save_safetensors(
        # One key: safetensors writes its metadata map in a random order, so a second key made the bytes of
        # the same weights differ from save to save (trial 19 P1); the version is in trainer_state.json.
        snap.states[MODEL],
        tmp / layout.WEIGHTS,
        metadata={"format": "pt"},
    )


def _write_config(tmp: Path, snap: Snapshot) -> None:
    with atomic.writing(tmp / layout.CHECKPOINT_CONFIG):
        header = f"Resolved config of the run, saved at step {snap.step}."
        (tmp / layout.CHECKPOINT_CONFIG).write_text(to_yaml(snap.cfg, header))


def _write_training_state(tmp: Path, snap: Snapshot) -> None:
    parts = {name: state for name, state in snap.states.items() if name != MODEL}
    atomic.save_torch({**parts, "step": snap.step}, tmp / layout.TRAINING_STATE)


def _write_trainer_state(tmp: Path, snap: Snapshot) -> None:
    state = {
        "format_version": FORMAT_VERSION,
        "bertcli_version": __version__,
        "step": snap.step,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # What the tokenizer files were: a file edited later is found (tokenizer_change), not used.
        TOKENIZER_SHA256: {name: hashlib.sha256(contents).hexdigest() for name, contents in snap.tokenizer.items()},
        # And the weights and training state, written just before (WRITERS' order): a flipped bit that
        # leaves every value finite is found too (file_change), never loaded.
        FILES_SHA256: {name: sha256_of(tmp / name) for name in HASHED},
        **snap.trainer_state,
    }
    with atomic.writing(tmp / layout.TRAINER_STATE):
        (tmp / layout.TRAINER_STATE).write_text(json.dumps(state, indent=2) + "\n")


# How each file of a checkpoint is written from a Snapshot, in this order: every one of layout.CHECKPOINT_FILES
# (without which a checkpoint is incomplete), and any other of the names layout.CHECKPOINT owns.
WRITERS: dict[str, Callable[[Path, Snapshot], None]] = {
    layout.WEIGHTS: _write_weights,
    layout.CHECKPOINT_CONFIG: _write_config,
    layout.TRAINING_STATE: _write_training_state,
    layout.TRAINER_STATE: _write_trainer_state,
}


def _tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor in a state dict (nested dicts and lists)."""
    import torch

    if isinstance(state, torch.Tensor):
        return [state]
    values = state.values() if isinstance(state, dict) else state if isinstance(state, (list, tuple)) else ()
    return [t for value in values for t in _tensors(value)]


def write(output_dir: Path, snap: Snapshot, name: str | None = None) -> Path:
    """Write checkpoint `snap` atomically as checkpoints/step-NNNNNNN (or checkpoints/NAME), with
    the run's tokenizer files: a checkpoint is self-contained. Refused (RunError) when a part holds
    NaN or inf: resuming from such a checkpoint could only fail again."""
    final = layout.checkpoints_dir(output_dir) / (name or layout.step_dir_name(snap.step))
    if not all_finite(_tensors(snap.states)):
        raise RunError(
            f"step {snap.step}: the weights or optimizer state hold NaN or inf, so no checkpoint was written; "
            "the earlier checkpoints are intact: lower optimizer.lr and resume from one of them"
        )
    if not (
        set(layout.CHECKPOINT_FILES) <= set(WRITERS) <= layout.CHECKPOINT.paths
        and set(snap.tokenizer) <= set(layout.TOKENIZER_FILES)
    ):
        # (a slip in this code, not the user's)
        raise ValueError("a checkpoint holds the files layout.py names, no others")
    guard(final)  # here as well: atomic.folder sees the path resolved, through any link
    with atomic.folder(final, guard) as tmp:
        for file, contents in snap.tokenizer.items():
            with atomic.writing(tmp / file):
                (tmp / file).write_bytes(contents)
            atomic.fsync_path(tmp / file)
        for writer in WRITERS.values():
            writer(tmp, snap)
        for file in WRITERS:
            atomic.fsync_path(tmp / file)
    return final


def prune(output_dir: Path, keep_last: int) -> None:
    """Delete every step checkpoint but the newest `keep_last`; one the user added a file to stays
    (and was refused when the run started)."""
    for _, old in layout.list_checkpoints(output_dir)[:-keep_last]:
        if ownership.not_owned(old, layout.CHECKPOINT) is None:
            atomic.remove_folder(old)


def best_eval_loss(output_dir: Path) -> float | None:
    """Held-out MLM loss of checkpoints/best, if there is one (and it says it)."""
    best = layout.checkpoints_dir(output_dir) / layout.BEST
    if not layout.is_checkpoint(best):
        return None
    try:
        loss = read_trainer_state(best).get("eval_metrics", {}).get("mlm_loss")
    except (OSError, ValueError, AttributeError, UsageError):
        return None
    return loss if isinstance(loss, (int, float)) else None


def settle_best(output_dir: Path, cfg: Config, resumed_from: Path | None, is_main: bool = True) -> float | None:
    """`best` belongs to the run's current model and history: it is removed (by the main process,
    with a line) when the run starts fresh, when its model differs from `cfg`'s, when it is past
    the step resumed from (a history left behind) or does not load; return the held-out MLM loss of
    the `best` kept (None: none). Every process decides alike (the same files), whether or not the
    main one has removed it yet."""
    best = layout.checkpoints_dir(output_dir) / layout.BEST
    if not best.exists():
        return None
    loss, reason = best_eval_loss(output_dir), None
    if resumed_from is not None and Path(resumed_from) == best:  # (choose_resume checked it whole)
        return loss
    if resumed_from is None:
        reason = "this run starts fresh, so it was of another run"
    elif is_foreign(resumed_from, output_dir):  # (trial 18 P9)
        reason = (  # (trial 27 S1: a backup copy of the run's own was "another run's")
            f"this run resumes from a checkpoint outside its checkpoints folder (another run's, or a copy), "
            f"{resumed_from}, so it was of another history"
        )
    else:
        try:
            check_own_files(best)
            step, resumed = read_trainer_state(best)["step"], read_trainer_state(resumed_from)["step"]
            diffs = model_differences(read_config(best), cfg)
        except Exception:  # noqa: BLE001  unreadable, or a link: no best to keep
            loss = None
        if loss is None:
            reason = "it is damaged (its config, trainer state or held-out loss does not load)"
        elif diffs:
            reason = f"it is of another model ({diffs[0]})"
        elif step > resumed:
            reason = f"it is of step {step}, past the step resumed from ({resumed}): a history left behind"
    if reason is None:
        return loss
    if cfg.model.init_from and ownership.relation(best, Path(cfg.model.init_from)) is not None:
        return None  # the weights this run starts from: read after this, so left in place (replaced at the next best)
    if (
        is_main and best.exists() and not best.is_symlink() and ownership.not_owned(best, layout.CHECKPOINT) is None
    ):  # (refused at start otherwise)
        if loss is None or _step_kept(output_dir, best):  # damaged, or its weights are in a step folder too
            atomic.remove_folder(best)
            console.log(f"removed {best}: {reason}")
        else:  # the only copy of those weights (trial 27 S1: removed): set aside as the later step folders are
            aside = _rename_aside(best, layout.ABANDONED_PREFIX)
            console.log(
                f"{best}: {reason}; no step folder holds its weights, so it is renamed {aside.name}: {_kept_words(aside)}"
            )
    return None


def _step_kept(output_dir: Path, best: Path) -> bool:
    """Whether a step folder of the run (kept, or set aside as abandoned) is of best's step: the same weights."""
    try:
        step = read_trainer_state(best)["step"]
    except (OSError, KeyError, TypeError, UsageError):
        return False
    name = layout.step_dir_name(step)
    root = layout.checkpoints_dir(output_dir)
    return any(layout.is_checkpoint(root / n) for n in (name, layout.ABANDONED_PREFIX + name))


def read_config(path: Path) -> Config:
    """The resolved config stored in a checkpoint folder (an empty one is damage, not the defaults),
    refused after any edit since the checkpoint was written (its SHA-256): it holds the architecture
    the weights run in (an edited hidden_act or head count gives other vectors from the same weights)."""
    file = Path(path) / layout.CHECKPOINT_CONFIG
    changed = file_change(path, (layout.CHECKPOINT_CONFIG,))
    if changed:
        raise UsageError(f"{Path(path) / changed[0]}: {changed[1]}; restore it, or use another checkpoint")
    try:
        raw = yaml.safe_load(read_own(file).decode("utf-8"))
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # a cut file, say (UnicodeDecodeError: a ValueError)
        raise DamagedFile(file, exc) from None
    if not raw:
        raise UsageError(f"{file}: empty, where the checkpoint's resolved config belongs; use another checkpoint")
    return config_from_dict(raw, str(file))


def trained_length(cfg: Config, _depth: int = 0) -> int | None:
    """The positions a run of `cfg` trains, where fewer than its model has (None: all of them): its
    data.max_seq_length, or more where it started from a model (model.init_from) trained longer:
    a bertcli checkpoint's own trained length, a Hugging Face folder's model_max_length (trial 19 S2:
    a run continued at 64 from a model trained at 64 was taken as trained at every position). A
    source that is gone, or says nothing, counts as trained at all of them."""
    length = cfg.data.max_seq_length
    source = Path(cfg.model.init_from) if cfg.model.init_from else None
    if source is not None:
        from bertcli.hf_import import tokenizer_limit

        if layout.identify(source).kind is layout.Kind.CHECKPOINT and _depth < 16:
            try:
                inherited = checkpoint_trained_length(source, _depth + 1)
                inherited = inherited if inherited is not None else cfg.model.max_position_embeddings
            except (OSError, BertcliError):
                inherited = None
        else:
            inherited = tokenizer_limit(source) if layout.is_hf_folder(source) else None
        length = max(length, inherited) if inherited is not None else cfg.model.max_position_embeddings
    return length if length < cfg.model.max_position_embeddings else None


TRAINED_LENGTH = "trained_length"  # trainer_state.json: the longest sequences the run has trained on so far
PREPARED_DATA = "prepared_data"  # trainer_state.json: what the examples came from (PreparedData.identity)


def checkpoint_trained_length(path: Path, _depth: int = 0) -> int | None:
    """The positions the model of checkpoint `path` was trained at, where fewer than it has (None:
    all): the longest over its run's history, as trainer_state.json records it (trial 20 U2: a run
    trained at 128 and resumed at 64 counted 64 only), else (a checkpoint written before the
    record) what its config says (trained_length)."""
    cfg = read_config(path)
    recorded = read_trainer_state(path).get(TRAINED_LENGTH)
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        return recorded if recorded < cfg.model.max_position_embeddings else None
    return trained_length(cfg, _depth)


def check_readable(path: Path) -> Config:
    """The config of checkpoint `path`, after every check that needs no torch: the config and the
    tokenizer files as recorded, the weights' SHA-256 as recorded and their shapes those of the
    config. `encode` and `export` run it before they import torch (3-4 s, 250 MB), so that a
    damaged checkpoint is refused in a fraction of a second; loading checks again (the hashes are
    not computed twice: ownership.sha256_of)."""
    from bertcli.hf_import import check_weights

    cfg = read_config(path)
    check_tokenizer_files(path)
    _check_weights_unchanged(path)
    check_weights(path, cfg.model)
    return cfg


def _check_weights_unchanged(path: Path) -> None:
    """Refuse (exit 2) checkpoint `path` if its weights are not those its record hashed (file_change)."""
    changed = file_change(path, (layout.WEIGHTS,))
    if changed:
        raise UsageError(f"{Path(path) / changed[0]}: {changed[1]}; the file is damaged: use another checkpoint")


def read_trainer_state(path: Path) -> dict[str, Any]:
    return read_own_json(Path(path) / layout.TRAINER_STATE)


def check_tokenizer_files(path: Path) -> None:
    """Refuse (exit 2) checkpoint `path` if a tokenizer file was changed since it was written (tokenizer_change)."""
    change = tokenizer_change(path)
    if change:
        raise UsageError(f"{Path(path) / change[0]}: {change[1]}; restore it, or use another checkpoint")


FILES_SHA256 = "files_sha256"  # trainer_state.json's record of HASHED
# The files written before trainer_state.json (WRITERS' order). Checkpoints written before the config was
# hashed lack its entry, and are read as they were.
HASHED = (layout.WEIGHTS, layout.CHECKPOINT_CONFIG, layout.TRAINING_STATE)


def file_change(path: Path, names: tuple[str, ...] = HASHED) -> tuple[str, str] | None:
    """A file of checkpoint `path` (of `names`) that is not the one it was written as, and why (None:
    they are, or the checkpoint predates the record): its SHA-256 against trainer_state.json's."""
    try:
        state = read_trainer_state(path)
    except (OSError, UsageError):  # no readable record: damage the callers' own checks name
        return None
    recorded = state.get(FILES_SHA256)
    required = must_record_hashes(state)
    if not isinstance(recorded, dict):
        return (
            (layout.TRAINER_STATE, f"holds no {FILES_SHA256} record, which a checkpoint of its format has")
            if required
            else None
        )
    for name in names:
        if required and name not in recorded:
            return (
                layout.TRAINER_STATE,
                f"its {FILES_SHA256} record has no {name}, which a checkpoint of its format has",
            )
        if name in recorded and sha256_of(own_file(Path(path) / name)) != recorded[name]:
            return name, (
                f"changed since the checkpoint was written (its SHA-256 is not the one {layout.TRAINER_STATE} "
                "records: cut short, a flipped bit, or an edit)"
            )
    return None


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights of checkpoint folder `path`, refused if one of its files is a symbolic link or a
    weight holds NaN or inf (exit 2, naming the file); unreadable weights are a RunError."""
    import safetensors.torch

    check_own_files(path)
    file = Path(path) / layout.WEIGHTS
    _check_weights_unchanged(path)
    try:
        weights = safetensors.torch.load_file(file)
    except (safetensors.SafetensorError, OSError, ValueError) as exc:
        raise RunError(
            f"{file}: cannot read weights ({exc}); the file is damaged: resume from another checkpoint"
        ) from None
    check_finite(weights, file)
    return weights


def check_fits(
    weights: dict[str, torch.Tensor], model: nn.Module, file: Path, optional: tuple[str, ...] = ()
) -> list[str]:
    """Refuse (exit 2, naming `file`) weights that do not fit `model`, whoever wrote them (a
    checkpoint, a Hugging Face folder): see check_shapes. Returns the missing optional weights."""
    # The model's shapes (under FSDP, a DTensor's shape is the whole tensor's).
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in TIED_ALIASES}
    return check_shapes({k: tuple(v.shape) for k, v in weights.items()}, expected, file, optional)


def check_shapes(
    found: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    file: Path,
    optional: tuple[str, ...] = (),
) -> list[str]:
    """Refuse (exit 2, naming `file`) weights of shapes `found` that do not fit a model of shapes
    `expected` (torch-free: hf_import.check_weights runs it on a file's header before torch is
    imported): none that the model lacks, each of the model's shape, and every weight of the model
    there but those under the `optional` prefixes, which are returned (the caller initialises
    them). The tied aliases are never needed: their targets carry them."""
    missing = sorted(set(expected) - set(found))
    needed = [k for k in missing if not k.startswith(optional)] if optional else missing
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(k for k in set(expected) & set(found) if found[k] != expected[k])
    if needed or unexpected or wrong:
        parts = []
        if needed:
            parts.append(f"{len(needed)} missing (e.g. {needed[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        if wrong:
            k = wrong[0]
            parts.append(f"{len(wrong)} of another shape (e.g. {k}: {found[k]} vs {expected[k]})")
        raise UsageError(f"{file}: weights do not fit this model: {'; '.join(parts)}")
    return missing


def load_weights(model: nn.Module, path: Path) -> None:
    """Load checkpoint `path`'s weights into `model` (on one process, unsharded), strictly: every
    key present, every shape right (check_fits), every value finite."""
    weights = read_weights(path)
    check_fits(weights, model, Path(path) / layout.WEIGHTS)
    model.load_state_dict(weights, strict=False)  # the tied aliases follow their targets


def read_training_state(path: Path, device: torch.device) -> dict[str, Any]:
    """A checkpoint's training_state.pt, on `device`: the parts but the model, and the step. Never
    unpickles arbitrary objects (weights_only: tensors and plain containers only)."""
    import torch

    file = own_file(Path(path) / layout.TRAINING_STATE)
    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols: the error below says it all
            warnings.simplefilter("ignore")
            return torch.load(file, map_location=device, weights_only=True)
    except pickle.UnpicklingError:  # weights_only refuses anything but tensors and plain containers
        raise DamagedState(
            f"{file}: cannot load training state: it holds objects other than tensors and plain "
            "values, so it was refused unread (unpickling it could run code); the file is damaged or "
            "was tampered with"
        ) from None
    except Exception as exc:  # truncated or otherwise damaged
        raise DamagedState(f"{file}: cannot load training state ({type(exc).__name__}); the file is damaged") from None


def check_same_model(path: Path, cfg: Config, output_dir: Path, *, vocab: bool = True) -> None:
    """Refuse (exit 2) to resume checkpoint `path` as a model other than `cfg`'s (a vocab_size still
    to come from the tokenizer, null in `cfg`, is not compared; nor any, without `vocab`: the tokenizer's
    to say). Torch-free: pretrain asks before it imports torch, and again where it resumes."""
    diffs = [
        d
        for d in model_differences(read_config(path), cfg)
        if not ((cfg.model.vocab_size is None or not vocab) and d.startswith("model.vocab_size="))
    ]
    if diffs:
        own = layout.checkpoints_dir(output_dir)
        fix = f"; to start fresh, set output_dir to a new folder{f' (or remove {own})' if own.exists() else ''}"
        raise UsageError(f"cannot resume from {path}: {'; '.join(diffs)}{fix}")


def model_differences(a: Config, b: Config) -> list[str]:
    """Model fields that differ between two configs, as 'model.key: a vs b'."""
    da, db = to_dict(a)["model"], to_dict(b)["model"]
    # init_from says where a run's first weights came from, not what the model is: a resumed run ignores it.
    return [
        f"model.{k}={da[k]!r} in the checkpoint vs {db[k]!r} in the config"
        for k in da
        if da[k] != db[k] and k != "init_from"
    ]


# Settings that may change on resume (the model may not), by what a change means. The others go unsaid:
# paths, devices, precision and parallelism (rounding at most), evaluation and save cadence, logging, and
# the tokenizer's settings (a run's tokenizer is fixed by its first checkpoint; another one is refused).
EXAMPLE_SETTINGS = [
    "train.seed",
    "global batch",  # batch_size x grad_accum_steps x processes, where the checkpoint recorded it
    "train.batch_size",
    "train.grad_accum_steps",
    "data.corpus",
    "data.split_sentences",
    "data.validation_fraction",
    "data.max_seq_length",
    "data.pairs",
    "data.short_seq_prob",
    "data.random_next_prob",
    "data.masked_lm_prob",
    "data.max_predictions_per_seq",
    "data.whole_word_mask",
    "data.mask_token_prob",
    "data.random_token_prob",
    "data.synthetic",
]
HELD_OUT_SETTINGS = [
    k for k in EXAMPLE_SETTINGS if k not in ("global batch", "train.batch_size", "train.grad_accum_steps")
] + ["train.eval_examples"]
UPDATE_SETTINGS = ["optimizer", "train.max_steps", "train.mlm_weight", "train.nsp_weight", "train.max_grad_norm"]


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as {"section.key": value}."""
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def held_out_changed(saved: Config, cfg: Config) -> bool:
    """Whether resuming a checkpoint saved with `saved` under `cfg` changes the held-out set (see
    setting_differences), so that held-out losses from now on are not comparable with `best`'s."""
    return cfg.train.eval_every > 0 and bool(_changes(saved, cfg, HELD_OUT_SETTINGS))


def _changes(saved: Config, cfg: Config, prefixes: list[str], batches: tuple[int | None, int] | None = None) -> str:
    """The settings under `prefixes` that differ between `saved` and `cfg`, as "key old -> new, ...":
    the global batch compared where `batches` (then, now) says it, not its split; a path setting by
    the file it names; the synthetic corpus's settings only when both use it."""
    old, new = _flat(to_dict(saved)), _flat(to_dict(cfg))
    if batches is not None and batches[0] is not None:  # compare the global batch, not its split
        for key in ("train.batch_size", "train.grad_accum_steps"):
            old.pop(key), new.pop(key)
        old["global batch"], new["global batch"] = batches
    synthetic = old["data.corpus"] == new["data.corpus"] == "synthetic"  # its settings matter only then

    def same(key: str, a: Any, b: Any) -> bool:
        # A path setting names one file however it is spelt (trial 20 C1: `../tok.json` in the
        # config, resolved as RUN/../tok.json, against the same file given with --set).
        if key in PATH_KEYS and isinstance(a, str) and isinstance(b, str) and a and b:
            return os.path.realpath(a) == os.path.realpath(b)
        return a == b

    keys = [
        k
        for k in new
        if any(k == p or k.startswith(p + ".") for p in prefixes)
        and not same(k, old.get(k), new[k])
        and (synthetic or not k.startswith("data.synthetic."))
    ]
    return ", ".join(f"{k} {old.get(k)!r} -> {new[k]!r}" for k in keys)


def tokenizer_setting_changes(saved: Config, cfg: Config) -> str:
    """The data.tokenizer settings of `cfg` other than checkpoint config `saved`'s, as "key old -> new, ..."
    (what a run that keeps its checkpoints' tokenizer ignores: prepare says them)."""
    return _changes(saved, cfg, ["data.tokenizer"])


def setting_differences(
    saved: Config, cfg: Config, *, step: int, where: str, batches: tuple[int | None, int] | None = None
) -> list[str]:
    """What resuming checkpoint `where` (at `step`, saved with config `saved`) under `cfg` changes,
    one line per kind of change: the examples later steps see, the held-out set, the updates.
    `batches`: the global batch (examples a step) then, if the checkpoint recorded it, and now: a
    step's examples depend on it alone, so 2 processes x 4 resumed as 1 x 8 changes nothing."""
    from bertcli.optim import lr_at

    def changed(prefixes: list[str]) -> str:
        return _changes(saved, cfg, prefixes, batches)

    lines = []
    examples, held_out, updates = changed(EXAMPLE_SETTINGS), changed(HELD_OUT_SETTINGS), changed(UPDATE_SETTINGS)
    if examples:
        seed = "train.seed" in examples
        lines.append(
            f"resuming {where} with other settings ({examples}): steps {step + 1:,} on train on other examples"
            f"{', masks and dropout' if seed else ''} than this run would have, so it is no longer the run "
            "it was (nor one that started with these settings)"
        )
    if held_out and cfg.train.eval_every > 0:
        lines.append(
            f"resuming {where} with other settings ({held_out}): the held-out set changes, so held-out "
            "metrics from now on are not comparable with the earlier ones (nor with the loss that kept "
            "checkpoints/best)"
        )
    if updates:
        before, after = (
            lr_at(step, saved.optimizer, saved.train.max_steps),
            lr_at(step, cfg.optimizer, cfg.train.max_steps),
        )
        lr = f" (learning rate {before:.3g} -> {after:.3g} at step {step + 1:,})" if before != after else ""
        lines.append(
            f"resuming {where} with other settings ({updates}): the updates of steps {step + 1:,} on "
            f"follow them{lr}; what the first {step:,} steps learned is kept"
        )
    # Other data.tokenizer settings are said where the data is prepared (prepare's _say_ignored_tokenizer_settings).
    return lines


def _other_held_out(then: Any, now: dict[str, Any] | None) -> bool:
    """Whether a checkpoint's recorded prepared data (`then`, PREPARED_DATA; absent before it was recorded)
    had another held-out set than `now`'s."""
    return isinstance(then, dict) and now is not None and then.get("held_out") != now.get("held_out")


def data_differences(saved: Config, cfg: Config, then: Any, now: dict[str, Any] | None, *, where: str) -> list[str]:
    """What resuming checkpoint `where` on prepared data `now` changes where the data it trained on (`then`,
    its PREPARED_DATA) differs, with the settings that make it unchanged: the corpus's text changed (trial 26
    P5: a file added, edited or removed, and the resume said nothing). Settings that changed are said by
    setting_differences."""
    if not isinstance(then, dict) or now is None or _changes(saved, cfg, ["data.corpus", "data.split_sentences"]):
        return []
    lines = []
    if then.get("index") != now["index"] and not _changes(saved, cfg, ["data.validation_fraction"]):
        counted = then.get("documents")
        documents = f"{counted:,}" if isinstance(counted, int) else "?"
        lines.append(
            f"resuming {where} on a corpus whose files or text changed since ({documents} documents then, "
            f"{now['documents']:,} now): the steps from here on train on other examples than this run would have, "
            "so it is no longer the run it was"
        )
    if _other_held_out(then, now) and cfg.train.eval_every > 0 and not _changes(saved, cfg, HELD_OUT_SETTINGS):
        lines.append(
            f"resuming {where} on a corpus whose held-out examples changed since (its held-out documents, or their "
            "order in the corpus): held-out metrics from now on are not comparable with the earlier ones (nor with the "
            "loss that kept checkpoints/best)"
        )
    return lines


def damage(path: Path) -> str | None:
    """Why complete checkpoint folder `path` cannot be resumed from (None: it loads): none of its
    files is a symbolic link, its config and trainer state parse, its weights load and are finite,
    and its training state is a whole zip archive whose every member matches its CRC (what an
    empty, cut or flipped file fails) that torch's own reader opens too (it reads fields of the
    central directory that Python's zipfile ignores, and reads nothing of a member marked as a
    folder), holding the optimizer state of that step and of those weights (its tensors are
    mapped, not read)."""
    import zipfile

    import safetensors.torch
    import torch

    links = [name for name in sorted(layout.CHECKPOINT.paths) if (Path(path) / name).is_symlink()]
    if links:
        return f"{links[0]}: a symbolic link, which bertcli never follows out of a checkpoint folder"
    name = layout.CHECKPOINT_CONFIG
    try:
        read_config(path)
        name = layout.TRAINER_STATE
        step = read_trainer_state(path).get("step")
        if not isinstance(step, int):
            return f"{name}: no step"
        named = layout.STEP_DIR.match(Path(path).name)
        if named and int(named.group(1)) != step:  # (a copy under another name: resumed by its name, unsaid)
            return f"{name}: step {step:,}, where the folder's name says {int(named.group(1)):,}"
        change = tokenizer_change(path)
        if change:
            return f"{change[0]}: {change[1]}"
        changed = file_change(path)
        if changed:
            return f"{changed[0]}: {changed[1]}"
        name = layout.WEIGHTS
        weights = safetensors.torch.load_file(Path(path) / name)
        bad = non_finite(weights)
        if bad:
            return f"{name}: {len(bad)} weight tensor(s) hold NaN or inf (e.g. {bad[0]})"
        expected = weight_keys(read_config(path).model)
        odd = sorted(set(weights) ^ expected)
        if odd:
            how = "it lacks" if odd[0] in expected else "it holds a tensor the model has no place for:"
            return f"{name}: {how} {odd[0]} (of {len(odd)} key(s) that do not fit its {layout.CHECKPOINT_CONFIG})"
        name = layout.TRAINING_STATE
        with open(Path(path) / name, "rb") as fh:
            if fh.read(1) == b"\x80" and not zipfile.is_zipfile(fh):  # a pickle's first byte, no archive
                return (
                    f"{name}: a bare pickle, not torch's archive, so it was refused unread (unpickling it could "
                    "run code); it was damaged or tampered with"
                )
        with zipfile.ZipFile(Path(path) / name) as archive:
            bad = archive.testzip()
            # torch's reader (miniz) takes a member whose MS-DOS attributes say "folder" for an empty one and
            # leaves its buffer unwritten: whatever memory held is then unpickled (Python's zipfile ignores them)
            folders = [i.filename for i in archive.infolist() if i.is_dir() or i.external_attr & 0x10]
        if bad:
            return f"{name}: {bad} is corrupt"
        if folders:
            return f"{name}: its member {folders[0]} is marked as a folder in the zip directory"
        with warnings.catch_warnings():  # torch warns about odd pickle protocols
            warnings.simplefilter("ignore")
            state = torch.load(Path(path) / name, map_location="cpu", weights_only=True, mmap=True)
        optimizer = state.get("optimizer") if isinstance(state, dict) else None
        if not isinstance(optimizer, dict) or not isinstance(optimizer.get("state"), dict):
            return f"{name}: no optimizer state in it"
        if state.get("step") != step:
            return f"{name}: the state of step {state.get('step')!r}, not of step {step} as {layout.TRAINER_STATE} says"
        unknown = sorted(k for k in optimizer["state"] if isinstance(k, str) and k not in weights)  # (1: by position)
        return (
            f"{name}: optimizer state of {len(unknown)} parameter(s) the weights lack (e.g. {unknown[0]})"
            if unknown
            else None
        )
    except DamagedFile as exc:
        return f"{exc.file.name}: {exc.reason}"
    except pickle.UnpicklingError:  # weights_only refuses anything but tensors and plain containers
        return (
            f"{name}: it holds objects other than tensors and plain values, so it was refused unread; it was damaged "
            "or tampered with"
        )
    except Exception as exc:  # noqa: BLE001  any way of not loading is damage
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"{name}: {reason}"


def check_same_tokenizer(ckpt: Path, source: Path, contents: bytes) -> None:
    """Refuse to resume `ckpt` on data tokenized by another tokenizer (`contents`: the tokenizer.json
    the run's data is tokenized with, from file `source`): the weights were trained on the
    checkpoint's token ids."""
    from tokenizers import Tokenizer

    from bertcli.data.tokenizer import read_tokenizer_json, tokenizer_identity

    file = ckpt / layout.TOKENIZER_JSON
    if not file.is_file():
        return  # a checkpoint of the synthetic corpus
    ours = tokenizer_identity(read_tokenizer_json(own_file(file)))
    theirs = tokenizer_identity(Tokenizer.from_str(contents.decode("utf-8")))
    if ours != theirs:
        raise UsageError(
            f"the run's data is tokenized with {source} (tokenizer {theirs[:12]}), but the checkpoint {ckpt} was "
            f"trained with tokenizer {ours[:12]}: resuming on other token ids would garble the model. "
            f"Prepare with the checkpoint's own tokenizer (data.tokenizer.path: {file}), "
            "or start a new run with another output_dir"
        )


def _rename_aside(folder: Path, prefix: str) -> Path:
    """Rename checkpoint `folder` PREFIX-step-NNNNNNN (a time added when that name is taken): out of
    what resuming and pruning count, kept for the user."""
    aside = folder.with_name(f"{prefix}{folder.name}")
    if aside.exists():
        aside = aside.with_name(f"{aside.name}.{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(folder, aside)
    return aside


def _kept_words(aside: Path) -> str:
    """What a folder set aside costs and that it is the user's to delete."""
    return f"it keeps {layout.folder_bytes(aside) / 2**20:,.1f} MiB until you delete it (bertcli never does)"


def _set_aside(damaged: list[tuple[Path, str]], resumed: Path | None, is_main: bool) -> None:
    """Rename each damaged or incomplete checkpoint folder damaged-step-NNNNNNN (by the main process),
    saying why and what the run resumes from instead."""
    for bad, reason in damaged:
        if is_main:
            aside = _rename_aside(bad, layout.DAMAGED_PREFIX)
            then = (
                f"resuming from the newest checkpoint that loads, {resumed}"
                if resumed
                else "no checkpoint loads: starting fresh"
            )
            console.log(f"{bad} is damaged ({reason}): renamed {aside.name} ({_kept_words(aside)}); {then}")


def choose_resume(
    output_dir: Path, resume: str, cfg: Config, is_main: bool = True, last_step: int | None = None
) -> Path | None:
    """The checkpoint to resume from (None = start fresh), per `resume`: auto, never or a path. `auto`
    takes the newest checkpoint that loads: newer damaged ones (a disk that failed, a file someone
    emptied) are reported and, by the main process, renamed damaged-step-NNNNNNN, so that neither
    resuming nor pruning counts them again (pruning keeps the newest: it would delete good ones).
    A path at or past `last_step` leaves the run's checkpoints as they are: nothing is trained from it
    (trial 22 S2: the run's whole history was set aside, and the next pretrain started fresh)."""
    found = layout.list_checkpoints(output_dir)
    abandoned: list[tuple[Path, int]] = []  # (resuming by path) the run's later checkpoints: another history
    if resume == "never":
        if found:
            raise ResumeRefused(layout.checkpoints_dir(output_dir), len(found))
        return None
    if resume == "auto":
        # A step folder that lacks files (a copy cut short, a file deleted) newer than the newest good
        # checkpoint is damage too: said and set aside, never skipped silently.
        partial = [
            (s, p, layout.incomplete(p)) for s, p in layout.list_step_folders(output_dir) if not layout.is_checkpoint(p)
        ]
        if not found:
            _set_aside([(p, why) for _, p, why in reversed(partial)], None, is_main)
            root = layout.checkpoints_dir(output_dir)
            aside = sorted(
                p.name
                for p in (root.iterdir() if root.is_dir() and not root.is_symlink() else [])
                if p.name.startswith((layout.ABANDONED_PREFIX, layout.DAMAGED_PREFIX))
            )
            if aside and is_main:  # (trial 22 S2: a run of only set-aside checkpoints started over, unsaid)
                console.log(
                    f"{root} holds no checkpoint to resume, only ones set aside ({', '.join(aside[:3])}"
                    f"{', ...' if len(aside) > 3 else ''}): this run starts fresh, from step 0"
                )
            return None
        damaged, chosen = [], None
        for _, candidate in reversed(found):
            reason = damage(candidate)
            if reason is None:
                chosen = candidate
                break
            damaged.append((candidate, reason))
        good = int(layout.STEP_DIR.match(chosen.name).group(1)) if chosen else -1
        # `best` is a whole checkpoint too: an intact one of a later step than the newest good step folder
        # (the copy of a step found damaged) is resumed from, not removed as past it (trial 17 P3).
        path = (_intact_best_after(output_dir, good, found[-1][0]) if damaged else None) or chosen
        if path is None:
            root = layout.checkpoints_dir(output_dir)
            raise RunError(
                f"{root}: no checkpoint loads (the newest, {damaged[0][0].name}: {damaged[0][1]}); to start "
                f"fresh, move {root} aside or set output_dir to a new folder"
            )
        damaged += [(p, why) for s, p, why in reversed(partial) if s > good]
        _set_aside(damaged, path, is_main)
    else:
        path = Path(resume)
        check_not_set_aside(path, output_dir)
        problem = layout.incomplete(path)
        if problem:
            raise UsageError(f"{path}: {problem}")
        check_own_files(path)
        reason = damage(path)
        if reason is not None:
            raise DamagedState(f"{path} is damaged ({reason})")
        # The run's checkpoints past that step are another history: `--resume auto` (the next slice, the same
        # command) would go back to it, and keep_last would prune the new one first. Another run's checkpoint
        # makes all of them another history (trial 18 P9: a fall-back went to one of another model).
        step = read_trainer_state(path)["step"]
        foreign = is_foreign(path, output_dir)
        if last_step is None or step < last_step:
            abandoned = [(p, s) for s, p in found if (foreign or s > step) and p.resolve() != path.resolve()]
    check_same_model(path, cfg, output_dir)
    for later, step_of in abandoned if is_main else []:
        aside = _rename_aside(later, layout.ABANDONED_PREFIX)
        why = (
            f"the run resumes from a checkpoint outside its checkpoints folder (another run's, or a copy), {path}"
            if step_of <= step
            else f"past the step resumed from ({step})"
        )
        console.log(
            f"{later} is of step {step_of}, {why}: a history left behind: renamed "
            f"{aside.name}, so that resuming never goes back to it ({_kept_words(aside)})"
        )
    return path


def check_not_set_aside(path: Path, output_dir: Path) -> None:
    """Refuse (exit 2) resuming, in its own run, a checkpoint that run set aside (abandoned-*, damaged-*):
    its history is not the one the run's step folders and metrics hold, which the resume would splice
    together (trial 24 S3: the steps below it, of another branch, stayed as its own)."""
    path = Path(path)
    if path.name.startswith((layout.ABANDONED_PREFIX, layout.DAMAGED_PREFIX)) and not is_foreign(path, output_dir):
        raise UsageError(
            f"--resume {path}: a checkpoint this run set aside, of another history than its step folders and "
            "metrics: resume it in a run of its own (another output_dir: pretrain --resume takes another run's "
            "checkpoint)"
        )


def set_aside_note(path: Path) -> str | None:
    """What encode, export and init say of a checkpoint its run set aside (trial 25: an abandoned-* one was
    used as any other, unsaid): None for any other folder."""
    name = Path(path).name
    if name.startswith((layout.ABANDONED_PREFIX + "step-", layout.ABANDONED_PREFIX + layout.BEST)):
        why = "of a history left behind when the run resumed from an earlier checkpoint (or another run's)"
    elif name.startswith(layout.DAMAGED_PREFIX + "step-"):
        why = "found damaged when the run resumed (it said why then)"
    else:
        return None
    return f"{path} is a checkpoint its run set aside, {why}; the run's own checkpoints are its step-* folders"


def is_foreign(ckpt: Path | None, output_dir: Path) -> bool:
    """Whether checkpoint `ckpt` is another run's (not a folder in output_dir's checkpoints/)."""
    return ckpt is not None and Path(ckpt).resolve().parent != layout.checkpoints_dir(output_dir).resolve()


def _intact_best_after(output_dir: Path, step: int, newest: int) -> Path | None:
    """The run's `best` where it is an intact checkpoint of a step past `step` and not past `newest`
    (the run's newest step folder: a `best` past it is of a history left behind); else None."""
    best = layout.checkpoints_dir(output_dir) / layout.BEST
    if best.is_symlink() or not layout.is_checkpoint(best):
        return None
    try:
        at = read_trainer_state(best).get("step")
    except (OSError, ValueError, UsageError):
        return None
    return best if isinstance(at, int) and step < at <= newest and damage(best) is None else None


@dataclass(frozen=True)
class Progress:
    """Where a run stands (from trainer_state.json): optimizer steps done, non-padding tokens
    trained on and training time (s), all before this process started."""

    step: int = 0
    tokens_seen: int = 0
    train_time_s: float = 0.0
    trained_length: int = 0  # the longest sequences trained on (0: none yet)


class CheckpointManager:
    """The run's checkpoints, as torchtitan's CheckpointManager: which one to resume from (`choose`),
    restoring the named parts of the training state from it (`load`), and saving them (`save`):
    step-NNNNNNN every checkpoint.save_every steps, at the run's last step and when the run is
    asked to stop (older ones pruned to checkpoint.keep_last), and `best` whenever the held-out MLM
    loss is the lowest so far. Every process calls each method at the same points (FSDP gathers
    and shards collectively); only the main process writes, renames and removes."""

    def __init__(self, cfg: Config, device: torch.device, *, is_main: bool, tokenizer: dict[str, bytes]) -> None:
        self.cfg, self.device, self.is_main = cfg, device, is_main
        self.output_dir = Path(cfg.output_dir)
        self.tokenizer = tokenizer  # the prepared data's files (name: bytes), as the run read them when it started
        self.parts: dict[str, Stateful] = {}
        self.resumed_from: Path | None = None
        self.best: float | None = None  # the held-out MLM loss of checkpoints/best, kept by settle_best
        self.last_saved: Path | None = None  # the newest complete checkpoint of the run

    def choose(self, resume: str, last_step: int | None = None) -> Path | None:
        """The checkpoint to resume from per `resume` (auto, never or a path: see choose_resume;
        None: start fresh), refused if it was trained with another tokenizer than the prepared
        data's; and `best` settled (settle_best), unless that checkpoint is at or past `last_step`:
        a run with nothing to do sets none of its checkpoints aside (`best` is only caught up)."""
        self.resumed_from = choose_resume(self.output_dir, resume, self.cfg, is_main=self.is_main, last_step=last_step)
        if self.resumed_from is not None and layout.TOKENIZER_JSON in self.tokenizer:
            prepared = Path(self.cfg.data.prepared_dir) / layout.TOKENIZER_JSON
            check_same_tokenizer(self.resumed_from, prepared, self.tokenizer[layout.TOKENIZER_JSON])
        if (
            self.resumed_from is not None
            and last_step is not None
            and read_trainer_state(self.resumed_from)["step"] >= last_step
        ):
            # Nothing to do: `best` is not removed as past the step or of another history, only caught up.
            self.best = best_eval_loss(self.output_dir)
        else:
            self.best = settle_best(self.output_dir, self.cfg, self.resumed_from, self.is_main)
        self._catch_up_best()
        self.last_saved = self.resumed_from
        return self.resumed_from

    def _catch_up_best(self) -> None:
        """A run stopped after a step checkpoint that was evaluated best but before `best` was written
        (the disk filled, the process was killed) left an older `best`, which encode and export then
        used: the checkpoint resumed from, whose held-out loss beats `best`'s, is copied to `best`
        (its trainer_state.json holds eval_metrics only when that step was evaluated). Only a step
        folder of this run's: another run's checkpoint (--resume PATH) was evaluated on that run's
        held-out set, and `best` itself is no step (trial 17 P5: "best was evaluated best")."""
        if (
            self.resumed_from is None
            or is_foreign(self.resumed_from, self.output_dir)
            or self.resumed_from.name == layout.BEST
        ):
            return
        loss = read_trainer_state(self.resumed_from).get("eval_metrics", {}).get("mlm_loss")
        if (
            not isinstance(loss, (int, float))
            or not math.isfinite(loss)
            or (self.best is not None and loss >= self.best)
        ):
            return
        self.best = loss  # every process alike; the main one writes
        if self.is_main:
            best = layout.checkpoints_dir(self.output_dir) / layout.BEST
            guard(best)
            with atomic.folder(best, guard) as tmp:
                for name in layout.CHECKPOINT_FILES + layout.TOKENIZER_FILES:
                    if (self.resumed_from / name).is_file():
                        with atomic.writing(tmp / name):  # (a full disk: copyfile's error names its source)
                            shutil.copyfile(own_file(self.resumed_from / name), tmp / name)
                        atomic.fsync_path(tmp / name)
            console.log(
                f"wrote {best}: {self.resumed_from.name} was evaluated best (held-out MLM loss {loss:.4g}), and not yet copied there"
            )

    def load(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        examples_per_step: int | None = None,
        data_identity: dict[str, Any] | None = None,
        **more: Stateful,
    ) -> Progress:
        """Take the parts of the training state that every checkpoint saves from now on: the weights
        of `model` (after parallelize: sharded or not), the state of `optimizer` and `scaler`, and
        any `more` (into training_state.pt, under their names); restore them from the checkpoint
        `choose` picked. Returns where the run stands (all zero when it starts fresh).
        `examples_per_step`: the global batch now (batch size x accumulation x processes), which
        decides the examples of a step whatever the number of processes; `data_identity`: the prepared
        data's now (PREPARED_DATA), against the checkpoint's."""
        self.parts = {MODEL: ModelPart(model), "optimizer": OptimizerPart(model, optimizer), "scaler": scaler, **more}
        path = self.resumed_from
        if path is None:
            return Progress()
        weights = read_weights(path)
        check_fits(weights, model, path / layout.WEIGHTS)
        self.parts[MODEL].load_state_dict(weights)
        state, file = read_training_state(path, self.device), path / layout.TRAINING_STATE
        for name, part in self.parts.items():
            if name == MODEL:
                continue
            if not isinstance(state, dict) or name not in state:
                raise DamagedState(f"{file}: no {name} state in it")
            if not state[name]:
                continue  # nothing to restore (the state of a scaler that is off)
            try:
                part.load_state_dict(state[name])
            except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # tampered, or an older format (by position)
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0]}" if str(exc) else type(exc).__name__
                raise DamagedState(f"{file}: the {name} state does not fit this model ({reason})") from None
        trainer = read_trainer_state(path)
        progress = Progress(
            step=int(state["step"]),
            tokens_seen=int(trainer.get("tokens_seen", 0)),
            train_time_s=float(trainer.get("train_time_s", 0.0)),
            trained_length=checkpoint_trained_length(path) or self.cfg.model.max_position_embeddings,
        )
        console.info(f"resuming from {path} (step {progress.step})")
        saved = read_config(path)
        if progress.step < self.cfg.train.max_steps:  # (else there is nothing to do)
            saved_batch = trainer.get("examples_per_step")
            for line in setting_differences(
                saved,
                self.cfg,
                step=progress.step,
                where=path.name,
                batches=None
                if examples_per_step is None
                else (saved_batch if isinstance(saved_batch, int) else None, examples_per_step),
            ):
                console.log(line)
            for line in data_differences(saved, self.cfg, trainer.get(PREPARED_DATA), data_identity, where=path.name):
                console.log(line)
            best = layout.checkpoints_dir(self.output_dir) / layout.BEST
            try:  # best's own held-out set: a run stopped before its next evaluation kept it (trial 24 S4)
                other_set = self.best is not None and (
                    held_out_changed(read_config(best), self.cfg)
                    or (
                        self.cfg.train.eval_every > 0
                        and _other_held_out(read_trainer_state(best).get(PREPARED_DATA), data_identity)
                    )
                )
            except (BertcliError, OSError):
                other_set = False
            if other_set:
                # (trial 23 P5: `best` was then replaced by comparing losses on two held-out sets)
                self.best = None
                console.log(
                    f"{layout.checkpoints_dir(self.output_dir) / layout.BEST} is replaced at this run's next "
                    "evaluation: its held-out loss was on the earlier set"
                )
        # The checkpoints' configs say the tokenizer in use: the run's, whatever data.tokenizer says now.
        self.cfg = dataclasses.replace(
            self.cfg, data=dataclasses.replace(self.cfg.data, tokenizer=saved.data.tokenizer)
        )
        return progress

    def due(self, step: int, last_step: int) -> bool:
        return step % self.cfg.checkpoint.save_every == 0 or step == last_step

    def save(self, step: int, trainer_state: dict[str, Any], periodic: bool) -> None:
        """Save step `step` (`periodic`: a step checkpoint is due) and `best` if `trainer_state` (what
        trainer_state.json records) holds held-out metrics better than the best so far."""
        loss = trainer_state.get("eval_metrics", {}).get("mlm_loss")
        # A NaN held-out loss is never best (the first evaluation of a diverged run had made one).
        new_best = loss is not None and math.isfinite(loss) and (self.best is None or loss < self.best)
        if not (periodic or new_best):
            return
        states = {name: part.state_dict() for name, part in self.parts.items()}  # every process: FSDP gathers
        snap = Snapshot(step=step, states=states, trainer_state=trainer_state, cfg=self.cfg, tokenizer=self.tokenizer)
        # The step checkpoint first: it is what resuming needs, so a disk that fills while `best` is
        # written still leaves the run resumable from this step.
        if periodic and self.is_main:
            self.last_saved = write(self.output_dir, snap)
            prune(self.output_dir, self.cfg.checkpoint.keep_last)
        if new_best:
            self.best = loss
            if self.is_main:
                write(self.output_dir, snap, name=layout.BEST)
