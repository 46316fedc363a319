"""Export: a checkpoint as a Hugging Face and sentence-transformers folder; the checkpoint a path names."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bertcli import __version__, checkpoint, hf_names, layout, resume, store
from bertcli.data.tokenizer import describe, read_tokenizer_json
from bertcli.errors import RunError, UsageError
from bertcli.layout import Kind
from bertcli.sbert import read_sentence_model, sentence_files

if TYPE_CHECKING:
    from bertcli.hf_import import EncoderFolder

T = TypeVar("T")

SPECIAL_TOKENS = {f"{name}_token": f"[{name.upper()}]" for name in ("unk", "sep", "pad", "cls", "mask")}
A_MODEL = "a model is a run folder, a checkpoint folder or a Hugging Face BERT folder"


def _refuse_incomplete(path: Path) -> None:
    raise UsageError(f"{path}: {layout.incomplete(path)}; use another checkpoint of the run")


def find_checkpoint(path: Path) -> Path:
    """A checkpoint folder, or a run folder's best checkpoint (else its newest), none of its files a link. A best
    of another model than the newest's (left by an earlier run) is passed over: the callers name what they read."""
    refuse_a_part_of_a_run(Path(path), "a checkpoint")
    path = _run_outputs(Path(path))
    found = layout.identify(path)
    if found.kind is Kind.INCOMPLETE_CHECKPOINT:
        _refuse_incomplete(path)
    if found.kind is not Kind.CHECKPOINT:
        root = layout.checkpoints_dir(path)  # a link to another run's checkpoint would be read as this run's
        children = list(root.iterdir()) if root.is_dir() else []
        for link in [root] + [c for c in children if c.name == layout.BEST or layout.STEP_DIR.match(c.name)]:
            if link.is_symlink():
                raise store.linked(link, "remove the link, or name the checkpoint folder to read")
        newest = found.checkpoints[-1][1] if found.checkpoints else None
        if found.best is not None and (newest is None or _same_model(found.best, newest)):
            newest = found.best
        if newest is None:
            raise UsageError(f"{path}: no checkpoint here; pass a checkpoint folder or a run folder with checkpoints/")
        path = newest
    checkpoint.check_links(path)
    return path


def _same_model(best: Path, newest: Path) -> bool:
    """Whether a run's best is of the model of its newest checkpoint (a best whose config does not read is not)."""
    checkpoint.check_links(best)
    try:
        ours = checkpoint.read_config(best)
    except Exception:  # noqa: BLE001  damaged in any way
        return False
    return not resume.model_differences(ours, checkpoint.read_config(newest))


def described(ckpt: Path) -> str:
    """`ckpt` with its step and, where it was evaluated, its held-out MLM loss."""
    try:
        state = checkpoint.read_trainer_state(ckpt)
    except (UsageError, RunError, OSError):  # damage: reading the checkpoint says so
        return str(ckpt)
    loss = (state.get("eval_metrics") or {}).get("mlm_loss")
    held_out = f", held-out MLM loss {loss:.4f}" if isinstance(loss, (int, float)) else ""
    return f"{ckpt} (step {state.get('step')}{held_out})"


def check_model_path(path: Path, hf: EncoderFolder | None) -> None:
    """Refuse a model path that is no run, checkpoint or Hugging Face folder (`hf`), before torch is imported."""
    found = layout.identify(path)
    if hf is not None or found.kind in (Kind.CHECKPOINT, Kind.RUN):  # (a run with no checkpoint: find_checkpoint)
        return
    if found.kind is Kind.SENTENCE:
        st = read_sentence_model(path)
        raise UsageError(f"{st.transformer if st else path}: no config.json of its BERT; restore the folder's files")
    if found.kind is Kind.INCOMPLETE_CHECKPOINT:
        _refuse_incomplete(path)
    refuse_a_part_of_a_run(path, "a model")
    what = "no such folder" if found.kind is Kind.MISSING else "not a model"
    raise UsageError(f"{path}: {what}; {A_MODEL} (config.json, model.safetensors, and tokenizer.json or vocab.txt)")


def refuse_a_part_of_a_run(path: Path, wanted: str) -> None:
    """Refuse a run's config.yaml or checkpoints/ given for its run folder, or prepared data, saying what to pass."""
    part = {layout.RUN_CONFIG: "config", layout.CHECKPOINTS: "checkpoints folder"}.get(path.name)
    if part and path.exists() and layout.identify(path.parent).kind is Kind.RUN:
        raise UsageError(f"{path}: a run's {part}, not {wanted}: pass the run folder, {path.parent}")
    if layout.identify(path).kind is Kind.PREPARED:
        raise UsageError(f"{path}: prepared data, not {wanted}: pass the run folder that trained on it")


