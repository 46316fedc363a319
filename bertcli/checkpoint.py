"""Checkpoints, `output_dir/checkpoints/step-NNNNNNN/`, written whole: model.safetensors, training_state.pt (the other
parts, gathered whole from FSDP shards: any number of processes resumes), trainer_state.json, config and tokenizer."""

from __future__ import annotations

import contextlib
import hashlib
import math
import pickle  # only for its exception type: nothing is unpickled here
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from bertcli import __version__, console, layout, store, weights
from bertcli.config import Config
from bertcli.config_load import config_from_dict, load_yaml
from bertcli.config_write import to_yaml
from bertcli.errors import BertcliError, DamagedFile, RunError, UsageError
from bertcli.hf_names import TIED_ALIASES, weight_keys

if TYPE_CHECKING:  # torch is imported where tensors are handled: inspect reads checkpoints without it
    import torch
    from torch import nn

# 3: trainer_state.json records the SHA-256 of every file; 2: optimizer state keyed by parameter name.
FORMAT_VERSION = 3
TOKENIZER_SHA256 = "tokenizer_sha256"  # trainer_state.json: the SHA-256 of each tokenizer file
FILES_SHA256 = "files_sha256"  # and of HASHED, written before it
HASHED = (layout.WEIGHTS, layout.CHECKPOINT_CONFIG, layout.TRAINING_STATE)
TRAINED_LENGTH = "trained_length"  # the longest sequences the run has trained on so far
PREPARED_DATA = "prepared_data"  # what the examples came from (PreparedData.identity)
FIX = "use another checkpoint"
METRICS_START = b'{"step": '  # how every line of metrics.jsonl starts
MODEL = "model"  # the part written as model.safetensors; every other part goes into training_state.pt
# checkpoint.best_metric -> the sign that makes a lower score the better one (accuracies are negated)
BEST_SIGN = {"mlm_loss": 1.0, "mlm_acc": -1.0, "probe_accuracy": -1.0, "probe_macro_f1": -1.0}


def read_trainer_state(path: Path) -> dict[str, Any]:
    return store.read_own_json(Path(path) / layout.TRAINER_STATE)


def recorded_digests(state: dict[str, Any]) -> dict[str, str] | str:
    """The SHA-256 of each file the trainer state records, or why a record its format has is missing (damage)."""
    version = state.get("format_version")
    old = isinstance(version, int) and not isinstance(version, bool) and version < FORMAT_VERSION
    records: dict[str, str] = {}
    for key in (TOKENIZER_SHA256, FILES_SHA256):
        if isinstance(record := state.get(key), dict):
            records |= record
        elif not old:
            return f"no {key} record, which a checkpoint of its format has"
    return records if old or set(HASHED) <= set(records) else f"its {FILES_SHA256} record lacks a file"


def change(path: Path, names: tuple[str, ...] | None = None) -> tuple[str, str] | None:
    """The first file of checkpoint `path` (of `names`) not as written, and why (None: none, or no readable record)."""
    try:
        records = recorded_digests(read_trainer_state(path))
    except (OSError, UsageError):
        return None
    if isinstance(records, str):
        return layout.TRAINER_STATE, records
    if layout.TOKENIZER_JSON not in records and all((Path(path) / n).is_file() for n in layout.TOKENIZER_FILES):
        # A checkpoint from before the tokenizer's digests: its vocab.txt at least is that of its tokenizer.json.
        from bertcli.data.tokenizer import read_tokenizer_json, vocab_text

        vocab = vocab_text(read_tokenizer_json(Path(path) / layout.TOKENIZER_JSON)).encode()
        if store.read_own(Path(path) / layout.VOCAB) != vocab:
            return layout.VOCAB, "does not match the tokenizer.json beside it"
    return store.digest_change(path, records, names)


def check_unchanged(path: Path, names: tuple[str, ...] | None = None) -> None:
    """Refuse (exit 2) checkpoint `path` where a file (of `names`) is not the one it was written with."""
    if found := change(path, names):
        raise UsageError(f"{Path(path) / found[0]}: {found[1]}; restore it, or {FIX}")


