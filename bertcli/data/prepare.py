"""`bertcli prepare`: raw text -> tokenizer -> token-id shards. `make_plan` decides to reuse, update, prepare afresh
or let the data stand in for a corpus that is gone; `update` renames units in, then the index, then the manifest."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import operator
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from bertcli import __version__, console, layout, sniff, store
from bertcli.config import Config, DataConfig, changes_line, with_vocab
from bertcli.console import info, log
from bertcli.data import prepared as prep
from bertcli.data import scan
from bertcli.data import tokenizer as wordpiece
from bertcli.data.corpus import held_out_stride, is_held_out
from bertcli.data.text import LineSample, read_sentences, read_text
from bertcli.data.units import UnitSettings, one_core, prepare_units, write_index
from bertcli.errors import RunError, UsageError
from bertcli.layout import INDEX, KEY, MANIFEST, SPLITS, UNIT_RECORD, UNITS
from bertcli.sizes import free_bytes
from bertcli.stopping import Stopper, stopping

KEEP_TOKENIZER_SHARE = 0.5  # a changed corpus keeps its tokenizer while unchanged files hold this share of it
PREPARED_SHARE = 0.2  # bytes of prepared data per byte of corpus file, at least (English text: 0.5 to 0.6)


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, as a scheduler or taskset sets it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class Plan:
    """What `prepare` found and will do, as data."""

    action: str  # "reuse", "update", "fresh" or "stand_in"
    folder: Path
    files: list[Path]
    entries: list[dict[str, Any]]
    source: str  # of the tokenizer: "given" (data.tokenizer.path), "run" (its checkpoints), "kept" or "train"
    tok: Tokenizer | None = None  # None: to be trained
    tokenizer_file: Path | None = None  # the given or the run's tokenizer file
    old: dict[str, Any] | None = None  # the manifest found
    why: str | None = None  # why the folder is not reused as it is
    warning: bool = False  # `why` is damage: said even when quiet
    units: list[scan.Unit] = field(default_factory=list)
    make: list[scan.Unit] = field(default_factory=list)  # the units to prepare (update)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # those of the units kept (update)
    index_ok: bool = True


@dataclass
class Run:
    """How a prepare runs; `vocab_check` refuses the vocabulary's size before tokenizing (pretrain's)."""

    quiet: bool
    workers: int
    stopper: Stopper
    vocab_check: Callable[[int], None]


def prepare(
    cfg: Config,
    quiet: bool = False,
    force: bool = False,
    workers: int | None = None,
    run_tokenizer: Path | None = None,
    vocab_check: Callable[[int], None] | None = None,
) -> Path:
    """Prepare cfg's corpus on `workers` processes, keeping what is whole and unchanged; return the folder."""
    workers = workers or default_workers()
    with stopping("nothing was kept (the temporary data was removed)") as stopper, one_core(workers):
        plan = make_plan(cfg, force=force, run_tokenizer=run_tokenizer)
        say(plan, cfg)
        run = Run(quiet, workers, stopper, vocab_check or (lambda size: None))
        act = {"reuse": _reused, "fresh": fresh, "update": update}.get(plan.action)  # a stand-in is used as it is
        if act is not None:
            act(plan, cfg, run)
        return plan.folder


# ------------------------------------------------------------------------------------------ the plan
def fixed_tokenizer(cfg: Config, run_tokenizer: Path | None = None) -> tuple[Path, Tokenizer] | None:
    """(file, tokenizer) of data.tokenizer.path, else of the run's checkpoints; None: one is trained or kept."""
    if cfg.data.tokenizer.path:
        file = wordpiece.find_tokenizer_file(Path(cfg.data.tokenizer.path))
        return file, wordpiece.load_tokenizer(file, cfg.data.tokenizer)
    return (run_tokenizer, wordpiece.read_tokenizer_json(run_tokenizer)) if run_tokenizer is not None else None


def tokenizer_sha256(tok: Tokenizer) -> str:
    """What the units' keys take of a tokenizer: all of it as used (vocabulary, normaliser, settings)."""
    return hashlib.sha256(tok.to_str().encode()).hexdigest()


