"""`bertcli inspect`: what a config, a run folder, a checkpoint folder, prepared data or a Hugging
Face folder (a sentence-transformers folder, a bertcli export) holds, as a report dict (printed as
tables or as one JSON object). Torch-free: parameter counts and FLOPs come from the config's numbers
(`sizes.py`, checked against built models by the tests), shapes from safetensors headers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from bertcli import checkpoint, hf_import, layout, resolve, resume, sizes, weights
from bertcli.config import Config, DataConfig, ModelConfig, with_vocab
from bertcli.data.examples import ExampleBuilder
from bertcli.data.prepare import fixed_tokenizer, made_from
from bertcli.data.prepared import (
    cache_check,
    corpus_drift,
    corpus_gone,
    load_prepared,
    random_next,
    read_manifest,
    verify,
    vocabulary_sample,
)
from bertcli.data.tokenizer import (
    describe,
    find_tokenizer_file,
    read_tokenizer_json,
    tokenizer_identity,
)
from bertcli.errors import UsageError
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


def parameter_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per part and in total, as Hugging Face counts them (no vocabulary padding, the
    tied decoder once, in embeddings), plus `total_with_padding`: what bertcli trains."""
    counts = sizes.parameter_counts(dataclasses.replace(cfg, pad_vocab_multiple=1))
    return counts | {"total": sum(counts.values()), "total_with_padding": sizes.parameter_count(cfg)}


def architecture(cfg: Config) -> dict[str, Any]:
    m = cfg.model
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size,
        "num_hidden_layers": m.num_hidden_layers,
        "num_attention_heads": m.num_attention_heads,
        "head_size": m.hidden_size // m.num_attention_heads,
        "intermediate_size": m.intermediate_size,
        "hidden_act": m.hidden_act,
        "max_position_embeddings": m.max_position_embeddings,
        "max_seq_length": cfg.data.max_seq_length,
    }


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
    """A checkpoint's trainer state and config, or None with what is wrong added to `damaged`."""
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
    # Files changed since they were written (their SHA-256): what encode, export and resume refuse.
    if change := checkpoint.change(ckpt):
        damaged.append(f"{ckpt / change[0]}: {change[1]}")
    return found


def _training(output_dir: Path, cfg: Config, only: Path | None = None, *, with_run: bool = True) -> dict[str, Any]:
    """The training report of the run in `output_dir`, or of its checkpoint `only`; without `with_run`, its
    best is not read (a checkpoint out of the run's history: its best is another's)."""
    damaged: list[str] = []  # files that could not be read, and why: the report says so and shows the rest
    ckpts = layout.list_checkpoints(output_dir)
    records, bad_records = read_metrics_checked(output_dir / layout.METRICS)
    if bad_records:
        damaged.append(bad_records)
    train_records = [r for r in records if r.get("split", "train") == "train"]
    eval_records = [r for r in records if r.get("split") == "eval"]
    source, state, saved = None, {}, None  # the newest checkpoint that reads (a damaged one is named)
    for candidate in [only] if only else [p for _, p in reversed(ckpts)]:
        found = _readable(candidate, damaged)
        if found:
            source, (state, saved) = candidate, found
            break
    last = state.get("metrics") if only else (train_records[-1] if train_records else state.get("metrics"))
    last_eval = state.get("eval_metrics") if only else (eval_records[-1] if eval_records else state.get("eval_metrics"))
    best = layout.checkpoints_dir(output_dir) / layout.BEST
    tokenizer = None  # the run's tokenizer (fixed by its first checkpoint), as a short hash of what fixes the token ids
    if source and (source / layout.TOKENIZER_JSON).is_file():
        try:
            tokenizer = tokenizer_identity(read_tokenizer_json(source / layout.TOKENIZER_JSON))[:12]
        except UsageError as exc:
            damaged.append(str(exc))
    # best is checked as the step folders are (encode and export of the run read it)
    seen = len(damaged)
    itself = only is not None and Path(only).resolve() == best.resolve()  # (inspect of best: read above once)
    best_read = _readable(best, damaged) if with_run and not itself and layout.is_checkpoint(best) else None
    best_state, best_damaged = (best_read[0] if best_read else state if itself else {}), len(damaged) > seen
    report = {
        "last_eval_metrics": last_eval if isinstance(last_eval, dict) else {},
        "best_checkpoint": str(best) if with_run and layout.is_checkpoint(best) else None,
        "best_damaged": best_damaged,
        # Which step best holds, and its held-out MLM loss: what made it best.
        "best_step": best_state.get("step"),
        "best_mlm_loss": (best_state.get("eval_metrics") or {}).get("mlm_loss"),
        "output_dir": os.path.normpath(output_dir),  # (a config's "../other": the folder it names)
        # A run's step: the newest checkpoint's, or a later logged step (a run killed after logging).
        # A checkpoint whose trainer state does not read: its step and tokens are unknown (None), not 0.
        "step": (state.get("step") if source else None)
        if only
        else max([state.get("step", 0)] + [r["step"] for r in records[-1:]]),
        # The resolved config of the newest checkpoint knows about command-line overrides; the file does not.
        "max_steps": saved.train.max_steps if saved else cfg.train.max_steps,
        "tokens_seen": state.get("tokens_seen", 0) if source or not only else None,
        "train_time_s": state.get("train_time_s") if isinstance(state.get("train_time_s"), (int, float)) else None,
        "last_metrics": last if isinstance(last, dict) else {},
        "checkpoints": [{"step": s, "path": str(p)} for s, p in ckpts],
        # damaged-step-N and abandoned-step-N: out of the run's history, kept for the user to delete
        "set_aside": [{"path": str(p), "bytes": layout.folder_bytes(p)} for p in layout.set_aside(output_dir)],
        "metrics_file": str(output_dir / layout.METRICS) if records else None,
        "tokenizer": tokenizer,
    }
    if damaged:
        report["damaged"] = damaged
    return report


