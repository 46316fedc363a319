"""Checkpoints: atomic save, validated load, resume selection, pruning.

A checkpoint is a folder `output_dir/checkpoints/step-NNNNNNN/` holding
  model.safetensors    weights under Hugging Face BertForPreTraining key names (tied aliases left out)
  config.yaml          the resolved run config
  training_state.pt    optimizer state (keyed by parameter name) and grad-scaler state; loads
                       with torch.load(weights_only=True)
  trainer_state.json   step, tokens seen, last metrics (what `inspect` reads, no torch needed)
It is written into a temporary folder and renamed into place, so a folder named step-* is
always complete. Its files are read as bertcli's own: one that is a symbolic link is refused (or,
resuming, the checkpoint is set aside as damaged), never followed out of the folder, and weights
holding NaN or inf are refused wherever they are loaded. The RNG needs no saved state: every
step reseeds from (seed, step).
Weights and optimizer state are saved whole (gathered from FSDP shards), so a checkpoint resumes
on any number of processes, with or without FSDP.
"""

from __future__ import annotations

import errno
import json
import os
import pickle  # only for its exception type: nothing is unpickled here
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
import yaml
from torch import nn

from bertcli import __version__, atomic, console, ownership
from bertcli.config import Config, to_dict
from bertcli.config_load import config_from_dict
from bertcli.config_write import to_yaml
from bertcli.errors import RunError, UsageError
from bertcli.model import TIED_ALIASES

FORMAT_VERSION = 2  # 2: optimizer state keyed by parameter name (1: by position)
FILES = ("model.safetensors", "config.yaml", "training_state.pt", "trainer_state.json")
STEP_DIR = re.compile(r"^step-(\d+)$")
BEST = "best"  # checkpoints/best: the lowest held-out MLM loss so far
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # the prepared data's (Dataset.tokenizer_files), read at start


def linked(path: Path, where: str = "a checkpoint folder",
           fix: str = "replace it with the file itself, or use another checkpoint") -> UsageError:
    """The error for a file of bertcli's own folder `where` that is a symbolic link."""
    return UsageError(f"{path} is a symbolic link, which bertcli never follows out of {where} (its target could be "
                      f"any file): {fix}")


def own_file(path: Path) -> Path:
    """`path`, a file of a checkpoint folder; refused (exit 2) if it is a symbolic link."""
    if Path(path).is_symlink():
        raise linked(path)
    return Path(path)