def make_plan(cfg: Config, *, force: bool, run_tokenizer: Path | None) -> Plan:
    """Scan the corpus, read and verify what is prepared, and decide (see the module's docstring)."""
    data, folder = cfg.data, Path(cfg.data.prepared_dir)
    stand_in = stands_in(cfg)
    if stand_in and force:
        raise UsageError(f"{data.corpus}: corpus not found; --force needs it ({folder} stands in without it)")
    guard = prepared_guard(cfg, folder)
    clean_leftovers(folder)
    old, why_not = prep.read_manifest(folder)
    file, tok = fixed_tokenizer(cfg, run_tokenizer) or (None, None)
    source = "given" if data.tokenizer.path else "run" if tok is not None else "train"
    if source == "given":
        wordpiece.check_ids(tok, file)  # its vocab.txt is written into the data and every checkpoint
        if clashes := wordpiece.casing_clashes(tok, data.tokenizer):
            log(f"warning: {clashes}: ignored, as the tokenizer of data.tokenizer.path ({file}) keeps its casing")
    pad = tok.token_to_id("[PAD]") if tok is not None else wordpiece.SPECIAL.index("[PAD]")  # the model's padding row
    if problem := cfg.model.pad_problem(pad, str(file or data.corpus)):
        raise UsageError(problem)
    if stand_in and old is not None:
        return _stand_in(cfg, old=old, source=source, file=file, tok=tok)
    files = scan.files_of(cfg)
    previous = old["corpus"]["files"] if old and old.get("unit_bytes") == scan.UNIT_BYTES else []
    entries = scan.file_entries(files, previous)
    plan = Plan("fresh", folder, files, entries, source=source, tok=tok, tokenizer_file=file, old=old)
    if old is None or force:
        if why_not and not force:
            guard(folder)  # a folder bertcli did not write is refused, not said to be prepared again
            plan.why, plan.warning = f"{why_not}: preparing it again", True
        return plan
    why_new = tokenizer_changed(old, plan, data)
    if why_new is None:
        kept, total = scan.unchanged_bytes(entries, old["corpus"]["files"]), sum(e["bytes"] for e in entries)
        if source != "train" or kept >= KEEP_TOKENIZER_SHARE * total:
            return _update_plan(plan, cfg)
        new = f"{100 * (1 - kept / max(total, 1)):.0f}% new"
        plan.why = f"was made from other inputs ({input_changes(old, plan, cfg)}): {new}, training a new tokenizer"
    elif why_new.startswith("is damaged"):
        plan.why, plan.warning = f"{why_new}: preparing it again", True
    else:
        plan.why = f"was made from other inputs ({input_changes(old, plan, cfg)}): preparing it again"
    return plan


def _update_plan(plan: Plan, cfg: Config) -> Plan:
    """Which units of the kept tokenizer are whole and which to prepare (a unit the index disagrees with too)."""
    folder, old = plan.folder, plan.old
    plan.action, plan.tok = "update", wordpiece.read_tokenizer_json(folder / layout.TOKENIZER_JSON)
    plan.source = plan.source if plan.source != "train" else "kept"
    plan.units = scan.plan_units(plan.files, plan.entries, tokenizer_sha256(plan.tok), cfg.data)
    records, damaged = {u["key"]: u for u in old["units"]}, []
    vocab, dtype = plan.tok.get_vocab_size(with_added_tokens=True), _dtype(plan.tok)
    for unit in {u.key: u for u in plan.units}.values():  # a unit twice (two equal files): prepared once
        record = records.get(unit.key) or _stray_record(folder, unit.key)
        problem = prep.check_unit(folder, unit.key, record, dtype_name=dtype, vocab_size=vocab) if record else "missing"
        if problem is None:
            plan.records[unit.key] = record
        else:
            damaged += [problem] if unit.key in records else []
            plan.make.append(unit)
    index = None if damaged else prep.check_index(folder, old)
    if index and index[1] in plan.records and index[1] in records:  # the unit or the index: neither is the truth
        damaged.append(index[0])
        plan.make.append(next(u for u in plan.units if u.key == index[1]))
        del plan.records[index[1]]
    plan.index_ok = not damaged and index is None and scan.index_digest(plan.units) == old["index"]
    if not plan.make and plan.index_ok:
        plan.action = "reuse"
    elif damaged or index:
        plan.why, plan.warning = f"is damaged ({(damaged or [index[0]])[0]})", True
    return plan