def inspect_path(path: Path) -> dict[str, Any]:
    """The report for what `path` is (layout.identify): a config file, a run folder, a checkpoint
    folder, prepared data, or a Hugging Face or sentence-transformers folder. A run that trains
    prunes its checkpoints while they are read: a file gone meanwhile makes the report again, up to
    three times."""
    for tries in range(3, 0, -1):
        try:
            return _inspect_path(Path(path))
        except FileNotFoundError:
            if tries == 1 or not Path(path).exists():
                raise
    raise AssertionError("unreachable")  # (the last try returns or raises)


def _inspect_path(path: Path) -> dict[str, Any]:
    found = layout.identify(path)
    if found.kind is Kind.MISSING:
        raise UsageError(
            f"{path}: no such file or folder; pass a config file, a run folder, a checkpoint folder, a "
            "prepared-data folder or a Hugging Face (or sentence-transformers) model folder"
        )
    training, note = None, None
    if found.kind is Kind.PREPARED:
        return data_report(path)
    if found.kind in (Kind.HF, Kind.SENTENCE):
        refuse_a_module(path, "inspect")
        return folder_report(path)
    if found.kind is Kind.FILE:
        kind, cfg = "config", resolve.load_run(path, adopt_init_from=False)
    elif found.kind is Kind.CHECKPOINT:
        kind, cfg = "checkpoint", _checkpoint_config(path)
        note = resume.set_aside_note(path)
        apart = note is not None or path.resolve().parent.name != layout.CHECKPOINTS  # out of its run's history
        training = _training(path.parent.parent, cfg, only=path, with_run=not apart)
        if apart:  # none of the run's own is shown
            training |= {"output_dir": None, "checkpoints": None, "set_aside": []}
        try:  # its sizes are the weights' (a file already named as damaged is not named twice)
            if not any(str(path / layout.WEIGHTS) in line for line in training.get("damaged", [])):
                weights.check_file(path / layout.WEIGHTS, cfg.model, path / layout.CHECKPOINT_CONFIG)
        except UsageError as exc:
            training.setdefault("damaged", []).append(str(exc))
    elif found.kind is Kind.INCOMPLETE_CHECKPOINT:
        raise UsageError(f"{path}: {layout.incomplete(path)}; inspect the run folder, or another checkpoint")
    elif found.kind is Kind.RUN and found.config is not None:
        kind, cfg = "run", resolve.load_run(found.config, adopt_init_from=False)
        training = _run_training(cfg)
    elif found.kind is Kind.RUN and found.checkpoints:
        kind, cfg = "run", None
        for _, ckpt in reversed(found.checkpoints):  # the newest whose config reads
            with contextlib.suppress(Exception):
                cfg = checkpoint.read_config(ckpt)
                break
        if cfg is None:
            raise UsageError(f"{path}: no checkpoint here has a config.yaml that reads; pass its config file instead")
        training = _training(path, cfg)
    else:
        refuse_a_part_of_a_run(path, "a checkpoint")  # a run's checkpoints/: its run folder
        raise UsageError(
            f"{path}: not a config file, a run folder (with config.yaml), a checkpoint folder "
            f"(with {', '.join(layout.CHECKPOINT_FILES)}), a prepared-data folder (with {layout.MANIFEST}) or a "
            "Hugging Face (or sentence-transformers) model folder (with config.json)"
        )
    cfg, vocab_note = _with_vocab(cfg)
    report: dict[str, Any] = {
        "kind": kind,
        "path": str(path),
        "architecture": architecture(cfg),
        "parameters": parameter_counts(cfg.model),
        "flops": flops(cfg),
    }
    if vocab_note:
        report["architecture"]["vocab_size_note"] = vocab_note
    if note:
        report["note"] = note
    if training is not None:
        report["training"] = training
    return report