def read_own(path: Path, where: str = "a checkpoint folder",
             fix: str = "replace it with the file itself, or use another checkpoint") -> bytes:
    """The bytes of a file of bertcli's own folder `where` (a checkpoint, the prepared data); a
    symbolic link is refused (exit 2, with `fix`), at the open itself (O_NOFOLLOW)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP or Path(path).is_symlink():
            raise linked(path, where, fix) from None
        raise
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def check_own_files(folder: Path) -> None:
    """Refuse (exit 2) a checkpoint folder one of whose files is a symbolic link."""
    for name in (*FILES, *TOKENIZER_FILES):
        own_file(Path(folder) / name)


def layout(extra_files: list[Path] = ()) -> ownership.Layout:
    """What a checkpoint folder holds (FILES and the copied tokenizer files): save replaces and
    prunes only folders that hold nothing else and whose trainer_state.json bertcli wrote."""
    names = [*FILES, *TOKENIZER_FILES, *(Path(extra).name for extra in extra_files)]
    return ownership.Layout("a checkpoint", "trainer_state.json", frozenset(names), damaged_proof_counts=True)


def guard(extra_files: list[Path] = ()) -> Callable[[Path], None]:
    """The check that a checkpoint folder (step-NNNNNNN or best) may be replaced (see ownership.py)."""
    def check(target: Path) -> None:
        ownership.check_replaceable(target, layout(extra_files), f"move it out of {Path(target).parent}, or set "
                                    "output_dir to a new folder")
    return check


def check_replaceable(output_dir: Path, max_steps: int) -> None:
    """Refuse, before training, a run whose checkpoints/ holds a folder bertcli did not write that
    it could replace or delete: `best`, a complete step-NNNNNNN folder (pruning), or one of a step
    it may save (<= max_steps). An incomplete folder of a later step is never touched, so it stays."""
    root = checkpoints_dir(output_dir)
    if root.is_dir():
        for child in sorted(root.iterdir()):
            match = STEP_DIR.match(child.name)
            if child.name == BEST or (match and (is_checkpoint(child) or int(match.group(1)) <= max_steps)):
                guard()(child)


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
    with atomic.writing(path):
        safetensors.torch.save_file(tensors, path, metadata=metadata)
    os.chmod(path, 0o666 & ~umask())


def checkpoints_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step-{step:07d}"


def is_checkpoint(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in FILES)


def incomplete(path: Path) -> str | None:
    """Why `path` is no checkpoint folder to resume from (None: it is a complete one)."""
    if not path.exists():
        return "no such checkpoint folder"
    if not is_checkpoint(path):
        missing = [name for name in FILES if not (path / name).is_file()]
        return f"not a complete checkpoint (missing {', '.join(missing)})"
    return None


class ResumeRefused(UsageError):
    """Resuming is off (resume='never') but output_dir already holds checkpoints."""

    def __init__(self, folder: Path, count: int) -> None:
        super().__init__(f"{folder} already holds {count} checkpoint(s) and resume is 'never'; resume 'auto' to "
                         "continue, or use another output_dir to start fresh")
        self.folder, self.count = folder, count


class DamagedState(RunError):
    """A checkpoint's training_state.pt that cannot be loaded; `reason` says what and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}: resume from another checkpoint or start in a new output_dir")
        self.reason = reason


def list_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in output_dir, oldest first."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and is_checkpoint(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def gather(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The whole weights (without the tied aliases) and optimizer state, keyed by parameter name,
    on the CPU. With FSDP this gathers the shards: every process must call it, and the result is
    complete on rank 0 only (the others get empty dicts)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = {k: v.detach().contiguous() for k, v in get_model_state_dict(model, options=options).items()
               if k not in TIED_ALIASES}  # contiguous: what safetensors needs
    return weights, get_optimizer_state_dict(model, optimizer, options=options)


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every floating-point tensor holds only finite numbers (one host sync per device)."""
    checks: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if torch.is_floating_point(t):
            checks.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(per_device).all()) for per_device in checks.values())


def non_finite(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors that hold NaN or inf. A tensor whose sum is finite holds
    only finite values; isfinite (which allocates a mask as large as the tensor) runs only where
    the sum is not (NaN, inf, or finite values so large that the sum overflows)."""
    return [name for name, t in tensors.items()
            if torch.is_floating_point(t) and not torch.isfinite(t.sum()) and not bool(torch.isfinite(t).all())]


def check_finite(tensors: dict[str, torch.Tensor], file: Path, fix: str = "use another checkpoint") -> None:
    """Refuse (exit 2) weights that hold NaN or inf: no model computes anything with them."""
    bad = non_finite(tensors)
    if bad:
        raise UsageError(f"{file}: {len(bad)} weight tensor(s) hold NaN or inf (e.g. {bad[0]}); the file is damaged: "
                         f"{fix}")


