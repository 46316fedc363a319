"""sentence-transformers folders: how one makes its embeddings (modules.json), which encode follows; an export's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertcli import layout
from bertcli.errors import UsageError
from bertcli.layout import MODULE_CONFIG, POOLING_MODULE, SENTENCE_MODULES, SENTENCE_PROMPTS, SENTENCE_SETTINGS
from bertcli.store import read_json

SUPPORTED = ("cls", "mean", "max")  # the pooling modes bertcli computes, as sentence-transformers names them
DEFAULT_POOLING = "mean"  # sentence-transformers' for a plain transformer: encode.resolve's, an export's 1_Pooling
# The older config format: one boolean per mode (all false means mean, as sentence-transformers reads it).
LEGACY_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(frozen=True)
class SentenceModel:
    folder: Path  # the folder holding modules.json
    transformer: Path  # the BERT folder (config.json, weights, tokenizer)
    pooling: str  # as the folder names it: "mean", "cls", "max", "mean_sqrt_len_tokens", "cls+mean" ...
    normalize: bool
    max_seq_length: int | None  # None: the model's own limit
    lowercase: bool
    unsupported: list[str] = field(default_factory=list)  # modules bertcli does not run (Dense, ...)
    default_prompt: tuple[str, str] | None = None  # (name, text) that encode() prepends to every text

    def problem(self) -> str | None:
        """Why bertcli cannot reproduce this model's embeddings, or None when it can."""
        if self.unsupported:
            return f"its modules.json also runs {', '.join(self.unsupported)}, which bertcli does not"
        if self.default_prompt:
            name, text = self.default_prompt
            return f"its {SENTENCE_PROMPTS} prepends the prompt {name!r} ({text!r}) to every text; bertcli does not"
        if self.pooling not in SUPPORTED:
            return f"its pooling is {self.pooling}, which bertcli does not compute"
        return None


class NotReproducible(UsageError):
    def __init__(self, folder: Path, problem: str) -> None:
        super().__init__(f"--model {folder}: {problem}; pass --pooling cls, mean or max")


def _read_object(file: Path) -> dict[str, Any]:
    """A JSON file's object; {} where the file is not there or holds another value."""
    raw = read_json(file, object) if file.is_file() else {}
    return raw if isinstance(raw, dict) else {}


def _pooling_mode(file: Path) -> str:
    raw = read_json(file)
    mode = raw.get("pooling_mode")
    if mode is None:
        mode = [name for key, name in LEGACY_MODES.items() if raw.get(key)] or ["mean"]
    return "+".join(str(m) for m in ([mode] if isinstance(mode, str) else mode))  # several: vectors concatenated


def _max_seq_length(settings: dict[str, Any], transformer: Path) -> int | None:
    """Tokens per text as sentence-transformers 6 takes them: sentence_bert_config.json's tokenizer_args (or
    processor_kwargs) model_max_length, its max_seq_length, tokenizer_config.json's model_max_length; or None."""
    key = "tokenizer_args" if "tokenizer_args" in settings else "processor_kwargs"
    kwargs = settings.get(key) if isinstance(settings.get(key), dict) else {}
    settings_file, tokenizer_config = transformer / SENTENCE_SETTINGS, transformer / layout.TOKENIZER_CONFIG
    sources = [
        (settings_file, f"{key}.model_max_length", kwargs.get("model_max_length")),
        (settings_file, "max_seq_length", settings.get("max_seq_length")),
        (tokenizer_config, "model_max_length", _read_object(tokenizer_config).get("model_max_length")),
    ]
    for file, name, length in sources:
        if length is not None:  # (transformers writes 10^30 for "no limit": the model's positions cap it)
            if not isinstance(length, int) or isinstance(length, bool) or length < 2:
                raise UsageError(f"{file}: {name} is {length!r}; expected a whole number of at least 2")
            return length
    return None