def _run_training(cfg: Config) -> dict[str, Any]:
    """The training report of a run by its config, with the tokenizer of its prepared data (it must
    be the run's to resume) or why that cannot be read."""
    training = _training(Path(cfg.output_dir), cfg)
    manifest, why_not = read_manifest(Path(cfg.data.prepared_dir))
    damage = verify(Path(cfg.data.prepared_dir), manifest) if manifest is not None else None
    if damage:  # as `inspect DATA` checks it (the next pretrain prepares it again)
        gone = corpus_gone(manifest)
        training.setdefault("damaged", []).append(
            f"{cfg.data.prepared_dir}: the prepared data is damaged ({damage[0]}); "
            + (
                f"its corpus, {gone}, is not there to prepare it from again: put it back, then the next pretrain or "
                "prepare prepares it again"
                if gone
                else "the next pretrain or prepare prepares it again"
            )
        )
    if manifest is not None:  # next to the run's own tokenizer: they must be the same to resume
        identity = manifest["tokenizer"].get("identity")
        training["prepared_data_tokenizer"] = identity[:12] if isinstance(identity, str) else None
    elif why_not is not None and why_not.startswith("is damaged"):
        training.setdefault("damaged", []).append(f"{Path(cfg.data.prepared_dir) / layout.MANIFEST}: {why_not}")
    newest = layout.list_checkpoints(Path(cfg.output_dir))[-1:]
    if newest:  # what pretrain refuses of a config edited after the run trained
        try:
            resume.check_same_model(newest[0][1], cfg)
        except UsageError as exc:
            training["warnings"] = [f"the architecture above is the config's; pretrain would refuse it: {exc}"]
        except Exception:  # noqa: BLE001  a checkpoint whose config does not read: named as damaged above
            pass
    return training


def _checkpoint_config(path: Path) -> Config:
    """The config a checkpoint folder was saved with; one line naming the file when it is damaged."""
    try:
        return checkpoint.read_config(path)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001  YAML or worse
        raise UsageError(
            f"{path / layout.CHECKPOINT_CONFIG}: damaged ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
            "inspect the run folder or another checkpoint"
        ) from None