def _stand_in(cfg: Config, old: dict[str, Any], source: str, file: Path | None, tok: Tokenizer | None) -> Plan:
    """The prepared folder standing in for a corpus that is gone; refused unless whole and of cfg's settings."""
    data, folder, entries = cfg.data, Path(cfg.data.prepared_dir), old["corpus"]["files"]
    files = [Path(e["path"]) for e in entries]
    plan = Plan("stand_in", folder, files, entries, source=source, tok=tok, tokenizer_file=file, old=old)
    why = tokenizer_changed(old, plan, data)
    if why is None and (changed := unit_setting_changes(old, data)):
        why = f"was prepared with other settings ({changed})"
    if why is None and old.get("unit_bytes") != scan.UNIT_BYTES:
        why = "was prepared by another version of bertcli (in units of another size)"
    if why is None:
        sha = tokenizer_sha256(wordpiece.read_tokenizer_json(folder / layout.TOKENIZER_JSON))
        if scan.index_digest(scan.plan_units(plan.files, entries, sha, data)) != old["index"]:
            why = "does not hold the corpus's units as recorded"
    if why is None and (damage := prep.verify(folder, old)):
        why = f"is damaged ({damage[0]})"
    if why is not None:
        raise UsageError(f"{data.corpus}: corpus not found and {folder} {why}; put it back (or set data.corpus)")
    return plan


def stands_in(cfg: Config) -> bool:
    """Whether data.corpus is gone (moved, unmounted) while data.prepared_dir holds data prepared from it."""
    if cfg.data.corpus in ("synthetic", "sample") or scan.corpus_path(cfg).is_symlink():
        return False
    gone = prep.corpus_gone(prep.read_manifest(Path(cfg.data.prepared_dir))[0])
    return gone is not None and os.path.realpath(gone) == os.path.realpath(cfg.data.corpus)


def tokenizer_settings(data: DataConfig, corpus_chars: int) -> dict[str, Any]:
    """The data.tokenizer settings a trained tokenizer depends on (sample_chars only below `corpus_chars`)."""
    settings = {k: v for k, v in dataclasses.asdict(data.tokenizer).items() if k != "path"}
    if not 0 < settings.get("sample_chars", 0) < corpus_chars:
        settings["sample_chars"] = None
    return settings


def _trained_as_configured(recorded: dict[str, Any], data: DataConfig) -> bool:
    sample = recorded.get("sample")
    chars = sample.get("corpus_chars") if isinstance(sample, dict) else None
    trained = recorded.get("source") == "trained" and isinstance(chars, int)
    return trained and recorded.get("settings") == tokenizer_settings(data, chars)


def tokenizer_changed(old: dict[str, Any], plan: Plan, data: DataConfig) -> str | None:
    """Why the prepared folder's tokenizer cannot be kept (None: it can)."""
    recorded = old["tokenizer"]
    if plan.source == "given" and recorded.get("given_sha256") != tokenizer_sha256(plan.tok):
        return "was prepared with another tokenizer (data.tokenizer.path)"
    if plan.source == "run" and recorded.get("identity") != wordpiece.tokenizer_identity(plan.tok):
        return "was prepared with a tokenizer other than the run's own"
    if plan.source == "train" and not _trained_as_configured(recorded, data):
        return "was prepared with other tokenizer settings (data.tokenizer)"
    damage = prep.check_tokenizer(plan.folder, old)
    return f"is damaged ({damage})" if damage else None


def made_from(cfg: Config, manifest: dict[str, Any]) -> bool:
    """Whether prepared data holds a tokenizer trained from cfg's corpus files (by path) and tokenizer settings."""
    if not _trained_as_configured(manifest["tokenizer"], cfg.data):
        return False
    with console.silent():  # what it says of the corpus, preparing says
        try:
            paths = {str(f.resolve()) for f in scan.files_of(cfg)}
        except UsageError:
            return False
    return paths == {e.get("path") for e in manifest["corpus"]["files"]}


UNIT_SETTINGS = ("split_sentences", "validation_fraction", "document")  # in every unit's key (scan.plan_units)


def _unit_settings(old: dict[str, Any], data: DataConfig) -> list[tuple[str, Any, Any]]:
    """(data.KEY, as `old` records it, as set) of each setting in every unit's key."""
    then = {"document": "blank_line"} | old  # a manifest without data.document: blank lines ended documents
    return [(f"data.{k}", then.get(k), getattr(data, k)) for k in UNIT_SETTINGS]


def unit_setting_changes(old: dict[str, Any], data: DataConfig) -> str:
    """The settings in every unit's key that differ from those `old` was prepared with."""
    return changes_line([c for c in _unit_settings(old, data) if c[1] != c[2]])