def refuse_a_module(path: Path, command: str) -> None:
    """Refuse a sentence-transformers model's module folder but its BERT, naming the model to give `command`."""
    parent = Path(path).resolve().parent
    if layout.identify(parent).kind is not layout.Kind.SENTENCE:
        return
    try:
        model = read_sentence_model(parent)
    except (UsageError, OSError, ValueError):  # a damaged modules.json: the command's own checks say so
        return
    if model is not None and model.transformer.resolve() != Path(path).resolve():
        raise UsageError(f"{path}: a module of sentence-transformers model {parent}, not a model: {command} {parent}")


def read_sentence_model(folder: Path) -> SentenceModel | None:
    """The settings of a sentence-transformers folder; None when `folder` has no modules.json."""
    folder = Path(folder)
    file = folder / SENTENCE_MODULES
    if not file.is_file():
        return None
    modules = read_json(file, list)
    if not all(isinstance(m, dict) for m in modules):
        raise UsageError(f"{file}: expected a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]  # ...models.Pooling: Pooling
    if not kinds or kinds[0] != "Transformer":
        raise UsageError(f"{file}: the first module is {kinds[0] if kinds else 'missing'}, not a BERT Transformer")
    transformer = folder / str(modules[0].get("path", ""))
    pooling, normalize, unsupported = None, False, []
    for module, kind in zip(modules[1:], kinds[1:]):
        if kind == "Pooling" and pooling is None:
            pooling = _pooling_mode(folder / str(module.get("path", "")) / MODULE_CONFIG)
        elif kind == "Normalize" and not normalize and pooling is not None:
            normalize = True  # no settings: the module may have no folder at all
        else:  # (a Normalize before the Pooling: sentence-transformers 6 leaves that vector unit-less, 5 fails)
            unsupported.append(f"{kind} before Pooling" if kind == "Normalize" and pooling is None else kind)
    prompts, raw = _read_object(folder / SENTENCE_PROMPTS), _read_object(transformer / SENTENCE_SETTINGS)
    name = prompts.get("default_prompt_name")
    text = prompts.get("prompts", {}).get(name) if isinstance(prompts.get("prompts"), dict) else None
    return SentenceModel(
        folder,
        transformer,
        pooling or "none (token vectors)",
        normalize,
        max_seq_length=_max_seq_length(raw, transformer),
        lowercase=bool(raw.get("do_lower_case", False)),
        unsupported=unsupported,
        default_prompt=(str(name), text) if isinstance(text, str) and text else None,
    )


def sentence_files(hidden_size: int, max_seq_length: int) -> dict[str, Any]:
    """The files (path: JSON) making a BERT folder a sentence-transformers one (DEFAULT_POOLING), as published."""
    module = "sentence_transformers.models."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": f"{module}Transformer"},
        {"idx": 1, "name": "1", "path": POOLING_MODULE, "type": f"{module}Pooling"},
    ]
    modes = {key: mode == DEFAULT_POOLING for key, mode in list(LEGACY_MODES.items())[:4]}  # (the first four)
    return {
        SENTENCE_MODULES: modules,
        SENTENCE_SETTINGS: {"max_seq_length": max_seq_length, "do_lower_case": False},  # (the tokenizer's casing)
        f"{POOLING_MODULE}/{MODULE_CONFIG}": {"word_embedding_dimension": hidden_size, **modes},
    }


def lowercase_first(normalizer: Any) -> Any:
    """`normalizer` with do_lower_case as sentence-transformers 6 applies it: a Lowercase first, unless one is there
    (a BertNormalizer's does not count). Lower-casing the text itself would unmake special tokens such as [MASK]."""
    from tokenizers import normalizers

    parts = list(normalizer) if isinstance(normalizer, normalizers.Sequence) else [normalizer] if normalizer else []
    if any(isinstance(part, normalizers.Lowercase) for part in parts):
        return normalizer
    return normalizers.Sequence([normalizers.Lowercase(), *parts])