def folder_report(path: Path) -> dict[str, Any]:
    """A Hugging Face BERT folder (or a sentence-transformers folder around one): its architecture,
    the parameters its weights file holds, its tokenizer and, for sentence-transformers, how its
    embeddings are made."""
    sentence = read_sentence_model(path)
    folder = sentence.transformer if sentence else path
    model = hf_import.read_hf_config(folder)
    # The length encode and transformers use: sentence_bert_config.json's, else the tokenizer's
    # model_max_length, else the positions.
    limit = (sentence.max_seq_length if sentence else None) or hf_import.tokenizer_limit(folder)
    seq = min(limit or model.max_position_embeddings, model.max_position_embeddings)
    cfg = Config(model=model, data=DataConfig(max_seq_length=seq, max_predictions_per_seq=max(1, round(0.15 * seq))))
    raw = json.loads((folder / layout.HF_CONFIG).read_text(encoding="utf-8"))
    classes = raw.get("architectures") or ["?"]
    counts = dict.fromkeys(PARTS, 0)
    for name, shape in weights.stored_shapes(hf_import.weights_file(folder)).items():
        part = next((p for p, prefix in PARTS.items() if name.startswith(prefix)), None)
        if part is None:
            raise UsageError(f"{folder / layout.WEIGHTS}: {name} is not a BERT weight bertcli knows")
        counts[part] += int(np.prod(shape))
    absent = [p for p in PARTS if counts[p] == 0]
    parameters = {p: n for p, n in counts.items() if n} | {"total": sum(counts.values())}
    report: dict[str, Any] = {
        "kind": "sentence-transformers folder" if sentence else "Hugging Face folder",
        "path": str(path),
        "architecture": {"class": ", ".join(map(str, classes)), **architecture(cfg)},
        "parameters": parameters,
        "absent_parts": absent,
        "flops": flops(cfg),
    }
    if "bertcli_version" in raw:  # a bertcli export: which checkpoint of its run it is
        report["bertcli_export"] = {"bertcli_version": raw["bertcli_version"], "step": raw.get("bertcli_step")}
    try:
        tok_file = find_tokenizer_file(folder)
    except UsageError:
        report["tokenizer"] = None
    else:
        tok = hf_import.load_model_tokenizer(tok_file, model)
        report["tokenizer"] = {"file": str(tok_file), **describe(tok)}
    if sentence:
        report["sentence_transformers"] = {
            "pooling": sentence.pooling,
            "normalize": sentence.normalize,
            "max_seq_length": sentence.max_seq_length,
            "bertcli_encode": sentence.problem() or "reproduces these embeddings by default",
        }
    return report


def _with_vocab(cfg: Config) -> tuple[Config, str | None]:
    """A resolved config whose vocab_size is null gets the prepared tokenizer's size, or else the
    size the tokenizer will be trained to (said in a note)."""
    if cfg.model.vocab_size is not None:
        return cfg, None
    fixed = fixed_tokenizer(cfg, resume.run_tokenizer(cfg))  # data.tokenizer.path, or the run's checkpoints'
    manifest, _ = read_manifest(Path(cfg.data.prepared_dir))  # damaged: said with the training report
    if fixed is not None:
        size, note = fixed[1].get_vocab_size(with_added_tokens=True), f"from the tokenizer {fixed[0]}"
    elif manifest is not None and made_from(cfg, manifest):
        size, note = manifest["tokenizer"]["vocab_size"], f"from the tokenizer in {cfg.data.prepared_dir}"
    else:  # (not the size of data another config prepared there)
        why = "not prepared yet" if manifest is None else f"{cfg.data.prepared_dir} holds data of other inputs"
        size, note = (
            cfg.data.tokenizer.vocab_size,
            f"data.tokenizer.vocab_size ({why}: the trained size may be smaller)",
        )
    return with_vocab(cfg, size, note), note


