"""Hugging Face interoperability: export a bertcli checkpoint as a folder that `transformers` loads
as `BertForPreTraining` with no custom code, and read Hugging Face BERT folders back.

bertcli's weights already carry Hugging Face's key names; what differs is bookkeeping: bertcli
pads the vocabulary rows to a multiple of 64 (export drops the padding, import adds it back),
and stores no tied aliases. Only safetensors weights are read: nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from tokenizers import Tokenizer

from bertcli import __version__, atomic, checkpoint, console, layout, ownership
from bertcli.config import Config, ModelConfig, TokenizerConfig
from bertcli.config_load import model_config_from_dict, preset_config
from bertcli.data.tokenizer import describe, find_tokenizer_file, load_tokenizer, read_tokenizer_json
from bertcli.errors import UsageError
from bertcli.layout import Kind
from bertcli.model import TIED_ALIASES, BertForPreTraining, padded_vocab_size
from bertcli.sbert import read_sentence_model

HF_FIELDS = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("pad_vocab_multiple", "init_from")]
# An export is layout.EXPORT; its config.json carries bertcli_version, the proof that bertcli wrote it.

# Continued pretraining: the peak learning rate of BERT fine-tuning and of Hugging Face's run_mlm, well below
# what a preset uses from scratch (2e-3 for tiny, 1e-4 for base): a high rate would first undo what the
# model learned. Warm-up: 5% of the steps, at most the preset's.
CONTINUED_LR = 5e-5
CONTINUED_WARMUP_SHARE = 0.05
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


class ExportExists(UsageError):
    """export's OUT_DIR exists and replacing it was not asked for (the CLI words the flag that asks)."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__(f"{out_dir} already exists; replace it (an earlier export only), or choose another folder")
        self.out_dir = out_dir


def find_checkpoint(path: Path) -> Path:
    """A checkpoint folder, or a run folder's best checkpoint (else its newest); refused if one of
    its files is a symbolic link. A `best` of another model than the newest checkpoint's (left by an
    earlier run) is passed over, with a line."""
    path = Path(path)
    found = layout.identify(path)
    if found.kind is Kind.CHECKPOINT:
        checkpoint.check_own_files(path)
        return path
    if found.kind is Kind.INCOMPLETE_CHECKPOINT:
        raise UsageError(f"{path}: {layout.incomplete(path)}; use another checkpoint of the run")
    best = found.best
    chosen = found.checkpoints[-1][1] if found.checkpoints else None
    if best is not None:
        checkpoint.check_own_files(best)
        try:
            ours = checkpoint.read_config(best)
        except Exception:  # noqa: BLE001  a best whose config does not load is no better
            ours = None
        differ = chosen is not None and (
            ours is None or checkpoint.model_differences(ours, checkpoint.read_config(chosen))
        )
        if not differ:
            chosen = best
        else:
            console.log(
                f"{best} is not of the run's model (that of its newest checkpoint), so it is passed over: "
                f"using {chosen}"
            )
    if chosen is None:
        raise UsageError(
            f"{path}: no checkpoint here; pass a checkpoint folder or a run folder that holds checkpoints/"
        )
    checkpoint.check_own_files(chosen)
    return chosen


# ------------------------------------------------------------------------------------------ export


