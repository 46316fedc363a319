"""`bertcli inspect`: what a config, run, checkpoint, prepared data or Hugging Face folder holds, as a report dict
printed as tables or JSON. Torch-free: counts come from the config's numbers, shapes from safetensors headers."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from bertcli import checkpoint, hf_import, layout, resolve, resume, sizes, weights
from bertcli.adopt import newest_config
from bertcli.config import Config, DataConfig, ModelConfig, with_vocab
from bertcli.data import prepared as prep
from bertcli.data.examples import ExampleBuilder, padded_width
from bertcli.data.prepare import fixed_tokenizer, made_from
from bertcli.data.tokenizer import describe, find_tokenizer_file, read_tokenizer_json, tokenizer_identity
from bertcli.errors import DamagedFile, UsageError
from bertcli.export import refuse_a_part_of_a_run
from bertcli.layout import Kind
from bertcli.metrics import read_metrics_checked
from bertcli.sbert import read_sentence_model, refuse_a_module

PARTS = {
    "embeddings": "bert.embeddings.",
    "encoder": "bert.encoder.",
    "pooler": "bert.pooler.",
    "mlm_head": "cls.predictions.",
    "nsp_head": "cls.seq_relationship.",
}
CHECKED = "no symbolic links, the tokenizer's hashes, shard sizes, offsets, the index, token ids below the vocabulary"
READS = (
    "a config file, a run folder (with config.yaml), a checkpoint folder, a prepared-data folder (with "
    "manifest.json) or a Hugging Face (or sentence-transformers) model folder (with config.json)"
)


def parameter_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per part and `total` as Hugging Face counts them (no padding), and `total_with_padding`."""
    counts = sizes.parameter_counts(dataclasses.replace(cfg, pad_vocab_multiple=1))
    return counts | {"total": sum(counts.values()), "total_with_padding": sizes.parameter_count(cfg)}


