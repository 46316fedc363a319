"""Every name bertcli writes or reads, and `identify`: what a path is. A run folder (output_dir) holds config.yaml
(the user's: never rewritten), resolved-config.yaml, metrics.jsonl, tensorboard/, .lock, checkpoints/, data/."""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass
from pathlib import Path

# NAME is written as .tmp-NAME.PID, then renamed into place; a folder replaced is moved aside as .tmp-old-NAME.PID,
# one deleted renamed .tmp-del-NAME.PID. PID tells a gone writer's leftovers from a write under way.
TMP_PREFIX = ".tmp-"
TEMPORARY = re.compile(rf"{re.escape(TMP_PREFIX)}(?:(old|del)-)?(.+)\.(\d{{1,9}})")


def tmp_name(final: Path, how: str = "", pid: int | None = None) -> Path:
    """The temporary name of `final` for process `pid` (this one): how is '', 'old' or 'del'."""
    return Path(final).with_name(f"{TMP_PREFIX}{how + '-' if how else ''}{Path(final).name}.{pid or os.getpid()}")


CONFIG_YAML = "config.yaml"

RUN_CONFIG = CONFIG_YAML
RUN_SETTINGS = "resolved-config.yaml"  # the config the run trains with, --set included, written at each start
METRICS = "metrics.jsonl"
METRICS_LEFT = "metrics.left-behind.jsonl"  # the records a resume drops from METRICS: a history left behind
TENSORBOARD = "tensorboard"
LOCK = ".lock"
CHECKPOINTS = "checkpoints"
RUN_FILES = (RUN_CONFIG, RUN_SETTINGS, METRICS, METRICS_LEFT, LOCK)  # the run folder's own files, next to its folders
RUN_FOLDERS = (TENSORBOARD,)
RUN_OUTPUTS = (CHECKPOINTS, TENSORBOARD, METRICS, METRICS_LEFT, RUN_SETTINGS)  # what pretrain writes (the lock aside)

WEIGHTS = "model.safetensors"  # also a Hugging Face folder's
CHECKPOINT_CONFIG = CONFIG_YAML  # the run's resolved config, as it was at that step
TRAINING_STATE = "training_state.pt"
TRAINER_STATE = "trainer_state.json"
CHECKPOINT_FILES = (WEIGHTS, CHECKPOINT_CONFIG, TRAINING_STATE, TRAINER_STATE)  # all there: a complete checkpoint
TOKENIZER_JSON = "tokenizer.json"
VOCAB = "vocab.txt"
TOKENIZER_FILES = (TOKENIZER_JSON, VOCAB)  # the prepared data's, copied into every checkpoint
BEST = "best"
STEP_PREFIX = "step-"
STEP_DIR = re.compile(rf"^{STEP_PREFIX}(\d+)$")
DAMAGED_PREFIX = "damaged-"
ABANDONED_PREFIX = "abandoned-"  # step folders past the one a `--resume PATH` went back to: another history

MANIFEST = "manifest.json"  # written last: what makes the rest valid
SPLITS = ("train", "valid")
TOKENS, SEG_OFFSETS, DOC_OFFSETS = "tokens.bin", "seg_offsets.bin", "doc_offsets.bin"  # per split (corpus.Corpus)
SHARD_FILES = (TOKENS, SEG_OFFSETS, DOC_OFFSETS)  # a unit's, per split
INDEX_FILES = (SEG_OFFSETS, DOC_OFFSETS)  # the index's, per split
UNITS = "units"  # units/KEY/
UNIT_RECORD = "unit.json"  # units/KEY/unit.json: the unit's counts, written before it is renamed into place
INDEX = "index"  # index/DIGEST/
KEY = "[0-9a-f]{64}"  # a unit's key, an index's digest (a SHA-256)

HF_CONFIG = "config.json"
HF_PICKLE = "pytorch_model.bin"  # refused: loading a pickle can run code
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
SENTENCE_MODULES = "modules.json"  # sentence-transformers: the modules, run in order
SENTENCE_SETTINGS = "sentence_bert_config.json"
SENTENCE_PROMPTS = "config_sentence_transformers.json"  # its prompts, and the one encode() prepends by default
MODULE_CONFIG = HF_CONFIG  # a sentence-transformers module's settings, in its own folder
POOLING_MODULE = "1_Pooling"  # the folder of an export's Pooling module