def save(output_dir: Path, step: int, state: tuple[dict[str, torch.Tensor], dict[str, Any]],
         scaler: torch.amp.GradScaler, cfg: Config, trainer_state: dict[str, Any], keep_last: int,
         extra_files: dict[str, bytes] | None = None, name: str | None = None) -> Path:
    """Write checkpoint `step` of `state` (weights and optimizer state, from `gather`) atomically
    (as checkpoints/step-NNNNNNN, or checkpoints/NAME), with `extra_files` (name: contents; the
    tokenizer the run trains with, read once when it started: a checkpoint is self-contained),
    and prune all step checkpoints but the newest `keep_last`."""
    extra_files = extra_files or {}
    root = checkpoints_dir(output_dir)
    final = root / (name or step_dir_name(step))
    weights, optimizer_state = state
    # A checkpoint never holds NaN or inf: resuming from one could only fail again.
    if not all_finite([*weights.values(), *(t for s in optimizer_state["state"].values() for t in s.values())]):
        raise RunError(f"step {step}: the weights or optimizer state hold NaN or inf, so no checkpoint was written; "
                       "the earlier checkpoints are intact: lower optimizer.lr and resume from one of them")
    with atomic.folder(final, guard(extra_files)) as tmp:
        for extra, contents in extra_files.items():
            with atomic.writing(tmp / extra):
                (tmp / extra).write_bytes(contents)
            atomic.fsync_path(tmp / extra)
        save_safetensors(weights, tmp / "model.safetensors", metadata={"format": "pt", "producer": f"bertcli {__version__}"})
        with atomic.writing(tmp / "config.yaml"):
            (tmp / "config.yaml").write_text(to_yaml(cfg, f"Resolved config of the run, saved at step {step}."))
        atomic.save_torch({"optimizer": optimizer_state, "scaler": scaler.state_dict(), "step": step},
                          tmp / "training_state.pt")
        state = {"format_version": FORMAT_VERSION, "bertcli_version": __version__, "step": step,
                 "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **trainer_state}
        with atomic.writing(tmp / "trainer_state.json"):
            (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
        for name in FILES:
            atomic.fsync_path(tmp / name)
    for _, old in list_checkpoints(output_dir)[:-keep_last]:
        if ownership.not_owned(old, layout(extra_files)) is None:  # a folder the user added to stays (checked at start)
            atomic.remove_folder(old)
    return final


def best_eval_loss(output_dir: Path) -> float | None:
    """Held-out MLM loss of checkpoints/best, if there is one (and it says it)."""
    best = checkpoints_dir(output_dir) / BEST
    if not is_checkpoint(best):
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
    best = checkpoints_dir(output_dir) / BEST
    if not best.exists():
        return None
    loss, reason = best_eval_loss(output_dir), None
    if resumed_from is None:
        reason = "this run starts fresh, so it was of another run"
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
    if is_main and best.exists() and ownership.not_owned(best, layout()) is None:  # (refused at start otherwise)
        target = best.resolve()
        atomic.remove_folder(target)
        if best.is_symlink():
            target.mkdir()  # the link stays, to an empty folder: the next best is written there
        console.log(f"removed {best}: {reason}")
    return None


def read_config(path: Path) -> Config:
    """The resolved config stored in a checkpoint folder."""
    raw = yaml.safe_load(read_own(Path(path) / "config.yaml").decode("utf-8"))
    return config_from_dict(raw or {}, str(Path(path) / "config.yaml"))


def read_trainer_state(path: Path) -> dict[str, Any]:
    return json.loads(read_own(Path(path) / "trainer_state.json").decode("utf-8"))


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights of checkpoint folder `path`, refused if one of its files is a symbolic link or a
    weight holds NaN or inf (exit 2, naming the file); unreadable weights are a RunError."""
    check_own_files(path)
    file = Path(path) / "model.safetensors"
    try:
        weights = safetensors.torch.load_file(file)
    except (safetensors.SafetensorError, OSError, ValueError) as exc:
        raise RunError(f"{file}: cannot read weights ({exc}); the file is damaged: resume from another checkpoint") from None
    check_finite(weights, file)
    return weights


def load_weights(model: nn.Module, path: Path) -> None:
    """Load model.safetensors into `model`, strictly: every key present, every shape right, every
    value finite."""
    file = Path(path) / "model.safetensors"
    weights = read_weights(path)
    expected = {k: v.shape for k, v in model.state_dict().items() if k not in TIED_ALIASES}
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = sorted(k for k in set(expected) & set(weights) if tuple(weights[k].shape) != tuple(expected[k]))
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        if wrong:
            k = wrong[0]
            parts.append(f"{len(wrong)} of another shape (e.g. {k}: {tuple(weights[k].shape)} vs {tuple(expected[k])})")
        raise UsageError(f"{file}: weights do not fit this model: {'; '.join(parts)}")
    model.load_state_dict(weights, strict=False)  # the tied aliases follow their targets


def load_training_state(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                        device: torch.device) -> int:
    """Restore optimizer and scaler; return the step. Never unpickles arbitrary objects. Under
    FSDP every process calls it and keeps its own shard of the optimizer state."""
    file = own_file(Path(path) / "training_state.pt")
    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols: the error below says it all
            warnings.simplefilter("ignore")
            state = torch.load(file, map_location=device, weights_only=True)
    except pickle.UnpicklingError:  # weights_only refuses anything but tensors and plain containers
        raise DamagedState(f"{file}: cannot load training state: it holds objects other than tensors and plain "
                           "values, so it was refused unread (unpickling it could run code); the file is damaged or "
                           "was tampered with") from None
    except Exception as exc:  # truncated or otherwise damaged
        raise DamagedState(f"{file}: cannot load training state ({type(exc).__name__}); the file is damaged") from None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict  # slow: only here

    try:
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # tampered, or an older format (by position)
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0]}" if str(exc) else type(exc).__name__
        raise DamagedState(f"{file}: the optimizer state does not fit this model ({reason})") from None
    if state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    return int(state["step"])


def model_differences(a: Config, b: Config) -> list[str]:
    """Model fields that differ between two configs, as 'model.key: a vs b'."""
    da, db = to_dict(a)["model"], to_dict(b)["model"]
    # init_from says where a run's first weights came from, not what the model is: a resumed run ignores it.
    return [f"model.{k}={da[k]!r} in the checkpoint vs {db[k]!r} in the config" for k in da
            if da[k] != db[k] and k != "init_from"]


# Settings that may change on resume (the model may not), by what a change means. The others go unsaid:
# paths, devices, precision and parallelism (rounding at most), evaluation and save cadence, logging, and
# the tokenizer's settings (a run's tokenizer is fixed by its first checkpoint; another one is refused).
EXAMPLE_SETTINGS = ["train.seed", "train.batch_size", "train.grad_accum_steps", "data.corpus", "data.split_sentences",
                    "data.validation_fraction", "data.max_seq_length", "data.pairs", "data.short_seq_prob",
                    "data.random_next_prob", "data.masked_lm_prob", "data.max_predictions_per_seq",
                    "data.whole_word_mask", "data.mask_token_prob", "data.random_token_prob", "data.synthetic"]
HELD_OUT_SETTINGS = [k for k in EXAMPLE_SETTINGS if k not in ("train.batch_size", "train.grad_accum_steps")] + [
    "train.eval_examples"]
UPDATE_SETTINGS = ["optimizer", "train.max_steps", "train.mlm_weight", "train.nsp_weight", "train.max_grad_norm"]


def setting_differences(saved: Config, cfg: Config, step: int, where: str) -> list[str]:
    """What resuming checkpoint `where` (at `step`, saved with config `saved`) under `cfg` changes,
    one line per kind of change: the examples later steps see, the held-out set, the updates."""
    from bertcli.optim import lr_at

    def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    old, new = flat(to_dict(saved)), flat(to_dict(cfg))
    synthetic = old["data.corpus"] == new["data.corpus"] == "synthetic"  # its settings matter only then

    def changed(prefixes: list[str]) -> str:
        keys = [k for k in new if any(k == p or k.startswith(p + ".") for p in prefixes) and old.get(k) != new[k]
                and (synthetic or not k.startswith("data.synthetic."))]
        return ", ".join(f"{k} {old.get(k)!r} -> {new[k]!r}" for k in keys)

    lines = []
    examples, held_out, updates = changed(EXAMPLE_SETTINGS), changed(HELD_OUT_SETTINGS), changed(UPDATE_SETTINGS)
    if examples:
        seed = "train.seed" in examples
        lines.append(f"resuming {where} with other settings ({examples}): steps {step + 1:,} on train on other examples"
                     f"{', masks and dropout' if seed else ''} than this run would have, so it is no longer the run "
                     "it was (nor one that started with these settings)")
    if held_out and cfg.train.eval_every > 0:
        lines.append(f"resuming {where} with other settings ({held_out}): the held-out set changes, so held-out "
                     "metrics from now on are not comparable with the earlier ones (nor with the loss that kept "
                     "checkpoints/best)")
    if updates:
        before, after = lr_at(step, saved.optimizer, saved.train.max_steps), lr_at(step, cfg.optimizer, cfg.train.max_steps)
        lr = f" (learning rate {before:.3g} -> {after:.3g} at step {step + 1:,})" if before != after else ""
        lines.append(f"resuming {where} with other settings ({updates}): the updates of steps {step + 1:,} on "
                     f"follow them{lr}; what the first {step:,} steps learned is kept")
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

    links = [name for name in (*FILES, *TOKENIZER_FILES) if (Path(path) / name).is_symlink()]
    if links:
        return f"{links[0]}: a symbolic link, which bertcli never follows out of a checkpoint folder"
    name = "config.yaml"
    try:
        read_config(path)
        name = "trainer_state.json"
        step = read_trainer_state(path).get("step")
        if not isinstance(step, int):
            return f"{name}: no step"
        name = "model.safetensors"
        weights = safetensors.torch.load_file(Path(path) / name)
        bad = non_finite(weights)
        if bad:
            return f"{name}: {len(bad)} weight tensor(s) hold NaN or inf (e.g. {bad[0]})"
        name = "training_state.pt"
        with open(Path(path) / name, "rb") as fh:
            if fh.read(1) == b"\x80" and not zipfile.is_zipfile(fh):  # a pickle's first byte, no archive
                return (f"{name}: a bare pickle, not torch's archive, so it was refused unread (unpickling it could "
                        "run code); it was damaged or tampered with")
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
            return f"{name}: the state of step {state.get('step')!r}, not of step {step} as trainer_state.json says"
        unknown = sorted(k for k in optimizer["state"] if isinstance(k, str) and k not in weights)  # (1: by position)
        return f"{name}: optimizer state of {len(unknown)} parameter(s) the weights lack (e.g. {unknown[0]})" if unknown else None
    except pickle.UnpicklingError:  # weights_only refuses anything but tensors and plain containers
        return (f"{name}: it holds objects other than tensors and plain values, so it was refused unread; it was damaged "
                "or tampered with")
    except Exception as exc:  # noqa: BLE001  any way of not loading is damage
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"{name}: {reason}"


def check_same_tokenizer(ckpt: Path, prepared: Path, contents: bytes) -> None:
    """Refuse to resume `ckpt` on data tokenized by another tokenizer (`contents` of `prepared`, the
    prepared folder's tokenizer.json, as the run read it): the weights were trained on the
    checkpoint's token ids."""
    from tokenizers import Tokenizer

    from bertcli.data.tokenizer import read_tokenizer_json, tokenizer_identity

    if not (ckpt / "tokenizer.json").is_file():
        return  # a checkpoint of the synthetic corpus
    ours = tokenizer_identity(read_tokenizer_json(own_file(ckpt / "tokenizer.json")))
    theirs = tokenizer_identity(Tokenizer.from_str(contents.decode("utf-8")))
    if ours != theirs:
        raise UsageError(f"{prepared.parent} was prepared with tokenizer {theirs[:12]}, but the checkpoint {ckpt} was "
                         f"trained with tokenizer {ours[:12]}: resuming on other token ids would garble the model. "
                         f"Prepare with the checkpoint's own tokenizer (--set data.tokenizer.path={ckpt / 'tokenizer.json'}), "
                         "or start a new run with another output_dir")


def choose_resume(output_dir: Path, resume: str, cfg: Config, is_main: bool = True) -> Path | None:
    """The checkpoint to resume from (None = start fresh), per `resume`: auto, never or a path. `auto`
    takes the newest checkpoint that loads: newer damaged ones (a disk that failed, a file someone
    emptied) are reported and, by the main process, renamed damaged-step-NNNNNNN, so that neither
    resuming nor pruning counts them again (pruning keeps the newest: it would delete good ones)."""
    found = list_checkpoints(output_dir)
    if resume == "never":
        if found:
            raise ResumeRefused(checkpoints_dir(output_dir), len(found))
        return None
    if resume == "auto":
        if not found:
            return None
        damaged = []
        for _, path in reversed(found):
            reason = damage(path)
            if reason is None:
                break
            damaged.append((path, reason))
        else:
            root = checkpoints_dir(output_dir)
            raise RunError(f"{root}: no checkpoint loads (the newest, {damaged[0][0].name}: {damaged[0][1]}); to start "
                           f"fresh, move {root} aside or set output_dir to a new folder")
        for bad, reason in damaged:
            aside = bad.with_name(f"damaged-{bad.name}")
            if is_main:
                if aside.exists():
                    aside = aside.with_name(f"{aside.name}.{time.strftime('%Y%m%d-%H%M%S')}")
                os.replace(bad, aside)
                console.log(f"{bad} is damaged ({reason}): renamed {aside.name}; resuming from the newest checkpoint "
                    f"that loads, {path}")
    else:
        path = Path(resume)
        problem = incomplete(path)
        if problem:
            raise UsageError(f"{path}: {problem}")
        check_own_files(path)
        reason = damage(path)
        if reason is not None:
            raise DamagedState(f"{path} is damaged ({reason})")
    diffs = model_differences(read_config(path), cfg)
    if diffs:
        raise UsageError(f"cannot resume from {path}: {'; '.join(diffs)}; to start fresh, set output_dir to a new "
                         f"folder (or remove {checkpoints_dir(output_dir)})")
    return path


class Checkpointer:
    """Decides when to save and writes the run's checkpoints: step-NNNNNNN every
    checkpoint.save_every steps, at the run's last step and when the run is asked to stop;
    `best` whenever the held-out MLM loss is the lowest so far. Every process calls `save` at
    the same steps (FSDP gathers the weights collectively); only rank 0 writes."""

    def __init__(self, cfg: Config, is_main: bool, tokenizer: dict[str, bytes], resumed_from: Path | None,
                 best: float | None) -> None:
        self.cfg, self.is_main, self.tokenizer = cfg, is_main, tokenizer  # the files as the run read them at start
        self.output_dir = Path(cfg.output_dir)
        self.best = best  # the held-out MLM loss of checkpoints/best, kept by settle_best
        self.last_saved: Path | None = resumed_from  # the newest complete checkpoint of the run

    def due(self, step: int, last_step: int) -> bool:
        return step % self.cfg.checkpoint.save_every == 0 or step == last_step

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
             state: dict[str, Any], periodic: bool) -> None:
        """Save step `step` (`periodic`: a step checkpoint is due) and `best` if `state` holds held-out
        metrics better than the best so far."""
        loss = state.get("eval_metrics", {}).get("mlm_loss")
        new_best = loss is not None and (self.best is None or loss < self.best)
        if not (periodic or new_best):
            return
        gathered = gather(model, optimizer)  # every process: FSDP gathers
        keep = self.cfg.checkpoint.keep_last
        if new_best:
            self.best = loss
            if self.is_main:
                save(self.output_dir, step, gathered, scaler, self.cfg, state, keep, self.tokenizer, name=BEST)
        if periodic and self.is_main:
            self.last_saved = save(self.output_dir, step, gathered, scaler, self.cfg, state, keep, self.tokenizer)