def architecture(cfg: Config) -> dict[str, Any]:
    m = cfg.model
    first = {k: getattr(m, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")}
    head = {"head_size": m.hidden_size // m.num_attention_heads}
    rest = {k: getattr(m, k) for k in ("intermediate_size", "hidden_act", "max_position_embeddings")}
    return first | head | rest | {"max_seq_length": cfg.data.max_seq_length}


def flops(cfg: Config) -> dict[str, Any]:
    seq = cfg.data.max_seq_length
    share = min(cfg.data.masked_lm_prob, cfg.data.max_predictions_per_seq / seq)
    return {
        "training_flops_per_token": sizes.flops_per_token(cfg.model, seq, share),
        "seq_len": seq,
        "predicted_share": share,
        "note": "forward+backward matmul FLOPs per non-padding token at full sequence length",
    }


def _readable(ckpt: Path, damaged: list[str]) -> tuple[dict[str, Any], Config] | None:
    """A checkpoint's trainer state and config, or None; what is wrong (a file changed too) goes to `damaged`."""
    name = layout.TRAINER_STATE
    try:
        state = checkpoint.read_trainer_state(ckpt)
        if not isinstance(state, dict) or type(state.get("step")) is not int:
            raise ValueError("no integer step")
        name = layout.CHECKPOINT_CONFIG
        found = state, checkpoint.read_config(ckpt)
    except Exception as exc:  # noqa: BLE001  damaged in any way: say which file, report the rest
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        damaged.append(text if text.startswith(f"{ckpt / name}: ") else f"{ckpt / name}: {text}")
        return None
    if change := checkpoint.change(ckpt):
        damaged.append(f"{ckpt / change[0]}: {change[1]}")
    return found


def _training(output_dir: Path, cfg: Config, only: Path | None = None, *, with_run: bool = True) -> dict[str, Any]:
    """The report of the run in `output_dir`, or of its checkpoint `only` (not `with_run`: nothing of the run's)."""
    ckpts = layout.list_checkpoints(output_dir) if with_run else []
    running = resume.read_settings(output_dir)[1] if with_run and not only else None  # what the run trains with
    aside = layout.set_aside(output_dir) if with_run else []
    records, bad_records = read_metrics_checked(output_dir / layout.METRICS) if with_run else ([], None)
    damaged = [bad_records] if bad_records else []
    source, state, saved = None, {}, None  # the newest checkpoint that reads
    for candidate in [only] if only else [p for _, p in reversed(ckpts)]:
        if found := _readable(candidate, damaged):
            source, (state, saved) = candidate, found
            break

    def latest(split: str, key: str) -> dict[str, Any]:  # a run's newest logged record, a checkpoint's own
        logged = [r for r in records if r.get("split", "train") == split]
        value = logged[-1] if logged and not only else state.get(key)
        return value if isinstance(value, dict) else {}

    tokenizer = None  # the run's (fixed by its first checkpoint): a short hash of what fixes the token ids
    if source and (source / layout.TOKENIZER_JSON).is_file():
        try:
            tokenizer = tokenizer_identity(read_tokenizer_json(source / layout.TOKENIZER_JSON))[:12]
        except UsageError as exc:
            damaged.append(str(exc))
    best = layout.checkpoints_dir(output_dir) / layout.BEST  # checked as the steps are: encode and export read it
    has_best = with_run and layout.is_checkpoint(best)
    itself = only is not None and Path(only).resolve() == best.resolve()  # inspect of best: read above
    seen = len(damaged)
    best_read = _readable(best, damaged) if has_best and not itself else None
    best_state = best_read[0] if best_read else state if itself else {}
    logged_steps = [r["step"] for r in records[-1:]]  # a run killed after logging is past its newest checkpoint
    report = {
        "last_eval_metrics": latest("eval", "eval_metrics"),
        "best_checkpoint": str(best) if has_best else None,
        "best_damaged": len(damaged) > seen,
        "best_step": best_state.get("step"),
        "best_mlm_loss": (best_state.get("eval_metrics") or {}).get("mlm_loss"),
        "output_dir": os.path.normpath(output_dir) if with_run else None,  # (a config's "../other": what it names)
        "step": (state.get("step") if source else None) if only else max([state.get("step", 0)] + logged_steps),
        "max_steps": (running or saved or cfg).train.max_steps,  # the run's own (its --set) where it says
        "tokens_seen": state.get("tokens_seen", 0) if source or not only else None,
        "train_time_s": state.get("train_time_s") if isinstance(state.get("train_time_s"), (int, float)) else None,
        "last_metrics": latest("train", "metrics"),
        "checkpoints": [{"step": s, "path": str(p)} for s, p in ckpts] if with_run else None,
        # damaged-step-N and abandoned-step-N: out of the run's history, the user's to delete
        "set_aside": [{"path": str(p), "bytes": layout.folder_bytes(p)} for p in aside],
        "tokenizer": tokenizer,
    }
    return report | ({"damaged": damaged} if damaged else {})


def inspect_path(path: Path) -> dict[str, Any]:
    """The report for what `path` is; made again (three tries) where a run that trains pruned a file read."""
    for _ in range(2):
        with contextlib.suppress(FileNotFoundError):
            return _inspect_path(Path(path))
    return _inspect_path(Path(path))


def _inspect_path(path: Path) -> dict[str, Any]:
    found = layout.identify(path)
    if found.kind is Kind.PREPARED:
        return data_report(path)
    if found.kind in (Kind.HF, Kind.SENTENCE):
        refuse_a_module(path, "inspect")
        return folder_report(path)
    kind, cfg, training, note = _model_source(path, found)
    cfg, vocab_note = _with_vocab(cfg)
    report: dict[str, Any] = {
        "kind": kind,
        "path": str(path),
        "architecture": architecture(cfg) | ({"vocab_size_note": vocab_note} if vocab_note else {}),
        "parameters": parameter_counts(cfg.model),
        "flops": flops(cfg),
        "batch": dataclasses.asdict(sizes.planned(cfg)) | {"examples_per_step": cfg.train.batch_size},
    }
    return report | ({"note": note} if note else {}) | ({"training": training} if training is not None else {})


def _model_source(path: Path, found: layout.Found) -> tuple[str, Config, dict[str, Any] | None, str | None]:
    """(kind, config, training report, note) of a config file, a run or a checkpoint; anything else is refused."""
    if found.kind is Kind.FILE:
        return "config", resolve.load_run(path, adopt_init_from=False), None, None
    if found.kind is Kind.CHECKPOINT:
        return _checkpoint_source(path)
    if found.kind is Kind.INCOMPLETE_CHECKPOINT:
        raise UsageError(f"{path}: {layout.incomplete(path)}; inspect the run folder, or another checkpoint")
    if found.kind is Kind.RUN and found.config is not None:  # with the --set values the run keeps
        cfg = resume.run_config(found.config, [], adopt=False)[0]
        return "run", cfg, _run_training(cfg), None
    if found.kind is Kind.RUN and found.checkpoints:  # no config.yaml: the newest checkpoint's that reads
        if (newest := newest_config(path)) is None:
            raise UsageError(f"{path}: no checkpoint here has a config.yaml that reads; pass its config file instead")
        return "run", newest[1], _training(path, newest[1]), None
    refuse_a_part_of_a_run(path, "a checkpoint")  # a run's checkpoints/: its run folder
    missing = found.kind is Kind.MISSING
    raise UsageError(f"{path}: no such file or folder; pass {READS}" if missing else f"{path}: not {READS}")


def _checkpoint_source(path: Path) -> tuple[str, Config, dict[str, Any], str | None]:
    """A checkpoint folder's config, training report and note (set aside by its run); its weights checked."""
    try:
        cfg = checkpoint.read_config(path)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001  YAML or worse
        raise DamagedFile(path / layout.CHECKPOINT_CONFIG, exc, "inspect another") from None
    note = resume.set_aside_note(path)
    apart = note is not None or path.resolve().parent.name != layout.CHECKPOINTS  # out of its run's history
    training = _training(path.parent.parent, cfg, only=path, with_run=not apart)
    if not any(str(path / layout.WEIGHTS) in line for line in training.get("damaged", [])):  # (not named twice)
        try:
            weights.check_file(path / layout.WEIGHTS, cfg.model, path / layout.CHECKPOINT_CONFIG)
        except UsageError as exc:
            training.setdefault("damaged", []).append(str(exc))
    return "checkpoint", cfg, training, note


def _run_training(cfg: Config) -> dict[str, Any]:
    """The training report of a run by its config, with the tokenizer of its prepared data (the run's, to resume)."""
    training = _training(Path(cfg.output_dir), cfg)
    prepared = Path(cfg.data.prepared_dir)
    manifest, why_not = prep.read_manifest(prepared)
    if manifest is not None and (damage := prep.verify(prepared, manifest)):  # as `inspect DATA` checks it
        fix = f"put its corpus, {gone}, back; then " if (gone := prep.corpus_gone(manifest)) else ""
        damaged = f"{prepared}: the prepared data is damaged ({damage[0]}); {fix}the next pretrain redoes it"
        training.setdefault("damaged", []).append(damaged)
    if manifest is not None:  # next to the run's own tokenizer: they must be the same to resume
        identity = manifest["tokenizer"].get("identity")
        training["prepared_data_tokenizer"] = identity[:12] if isinstance(identity, str) else None
    elif why_not is not None and why_not.startswith("is damaged"):
        training.setdefault("damaged", []).append(f"{prepared / layout.MANIFEST}: {why_not}")
    if newest := layout.list_checkpoints(Path(cfg.output_dir))[-1:]:  # what pretrain refuses of an edited config
        try:
            resume.check_same_model(newest[0][1], cfg)
        except UsageError as exc:
            training["warnings"] = [f"the architecture above is the config's; pretrain would refuse it: {exc}"]
        except Exception:  # noqa: BLE001  a checkpoint whose config does not read: named as damaged
            pass
    return training


def folder_report(path: Path) -> dict[str, Any]:
    """A Hugging Face (or sentence-transformers) folder: architecture, weights, tokenizer, how embeddings are made."""
    sentence = read_sentence_model(path)
    folder = sentence.transformer if sentence else path
    model = hf_import.read_hf_config(folder)
    # The length encode and transformers use: sentence-transformers', else the tokenizer's, else the positions.
    limit = (sentence.max_seq_length if sentence else None) or hf_import.tokenizer_limit(folder)
    seq = min(limit or model.max_position_embeddings, model.max_position_embeddings)
    cfg = Config(model=model, data=DataConfig(max_seq_length=seq, max_predictions_per_seq=max(1, round(0.15 * seq))))
    raw = json.loads((folder / layout.HF_CONFIG).read_text(encoding="utf-8"))
    counts, tok_file = dict.fromkeys(PARTS, 0), None
    for name, shape in weights.stored_shapes(hf_import.weights_file(folder)).items():  # (all known: read_hf_config)
        counts[next(p for p, prefix in PARTS.items() if name.startswith(prefix))] += int(np.prod(shape))
    report: dict[str, Any] = {
        "kind": "sentence-transformers folder" if sentence else "Hugging Face folder",
        "path": str(path),
        "architecture": {"class": ", ".join(map(str, raw.get("architectures") or ["?"])), **architecture(cfg)},
        "parameters": {p: n for p, n in counts.items() if n} | {"total": sum(counts.values())},
        "absent_parts": [p for p in PARTS if counts[p] == 0],
        "flops": flops(cfg),
        "tokenizer": None,
    }
    if "bertcli_version" in raw:  # a bertcli export: which checkpoint of its run it is
        report["bertcli_export"] = {"bertcli_version": raw["bertcli_version"], "step": raw.get("bertcli_step")}
    with contextlib.suppress(UsageError):  # none in the folder: None
        tok_file = find_tokenizer_file(folder)
    if tok_file is not None:  # checked against the model: one of another model's is refused
        report["tokenizer"] = {"file": str(tok_file), **describe(hf_import.load_model_tokenizer(tok_file, model))}
    if sentence:
        settings = {k: getattr(sentence, k) for k in ("pooling", "normalize", "max_seq_length")}
        encode = sentence.problem() or "reproduces these embeddings by default"
        report["sentence_transformers"] = settings | {"bertcli_encode": encode}
    return report


def _with_vocab(cfg: Config) -> tuple[Config, str | None]:
    """`cfg` with a null vocab_size set: the tokenizer's size, else the size it will be trained to; and a note."""
    if cfg.model.vocab_size is not None:
        return cfg, None
    fixed = fixed_tokenizer(cfg, resume.run_tokenizer(cfg))  # data.tokenizer.path, or the run's checkpoints'
    manifest, _ = prep.read_manifest(Path(cfg.data.prepared_dir))  # damaged: said with the training report
    if fixed is not None:
        size, note = fixed[1].get_vocab_size(with_added_tokens=True), f"from the tokenizer {fixed[0]}"
    elif manifest is not None and made_from(cfg, manifest):  # (not the size of data another config prepared)
        size, note = manifest["tokenizer"]["vocab_size"], f"from the tokenizer in {cfg.data.prepared_dir}"
    else:
        why = "not prepared yet" if manifest is None else f"{cfg.data.prepared_dir} holds data of other inputs"
        note = f"data.tokenizer.vocab_size ({why}: the trained size may be smaller)"
        size = cfg.data.tokenizer.vocab_size
    return with_vocab(cfg, size, note), note


def data_report(folder: Path, examples: int = 512) -> dict[str, Any]:
    """Statistics of prepared data, and one decoded example pair with its masked positions marked."""
    prepared, config = prep.load_prepared(folder), folder.parent / layout.RUN_CONFIG
    try:  # the run config that owns this folder gives the sequence length and masking settings
        cfg, source = resolve.load_run(config, adopt_init_from=False), f"the config at {config}"
    except UsageError:
        cfg, source = Config(), "the default config"  # (no run's config beside the folder)
    train, m = prepared.corpus("train"), prepared.manifest
    note = None
    if cfg.data.pairs and train.num_documents < 2:  # no NSP pairs: a run on it sets data.pairs false
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, pairs=False))
        note = f"one training document makes no NSP pairs: shown as with data.pairs false ({source} says true)"
    example, padding = _example(prepared, train, cfg, examples)
    lengths = np.diff(np.asarray(train.seg_offsets))
    files, splits = m["corpus"]["files"], m["splits"]
    corpus_bytes = sum(f.get("bytes", 0) for f in files)
    share, warning = prep.random_next(folder, m, cfg.data, cfg.train.seed)
    tokens = splits["train"]["tokens"] + splits["valid"]["tokens"]
    return {
        "kind": "prepared data",
        "path": str(folder),
        "corpus": m["corpus"]["source"],
        "files": len(files),
        "corpus_bytes": corpus_bytes,
        "units": len(m["units"]),
        "splits": splits,
        "vocab_size": prepared.vocab_size,
        "tokenizer": m["tokenizer"]["source"],
        "vocabulary_sample": prep.vocabulary_sample(m),
        "dtype": m["dtype"],
        "unknown_rate": m["unknown_tokens"] / max(tokens, 1),
        "segment_length_mean": float(lengths.mean()),
        "segment_length_p95": float(np.percentile(lengths, 95)),
        "max_seq_length": cfg.data.max_seq_length,
        "settings": f"max_seq_length {cfg.data.max_seq_length}, data.pairs {str(cfg.data.pairs).lower()}: {source}",
        "padding_share": padding,
        "pairs_note": note,
        "corpus_now": prep.corpus_drift(m),
        "example": example,
        "random_next_share": share,
        "random_next_prob": cfg.data.random_next_prob if cfg.data.pairs else None,
        "random_next_warning": warning,
        "checked": CHECKED,
        "cache_check": prep.cache_check(corpus_bytes),
    }


def _example(prepared: Any, train: Any, cfg: Config, n: int) -> tuple[dict[str, Any], float]:
    """An example a run of `cfg` builds, its masks marked; and the share of padding in its first `n` examples' batches."""
    t, micro = cfg.train, sizes.planned(cfg).micro
    builder = ExampleBuilder(train, cfg.data, t.batch_size)
    e, token = builder.example(t.seed, 0, 0, stream=2), prepared.tokenizer.id_to_token
    lengths = [
        [len(builder.example(t.seed, *divmod(g, builder.examples_per_step)).tokens) for g in range(m, m + micro)]
        for m in range(0, max(n, micro), micro)
    ]  # (micro-batches, micro): the rows of steps 0, 1, ... in order
    slots = sum(padded_width(max(rows), cfg.data.max_seq_length) * len(rows) for rows in lengths)
    shown = [token(int(t)) for t in e.tokens]
    for position, label in zip(e.pred_positions, e.pred_labels):
        original = token(int(label))
        shown[position] = f"[{shown[position]}→{original}]" if shown[position] != original else f"[={original}]"
    example = {
        "nsp_label": int(e.nsp_label) if cfg.data.pairs else None,
        "text": " ".join(shown),
        "legend": "[shown→original] masked or replaced, [=original] chosen but kept",
    }
    return example, 1.0 - sum(map(sum, lengths)) / slots


def _table(rows: list[tuple[str, Any]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def _num(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


# The rows of prepared data's report: a label, its line, and the fields without which the row is left out.
DATA_ROWS = (
    ("corpus", "{corpus} ({files} file(s), {corpus_bytes:,} bytes, prepared in {units:,} unit(s))"),
    ("documents", "{train[documents]:,} train + {valid[documents]:,} held out"),
    ("sentences", "{train[segments]:,} + {valid[segments]:,}"),
    ("tokens", "{train[tokens]:,} + {valid[tokens]:,} ({dtype})"),
    ("vocabulary", "{vocab_size:,} ({tokenizer})"),
    ("vocabulary from", "{vocabulary_sample}", "vocabulary_sample"),
    ("unknown tokens", "{unknown_rate:.3%}"),
    ("sentence length", "mean {segment_length_mean:.1f}, 95th percentile {segment_length_p95:.0f} tokens"),
    ("padding", "{padding_share:.1%} of the token slots of the first steps' batches ({settings})"),
    (
        "random next",
        "{random_next_share:.1%} of NSP pairs (data.random_next_prob {random_next_prob:.0%})",
        "random_next_share",
    ),
    ("checked at use", "{checked}"),
    ("reused while", "the settings are unchanged and {cache_check}"),
)

# Sections printed as a table of their items: the report's key, the title.
SECTIONS = (
    ("tokenizer", "tokenizer"),
    ("bertcli_export", "exported by bertcli"),
    ("sentence_transformers", "sentence-transformers (how its embeddings are made)"),
)


def format_report(report: dict[str, Any]) -> str:
    if report["kind"] == "prepared data":
        return _format_data(report)
    lines = [f"{report['kind']}: {report['path']}"] + ([f"note: {report['note']}"] if report.get("note") else [])
    p, f = report["parameters"], report["flops"]
    lines += ["", "architecture", *_table([(k, _num(v)) for k, v in report["architecture"].items()])]
    lines += ["", "parameters (tied decoder counted once)"]
    lines += _table([(k, f"{v:>13,}  {100 * v / p['total']:5.1f}%") for k, v in p.items()])
    if report.get("absent_parts"):
        absent = ", ".join(report["absent_parts"])
        lines.append(f"  not in the weights file (trained from scratch when pretraining from it): {absent}")
    mflops = f"{f['training_flops_per_token'] / 1e6:,.1f} M"
    lines += ["", f"training FLOPs per token  {mflops} (seq {f['seq_len']}, {f['predicted_share']:.1%} predicted)"]
    if b := report.get("batch"):
        lines.append(
            f"batch  {b['examples_per_step']:,} examples a step: {b['accum']} micro-batch(es) of {b['micro']:,} ({b['why']})"
        )
    for key, title in SECTIONS:
        if key in report and (report[key] or key == "tokenizer"):
            items = [(k, _num(v)) for k, v in (report[key] or {}).items()]
            lines += ["", title] + (_table(items) if items else ["  none in the folder"])
    return "\n".join(lines + (_format_training(report["training"]) if report.get("training") else []))


def _format_training(t: dict[str, Any]) -> list[str]:
    unknown = "unknown (damaged)"
    rows = [("output_dir", t["output_dir"])] if t["output_dir"] is not None else []
    rows += [
        ("step", f"{unknown if t['step'] is None else format(t['step'], ',')} / {t['max_steps']:,}"),
        ("tokens seen", unknown if t["tokens_seen"] is None else _num(t["tokens_seen"])),
    ]
    if t.get("train_time_s") is not None:
        rows.append(("train time", f"{t['train_time_s']:.1f} s"))
    logged = t["last_metrics"].get("step")
    if isinstance(logged, int) and logged != t["step"]:  # figures older than the step shown
        rows.append(("last logged", f"at step {logged:,}"))
    for prefix, key in (("last", "last_metrics"), ("held-out", "last_eval_metrics")):
        rows += [(f"{prefix} {k}", _num(v)) for k, v in t[key].items() if k not in ("step", "split")]
    if t.get("best_checkpoint"):
        loss = t.get("best_mlm_loss")
        what = [f"step {t['best_step']:,}"] if isinstance(t.get("best_step"), int) else []
        what += [f"held-out MLM loss {loss:.4f}"] if isinstance(loss, (int, float)) else []
        what += ["damaged: see below"] if t.get("best_damaged") else []
        rows.append(("best checkpoint", t["best_checkpoint"] + (f" ({', '.join(what)})" if what else "")))
    if t.get("tokenizer"):
        prepared = f" (prepared data: {t['prepared_data_tokenizer']})" if "prepared_data_tokenizer" in t else ""
        rows.append(("tokenizer", t["tokenizer"] + prepared))
    lines = ["", "training", *_table(rows)]
    for key, title in (("warnings", "warnings"), ("damaged", "damaged (left out above)")):
        lines += ["", title] + [f"  {line}" for line in t[key]] if t.get(key) else []
    if t["checkpoints"] is not None:
        lines += ["", f"checkpoints ({len(t['checkpoints'])})"]
        lines += [f"  step {c['step']:>9,}  {c['path']}" for c in t["checkpoints"]] or ["  none yet"]
    if t.get("set_aside"):
        total = sum(round(c["bytes"] / 2**20, 1) for c in t["set_aside"])  # the sum of the figures shown
        lines += ["", f"set aside ({len(t['set_aside'])}, {total:,.1f} MiB: yours to delete; bertcli never does)"]
        lines += [f"  {c['bytes'] / 2**20:>9,.1f} MiB  {c['path']}" for c in t["set_aside"]]
    return lines


def _format_data(r: dict[str, Any]) -> str:
    fields, ex = r | r["splits"], r["example"]
    rows = [(k, line.format_map(fields)) for k, line, *needs in DATA_ROWS if all(fields[n] is not None for n in needs)]
    notes = [r["random_next_warning"]] if r.get("random_next_warning") else []
    notes += [f"note: {r[key]}" for key in ("pairs_note", "corpus_now") if r.get(key)]
    label = ex["nsp_label"]
    nsp = "no sentence pair" if label is None else f"NSP label {label}: {'B is random' if label else 'B follows A'}"
    head = [f"prepared data: {r['path']}", ""]
    return "\n".join(head + _table(rows) + notes + ["", f"example ({nsp}; {ex['legend']})", "  " + ex["text"]])