@dataclass(frozen=True)
class Layout:
    """A kind of folder bertcli writes whole (store.not_owned: what it may replace)."""

    noun: str  # what such a folder is, for messages: "prepared data", "a checkpoint"
    proof: str  # the file whose "bertcli_version" key shows that bertcli wrote the folder
    paths: frozenset[str]  # every path (relative, '/'-separated, folders included) bertcli writes in it
    damaged_proof_counts: bool = False  # a proof file cut by a failing disk counts (its name is bertcli's alone)
    own_mark: str | None = None  # ... as it does where this folder holds entries of bertcli's own names (units/KEY)
    patterns: tuple[re.Pattern[str], ...] = ()  # whole relative paths of variable names (units/KEY/...)

    def holds(self, rel: str) -> bool:
        """Whether bertcli writes relative path `rel` ('/'-separated; parts under temporary names too) there."""
        rel = "/".join(m.group(2) if (m := TEMPORARY.fullmatch(part)) else part for part in rel.split("/"))
        return rel in self.paths or any(p.fullmatch(rel) for p in self.patterns)


# Every name a checkpoint folder may hold (one not in CHECKPOINT_FILES: old checkpoints without it still load).
CHECKPOINT = Layout(
    "a checkpoint", TRAINER_STATE, frozenset((*CHECKPOINT_FILES, *TOKENIZER_FILES)), damaged_proof_counts=True
)
_SPLIT, _SHARD, _INDEX = ("|".join(map(re.escape, names)) for names in (SPLITS, SHARD_FILES, INDEX_FILES))
# Every path a prepared folder holds (this format's and format 3's): `prepare` replaces or removes only these.
_PREPARED = (MANIFEST, *TOKENIZER_FILES, UNITS, INDEX, *SPLITS, *(f"{s}/{n}" for s in SPLITS for n in SHARD_FILES))
_UNIT_PATH = re.compile(rf"{UNITS}/{KEY}(?:/{re.escape(UNIT_RECORD)}|/(?:{_SPLIT})(?:/(?:{_SHARD}))?)?")
_INDEX_PATH = re.compile(rf"{INDEX}/{KEY}(?:/(?:{_SPLIT})(?:/(?:{_INDEX}))?)?")
PREPARED = Layout("prepared data", MANIFEST, frozenset(_PREPARED), patterns=(_UNIT_PATH, _INDEX_PATH), own_mark=UNITS)
# A Hugging Face folder that is a sentence-transformers one too (its Transformer at the top, its Pooling below).
_HF = (HF_CONFIG, WEIGHTS, *TOKENIZER_FILES, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP)
_SENTENCE = (SENTENCE_MODULES, SENTENCE_SETTINGS, POOLING_MODULE, f"{POOLING_MODULE}/{MODULE_CONFIG}")
EXPORT = Layout("an export", HF_CONFIG, frozenset((*_HF, *_SENTENCE)))


def prepared_lock(folder: Path) -> Path:
    """PARENT/.NAME.lock: beside prepared folder `folder`, which a rename replaces whole (a lock inside too)."""
    return Path(folder).parent / f".{Path(folder).name}{LOCK}"


def checkpoints_dir(output_dir: Path) -> Path:
    return Path(output_dir) / CHECKPOINTS


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:07d}"


def is_checkpoint(path: Path) -> bool:
    return Path(path).is_dir() and all((Path(path) / name).is_file() for name in CHECKPOINT_FILES)


def list_step_folders(output_dir: Path) -> list[tuple[int, Path]]:
    """The step-NNNNNNN folders of run folder `output_dir`, complete or not, oldest first."""
    root = checkpoints_dir(output_dir)
    children = root.iterdir() if root.is_dir() else ()
    return sorted((int(m.group(1)), c) for c in children if (m := STEP_DIR.match(c.name)) and c.is_dir())