def export(source: Path, out_dir: Path, force: bool = False) -> Path:
    """Write checkpoint `source` (or a run's best/newest) as a Hugging Face folder."""
    out_dir = Path(out_dir)
    ckpt = find_checkpoint(source)
    fix = "choose a new or empty OUT_DIR"
    ownership.check_apart(out_dir, [ownership.Input("the source checkpoint", ckpt)], fix)
    ownership.check_output_folder(out_dir, fix)
    if out_dir.exists() and not force:
        raise ExportExists(out_dir)

    def guard(target: Path) -> None:  # forced, it replaces an earlier export only, never anything else
        ownership.check_replaceable(target, layout.EXPORT, fix)

    guard(out_dir)
    cfg = checkpoint.read_config(ckpt)
    m = cfg.model
    check_weights(ckpt, m)  # an export whose config.json claims other sizes would load nowhere
    checkpoint.check_tokenizer_files(ckpt)  # the tokenizer the model was trained with, not an edited one
    weights = checkpoint.read_weights(ckpt)  # finite, and none of the checkpoint's files a symbolic link
    with torch.device("meta"):  # the model's keys and shapes, nothing allocated: the weights publish no other tensor
        checkpoint.check_fits(weights, BertForPreTraining(m), ckpt / layout.WEIGHTS)
    for key in ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias"):
        weights[key] = weights[key][: m.vocab_size].contiguous()  # drop the speed padding rows
    config = {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        **{k: getattr(m, k) for k in HF_FIELDS},
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "position_embedding_type": "absolute",
        "bertcli_version": __version__,
    }
    with atomic.folder(out_dir, guard) as tmp:
        _write_json(tmp / layout.HF_CONFIG, config)
        checkpoint.save_safetensors(weights, tmp / layout.WEIGHTS, metadata={"format": "pt"})
        for name in layout.TOKENIZER_FILES:
            if not (ckpt / name).is_file():
                raise UsageError(f"{ckpt}: no {name}; a checkpoint of the synthetic corpus has no tokenizer to export")
            with atomic.writing(tmp / name):
                (tmp / name).write_bytes(ownership.read_own(ckpt / name))  # never through a link out of the checkpoint
        # The casing of the tokenizer itself, not of the config (a loaded tokenizer keeps its own):
        # transformers applies these keys over tokenizer.json's normalizer.
        tok = read_tokenizer_json(tmp / layout.TOKENIZER_JSON)
        casing = describe(tok)
        lower, strip = casing.get("lowercase", True), casing.get("strip_accents", True)
        tokenizer_config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": lower,
            "strip_accents": None if strip == lower else strip,
            "tokenize_chinese_chars": casing.get("tokenize_chinese_chars", True),
            "model_max_length": m.max_position_embeddings,
            **SPECIAL_TOKENS,
        }
        _write_json(tmp / layout.TOKENIZER_CONFIG, tokenizer_config)
        _write_json(tmp / layout.SPECIAL_TOKENS_MAP, SPECIAL_TOKENS)
        for path in tmp.iterdir():
            atomic.fsync_path(path)
    return out_dir


def _write_json(path: Path, value: Any) -> None:
    with atomic.writing(path):
        path.write_text(json.dumps(value, indent=2) + "\n")


# ------------------------------------------------------------------------------------------ import


def read_hf_config(folder: Path) -> ModelConfig:
    """The ModelConfig of a Hugging Face BERT folder's config.json."""
    file = Path(folder) / layout.HF_CONFIG
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{file}: cannot read ({exc})") from None
    if raw.get("model_type", "bert") != "bert":
        raise UsageError(f"{file}: model_type is {raw.get('model_type')!r}; bertcli reads BERT models only")
    values: dict[str, Any] = {}
    for name in HF_FIELDS:
        if name in raw and raw[name] is not None:
            values[name] = raw[name]
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise UsageError(
            f"{file}: position_embedding_type {raw['position_embedding_type']!r} is not supported (absolute only)"
        )
    cfg = model_config_from_dict(values, str(file))  # strict: types, choices, divisibility
    check_weights(folder, cfg)  # before anything of its size is built
    return cfg


# The sizes of a config against the weights file's tensors: (config fields, a tensor holding them as its shape).
SIZED = [
    (("vocab_size", "hidden_size"), "bert.embeddings.word_embeddings.weight"),
    (("max_position_embeddings", "hidden_size"), "bert.embeddings.position_embeddings.weight"),
    (("type_vocab_size", "hidden_size"), "bert.embeddings.token_type_embeddings.weight"),
    (("intermediate_size", "hidden_size"), "bert.encoder.layer.0.intermediate.dense.weight"),
]