def data_report(folder: Path, examples: int = 512) -> dict[str, Any]:
    """Statistics of prepared data, and one decoded example pair with its masked positions marked."""
    prepared = load_prepared(folder)
    m = prepared.manifest
    source = f"the config at {folder.parent / layout.RUN_CONFIG}"
    try:  # the run config that owns this folder gives the sequence length and masking settings
        cfg = resolve.load_run(folder.parent / layout.RUN_CONFIG, adopt_init_from=False)
    except UsageError:
        cfg, source = Config(), "the default config"  # (no run's config beside the folder)
    train = prepared.corpus("train")
    lengths = np.diff(np.asarray(train.seg_offsets))
    note = None
    if cfg.data.pairs and train.num_documents < 2:  # no NSP pairs: a run on it sets data.pairs false
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, pairs=False))
        note = (
            f"one training document makes no NSP pairs: shown as with data.pairs false ({source} says true; "
            "training on this data needs data.pairs: false and train.nsp_weight: 0)"
        )
    builder = ExampleBuilder(train, cfg.data, examples)
    rows = [builder.example(cfg.train.seed, 0, i, stream=2) for i in range(examples)]  # a stream of its own
    padding = 1.0 - float(np.mean([len(e.tokens) for e in rows])) / cfg.data.max_seq_length
    e = rows[0]
    shown = [prepared.tokenizer.id_to_token(int(t)) for t in e.tokens]
    for position, label in zip(e.pred_positions, e.pred_labels):
        original = prepared.tokenizer.id_to_token(int(label))
        shown[position] = f"[{shown[position]}→{original}]" if shown[position] != original else f"[={original}]"
    splits = m["splits"]
    tokens = splits["train"]["tokens"] + splits["valid"]["tokens"]
    share, warning = random_next(folder, m, cfg.data, cfg.train.seed)
    corpus_bytes = sum(f.get("bytes", 0) for f in m["corpus"]["files"])
    return {
        "kind": "prepared data",
        "path": str(folder),
        "corpus": m["corpus"]["source"],
        "files": len(m["corpus"]["files"]),
        "corpus_bytes": corpus_bytes,
        "units": len(m["units"]),
        "splits": splits,
        "vocab_size": prepared.vocab_size,
        "tokenizer": m["tokenizer"]["source"],
        "vocabulary_sample": vocabulary_sample(m),
        "dtype": m["dtype"],
        "unknown_rate": m["unknown_tokens"] / max(tokens, 1),
        "segment_length_mean": float(lengths.mean()),
        "segment_length_p95": float(np.percentile(lengths, 95)),
        "max_seq_length": cfg.data.max_seq_length,
        "padding_share": padding,
        "pairs_note": note,
        "corpus_now": corpus_drift(m),
        "example": {
            "nsp_label": int(e.nsp_label) if cfg.data.pairs else None,
            "text": " ".join(shown),
            "legend": "[shown→original] masked or replaced, [=original] chosen but kept",
        },
        "prepare_tokens_per_s": m.get("tokens_per_s"),
        "random_next_share": share,
        "random_next_prob": cfg.data.random_next_prob if cfg.data.pairs else None,
        "random_next_warning": warning,
        "checked": "files regular (no symbolic links), tokenizer.json and vocab.txt hashes, shard sizes, offsets, "
        "the index against the units, token ids below the vocabulary",
        "cache_check": cache_check(corpus_bytes),
    }