def _links(path: Path) -> list[str]:
    return [name for name in sorted(layout.CHECKPOINT.paths) if (Path(path) / name).is_symlink()]


def check_links(path: Path) -> None:
    """Refuse (exit 2) a checkpoint one of whose files is a symbolic link (never followed)."""
    if links := _links(path):
        raise store.linked(Path(path) / links[0], FIX)


def read_config(path: Path) -> Config:
    """The checkpoint's resolved config, refused after any edit (it is the architecture the weights run in)."""
    file = Path(path) / layout.CHECKPOINT_CONFIG
    check_unchanged(path, (layout.CHECKPOINT_CONFIG,))
    try:
        raw = load_yaml(store.read_own(file).decode("utf-8"))
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # cut short (UnicodeDecodeError is a ValueError)
        raise DamagedFile(file, exc) from None
    if not raw:
        raise UsageError(f"{file}: empty, where the checkpoint's resolved config belongs; {FIX}")
    return config_from_dict(raw, str(file))


def read_weights(path: Path, model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """The weights of checkpoint `path`, as written (their digest) and finite; refused where they do not fit `model`."""
    check_links(path)
    check_unchanged(path, (layout.WEIGHTS,))
    tensors = weights.load(Path(path) / layout.WEIGHTS, FIX)
    if model is not None:
        weights.check_fits(tensors, model, Path(path) / layout.WEIGHTS)
    return tensors


def load_weights(model: nn.Module, path: Path) -> None:
    """Load checkpoint `path`'s weights into `model` (one process, unsharded), strictly."""
    model.load_state_dict(read_weights(path, model), strict=False)  # the tied aliases follow their targets


def damaged_state(reason: str) -> RunError:
    return RunError(f"{reason}: resume from another checkpoint (--resume PATH) or start in a new output_dir")


def _torch_load(file: Path, **options: Any) -> Any:
    """torch.load of tensors and plain containers only (weights_only), its warnings silenced."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(file, weights_only=True, **options)


def check_readable(path: Path) -> Config:
    """The config of checkpoint `path`, after every check that needs no torch: links, digests, weight shapes."""
    check_links(path)
    cfg = read_config(path)
    check_unchanged(path)
    weights.check_file(Path(path) / layout.WEIGHTS, cfg.model, Path(path) / layout.CHECKPOINT_CONFIG)
    return cfg


def verify(path: Path) -> list[tuple[str, str]]:
    """What is damaged in complete checkpoint `path`, as (file, reason); [] where it resumes."""
    damage = [(n, store.file_problem(Path(path) / n)) for n in _links(path)]
    try:
        step = read_trainer_state(path).get("step")
    except (BertcliError, OSError) as exc:
        damage.append((layout.TRAINER_STATE, getattr(exc, "reason", str(exc))))
    if damage or (found := change(path)):
        return damage or [found]
    try:
        cfg = read_config(path)
    except (BertcliError, OSError) as exc:
        return [(layout.CHECKPOINT_CONFIG, getattr(exc, "reason", str(exc)))]
    named = layout.STEP_DIR.match(Path(path).name)
    if not isinstance(step, int) or (named and int(named.group(1)) != step):
        return [(layout.TRAINER_STATE, f"step {step!r}, not the step its folder's name says")]
    return _verify_tensors(path, cfg, step)


def _verify_tensors(path: Path, cfg: Config, step: int) -> list[tuple[str, str]]:
    try:
        tensors = weights.load(Path(path) / layout.WEIGHTS, FIX)
    except UsageError as exc:
        return [(layout.WEIGHTS, str(exc).split(": ", 1)[-1])]
    odd = sorted(set(tensors) ^ weight_keys(cfg.model))
    damage = [(layout.WEIGHTS, f"{len(odd)} key(s) that do not fit its config (e.g. {odd[0]})")] if odd else []
    file = Path(path) / layout.TRAINING_STATE
    try:
        with zipfile.ZipFile(file) as archive:
            bad = archive.testzip()
            folders = [i.filename for i in archive.infolist() if i.is_dir() or i.external_attr & 0x10]  # torch skips
        if bad or folders:
            return damage + [(layout.TRAINING_STATE, f"{bad or folders[0]} is corrupt")]
        state = _torch_load(file, map_location="cpu", mmap=True)
    except (zipfile.BadZipFile, pickle.UnpicklingError, OSError, RuntimeError, ValueError, EOFError) as exc:
        return damage + [(layout.TRAINING_STATE, f"not a whole archive of tensors ({type(exc).__name__})")]
    optimizer = state.get("optimizer") if isinstance(state, dict) else None
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("state"), dict) or state.get("step") != step:
        return damage + [(layout.TRAINING_STATE, f"no optimizer state of step {step}")]
    if unknown := [k for k in optimizer["state"] if isinstance(k, str) and k not in tensors]:
        damage.append((layout.TRAINING_STATE, f"optimizer state of a parameter the weights lack ({min(unknown)})"))
    return damage


def trained_length(cfg: Config, _depth: int = 0) -> int | None:
    """The positions a run of `cfg` trains where fewer than its model has (None: all), its init_from's included."""
    length = cfg.data.max_seq_length
    if cfg.model.init_from:
        from bertcli.hf_import import tokenizer_limit

        source = Path(cfg.model.init_from)
        if layout.identify(source).kind is layout.Kind.CHECKPOINT and _depth < 16:
            try:
                inherited = checkpoint_trained_length(source, _depth + 1) or cfg.model.max_position_embeddings
            except (OSError, BertcliError):
                inherited = None
        else:
            inherited = tokenizer_limit(source) if layout.is_hf_folder(source) else None
        length = max(length, inherited) if inherited is not None else cfg.model.max_position_embeddings
    return length if length < cfg.model.max_position_embeddings else None


def checkpoint_trained_length(path: Path, _depth: int = 0) -> int | None:
    """The positions checkpoint `path`'s model was trained at, where fewer than it has (recorded, or by config)."""
    cfg, recorded = read_config(path), read_trainer_state(path).get(TRAINED_LENGTH)
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        return recorded if recorded < cfg.model.max_position_embeddings else None
    return trained_length(cfg, _depth)


@dataclass(frozen=True)
class Snapshot:
    """One checkpoint's contents; `tokenizer`: name: bytes, as the run read them when it started."""

    step: int
    states: dict[str, Any]
    trainer_state: dict[str, Any]
    cfg: Config
    tokenizer: dict[str, bytes]


def _tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor in a state dict (nested dicts and lists)."""
    if hasattr(state, "is_floating_point"):
        return [state]
    values = state.values() if isinstance(state, dict) else state if isinstance(state, (list, tuple)) else ()
    return [t for value in values for t in _tensors(value)]


def write(output_dir: Path, snap: Snapshot, name: str | None = None) -> Path:
    """Write `snap` as checkpoints/step-NNNNNNN (or NAME); never one holding NaN or inf (RunError)."""
    final = layout.checkpoints_dir(output_dir) / (name or layout.step_dir_name(snap.step))
    if not weights.all_finite(_tensors(snap.states)):
        raise RunError(f"step {snap.step}: the weights or optimizer state hold NaN or inf: lower optimizer.lr")
    guard(final)  # here as well: store.folder sees the path resolved, through any link
    with store.folder(final, guard) as tmp:
        for file, data in snap.tokenizer.items():
            store.write_inside(tmp / file, data)
        store.save_safetensors(snap.states[MODEL], tmp / layout.WEIGHTS)
        config = to_yaml(snap.cfg, f"Resolved config of the run, saved at step {snap.step}.")
        store.write_inside(tmp / layout.CHECKPOINT_CONFIG, config)
        rest = {k: v for k, v in snap.states.items() if k != MODEL}
        store.save_torch({**rest, "step": snap.step}, tmp / layout.TRAINING_STATE)
        # Last: trainer_state.json records the others' SHA-256.
        tokenizer = {file: hashlib.sha256(data).hexdigest() for file, data in snap.tokenizer.items()}
        files = {file: store.sha256_of(tmp / file) for file in HASHED}
        head = {"format_version": FORMAT_VERSION, "bertcli_version": __version__, "step": snap.step}
        head["saved_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        record = {**head, TOKENIZER_SHA256: tokenizer, FILES_SHA256: files, **snap.trainer_state}
        store.write_json(tmp / layout.TRAINER_STATE, record)
    return final


def guard(target: Path) -> None:
    """Refuse (exit 2) to replace checkpoint folder `target` unless bertcli wrote it all; never through a link."""
    fix = f"move it out of {Path(target).parent}, or set output_dir to a new folder"
    if Path(target).is_symlink():
        raise store.linked(target, fix)
    store.check_replaceable(target, layout.CHECKPOINT, fix)


def check_run_folder(output_dir: Path, max_steps: int) -> None:
    """Refuse (exit 2) what in output_dir is not bertcli's and in the way of the run's outputs (torch-free)."""
    from bertcli.metrics import read_metrics_checked

    fix = "move it away, or set output_dir to another folder"
    root = layout.checkpoints_dir(output_dir)
    for name in layout.RUN_OUTPUTS:
        path = Path(output_dir) / name
        if path.is_symlink():
            raise store.linked(path, fix)
        if name in (layout.CHECKPOINTS, layout.TENSORBOARD) and path.exists() and not path.is_dir():
            raise UsageError(f"{path}: a file bertcli did not write, where the run keeps a folder: {fix}")
    fresh = not layout.list_step_folders(output_dir) and not (root / layout.BEST).exists()
    for name in (layout.METRICS_LEFT, layout.METRICS) if fresh else (layout.METRICS_LEFT,):
        path = Path(output_dir) / name
        records, bad = read_metrics_checked(path)
        with open(path, "rb") if path.is_file() else contextlib.nullcontext(None) as fh:
            start = fh.read(len(METRICS_START)) if fh else b""  # a record's first bytes: a line a crash cut keeps them
        if path.exists() and (not path.is_file() or not records and (bad or start and start != METRICS_START)):
            raise UsageError(f"{path}: not a file of records bertcli wrote: {fix}")
    for child in sorted(root.iterdir()) if root.is_dir() else ():
        match = layout.STEP_DIR.match(child.name)
        if child.is_symlink() and (match or child.name == layout.BEST):
            raise store.linked(child, fix)
        if child.name == layout.BEST or (match and (layout.is_checkpoint(child) or int(match.group(1)) <= max_steps)):
            guard(child)


def remove_leftovers(root: Path) -> None:
    """store.clean_leftovers for `root` (checkpoints/): temporary folders of checkpoint files only."""

    def ours(child: Path, name: str) -> bool:
        named = name == layout.BEST or layout.STEP_DIR.match(name) is not None
        return named and store.holds_only(child, layout.CHECKPOINT)

    store.clean_leftovers(root, ours)


def _dcp() -> Any:
    from torch.distributed.checkpoint import state_dict  # seconds to import: only when used

    return state_dict


def _full(**options: bool) -> Any:
    return _dcp().StateDictOptions(full_state_dict=True, **options)


class ModelPart:
    """The model's weights but the tied aliases, gathered whole on the CPU (every process calls; rank 0 gets)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        tensors = _dcp().get_model_state_dict(self.model, options=_full(cpu_offload=True))
        return {k: v.detach().contiguous() for k, v in tensors.items() if k not in TIED_ALIASES}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        _dcp().set_model_state_dict(self.model, dict(state), options=_full(strict=False))  # the tied aliases follow


class OptimizerPart:
    """The optimizer's state as a part, keyed by parameter name, whole and on the CPU."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        return _dcp().get_optimizer_state_dict(self.model, self.optimizer, options=_full(cpu_offload=True))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _dcp().set_optimizer_state_dict(self.model, self.optimizer, state, options=_full())


@dataclass(frozen=True)
class Progress:
    """Where a run stands before this process started (trainer_state.json)."""

    step: int = 0
    tokens_seen: int = 0
    train_time_s: float = 0.0
    trained_length: int = 0  # the longest sequences of the run's history, model.init_from's included


class CheckpointManager:
    """Named parts saved and restored whole, as torchtitan's: every process calls (FSDP gathers), the main writes."""

    def __init__(
        self, cfg: Config, *, is_main: bool, tokenizer: dict[str, bytes], best: float | None, last: Path | None
    ) -> None:
        self.cfg, self.is_main, self.tokenizer, self.output_dir = cfg, is_main, tokenizer, Path(cfg.output_dir)
        self.parts: dict[str, Any] = {}  # name: what has state_dict() and load_state_dict()
        self.best, self.last_saved = best, last  # checkpoints/best's score (best_score); the newest checkpoint

    def restore(
        self, path: Path | None, device: Any, *, model: nn.Module, optimizer: Any, scaler: Any, **more: Any
    ) -> Progress:
        """Take the parts every checkpoint saves (`more`: into training_state.pt by name), restored from `path`."""
        rest = {"optimizer": OptimizerPart(model, optimizer), "scaler": scaler, **more}
        self.parts = {MODEL: ModelPart(model), **rest}
        if path is None:  # a fresh run: model.init_from's history
            return Progress(trained_length=trained_length(self.cfg) or self.cfg.model.max_position_embeddings)
        self.parts[MODEL].load_state_dict(read_weights(path, model))
        file = path / layout.TRAINING_STATE  # (its links refused: read_weights)
        try:
            state = _torch_load(file, map_location=device)
        except Exception as exc:  # noqa: BLE001  truncated, or objects other than tensors (UnpicklingError)
            raise damaged_state(f"{file}: damaged ({type(exc).__name__})") from None
        for name, part in rest.items():
            if not isinstance(state, dict) or name not in state:
                raise damaged_state(f"{file}: no {name} state in it")
            try:
                if state[name]:  # (a scaler that is off has none)
                    part.load_state_dict(state[name])
            except (KeyError, TypeError, ValueError, RuntimeError) as exc:
                raise damaged_state(f"{file}: the {name} state does not fit the model ({type(exc).__name__})") from None
        step, trainer = int(state["step"]), read_trainer_state(path)
        console.info(f"resuming from {path} (step {step})")
        length = checkpoint_trained_length(path) or self.cfg.model.max_position_embeddings
        return Progress(step, int(trainer.get("tokens_seen", 0)), float(trainer.get("train_time_s", 0.0)), length)

    def due(self, step: int, last_step: int) -> bool:
        return step % self.cfg.checkpoint.save_every == 0 or step == last_step

    def save(self, step: int, trainer_state: dict[str, Any], periodic: bool) -> None:
        """Save step `step` where `periodic`, then `best` where its evaluation beats it (the step first: resumable)."""
        loss = best_score(trainer_state.get("eval_metrics"), self.cfg.checkpoint.best_metric)
        new_best = loss is not None and (self.best is None or loss < self.best)
        if not (periodic or new_best):
            return
        states = {name: part.state_dict() for name, part in self.parts.items()}  # every process: FSDP gathers
        snap = Snapshot(step=step, states=states, trainer_state=trainer_state, cfg=self.cfg, tokenizer=self.tokenizer)
        if periodic and self.is_main:
            self.last_saved = write(self.output_dir, snap)
            for _, old in layout.list_checkpoints(self.output_dir)[: -self.cfg.checkpoint.keep_last]:
                if store.not_owned(old, layout.CHECKPOINT) is None:  # one a user added a file to stays
                    store.remove_folder(old)
        if new_best:
            self.best = loss
            if self.is_main:
                write(self.output_dir, snap, name=layout.BEST)


def best_score(metrics: Any, metric: str) -> float | None:
    """The score of evaluation `metrics` by `metric`, lower the better; None where they hold no finite value."""
    value = metrics.get(metric) if isinstance(metrics, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return BEST_SIGN[metric] * value


def best_loss(path: Path, metric: str) -> float | None:
    """The score (best_score) of the evaluation checkpoint `path` records, where it records one."""
    try:
        return best_score(read_trainer_state(path).get("eval_metrics"), metric)
    except (OSError, AttributeError, BertcliError):
        return None