def input_changes(old: dict[str, Any], plan: Plan, cfg: Config) -> str:
    """What differs between the inputs `old` records and this config's, in words."""
    data, t, recorded = cfg.data, cfg.data.tokenizer, old["tokenizer"]
    changes = []
    if old["corpus"].get("source") != data.corpus:
        changes.append(f"corpus {old['corpus'].get('source')} -> {data.corpus}")
    elif files := scan.file_changes(old["corpus"]["files"], plan.entries, scan.corpus_path(cfg)):
        changes.append(f"corpus files {files}")
    now, then = str(plan.tokenizer_file) if plan.source == "given" else "trained", str(recorded.get("source"))
    own = then != "trained" and layout.checkpoints_dir(Path(cfg.output_dir)) in Path(then).parents  # the run's
    settings = [("data.tokenizer.source", then, now)] if then != now and not own else []
    settings += [
        ("data.tokenizer.vocab_size", recorded.get("requested_vocab_size"), t.vocab_size),
        ("data.tokenizer.min_frequency", recorded.get("min_frequency"), t.min_frequency),
        *_unit_settings(old, data),
    ]
    if now == "trained":  # a given tokenizer's casing is its own
        settings += [(f"data.tokenizer.{k}", recorded.get(k), getattr(t, k)) for k in ("lowercase", "strip_accents")]
    changes += [line] if (line := changes_line([s for s in settings if s[1] != s[2]])) else []
    return "; ".join(changes) or "the corpus or tokenizer settings differ"


_WITH_TOKENIZER = {
    "given": "the tokenizer of data.tokenizer.path",
    "run": "the run's own tokenizer",
    "kept": "the tokenizer trained on the corpus as it was (--force trains a new one)",
}


def say(plan: Plan, cfg: Config) -> None:
    """The one rendering of a plan: why the folder is not reused as it is, what is done, with which tokenizer."""
    folder, say_it, old = plan.folder, log if plan.warning else info, plan.old
    if plan.action == "reuse":
        info(f"prepared data in {folder} is up to date (corpus and settings unchanged, files intact): reusing it")
    elif plan.action == "stand_in":
        where = "is an empty folder (not mounted?)" if Path(cfg.data.corpus).is_dir() else "is not there"
        created = old.get("created", "earlier")
        log(f"warning: {cfg.data.corpus} {where}: {folder}, prepared {created}, stands in unchecked")
    elif plan.action == "fresh":
        if plan.why:
            say_it(f"prepared data in {folder} {plan.why}")
        if plan.source == "run":
            info(f"preparing {cfg.data.corpus} with {_WITH_TOKENIZER['run']}, {plan.tokenizer_file}")
    else:
        why = f" {plan.why}" if plan.why else f": {_update_why(plan, cfg)}"
        kept, megabytes = len({u.key for u in plan.units}) - len(plan.make), sum(u.bytes for u in plan.make) / 1e6
        work = f"preparing {len(plan.make)} of {len(plan.make) + kept} units ({megabytes:,.1f} MB) with {_WITH_TOKENIZER[plan.source]}"
        work = (work + (f", keeping the other {kept}" if kept else "")) if plan.make else "writing a new index"
        say_it(f"prepared data in {folder}{why}: {work}")


def _update_why(plan: Plan, cfg: Config) -> str:
    """What changed, for an update: the corpus's files and units, or the settings of every unit."""
    old_keys, new_keys = {u["key"] for u in plan.old["units"]}, {u.key for u in plan.units}
    units = ((len(new_keys - old_keys), "new or changed"), (len(old_keys - new_keys), "gone"))
    counts = ", ".join(f"{n} {word}" for n, word in units if n)
    files = scan.file_changes(plan.old["corpus"]["files"], plan.entries, scan.corpus_path(cfg))
    settings = unit_setting_changes(plan.old, cfg.data)
    if settings and {u.content for u in plan.units} == {u.get("content") for u in plan.old["units"]}:
        return f"the settings of every unit changed ({settings})"
    if not counts:
        return f"the corpus changed (files {files or 'in another order'})"
    also = f"; and the settings of every unit ({settings})" if settings else ""
    return f"the corpus changed ({f'files {files}; ' if files else ''}units of it {counts}){also}"


# ------------------------------------------------------------------------------------------ execution
def _dtype(tok: Tokenizer) -> str:
    return "uint16" if tok.get_vocab_size(with_added_tokens=True) <= 1 << 16 else "uint32"


def _progress(total: int | None, desc: str, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, disable=quiet or None, dynamic_ncols=True
    )