def _run_outputs(path: Path) -> Path:
    """Where the run at `path` keeps its checkpoints: its output_dir, else `path`; refused where both hold some."""
    from bertcli.resolve import load_run

    config = path / layout.RUN_CONFIG
    if layout.identify(path).kind is not Kind.RUN or not config.is_file():
        return path
    try:
        outputs = Path(os.path.normpath(load_run(config, adopt_init_from=False).output_dir))
    except (UsageError, OSError):
        return path
    if outputs.resolve() == path.resolve():
        return path
    if layout.checkpoints_dir(path).exists():
        raise UsageError(f"{path}: checkpoints/ here and in its output_dir {outputs}; name the checkpoint to read")
    return outputs


def read_checkpoint(path: Path, read: Callable[[Path], T]) -> tuple[Path, T]:
    """(the checkpoint `path` names, read(it)), chosen again (three tries) where a run that trains pruned it."""
    for tries in range(3, 0, -1):
        ckpt = None
        try:
            ckpt = find_checkpoint(path)  # (choosing reads step folders too)
            return ckpt, read(ckpt)
        except (OSError, UsageError, RunError) as exc:
            gone = isinstance(exc, FileNotFoundError) if ckpt is None else not ckpt.exists()
            if layout.identify(path).kind is not Kind.RUN or not gone or tries == 1:
                raise


def export(source: Path, out_dir: Path, force: bool = False) -> Path:
    """Write checkpoint `source` (or a run's best/newest) as a Hugging Face folder; return the folder."""
    return export_checkpoint(source, out_dir, force)[1]


def export_checkpoint(source: Path, out_dir: Path, force: bool = False) -> tuple[Path, Path]:
    """export(), returning the checkpoint written out with the folder."""
    return read_checkpoint(source, lambda ckpt: _export(ckpt, Path(out_dir), force))


def _export(ckpt: Path, out_dir: Path, force: bool) -> Path:
    fix = "choose a new or empty OUT_DIR"
    store.check_apart(out_dir, [store.Input("the source checkpoint", ckpt)], fix)
    store.check_not_inside_own(out_dir, fix)

    def guard(target: Path) -> None:  # (again before the swap: another export may have written it meanwhile)
        if target.exists() and not store.is_empty_folder(target):
            store.check_replaceable(target, layout.EXPORT, fix)  # forced, only an earlier export; never a file
            if not force:
                raise UsageError(f"{out_dir} already exists; pass --force to replace it, or choose another folder")

    guard(out_dir)
    store.clean_folder_leftovers(out_dir, layout.EXPORT)  # of an export killed while it wrote
    m = checkpoint.check_readable(ckpt).model  # every file as recorded, every weight of the config's shape
    tensors = checkpoint.read_weights(ckpt)  # (the bytes checked: their digest again)
    # The positions trained: what transformers and sentence-transformers truncate at, and bertcli's encode of it.
    trained = checkpoint.checkpoint_trained_length(ckpt) or m.max_position_embeddings
    architecture = {k: getattr(m, k) for k in hf_names.HF_FIELDS}
    config = {"architectures": ["BertForPreTraining"], "model_type": "bert", **architecture}
    config |= {"tie_word_embeddings": True, "torch_dtype": "float32", "position_embedding_type": "absolute"}
    step = checkpoint.read_trainer_state(ckpt).get("step")  # which checkpoint of the run this is
    config |= {"bertcli_version": __version__, "bertcli_step": step}  # the version marks it bertcli's (layout.EXPORT)
    with store.folder(out_dir, guard) as tmp:
        store.write_json(tmp / layout.HF_CONFIG, config)
        store.save_safetensors(hf_names.to_hf(tensors, m), tmp / layout.WEIGHTS)  # vocabulary padding dropped
        for name in layout.TOKENIZER_FILES:
            if not (ckpt / name).is_file():
                raise UsageError(f"{ckpt}: no {name}; a checkpoint of the synthetic corpus has no tokenizer to export")
            store.write_inside(tmp / name, store.read_own(ckpt / name))
        # The tokenizer's own casing: transformers applies these keys over tokenizer.json's normalizer.
        casing = describe(read_tokenizer_json(tmp / layout.TOKENIZER_JSON))
        lower, strip = casing.get("lowercase", True), casing.get("strip_accents", True)
        strip = None if strip == lower else strip
        chinese = casing.get("tokenize_chinese_chars", True)
        settings = {"do_lower_case": lower, "strip_accents": strip, "tokenize_chinese_chars": chinese}
        tokenizer_config = {"tokenizer_class": "BertTokenizer", **settings, "model_max_length": trained}
        store.write_json(tmp / layout.TOKENIZER_CONFIG, tokenizer_config | SPECIAL_TOKENS)
        store.write_json(tmp / layout.SPECIAL_TOKENS_MAP, SPECIAL_TOKENS)
        (tmp / layout.POOLING_MODULE).mkdir()
        for name, value in sentence_files(m.hidden_size, trained).items():  # pooled as encode pools
            store.write_json(tmp / name, value)
    return out_dir