def check_weights(folder: Path, cfg: ModelConfig) -> None:
    """Refuse (exit 2) a config whose sizes are not those of the tensors in `folder`'s
    model.safetensors (a Hugging Face folder or a checkpoint: vocabulary rows padded or not), read
    from the file's header alone; safetensors checks the header against the file's length. A model
    of `cfg` then costs about what the file holds: a config.json claiming absurd sizes (damage, or
    the config of another model) is one line, not an allocation that fails or runs for minutes."""
    folder = Path(folder)
    shapes = stored_shapes(folder)
    config = folder / (layout.HF_CONFIG if layout.is_hf_folder(folder) else layout.CHECKPOINT_CONFIG)
    mismatch = "the two do not belong together (one is damaged, or from another model): restore the folder's files"
    layers = {int(m.group(1)) for key in shapes if (m := re.match(r"bert\.encoder\.layer\.(\d+)\.", key))}
    if len(layers) != cfg.num_hidden_layers:
        raise UsageError(
            f"{config} says num_hidden_layers {cfg.num_hidden_layers:,}, but model.safetensors holds "
            f"{len(layers):,} layers: {mismatch}"
        )
    for fields, key in SIZED:
        expected = tuple(getattr(cfg, name) for name in fields)
        if key not in shapes:
            raise UsageError(f"{folder / layout.WEIGHTS}: the encoder is incomplete (no {key}); restore the file")
        rows = {expected[0], padded_vocab_size(cfg)} if fields[0] == "vocab_size" else {expected[0]}
        if len(shapes[key]) != 2 or shapes[key][0] not in rows or shapes[key][1] != expected[1]:
            said = " and ".join(f"{name} {getattr(cfg, name):,}" for name in fields)
            raise UsageError(
                f"{config} says {said}, but model.safetensors holds {key} of shape {tuple(shapes[key])}: {mismatch}"
            )


def check_tokenizer(tok: Tokenizer, cfg: ModelConfig, file: Path) -> None:
    """Refuse (exit 2) a tokenizer with ids past the model's vocab_size: they would index padding
    rows or nothing (an IndexError mid-run); such a tokenizer belongs to another model."""
    top = max(tok.get_vocab(with_added_tokens=True).values(), default=-1)
    if top >= cfg.vocab_size:
        raise UsageError(
            f"{file}: token ids go up to {top:,} but the model has vocab_size {cfg.vocab_size:,}; the "
            "tokenizer belongs to another model: restore the model's own tokenizer files"
        )


def _rename(key: str) -> str | None:
    """A Hugging Face (or original TF-converted) key as bertcli's BertForPreTraining key; None to drop."""
    key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    if key.endswith("position_ids") or key in TIED_ALIASES:
        return None  # a buffer of old transformers versions; tied aliases follow their targets
    if key.startswith(("embeddings.", "encoder.", "pooler.")):
        return "bert." + key  # a bare BertModel
    return key


def weights_file(folder: Path) -> Path:
    """The model.safetensors of a Hugging Face folder; a folder with only a pickle is refused, with why."""
    folder = Path(folder)
    file = folder / layout.WEIGHTS
    if not file.is_file():
        if (folder / layout.HF_PICKLE).is_file():  # the tensors as they are (no heads added), read without pickle code
            pickle_path = str(folder / layout.HF_PICKLE)
            convert = (
                f"import torch, safetensors.torch as st; w = torch.load({pickle_path!r}, weights_only=True); "
                f"st.save_file({{k: v.contiguous().clone() for k, v in w.items()}}, "
                f"{str(file)!r}, metadata={{'format': 'pt'}})"
            )
            raise UsageError(
                f"{folder}: only pytorch_model.bin here, and bertcli reads model.safetensors only (a .bin "
                f"file is a pickle, which can run code when loaded); convert it once, where you trust the "
                f'file: python3 -c "{convert}"'
            )
        raise UsageError(
            f"{folder}: no model.safetensors; a Hugging Face folder holds its weights in it (save "
            "them with save_pretrained(folder, safe_serialization=True))"
        )
    return file


def stored_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """The shapes of a Hugging Face folder's weights under bertcli's names (no vocabulary padding,
    no tied aliases), read from the safetensors header alone: nothing is loaded."""
    file = weights_file(folder)
    try:
        with safetensors.safe_open(file, "pt") as f:
            return {new: tuple(f.get_slice(key).get_shape()) for key in f.keys() if (new := _rename(key)) is not None}
    except (safetensors.SafetensorError, OSError, ValueError) as exc:
        raise UsageError(f"{file}: cannot read weights ({exc})") from None