def list_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    return [(step, path) for step, path in list_step_folders(output_dir) if is_checkpoint(path)]


def set_aside(output_dir: Path) -> list[Path]:
    """The checkpoint folders a run set aside (damaged-*, abandoned-*): the user's, kept by resuming and pruning."""
    root = checkpoints_dir(output_dir)
    children = root.iterdir() if root.is_dir() else ()
    return sorted(p for p in children if p.name.startswith((DAMAGED_PREFIX, ABANDONED_PREFIX)) and p.is_dir())


def folder_bytes(folder: Path) -> int:
    """The bytes of the files directly in `folder` (a checkpoint holds no subfolders; links not followed)."""
    return sum(p.lstat().st_size for p in Path(folder).iterdir() if p.is_file() and not p.is_symlink())


def incomplete(path: Path) -> str | None:
    """Why `path` is no checkpoint folder to resume from (None: it is a complete one)."""
    missing = [name for name in CHECKPOINT_FILES if not (Path(path) / name).is_file()]
    if not Path(path).exists():
        return "no such checkpoint folder"
    return f"not a complete checkpoint (missing {', '.join(missing)})" if missing else None


def is_hf_folder(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / HF_CONFIG).is_file()


class Kind(enum.Enum):
    MISSING = "nothing"
    FILE = "a file"  # a config file, for `inspect`
    PREPARED = "prepared data"
    CHECKPOINT = "a checkpoint folder"
    SENTENCE = "a sentence-transformers folder"  # modules.json (sbert.py reads it)
    HF = "a Hugging Face folder"
    INCOMPLETE_CHECKPOINT = "a checkpoint folder that lacks files"
    RUN = "a run folder"
    OTHER = "a folder of none of these kinds"


@dataclass(frozen=True)
class Found:
    kind: Kind
    path: Path
    missing: tuple[str, ...] = ()  # INCOMPLETE_CHECKPOINT: the checkpoint files it lacks
    config: Path | None = None  # RUN: its config.yaml; HF and SENTENCE: its config.json (None: not there)
    started: bool = False  # RUN: checkpoints/, metrics.jsonl or .lock is there (not a config file alone)
    checkpoints: tuple[tuple[int, Path], ...] = ()  # RUN: its complete step checkpoints, oldest first
    best: Path | None = None  # RUN: checkpoints/best, when complete


def identify(path: Path) -> Found:
    """What `path` is, by names alone (whoever reads the files checks them), the first match in the order
    below; a checkpoint lacking files has one of them but config.yaml, which a run has too."""
    path = Path(path)
    if not path.exists():
        return Found(Kind.MISSING, path)
    if not path.is_dir():
        return Found(Kind.FILE if path.is_file() else Kind.OTHER, path)
    if (path / MANIFEST).is_file():
        return Found(Kind.PREPARED, path)
    if is_checkpoint(path):
        return Found(Kind.CHECKPOINT, path)
    hf_config = path / HF_CONFIG if is_hf_folder(path) else None
    if (path / SENTENCE_MODULES).is_file():
        return Found(Kind.SENTENCE, path, config=hf_config)
    if hf_config is not None:
        return Found(Kind.HF, path, config=hf_config)
    missing = tuple(name for name in CHECKPOINT_FILES if not (path / name).is_file())
    named = STEP_DIR.match(path.name) is not None and path.parent.name == CHECKPOINTS  # run/checkpoints/step-N
    if named or any(name not in missing for name in CHECKPOINT_FILES if name != CHECKPOINT_CONFIG):
        return Found(Kind.INCOMPLETE_CHECKPOINT, path, missing=missing)
    config = path / RUN_CONFIG if (path / RUN_CONFIG).is_file() else None
    started = checkpoints_dir(path).is_dir() or any((path / name).exists() for name in (METRICS, LOCK))
    if config is None and not started:
        return Found(Kind.OTHER, path)
    best = checkpoints_dir(path) / BEST
    best = best if is_checkpoint(best) else None
    return Found(Kind.RUN, path, config=config, started=started, checkpoints=tuple(list_checkpoints(path)), best=best)