def fresh(plan: Plan, cfg: Config, run: Run) -> None:
    """Everything prepared into a temporary folder that then replaces the prepared folder whole."""
    data, start = cfg.data, time.perf_counter()
    check_enough_documents(scan.plan_units(plan.files, plan.entries, "", data), data)  # before the tokenizer is trained
    _check_room(plan.folder, sum(e["bytes"] for e in plan.entries))
    with store.folder(plan.folder, prepared_guard(cfg, plan.folder)) as tmp:
        plan.tok, sample = (plan.tok, None) if plan.tok is not None else train_tokenizer(plan, data, run)
        wordpiece.save_tokenizer(plan.tok, tmp)
        # read back as every later prepare reads it (its hash is in the units' keys)
        tok = wordpiece.read_tokenizer_json(tmp / layout.TOKENIZER_JSON)
        run.vocab_check(tok.get_vocab_size(with_added_tokens=True))
        plan.units = scan.plan_units(plan.files, plan.entries, tokenizer_sha256(tok), data)
        record = _tokenizer_record(cfg, plan, tok=tok, root=tmp, sample=sample)
        manifest = _tokenize(plan, cfg, tok=tok, root=tmp, run=run, tokenizer=record, start=start)
        store.write_json(tmp / MANIFEST, manifest)
        run.stopper.check()
    run.stopper.left = f"the prepared data in {plan.folder} is complete"  # in place: a stop from here on keeps it
    _report(plan.folder, manifest, cfg, f"prepared {plan.folder}")