def load_hf_weights(
    folder: Path, cfg: ModelConfig, model: BertForPreTraining | None = None
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Weights of a Hugging Face BERT folder under bertcli's names, vocabulary rows padded; and the
    parts (pooler, MLM head, NSP head) it lacks, which the caller initialises fresh. Shapes are
    checked against `model` (the one to load into), else against a model of `cfg` built on the meta
    device, whose initialisation there imports torch._dynamo (2 s): callers with a model pass it."""
    file = weights_file(folder)
    try:
        raw = safetensors.torch.load_file(file)
    except (safetensors.SafetensorError, OSError, ValueError) as exc:
        raise UsageError(f"{file}: cannot read weights ({exc})") from None
    checkpoint.check_finite(raw, file, "restore it, or use another model")
    weights = {new: value for key, value in raw.items() if (new := _rename(key)) is not None}
    if model is None:
        with torch.device("meta"):
            model = BertForPreTraining(cfg)
    V, padded = cfg.vocab_size, padded_vocab_size(cfg)
    for key in ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias"):
        if key in weights and weights[key].shape[0] == V and padded > V:
            pad = torch.zeros((padded - V, *weights[key].shape[1:]), dtype=weights[key].dtype)
            weights[key] = torch.cat([weights[key], pad])
    parts = {"bert.pooler.": "pooler", "cls.predictions.": "MLM head", "cls.seq_relationship.": "NSP head"}
    missing = checkpoint.check_fits(weights, model, file, optional=tuple(parts))  # the encoder whole, the rest may lack
    fresh = sorted({name for prefix, name in parts.items() if any(k.startswith(prefix) for k in missing)})
    return {k: v.float() for k, v in weights.items()}, fresh


def init_from(model: BertForPreTraining, path: Path, uninitialised: bool = False) -> list[str]:
    """Load a Hugging Face folder or a bertcli checkpoint into `model`; return the parts left fresh.
    `uninitialised`: the model was built without its random initialisation (encode does, to start
    faster), so the weights the folder lacks are initialised here, as a new model's would be."""
    path = Path(path)
    if layout.identify(path).kind is Kind.CHECKPOINT:
        checkpoint.load_weights(model, path)  # every weight, or an error
        return []
    weights, fresh = load_hf_weights(path, model.config, model)
    if uninitialised:
        missing = set(model.state_dict()) - set(weights) - set(TIED_ALIASES)
        for name, module in model.named_modules():  # a module owning a missing weight; loading follows
            if any(f"{name}.{p}" in missing for p, _ in module.named_parameters(recurse=False)):
                model._init_weights(module)
    model.load_state_dict(weights, strict=False)  # absent parts keep their fresh initialisation
    return fresh


def imported_config(path: Path) -> ModelConfig:
    """The architecture of an init_from source: a Hugging Face folder's config.json or a checkpoint's config."""
    path = Path(path)
    found = layout.identify(path)
    if found.kind is Kind.CHECKPOINT:
        return checkpoint.read_config(path).model
    if found.kind in (Kind.HF, Kind.SENTENCE) and found.config is not None:  # (sentence-transformers: its own BERT)
        return read_hf_config(path)
    raise UsageError(
        f"model.init_from={str(path)!r}: not a Hugging Face BERT folder (config.json + model.safetensors) "
        "nor a bertcli checkpoint folder"
    )


def adopt_imported(cfg: Config, path: Path) -> Config:
    """cfg with the model section of the init_from source; a YAML value that contradicts it is an error.

    The source matters only to start: a run that has checkpoints resumes from them. So when it is
    gone (phase 1's keep_last pruned the step a phase 2 came from, say), the run's newest checkpoint
    stands in for it: its architecture, and its tokenizer where the source was the tokenizer."""
    try:
        imported = imported_config(path)
    except UsageError:
        own = _newest_own_checkpoint(Path(cfg.output_dir))
        if own is None:
            raise  # starting fresh: the source is needed
        ckpt, model = own
        data = cfg.data
        tokenizer = data.tokenizer.path
        stand_in = (not tokenizer or Path(tokenizer) == path or path in Path(tokenizer).parents) and (
            ckpt / layout.TOKENIZER_JSON
        ).is_file()
        if stand_in:
            data = dataclasses.replace(
                data, tokenizer=dataclasses.replace(data.tokenizer, path=str(ckpt / layout.TOKENIZER_JSON))
            )
        console.info(
            f"model.init_from {path} is gone (or unreadable), but this run resumes from its own checkpoints and "
            f"does not need it: the architecture{' and the tokenizer' if stand_in else ''} come from {ckpt}"
        )
        return _adopt(dataclasses.replace(cfg, data=data), model, ckpt)
    cfg = _adopt(cfg, imported, path)
    if not cfg.data.tokenizer.path:  # the imported model's own tokenizer
        cfg = dataclasses.replace(
            cfg, data=dataclasses.replace(cfg.data, tokenizer=dataclasses.replace(cfg.data.tokenizer, path=str(path)))
        )
    return cfg


def _adopt(cfg: Config, imported: ModelConfig, path: Path) -> Config:
    """cfg with model section `imported` (from `path`); a YAML value that contradicts it is an error."""
    clashes = [
        f"model.{k}={getattr(cfg.model, k)!r} but {path} has {getattr(imported, k)!r}"
        for k in HF_FIELDS
        if getattr(cfg.model, k) is not None and getattr(cfg.model, k) != getattr(imported, k)
    ]
    if clashes:
        raise UsageError(
            f"{'; '.join(clashes)}: the architecture comes from model.init_from; remove those keys or "
            f"write a matching config with `bertcli init` from {path}"
        )
    model = dataclasses.replace(
        imported, pad_vocab_multiple=cfg.model.pad_vocab_multiple, init_from=cfg.model.init_from
    )
    return dataclasses.replace(cfg, model=model)


def _newest_own_checkpoint(output_dir: Path) -> tuple[Path, ModelConfig] | None:
    """The run's newest checkpoint whose config reads, with its architecture (None: no checkpoint)."""
    for _, path in reversed(layout.list_checkpoints(output_dir)):
        try:
            return path, checkpoint.read_config(path).model
        except Exception:  # noqa: BLE001  a damaged one: resuming sets it aside too
            continue
    return None


def continued_pretraining(source: Path, preset: str, overrides: list[str]) -> tuple[list[str], str]:
    """What `bertcli init` from SOURCE (init_from) sets before the user's overrides (which win): the
    imported architecture and weights, its tokenizer as data.tokenizer.path (with its casing), and
    optimizer values for continuing; and a note for the config's header saying so."""
    sentence = read_sentence_model(source) if layout.identify(source).kind is Kind.SENTENCE else None
    source = sentence.transformer if sentence else Path(source)  # a sentence-transformers folder's BERT
    imported = imported_config(source)
    if layout.identify(source).kind is not Kind.CHECKPOINT:
        weights_file(source)  # refused now (a pickle only, no weights), not when pretrain starts
    values = [f"model.{k}={getattr(imported, k)}" for k in HF_FIELDS] + [f"model.init_from={json.dumps(str(source))}"]
    try:
        tokenizer = find_tokenizer_file(source)
    except UsageError:
        tokenizer = None  # prepare trains one, as from scratch
    if tokenizer is not None:
        loaded = load_tokenizer(tokenizer, TokenizerConfig())
        check_tokenizer(loaded, imported, tokenizer)
        casing = describe(loaded)
        values.append(f"data.tokenizer.path={json.dumps(str(source))}")
        values += [f"data.tokenizer.{k}={casing[k]}" for k in ("lowercase", "strip_accents") if k in casing]
    scratch = preset_config(preset, values + overrides)
    warmup = min(scratch.optimizer.warmup_steps, max(1, round(CONTINUED_WARMUP_SHARE * scratch.train.max_steps)))
    values += [f"optimizer.lr={CONTINUED_LR}", f"optimizer.warmup_steps={warmup}"]
    cfg = preset_config(preset, values + overrides)
    o = cfg.optimizer
    note = (
        f"\nContinued pretraining from {source}: its architecture (model), weights (model.init_from)"
        f"{' and tokenizer (data.tokenizer.path)' if tokenizer else ''}.\n"
        f"optimizer.lr {o.lr:g} with {o.warmup_steps:,} warm-up steps, against {scratch.optimizer.lr:g} from scratch "
        f"in preset '{preset}':\na model that has learned already needs a lower rate, or the first steps undo it."
    )
    return values, note