def _table(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def _num(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_report(report: dict[str, Any]) -> str:
    if report["kind"] == "prepared data":
        return _format_data(report)
    lines = [f"{report['kind']}: {report['path']}"] + ([f"note: {report['note']}"] if report.get("note") else [])
    lines += ["", "architecture"]
    lines += _table([(k, _num(v)) for k, v in report["architecture"].items()])
    lines += ["", "parameters (tied decoder counted once)"]
    p = report["parameters"]
    lines += _table([(k, f"{v:>13,}  {100 * v / p['total']:5.1f}%") for k, v in p.items()])
    if report.get("absent_parts"):
        lines.append(
            f"  not in the weights file (trained from scratch when pretraining from it): "
            f"{', '.join(report['absent_parts'])}"
        )
    f = report["flops"]
    lines += [
        "",
        f"training FLOPs per token  {f['training_flops_per_token'] / 1e6:,.1f} M "
        f"(seq {f['seq_len']}, {100 * f['predicted_share']:.1f}% predicted)",
    ]
    if "tokenizer" in report:
        tok = report["tokenizer"]
        lines += ["", "tokenizer"] + (
            _table([(k, _num(v)) for k, v in tok.items()]) if tok else ["  none in the folder"]
        )
    if report.get("bertcli_export"):
        lines += ["", "exported by bertcli"] + _table([(k, _num(v)) for k, v in report["bertcli_export"].items()])
    if report.get("sentence_transformers"):
        lines += ["", "sentence-transformers (how its embeddings are made)"]
        lines += _table([(k, _num(v)) for k, v in report["sentence_transformers"].items()])
    t = report.get("training")
    if t:
        lines += ["", "training"]
        rows = [("output_dir", t["output_dir"])] if t["output_dir"] is not None else []
        rows += [
            ("step", f"{'unknown (damaged)' if t['step'] is None else format(t['step'], ',')} / {t['max_steps']:,}"),
            ("tokens seen", "unknown (damaged)" if t["tokens_seen"] is None else _num(t["tokens_seen"])),
        ]
        if t.get("train_time_s") is not None:
            rows.append(("train time", f"{t['train_time_s']:.1f} s"))
        logged = t["last_metrics"].get("step")
        if isinstance(logged, int) and logged != t["step"]:  # (trial 25: step 20's figures read as step 28's)
            rows.append(("last logged", f"at step {logged:,}"))
        rows += [(f"last {k}", _num(v)) for k, v in t["last_metrics"].items() if k not in ("step", "split")]
        rows += [(f"held-out {k}", _num(v)) for k, v in t["last_eval_metrics"].items() if k not in ("step", "split")]
        if t.get("best_checkpoint"):
            loss = t.get("best_mlm_loss")
            what = [f"step {t['best_step']:,}"] if isinstance(t.get("best_step"), int) else []
            what += [f"held-out MLM loss {loss:.4f}"] if isinstance(loss, (int, float)) else []
            what += ["damaged: see below"] if t.get("best_damaged") else []
            rows.append(("best checkpoint", t["best_checkpoint"] + (f" ({', '.join(what)})" if what else "")))
        if t.get("tokenizer"):
            rows.append(
                (
                    "tokenizer",
                    t["tokenizer"]
                    + (f" (prepared data: {t['prepared_data_tokenizer']})" if "prepared_data_tokenizer" in t else ""),
                )
            )
        lines += _table(rows)
        if t.get("warnings"):
            lines += ["", "warnings"] + [f"  {warning}" for warning in t["warnings"]]
        if t.get("damaged"):
            lines += ["", "damaged (left out above)"] + [f"  {problem}" for problem in t["damaged"]]
        if t["checkpoints"] is not None:
            lines += ["", f"checkpoints ({len(t['checkpoints'])})"]
            lines += [f"  step {c['step']:>9,}  {c['path']}" for c in t["checkpoints"]] or ["  none yet"]
        if t.get("set_aside"):
            total = sum(round(c["bytes"] / 2**20, 1) for c in t["set_aside"])  # the sum of the figures shown
            lines += ["", f"set aside ({len(t['set_aside'])}, {total:,.1f} MiB: yours to delete; bertcli never does)"]
            lines += [f"  {c['bytes'] / 2**20:>9,.1f} MiB  {c['path']}" for c in t["set_aside"]]
    return "\n".join(lines)


def _format_data(r: dict[str, Any]) -> str:
    sp = r["splits"]
    rows = [
        (
            "corpus",
            f"{r['corpus']} ({r['files']} file(s), {r['corpus_bytes']:,} bytes, prepared in {r['units']:,} unit(s))",
        ),
        ("documents", f"{sp['train']['documents']:,} train + {sp['valid']['documents']:,} held out"),
        ("sentences", f"{sp['train']['segments']:,} + {sp['valid']['segments']:,}"),
        ("tokens", f"{sp['train']['tokens']:,} + {sp['valid']['tokens']:,} ({r['dtype']})"),
        ("vocabulary", f"{r['vocab_size']:,} ({r['tokenizer']})"),
        *([("vocabulary from", r["vocabulary_sample"])] if r.get("vocabulary_sample") else []),
        ("unknown tokens", f"{100 * r['unknown_rate']:.3f}%"),
        (
            "sentence length",
            f"mean {r['segment_length_mean']:.1f}, 95th percentile {r['segment_length_p95']:.0f} tokens",
        ),
        ("padding", f"{100 * r['padding_share']:.1f}% of a batch at max_seq_length {r['max_seq_length']}"),
    ]
    if r.get("random_next_share") is not None:
        rows.append(
            (
                "random next",
                f"{100 * r['random_next_share']:.1f}% of NSP pairs (data.random_next_prob "
                f"{100 * r['random_next_prob']:.0f}%; first epoch at max_seq_length {r['max_seq_length']})",
            )
        )
    rows += [("checked at use", r["checked"]), ("reused while", f"the settings are unchanged and {r['cache_check']}")]
    ex = r["example"]
    warning = [r["random_next_warning"]] if r.get("random_next_warning") else []
    warning += [f"note: {r['pairs_note']}"] if r.get("pairs_note") else []
    warning += [f"note: {r['corpus_now']}"] if r.get("corpus_now") else []
    nsp = (
        "no sentence pair"
        if ex["nsp_label"] is None
        else f"NSP label {ex['nsp_label']}: {'B follows A' if ex['nsp_label'] == 0 else 'B is random'}"
    )
    return "\n".join(
        [f"prepared data: {r['path']}", ""]
        + _table(rows)
        + warning
        + ["", f"example ({nsp}; {ex['legend']})", "  " + ex["text"]]
    )