def update(plan: Plan, cfg: Config, run: Run) -> None:
    """The prepared folder brought up to date in place, its tokenizer and whole units kept."""
    folder, start, stopper, record = plan.folder, time.perf_counter(), run.stopper, plan.old["tokenizer"]
    run.vocab_check(plan.tok.get_vocab_size(with_added_tokens=True))
    stopper.left = f"the prepared data in {folder} is as it was (units finished are kept for the next prepare)"
    _check_room(folder, sum(u.bytes for u in plan.make))
    try:
        manifest = _tokenize(plan, cfg, tok=plan.tok, root=folder, run=run, tokenizer=record, start=start)
        store.write_text(folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")  # the commit point
        stopper.left = f"the prepared data in {folder} is complete"
    finally:
        clean_leftovers(folder, mine=True)
    _remove_unused(folder, manifest)
    _report(folder, manifest, cfg, f"updated {folder}")


def _tokenize(plan: Plan, cfg: Config, tok: Tokenizer, root: Path, run: Run, tokenizer: dict, start: float) -> dict:
    """Prepare the units to make into `root`, check the sizes, write the index; return the manifest to write."""
    data, todo = cfg.data, plan.make if plan.action == "update" else plan.units
    settings = UnitSettings(**{k: getattr(data, k) for k in UNIT_SETTINGS}, dtype=_dtype(tok), owner=os.getpid())
    with _progress(sum(u.bytes for u in todo), "tokenizing", run.quiet) as bar:
        made = prepare_units(
            todo, root, tok, settings=settings, workers=run.workers, progress=bar.update, stop=run.stopper.check
        )
    records = plan.records | made
    manifest = _manifest(cfg, plan, records=records, tokenizer=tokenizer, dtype=settings.dtype, start=start, todo=todo)
    check_sizes(manifest, data)
    if plan.action == "fresh" or not plan.index_ok:
        write_index(root, plan.units, records, manifest["index"])
    run.stopper.check()
    return manifest


def train_tokenizer(plan: Plan, data: DataConfig, run: Run) -> tuple[Tokenizer, dict[str, Any]]:
    """A WordPiece vocabulary trained on the corpus (or a sample of its lines), and what it was trained on. The
    trainer holds the main thread: a stop is seen through the wakeup pipe (stopper.poll)."""
    chars = wordpiece.scan_characters(read_text(plan.files), data.tokenizer)
    lines = LineSample(data.tokenizer.sample_chars or chars.count, chars.count)
    stopper, size = run.stopper, sum(e["bytes"] for e in plan.entries)
    size = None if any(sniff.sniff(f).codec for f in plan.files) else size  # compressed: bytes read are not these
    with _progress(size, "training tokenizer", run.quiet) as bar:
        calls = itertools.count(1)

        def progress(n: int) -> None:  # most lines of a sample yield no sentence: look for a stop per 1,024 lines
            bar.update(n)
            if next(calls) % 1024 == 0:
                stopper.poll()

        read = read_sentences(plan.files, split=data.split_sentences, progress=progress, keep=lines)
        sentences = _until_stopped((s for s in read if s is not None), stopper)
        tok = wordpiece.train_wordpiece(sentences, data.tokenizer, chars)
    stopper.check()
    sample = {"sample_chars": data.tokenizer.sample_chars, "corpus_chars": chars.count, "whole": lines.whole}
    sample |= {"lines": lines.lines, "chars": lines.chars}
    size, asked = tok.get_vocab_size(with_added_tokens=True), data.tokenizer.vocab_size
    if not lines.whole:
        info(f"the vocabulary was trained on {prep.sample_line(sample)}")
    if size > 1.25 * asked:  # every character has its pieces, whatever the size asked
        why = f"a token per corpus character ({len(chars.every):,}); give a tokenizer (data.tokenizer.path)"
        log(f"warning: {size:,} tokens, {size / asked:.1f}x data.tokenizer.vocab_size={asked:,}: {why}")
    return tok, sample


def _until_stopped(items: Iterator[str], stopper: Stopper) -> Iterator[str]:
    """`items` until a stop signal comes (looked for every 1,024 items, from whatever thread reads them)."""
    for n, item in enumerate(items):
        if n % 1024 == 0:
            stopper.poll()
        if stopper.signum is not None:
            return
        yield item


def _reused(plan: Plan, cfg: Config, run: Run) -> None:
    """Nothing to prepare: the files as they are now recorded where their names or times changed."""
    old, stamps = plan.old, operator.itemgetter("path", "mtime_ns")
    moved = [*map(stamps, plan.entries)] != [*map(stamps, old["corpus"]["files"])]
    if moved or old["corpus"]["source"] != cfg.data.corpus:
        manifest = {**old, "corpus": {"source": cfg.data.corpus, "files": plan.entries}}
        store.write_text(plan.folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    _remove_unused(plan.folder, old)  # units a stopped prepare finished for another corpus
    if warning := prep.random_next(plan.folder, old, cfg.data, cfg.train.seed)[1]:
        log(warning)


def _stray_record(folder: Path, key: str) -> dict[str, Any] | None:
    """The record of a unit a stopped `prepare` finished but never listed in a manifest: reused when whole."""
    try:
        record = store.read_own_json(folder / UNITS / key / UNIT_RECORD)
    except (OSError, UsageError):
        return None
    return record if prep.unit_ok(record, in_manifest=False) and record["key"] == key else None


def _tokenizer_record(cfg: Config, plan: Plan, tok: Tokenizer, root: Path, sample: dict | None) -> dict[str, Any]:
    """The manifest's record of a new folder's tokenizer."""
    t, casing = cfg.data.tokenizer, wordpiece.describe(tok)
    record = {
        "source": str(plan.tokenizer_file) if plan.tokenizer_file else "trained",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "identity": wordpiece.tokenizer_identity(tok),
        "sha256": {name: store.sha256_of(root / name) for name in layout.TOKENIZER_FILES},
        "requested_vocab_size": t.vocab_size,
        **{k: casing.get(k, getattr(t, k)) for k in ("lowercase", "strip_accents")},
        "min_frequency": t.min_frequency,
        "sample": sample,
        "given_sha256": tokenizer_sha256(plan.tok) if plan.source == "given" else None,  # as loaded, not as saved
    }
    if sample is not None:  # trained: on what, with which settings
        record["trained_on"] = {"files": len(plan.entries), "bytes": sum(e["bytes"] for e in plan.entries)}
        record["settings"] = tokenizer_settings(cfg.data, sample["corpus_chars"])
    return record


def _manifest(cfg: Config, plan: Plan, records: dict, tokenizer: dict, dtype: str, start: float, todo: list) -> dict:
    """The manifest of prepared data (deterministic but for the times); `todo`: the units tokenized this time."""
    data, units, seconds = cfg.data, plan.units, time.perf_counter() - start
    splits = {s: {c: sum(records[u.key]["splits"][s][c] for u in units) for c in prep.COUNTS} for s in SPLITS}
    prepared_tokens = sum(records[u.key]["splits"][s]["tokens"] for u in todo for s in SPLITS)
    return {
        "format_version": prep.FORMAT_VERSION,
        "bertcli_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "corpus": {"source": data.corpus, "files": plan.entries},
        "tokenizer": tokenizer,
        **{k: getattr(data, k) for k in (*UNIT_SETTINGS, "include", "exclude")},
        "unit_bytes": scan.UNIT_BYTES,
        "dtype": dtype,
        "splits": splits,
        "unknown_tokens": sum(records[u.key]["unknown_tokens"] for u in units),
        "index": scan.index_digest(units),
        "units": [
            {"key": u.key, "content": u.content, "bytes": u.bytes, "pieces": [list(p) for p in u.pieces]}
            | {k: records[u.key][k] for k in ("splits", "unknown_tokens")}
            for u in units
        ],
        "seconds": seconds,
        "prepared_tokens": prepared_tokens,
        "tokens_per_s": prepared_tokens / max(seconds, 1e-9),
    }


def _report(folder: Path, manifest: dict[str, Any], cfg: Config, done: str) -> None:
    t, v = manifest["splits"]["train"], manifest["splits"]["valid"]
    total, prepared = t["tokens"] + v["tokens"], manifest["prepared_tokens"]
    share, warning = prep.random_next(folder, manifest, cfg.data, cfg.train.seed)
    if warning:
        log(warning)
    pairs = "" if share is None else f"; random next sentences {100 * share:.1f}% of pairs"
    pairs += f" (data.random_next_prob {100 * cfg.data.random_next_prob:.0f}%)" if pairs else ""
    rate = f" for the {prepared:,} tokens of the changed units" if prepared < total else ""
    rate = f"{rate}, {manifest['tokens_per_s']:,.0f} tokens/s" if prepared else ", no unit to tokenize"
    info(
        f"{done}: {t['documents'] + v['documents']:,} documents ({v['documents']:,} held out), {t['segments'] + v['segments']:,} "
        f"sentences, {total:,} tokens, vocabulary {manifest['tokenizer']['vocab_size']:,}, unknown "
        f"{100 * manifest['unknown_tokens'] / max(total, 1):.2f}%{pairs}; {manifest['seconds']:.1f} s{rate}"
    )


def _remove_unused(folder: Path, manifest: dict[str, Any]) -> None:
    """Remove the units and indexes that `manifest` does not name (bertcli's own folders only)."""
    keep = {u["key"] for u in manifest["units"]} | {manifest["index"]}
    for sub in (UNITS, INDEX):
        for child in (folder / sub).iterdir() if (folder / sub).is_dir() else ():
            own = store.holds_only(child, layout.PREPARED, f"{sub}/{child.name}/")
            if re.fullmatch(KEY, child.name) and child.name not in keep and own:
                store.remove_folder(child)


def clean_leftovers(folder: Path, mine: bool = False) -> None:
    """Remove the temporary folders and manifest a killed prepare left (`mine`: this process's)."""
    store.clean_folder_leftovers(folder, layout.PREPARED, mine=mine)
    if not folder.is_dir() or folder.is_symlink():
        return
    for sub in (UNITS, INDEX):
        own = lambda c, name, sub=sub: store.holds_only(c, layout.PREPARED, f"{sub}/{name}/")  # noqa: E731
        store.clean_leftovers(folder / sub, own, mine=mine)
    store.clean_leftovers(folder, lambda c, name: name == MANIFEST and store.own_file(c), mine=mine)


def _check_room(folder: Path, corpus_bytes: int) -> None:
    """Refuse (exit 1) to prepare `corpus_bytes` of corpus where the disk has no room for PREPARED_SHARE of it."""
    free, need = free_bytes(folder), PREPARED_SHARE * corpus_bytes
    if free is not None and free < need:
        mib = f"{free / 2**20:,.1f} MiB free; {corpus_bytes / 2**20:,.1f} MiB of corpus takes at least {need / 2**20:,.1f} MiB"
        raise RunError(f"{folder}: its disk has {mib}: free space, or set data.prepared_dir to another disk")


# ------------------------------------------------------------------------------------------ checks
def prepared_guard(cfg: Config, folder: Path) -> Callable[[Path], None]:
    """Refuse a prepared_dir that is, contains or lies inside an input; return the check that only prepared
    data bertcli wrote (or an empty folder) is replaced, which store.folder runs before writing and the swap."""
    fix = "set data.prepared_dir to a new or empty folder (the default is data, next to the config)"
    inputs = [
        store.Input("the corpus", scan.corpus_path(cfg)),
        store.Input("the run folder (output_dir)", Path(cfg.output_dir), inside_ok=True),
    ]
    more = {
        "the tokenizer (data.tokenizer.path)": cfg.data.tokenizer.path,
        "the model (model.init_from)": cfg.model.init_from,
    }
    inputs += [store.Input(label, Path(value)) for label, value in more.items() if value]
    store.check_apart(folder, inputs, fix)
    return lambda target: store.check_replaceable(target, layout.PREPARED, fix)


def prepared_lock(cfg: Config) -> AbstractContextManager[Any]:
    """The lock of cfg's prepared folder where a prepare may replace it; a folder no prepare replaces is refused."""
    folder = Path(cfg.data.prepared_dir).expanduser().resolve()
    prepared_guard(cfg, folder)
    return nullcontext() if store.not_owned(folder, layout.PREPARED) is not None else store.prepared_lock(folder)


def _held_out_count(units: list[dict[str, Any]], stride: int) -> int:
    """Documents held out with every `stride`-th document of each unit."""
    documents = [sum(u["splits"][s]["documents"] for s in SPLITS) for u in units]
    return sum((n + scan.unit_phase(u["content"], stride)) // stride for n, u in zip(documents, units))


def check_sizes(manifest: dict[str, Any], data: DataConfig) -> None:
    """Refuse a split of too few documents: 2 with sentence pairs, else 1. Every fix named is one that works."""
    train, valid = manifest["splits"]["train"]["documents"], manifest["splits"]["valid"]["documents"]
    total, need, where = train + valid, 2 if data.pairs else 1, f"data.corpus={data.corpus!r}"
    if total == 0:
        raise UsageError(f"{where}: the corpus is empty (no text after reading and tokenizing)")
    why = " (random next sentences come from another document)" if data.pairs else ""
    if data.validation_fraction > 0 and valid < need:
        strides = range(held_out_stride(data.validation_fraction) - 1, 1, -1)
        stride = next((k for k in strides if need <= _held_out_count(manifest["units"], k) <= total - need), None)
        fixes = [f"raise data.validation_fraction to {1 / stride:.4g}"] if stride else []
        if total >= need:
            fixes.append("set data.validation_fraction: 0 (no held-out evaluation)")
        elif data.pairs:
            fixes.append("set data.validation_fraction: 0, data.pairs: false and train.nsp_weight: 0")
        fixes.append("add documents (blank lines separate them)")
        raise UsageError(
            f"{where}: {total} document(s) is too small for the held-out split: validation_fraction={data.validation_fraction} "
            f"holds out {valid}, and held-out examples need at least {need}{why}; {', or '.join(fixes)}"
        )
    if train < need:
        fix = "separate documents with blank lines, or set data.pairs: false and train.nsp_weight: 0 (no NSP)"
        raise UsageError(f"{where}: {train} training document(s); at least {need} are needed{why}: {fix}")


def check_enough_documents(units: list[scan.Unit], data: DataConfig) -> None:
    """check_sizes before any tokenizer work, reading only until there are enough documents (upper bounds)."""
    need, fraction, stride = 2 if data.pairs else 1, data.validation_fraction, held_out_stride(data.validation_fraction)
    counted, total = [], {"train": 0, "valid": 0}
    for unit in units:
        counts = {"train": 0, "valid": 0}
        for item in read_sentences(list(unit.parts), split=False, document=data.document):
            if item is None:
                split = "valid" if is_held_out(sum(counts.values()), fraction, unit.phase(stride)) else "train"
                counts[split] += 1
                total[split] += 1
                if total["train"] >= need and (fraction == 0 or total["valid"] >= need):
                    return
        counted.append({"content": unit.content, "splits": {s: {"documents": n} for s, n in counts.items()}})
    check_sizes({"splits": {s: {"documents": total[s]} for s in SPLITS}, "units": counted}, data)


def check_vocab_size(cfg: Config, run_tokenizer: Path | None = None) -> None:
    """Refuse a model.vocab_size the run's tokenizer (fixed, or to be trained) will not have."""
    size, data = cfg.model.vocab_size, cfg.data
    if size is None or data.corpus == "synthetic":
        return
    if (fixed := fixed_tokenizer(cfg, run_tokenizer)) is not None:
        with_vocab(cfg, fixed[1].get_vocab_size(with_added_tokens=True), str(fixed[0]))
    elif size > data.tokenizer.vocab_size and prep.read_manifest(Path(data.prepared_dir)) == (None, None):
        raise UsageError(
            f"model.vocab_size={size:,} but the tokenizer to be trained has at most data.tokenizer.vocab_size={data.tokenizer.vocab_size:,} tokens; set model.vocab_size: null to take the size from the tokenizer"
        )


def check_before_training(cfg: Config, run_tokenizer: Path | None = None) -> None:
    """Refuse now what preparing would refuse later, where the files show it at once."""
    check_vocab_size(cfg, run_tokenizer)
    if stands_in(cfg):  # the corpus is not here: its prepared data is checked where it is used
        return
    folder = Path(cfg.data.prepared_dir)
    if folder.is_dir() and prep.read_manifest(folder)[0] is None:
        prepared_guard(cfg, folder)(folder)
    with console.silent():  # what it says of the corpus, preparing says
        files = scan.files_of(cfg)
        sizes = [f.stat().st_size for f in files]
        if sum(sizes) < scan.UNIT_BYTES:  # one unit's worth: no file is cut into parts
            entries = [{"bytes": size, "sha256": store.sha256_of(f)} for f, size in zip(files, sizes)]
            check_enough_documents(scan.plan_units(files, entries, "", cfg.data), cfg.data)
