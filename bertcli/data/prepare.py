"""`bertcli prepare`: raw text -> tokenizer -> token-id shards that training memory-maps, in four steps:

    scan      the corpus's files and their hashes (scan.file_entries), its units (scan.plan_units)
    read      what is prepared (prepared.read_manifest), its tokenizer and units checked
    plan      `make_plan`: reuse it, update it (units to keep, units to make), prepare it afresh, or let
              it stand in for a corpus that is not there; with the tokenizer kept, given, the run's
              own or trained, and why: a `Plan`, said by `say` (one function renders every change)
    execute   `fresh` (everything into a temporary folder renamed over the old one) or `update` (new
              units renamed in one by one, then a new index, then the manifest: the commit point)

The tokenizer is trained once. A changed corpus keeps it while unchanged files hold at least half of
the corpus's bytes (a new vocabulary would change every unit's ids); a forced prepare trains a new
one; a run keeps the tokenizer of its checkpoints whatever happens (resume.run_tokenizer). The corpus
is read three times: its characters (which fix the vocabulary's ids), training (on a sample of its
lines past data.tokenizer.sample_chars: memory stays bounded), tokenizing (units.py). Held-out
documents are every k-th of each unit (k = 1/validation_fraction) from a phase its bytes give. A stop
signal leaves the previous manifest valid with all it names; the next prepare reuses finished units.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
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
from bertcli.config import Config, DataConfig, changes_line
from bertcli.console import info, log
from bertcli.data import prepared as prep
from bertcli.data import scan
from bertcli.data.corpus import held_out_stride, is_held_out
from bertcli.data.scan import (
    Unit,
    corpus_path,
    file_changes,
    file_entries,
    index_digest,
    plan_units,
    unchanged_bytes,
    unit_phase,
)
from bertcli.data.text import LineSample, corpus_files, read_sentences, read_text
from bertcli.data.tokenizer import (
    SPECIAL,
    casing_clashes,
    check_ids,
    describe,
    find_tokenizer_file,
    load_tokenizer,
    read_tokenizer_json,
    save_tokenizer,
    scan_characters,
    tokenizer_identity,
    train_wordpiece,
)
from bertcli.data.units import UnitSettings, one_core, prepare_units, write_index
from bertcli.errors import RunError, UsageError
from bertcli.layout import INDEX, KEY, MANIFEST, SPLITS, UNIT_RECORD, UNITS
from bertcli.sizes import free_bytes
from bertcli.stopping import Stopper, stopping

KEEP_TOKENIZER_SHARE = 0.5  # a changed corpus keeps its tokenizer while unchanged files hold this share of its bytes
PREPARED_SHARE = 0.2  # bytes of prepared data per byte of corpus file, at least (English text: 0.5 to 0.6)
UNKNOWN_SHARE = 0.01  # [UNK] in the units an update prepares beyond this share, and 5x the rest's, is warned of
SMALL_VOCAB_SHARE, SAMPLE_MISS = (
    0.5,
    2.0,
)  # a vocabulary under this share of the size asked, from a sample this far off its budget


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
    source: (
        str  # where the tokenizer comes from: "given" (data.tokenizer.path), "run" (its checkpoints), "kept" or "train"
    )
    tok: Tokenizer | None = None  # the tokenizer to use (None: to be trained)
    tokenizer_file: Path | None = None  # the given or the run's tokenizer file
    old: dict[str, Any] | None = None  # the manifest found
    why: str | None = None  # why the folder is not reused as it is
    warning: bool = False  # `why` is damage: said even when quiet
    units: list[Unit] = field(default_factory=list)
    make: list[Unit] = field(default_factory=list)  # the units to prepare (update)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # those of the units kept (update)
    index_ok: bool = True


def prepare(
    cfg: Config,
    quiet: bool = False,
    force: bool = False,
    workers: int | None = None,
    run_tokenizer: Path | None = None,
    vocab_check: Callable[[int], None] | None = None,
) -> Path:
    """Prepare the corpus of resolved config `cfg` on `workers` processes (default: the cores available),
    keeping what is prepared, whole and unchanged; return the prepared folder. `run_tokenizer`: the
    tokenizer.json the run's checkpoints fix (resume.run_tokenizer). `vocab_check`: called with the
    vocabulary's size before the corpus is tokenized (pretrain refuses a model its disk has no room for)."""
    workers = workers or default_workers()
    with stopping("nothing was kept (the temporary data was removed)") as stopper, one_core(workers):
        plan = make_plan(cfg, force=force, run_tokenizer=run_tokenizer)
        say(plan, cfg)
        if plan.action == "reuse":
            _reused(plan, cfg)
        elif plan.action == "fresh":
            fresh(plan, cfg, quiet=quiet, workers=workers, stopper=stopper, vocab_check=vocab_check)
        elif plan.action == "update":
            update(plan, cfg, quiet=quiet, workers=workers, stopper=stopper, vocab_check=vocab_check)
        return plan.folder


# ------------------------------------------------------------------------------------------ the plan
def fixed_tokenizer(cfg: Config, run_tokenizer: Path | None = None) -> tuple[Path, Tokenizer] | None:
    """The tokenizer file the run's data is tokenized with, and the tokenizer as used, where something
    fixes it: data.tokenizer.path (with the config's casing), else the run's checkpoints'; None: prepare
    trains one (or keeps the prepared folder's)."""
    if cfg.data.tokenizer.path:
        file = find_tokenizer_file(Path(cfg.data.tokenizer.path))
        return file, load_tokenizer(file, cfg.data.tokenizer)
    return (run_tokenizer, read_tokenizer_json(run_tokenizer)) if run_tokenizer is not None else None


def tokenizer_sha256(tok: Tokenizer) -> str:
    """What the units' keys take of a tokenizer: all of it as used (vocabulary, normaliser, settings)."""
    return hashlib.sha256(tok.to_str().encode()).hexdigest()


def make_plan(cfg: Config, *, force: bool, run_tokenizer: Path | None) -> Plan:
    """Scan the corpus, read and verify what is prepared, and decide (see the module's docstring)."""
    data, folder = cfg.data, Path(cfg.data.prepared_dir)
    stand_in = stands_in(cfg)
    if stand_in and force:
        raise UsageError(
            f"{data.corpus}: corpus not found, and --force prepares from the corpus; without --force, the data prepared from it in {folder} stands in for it"
        )
    guard = prepared_guard(cfg, folder)
    clean_leftovers(folder)
    old, why_not = prep.read_manifest(folder)
    fixed = fixed_tokenizer(cfg, run_tokenizer)
    source = "given" if data.tokenizer.path else "run" if fixed else "train"
    if source == "given":
        check_ids(fixed[1], fixed[0])  # its vocab.txt is written into the data and every checkpoint
        if clashes := casing_clashes(fixed[1], data.tokenizer):
            log(
                f"warning: {clashes}: ignored, as the tokenizer of data.tokenizer.path ({fixed[0]}) keeps its own casing; set them as it has them"
            )
    pad = fixed[1].token_to_id("[PAD]") if fixed else SPECIAL.index("[PAD]")  # the model's padding row: [PAD]
    if problem := cfg.model.pad_problem(pad, str(fixed[0] if fixed else data.corpus)):
        raise UsageError(problem)
    if stand_in and old is not None:
        return _stand_in(cfg, old, source, fixed)
    files = corpus_files(corpus_path(cfg))
    entries = file_entries(files, old["corpus"]["files"] if old and old.get("unit_bytes") == scan.UNIT_BYTES else [])
    plan = Plan(
        "fresh",
        folder,
        files,
        entries=entries,
        source=source,
        tok=fixed and fixed[1],
        tokenizer_file=fixed and fixed[0],
        old=old,
    )
    if old is None or force:
        if why_not and not force:
            guard(folder)  # a folder bertcli did not write is refused, not said to be prepared again
            plan.why, plan.warning = f"{why_not}: preparing it again", True
        return plan
    why_new = tokenizer_changed(old, plan, data)
    if why_new is None:
        kept, total = unchanged_bytes(entries, old["corpus"]["files"]), sum(e["bytes"] for e in entries)
        if source != "train" or kept >= KEEP_TOKENIZER_SHARE * total:
            return _update_plan(plan, cfg)
        changes = "; ".join(input_changes(old, plan, cfg))
        plan.why = f"was made from other inputs ({changes}): {100 * (1 - kept / max(total, 1)):.0f}% of the corpus is new, so a new tokenizer is trained on it"
    elif why_new.startswith("is damaged"):
        plan.why, plan.warning = f"{why_new}: preparing it again", True
    else:
        plan.why = f"was made from other inputs than this config's ({'; '.join(input_changes(old, plan, cfg))}): preparing it again"
    return plan


def _update_plan(plan: Plan, cfg: Config) -> Plan:
    """The units of the kept tokenizer, which of them are whole (kept) and which to prepare; whether the
    index is whole. A unit the index disagrees with is prepared again, then the index."""
    folder, old = plan.folder, plan.old
    plan.action, plan.tok = "update", read_tokenizer_json(folder / layout.TOKENIZER_JSON)
    plan.source = plan.source if plan.source != "train" else "kept"
    plan.units = plan_units(plan.files, plan.entries, tokenizer_sha256(plan.tok), cfg.data)
    records, damaged = {u["key"]: u for u in old["units"]}, []
    vocab_size, dtype = plan.tok.get_vocab_size(with_added_tokens=True), _dtype(plan.tok)
    for unit in {u.key: u for u in plan.units}.values():  # a unit twice (two equal files): prepared once
        record = records.get(unit.key) or _stray_record(folder, unit.key)
        problem = (
            "missing"
            if record is None
            else prep.check_unit(folder, unit.key, record, dtype_name=dtype, vocab_size=vocab_size)
        )
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
    plan.index_ok = not damaged and index is None and index_digest(plan.units) == old["index"]
    if not plan.make and plan.index_ok:
        plan.action = "reuse"
    elif damaged or index:
        plan.why, plan.warning = f"is damaged ({(damaged or [index[0]])[0]})", True
    return plan


def _stand_in(cfg: Config, old: dict[str, Any], source: str, fixed: tuple[Path, Tokenizer] | None) -> Plan:
    """The prepared folder as it is, for a corpus that is not there: where it was prepared with this
    config's settings and tokenizer and is whole; else one line saying why it cannot stand in."""
    data, folder = cfg.data, Path(cfg.data.prepared_dir)
    entries = old["corpus"]["files"]
    files = [Path(e["path"]) for e in entries]
    plan = Plan(
        "stand_in",
        folder,
        files,
        entries=entries,
        source=source,
        tok=fixed and fixed[1],
        tokenizer_file=fixed and fixed[0],
        old=old,
    )
    why = tokenizer_changed(old, plan, data)
    if why is None and (changed := unit_setting_changes(old, data)):
        why = f"was prepared with other settings ({changed})"
    if why is None and old.get("unit_bytes") != scan.UNIT_BYTES:
        why = "was prepared by another version of bertcli (in units of another size)"
    if why is None:
        tok = read_tokenizer_json(folder / layout.TOKENIZER_JSON)
        if index_digest(plan_units(plan.files, entries, tokenizer_sha256(tok), data)) != old["index"]:
            why = "does not hold the corpus's units as recorded"
    if why is None and (damage := prep.verify(folder, old)):
        why = f"is damaged ({damage[0]})"
    if why is not None:
        raise UsageError(
            f"{data.corpus}: corpus not found, and the data prepared from it in {folder} {why}, so it cannot stand in for it: put the corpus back (or set data.corpus to where it is now)"
        )
    return plan


def stands_in(cfg: Config) -> bool:
    """Whether data.corpus is not there (moved, unmounted, not copied to the machine that trains) while
    data.prepared_dir holds data prepared from it, which may then stand in for it."""
    if cfg.data.corpus in ("synthetic", "sample") or corpus_path(cfg).is_symlink():
        return False
    gone = prep.corpus_gone(prep.read_manifest(Path(cfg.data.prepared_dir))[0])
    return gone is not None and os.path.realpath(gone) == os.path.realpath(cfg.data.corpus)


def tokenizer_settings(data: DataConfig, corpus_chars: int) -> dict[str, Any]:
    """The data.tokenizer settings a tokenizer trained on `corpus_chars` characters depends on: all but
    its path, the sample's budget only where below the corpus (one that covers it trains on all of it)."""
    settings = {k: v for k, v in dataclasses.asdict(data.tokenizer).items() if k != "path"}
    if not 0 < settings.get("sample_chars", 0) < corpus_chars:
        settings["sample_chars"] = None
    return settings


def _trained_as_configured(recorded: dict[str, Any], data: DataConfig) -> bool:
    sample = recorded.get("sample")
    chars = sample.get("corpus_chars") if isinstance(sample, dict) else None
    return (
        recorded.get("source") == "trained"
        and isinstance(chars, int)
        and recorded.get("settings") == tokenizer_settings(data, chars)
    )


def tokenizer_changed(old: dict[str, Any], plan: Plan, data: DataConfig) -> str | None:
    """Why the prepared folder's tokenizer cannot be kept (None: it can)."""
    recorded = old["tokenizer"]
    if plan.source == "given" and recorded.get("given_sha256") != tokenizer_sha256(plan.tok):
        return "was prepared with another tokenizer (data.tokenizer.path)"
    if plan.source == "run" and recorded.get("identity") != tokenizer_identity(plan.tok):
        return "was prepared with a tokenizer other than the run's own"
    if plan.source == "train" and not _trained_as_configured(recorded, data):
        return "was prepared with other tokenizer settings (data.tokenizer)"
    damage = prep.check_tokenizer(plan.folder, old)
    return f"is damaged ({damage})" if damage else None


def made_from(cfg: Config, manifest: dict[str, Any]) -> bool:
    """Whether prepared data holds a tokenizer trained from cfg's corpus files (by path) and tokenizer
    settings, at a glance: nothing is hashed (inspect's question; prepare checks contents)."""
    if not _trained_as_configured(manifest["tokenizer"], cfg.data):
        return False
    with console.silent():  # (what it says of the corpus, preparing says)
        try:
            paths = {str(f.resolve()) for f in corpus_files(corpus_path(cfg))}
        except UsageError:
            return False
    return paths == {e.get("path") for e in manifest["corpus"]["files"]}


def unit_setting_changes(old: dict[str, Any], data: DataConfig) -> str:
    """The settings in every unit's key that differ from those `old` was prepared with."""
    keys = ("split_sentences", "validation_fraction")
    return changes_line([(f"data.{k}", old.get(k), getattr(data, k)) for k in keys if old.get(k) != getattr(data, k)])


def input_changes(old: dict[str, Any], plan: Plan, cfg: Config) -> list[str]:
    """What differs between the inputs `old` records and this config's, in words."""
    data, recorded = cfg.data, old["tokenizer"]
    changes = []
    if old["corpus"].get("source") != data.corpus:
        changes.append(
            f"corpus {old['corpus'].get('source')} -> {data.corpus}: another config shares data.prepared_dir, or data.corpus changed"
        )
    elif files := file_changes(old["corpus"]["files"], plan.entries, corpus_path(cfg)):
        changes.append(f"corpus files {files}")
    now = str(plan.tokenizer_file) if plan.source == "given" else "trained"
    then = str(recorded.get("source"))
    own = (
        then != "trained" and layout.checkpoints_dir(Path(cfg.output_dir)) in Path(then).parents
    )  # the run's checkpoint's
    settings = [("data.tokenizer.source", then, now)] if then != now and not own else []
    t = data.tokenizer
    settings += [
        ("data.tokenizer.vocab_size", recorded.get("requested_vocab_size"), t.vocab_size),
        ("data.tokenizer.min_frequency", recorded.get("min_frequency"), t.min_frequency),
        ("data.split_sentences", old.get("split_sentences"), data.split_sentences),
        ("data.validation_fraction", old.get("validation_fraction"), data.validation_fraction),
    ]
    if now == "trained":  # a given tokenizer's casing is its own
        settings += [
            ("data.tokenizer.lowercase", recorded.get("lowercase"), t.lowercase),
            ("data.tokenizer.strip_accents", recorded.get("strip_accents"), t.strip_accents),
        ]
    changes += [line] if (line := changes_line([s for s in settings if s[1] != s[2]])) else []
    return changes or ["the corpus or tokenizer settings differ"]


def say(plan: Plan, cfg: Config) -> None:
    """The one rendering of a plan: why the folder is not reused as it is, what is done, with which tokenizer."""
    with_tok = {
        "given": "the tokenizer of data.tokenizer.path",
        "run": "the run's own tokenizer (its checkpoints were trained on its token ids)",
        "kept": "the tokenizer trained on the corpus as it was (a forced prepare trains a new one)",
    }.get(plan.source)
    folder, say_it = plan.folder, log if plan.warning else info
    if plan.action == "fresh":
        if plan.why:
            say_it(f"prepared data in {folder} {plan.why}")
        if plan.source == "run":
            info(f"preparing {cfg.data.corpus} with {with_tok}, {plan.tokenizer_file}")
        shared = layout.identify(folder.parent)
        if (
            plan.old
            and plan.why
            and shared.kind is layout.Kind.RUN
            and shared.checkpoints
            and folder.parent.resolve() != Path(cfg.output_dir).resolve()
        ):
            log(
                f"warning: {folder} is the prepared data of the run in {folder.parent}: each prepare of one redoes the whole corpus while they share it; give this run a data.prepared_dir of its own"
            )
    elif plan.action == "update":
        old_keys, new_keys = {u["key"] for u in plan.old["units"]}, {u.key for u in plan.units}
        counts = [
            f"{n} {w}"
            for n, w in ((len(new_keys - old_keys), "new or changed"), (len(old_keys - new_keys), "gone"))
            if n
        ]
        files, settings = (
            file_changes(plan.old["corpus"]["files"], plan.entries, corpus_path(cfg)),
            unit_setting_changes(plan.old, cfg.data),
        )
        same_text = {u.content for u in plan.units} == {u.get("content") for u in plan.old["units"]}
        why = (
            f" {plan.why}"
            if plan.why
            else f": the settings of every unit changed ({settings})"
            if settings and same_text
            else f": the corpus changed ({'files ' + files + '; ' if files else ''}units of it {', '.join(counts)})"
            + (f"; and the settings of every unit ({settings})" if settings else "")
            if counts
            else f": the corpus changed (files {files or 'in another order'})"
        )
        kept = len(new_keys) - len(plan.make)
        work = (
            f"preparing {len(plan.make)} of {len(new_keys)} units ({sum(u.bytes for u in plan.make) / 1e6:,.1f} MB) with {with_tok}"
            + (f", keeping the other {kept}" if kept else "")
            if plan.make
            else "writing a new index"
        )
        say_it(f"prepared data in {folder}{why}: {work}")
    elif plan.action == "reuse":
        info(f"prepared data in {folder} is up to date (corpus and settings unchanged, files intact): reusing it")
    else:
        where = (
            "is an empty folder (not mounted?)"
            if Path(cfg.data.corpus).is_dir()
            else "is not there (moved, or not on this machine)"
        )
        documents = sum(plan.old["splits"][s]["documents"] for s in SPLITS)
        log(
            f"warning: {cfg.data.corpus} {where}: the data prepared from it in {folder} stands in as it is ({documents:,} documents, prepared {plan.old.get('created', 'earlier')}); whether the corpus changed since cannot be checked"
        )


# ------------------------------------------------------------------------------------------ execution
def _dtype(tok: Tokenizer) -> str:
    return "uint16" if tok.get_vocab_size(with_added_tokens=True) <= 1 << 16 else "uint32"


def _progress(total: int | None, desc: str, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, disable=quiet or None, dynamic_ncols=True
    )


def fresh(
    plan: Plan, cfg: Config, *, quiet: bool, workers: int, stopper: Stopper, vocab_check: Callable[[int], None] | None
) -> None:
    """Everything prepared into a temporary folder that then replaces the prepared folder whole."""
    data, start = cfg.data, time.perf_counter()
    check_enough_documents(plan_units(plan.files, plan.entries, "", data), data)  # before the tokenizer is trained
    _check_room(plan.folder, sum(e["bytes"] for e in plan.entries))
    with store.folder(plan.folder, prepared_guard(cfg, plan.folder)) as tmp:
        sample = None
        if plan.tok is None:
            plan.tok, sample = train_tokenizer(plan, data, quiet=quiet, stopper=stopper)
        save_tokenizer(plan.tok, tmp)
        tok = read_tokenizer_json(tmp / layout.TOKENIZER_JSON)  # as every later prepare reads it (the units' keys)
        if vocab_check is not None:
            vocab_check(tok.get_vocab_size(with_added_tokens=True))
        plan.units = plan_units(plan.files, plan.entries, tokenizer_sha256(tok), data)
        settings = UnitSettings(data.split_sentences, data.validation_fraction, _dtype(tok), os.getpid())
        with _progress(sum(u.bytes for u in plan.units), "tokenizing", quiet) as bar:
            records = prepare_units(
                plan.units, tmp, tok, settings=settings, workers=workers, progress=bar.update, stop=stopper.check
            )
        manifest = _manifest(
            cfg,
            plan,
            tok,
            tmp,
            records=records,
            settings=settings,
            sample=sample,
            seconds=time.perf_counter() - start,
            prepared=plan.units,
        )
        check_sizes(manifest, data)
        write_index(tmp, plan.units, records, manifest["index"])
        store.write_json(tmp / MANIFEST, manifest)
        stopper.check()
    stopper.left = f"the prepared data in {plan.folder} is complete"  # in place: a stop from here on keeps it
    _report(plan.folder, manifest, cfg, f"prepared {plan.folder}")


def train_tokenizer(plan: Plan, data: DataConfig, *, quiet: bool, stopper: Stopper) -> tuple[Tokenizer, dict[str, Any]]:
    """A WordPiece vocabulary trained on the corpus, or on a sample of its lines past sample_chars; and
    what it was trained on. The trainer holds the main thread while its threads read the corpus: a
    stop signal is seen through the wakeup pipe (stopper.poll), the reading ends, and what was
    trained on part of the corpus is never used."""
    chars = scan_characters(read_text(plan.files), data.tokenizer)
    lines = LineSample(data.tokenizer.sample_chars or chars.count, chars.count)
    compressed = any(sniff.sniff(f).codec for f in plan.files)
    with _progress(None if compressed else sum(e["bytes"] for e in plan.entries), "training tokenizer", quiet) as bar:
        calls = 0

        def progress(n: int) -> None:  # most lines of a sample yield no sentence: look for a stop per 1,024 lines
            nonlocal calls
            bar.update(n)
            calls += 1
            if calls % 1024 == 0:
                stopper.poll()

        read = read_sentences(plan.files, split=data.split_sentences, progress=progress, keep=lines)
        tok = train_wordpiece(_until_stopped((s for s in read if s is not None), stopper), data.tokenizer, chars)
    stopper.check()
    sample = {
        "sample_chars": data.tokenizer.sample_chars,
        "corpus_chars": chars.count,
        "whole": lines.whole,
        "lines": lines.lines,
        "chars": lines.chars,
    }
    size, asked = tok.get_vocab_size(with_added_tokens=True), data.tokenizer.vocab_size
    if not lines.whole:
        info(f"the vocabulary was trained on {prep.sample_line(sample)}")
    if size > 1.25 * asked:  # every character has its pieces, whatever the size asked
        log(
            f"warning: the vocabulary has {size:,} tokens, {size / asked:.1f}x data.tokenizer.vocab_size={asked:,}: every "
            f"character of the corpus is a token ({len(chars.every):,}), and each that continues a word a ## piece "
            f"({len(chars.inner):,}); raise vocab_size for its words, or give a tokenizer (data.tokenizer.path)"
        )
    elif (
        not lines.whole
        and size < SMALL_VOCAB_SHARE * asked
        and not 1 / SAMPLE_MISS <= (over := lines.chars / max(sample["sample_chars"], 1)) <= SAMPLE_MISS
    ):
        log(
            f"warning: the vocabulary has {size:,} tokens of the {asked:,} asked: the sample it was trained on is "
            f"{over:.2g}x data.tokenizer.sample_chars, as lines repeated many times are all in it or all out; "
            "deduplicate the corpus, or raise data.tokenizer.sample_chars"
        )
    return tok, sample


def _until_stopped(items: Iterator[str], stopper: Stopper) -> Iterator[str]:
    """`items` until a stop signal comes (looked for every 1,024 items, from whatever thread reads them)."""
    for n, item in enumerate(items):
        if n % 1024 == 0:
            stopper.poll()
        if stopper.signum is not None:
            return
        yield item


def update(
    plan: Plan, cfg: Config, *, quiet: bool, workers: int, stopper: Stopper, vocab_check: Callable[[int], None] | None
) -> None:
    """The prepared folder brought up to date in place: its tokenizer kept, its whole units kept, the
    others prepared and renamed in, then a new index, then the manifest (the commit point)."""
    data, folder, start, tok = cfg.data, plan.folder, time.perf_counter(), plan.tok
    if vocab_check is not None:
        vocab_check(tok.get_vocab_size(with_added_tokens=True))
    settings = UnitSettings(data.split_sentences, data.validation_fraction, _dtype(tok), os.getpid())
    stopper.left = f"the prepared data in {folder} is as it was (units finished are kept for the next prepare)"
    _check_room(folder, sum(u.bytes for u in plan.make))
    records = dict(plan.records)
    try:
        with _progress(sum(u.bytes for u in plan.make), "tokenizing", quiet) as bar:
            records |= prepare_units(
                plan.make, folder, tok, settings=settings, workers=workers, progress=bar.update, stop=stopper.check
            )
        _warn_unknown(plan, records)
        manifest = _manifest(
            cfg,
            plan,
            tok,
            folder,
            records=records,
            settings=settings,
            sample=None,
            seconds=time.perf_counter() - start,
            prepared=plan.make,
        )
        check_sizes(manifest, data)
        if not plan.index_ok:
            write_index(folder, plan.units, records, manifest["index"])
        stopper.check()
        store.write_text(folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")  # the commit point
        stopper.left = f"the prepared data in {folder} is complete"
    finally:
        clean_leftovers(folder, mine=True)
    _remove_unused(folder, manifest)
    _report(folder, manifest, cfg, f"updated {folder}")


def _reused(plan: Plan, cfg: Config) -> None:
    """Nothing to prepare: the files as they are now recorded where their names or times changed."""
    old, entries = plan.old, plan.entries
    if [(e["path"], e["mtime_ns"]) for e in entries] != [
        (e["path"], e["mtime_ns"]) for e in old["corpus"]["files"]
    ] or old["corpus"]["source"] != cfg.data.corpus:
        store.write_text(
            plan.folder / MANIFEST,
            json.dumps({**old, "corpus": {"source": cfg.data.corpus, "files": entries}}, indent=2) + "\n",
        )
    _remove_unused(plan.folder, old)  # units a stopped prepare finished for another corpus
    if warning := prep.random_next(plan.folder, old, cfg.data, cfg.train.seed)[1]:
        log(warning)


def _warn_unknown(plan: Plan, records: dict[str, dict[str, Any]]) -> None:
    """Warn where the units an update prepared are far more [UNK] than the units kept (or than the data
    before, where none was kept): text in characters the kept tokenizer lacks."""

    def unknown(group: list[Unit]) -> tuple[float, int]:
        tokens = sum(records[u.key]["splits"][s]["tokens"] for u in group for s in SPLITS)
        return sum(records[u.key]["unknown_tokens"] for u in group) / max(tokens, 1), tokens

    new, _ = unknown(plan.make)
    rest, rest_tokens = unknown([u for u in {u.key: u for u in plan.units}.values() if u not in plan.make])
    than = "of the others"
    if not rest_tokens:
        splits = plan.old["splits"]
        rest, than = (
            plan.old.get("unknown_tokens", 0) / max(splits["train"]["tokens"] + splits["valid"]["tokens"], 1),
            "before this update",
        )
    if new <= UNKNOWN_SHARE or new <= 5 * rest:
        return
    worst = max(plan.make, key=lambda u: unknown([u])[0])
    files = sorted({str(part.path) for part in worst.parts})
    remedy = {
        "given": "give a tokenizer that has them (data.tokenizer.path)",
        "run": "the run's checkpoints fix its tokenizer: a vocabulary with them needs a new run",
    }.get(plan.source, "prepare --force trains a new tokenizer on the whole corpus")
    log(
        f"warning: {100 * new:.1f}% of the tokens prepared now are [UNK] ({100 * rest:.2f}% {than}), the most in {files[0]} ({100 * unknown([worst])[0]:.0f}%): the tokenizer kept lacks their characters; {remedy}"
    )


def _stray_record(folder: Path, key: str) -> dict[str, Any] | None:
    """The record of a unit a stopped `prepare` finished but never listed in a manifest: reused when whole."""
    try:
        record = store.read_own_json(folder / UNITS / key / UNIT_RECORD)
    except (OSError, UsageError):
        return None
    return record if prep.unit_ok(record, in_manifest=False) and record["key"] == key else None


def _manifest(
    cfg: Config,
    plan: Plan,
    tok: Tokenizer,
    root: Path,
    *,
    records: dict[str, dict[str, Any]],
    settings: UnitSettings,
    sample: dict[str, Any] | None,
    seconds: float,
    prepared: list[Unit],
) -> dict[str, Any]:
    """The manifest of prepared data in `root` (deterministic but for the times). `prepared`: the units
    tokenized this time."""
    data, units = cfg.data, plan.units
    splits = {s: {c: sum(records[u.key]["splits"][s][c] for u in units) for c in prep.COUNTS} for s in SPLITS}
    prepared_tokens = sum(records[u.key]["splits"][s]["tokens"] for u in prepared for s in SPLITS)
    if plan.action == "update":
        tokenizer = plan.old["tokenizer"]
    else:
        casing = describe(tok)
        tokenizer = {
            "source": str(plan.tokenizer_file) if plan.tokenizer_file else "trained",
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "identity": tokenizer_identity(tok),
            "sha256": {name: store.sha256_of(root / name) for name in layout.TOKENIZER_FILES},
            "requested_vocab_size": data.tokenizer.vocab_size,
            "lowercase": casing.get("lowercase", data.tokenizer.lowercase),  # as used, not as configured
            "strip_accents": casing.get("strip_accents", data.tokenizer.strip_accents),
            "min_frequency": data.tokenizer.min_frequency,
            "sample": sample,
            "given_sha256": tokenizer_sha256(plan.tok) if plan.source == "given" else None,  # as loaded, not as saved
        }
        if sample is not None:  # trained: on what, with which settings
            tokenizer["trained_on"] = {"files": len(plan.entries), "bytes": sum(e["bytes"] for e in plan.entries)}
            tokenizer["settings"] = tokenizer_settings(data, sample["corpus_chars"])
    units_record = [
        {
            "key": u.key,
            "content": u.content,
            "bytes": u.bytes,
            "pieces": [list(p) for p in u.pieces],
            "splits": records[u.key]["splits"],
            "unknown_tokens": records[u.key]["unknown_tokens"],
        }
        for u in units
    ]
    return {
        "format_version": prep.FORMAT_VERSION,
        "bertcli_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "corpus": {"source": data.corpus, "files": plan.entries},
        "tokenizer": tokenizer,
        "split_sentences": data.split_sentences,
        "validation_fraction": data.validation_fraction,
        "unit_bytes": scan.UNIT_BYTES,
        "dtype": settings.dtype,
        "splits": splits,
        "unknown_tokens": sum(records[u.key]["unknown_tokens"] for u in units),
        "index": index_digest(units),
        "units": units_record,
        "seconds": seconds,
        "prepared_tokens": prepared_tokens,
        "tokens_per_s": prepared_tokens / max(seconds, 1e-9),
    }


def _report(folder: Path, manifest: dict[str, Any], cfg: Config, done: str) -> None:
    t, v = manifest["splits"]["train"], manifest["splits"]["valid"]
    total = t["tokens"] + v["tokens"]
    share, warning = prep.random_next(folder, manifest, cfg.data, cfg.train.seed)
    if warning:
        log(warning)
    pairs = (
        f"; random next sentences {100 * share:.1f}% of pairs (data.random_next_prob {100 * cfg.data.random_next_prob:.0f}%)"
        if share is not None
        else ""
    )
    prepared = manifest["prepared_tokens"]
    rate = (
        (f" for the {prepared:,} tokens of the changed units" if prepared < total else "")
        + f", {manifest['tokens_per_s']:,.0f} tokens/s"
        if prepared
        else ", no unit to tokenize"
    )
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
            if (
                re.fullmatch(KEY, child.name)
                and child.name not in keep
                and store.holds_only(child, layout.PREPARED, f"{sub}/{child.name}/")
            ):
                store.remove_folder(child)


def clean_leftovers(folder: Path, mine: bool = False) -> None:
    """Remove what a killed or stopped prepare left: its temporary prepared folder beside `folder`, and
    the temporary units, indexes and manifest inside it (a process that is gone; `mine`: this one's)."""
    store.clean_folder_leftovers(folder, layout.PREPARED, mine=mine)
    if not folder.is_dir() or folder.is_symlink():
        return
    for sub in (UNITS, INDEX):
        store.clean_leftovers(
            folder / sub, lambda c, name, sub=sub: store.holds_only(c, layout.PREPARED, f"{sub}/{name}/"), mine=mine
        )
    store.clean_leftovers(folder, lambda c, name: name == MANIFEST and store.own_file(c), mine=mine)


def _check_room(folder: Path, corpus_bytes: int) -> None:
    """Refuse (exit 1) to prepare `corpus_bytes` of corpus where the disk has no room for PREPARED_SHARE of it."""
    free, need = free_bytes(folder), PREPARED_SHARE * corpus_bytes
    if free is not None and free < need:
        raise RunError(
            f"{folder}: its disk has {free / 2**20:,.1f} MiB free, and preparing {corpus_bytes / 2**20:,.1f} MiB of corpus "
            f"takes at least {need / 2**20:,.1f} MiB: free space, or set data.prepared_dir to another disk"
        )


# ------------------------------------------------------------------------------------------ checks
def prepared_guard(cfg: Config, folder: Path) -> Callable[[Path], None]:
    """Refuse a prepared_dir that is, contains or lies inside an input; return the check store.folder
    runs before writing and before the swap: only prepared data bertcli wrote (or an empty folder) is replaced."""
    fix = "set data.prepared_dir to a new or empty folder (the default is data, next to the config)"
    inputs = [
        store.Input("the corpus", corpus_path(cfg)),
        store.Input("the run folder (output_dir)", Path(cfg.output_dir), inside_ok=True),
    ]
    for label, value in (
        ("the tokenizer (data.tokenizer.path)", cfg.data.tokenizer.path),
        ("the model (model.init_from)", cfg.model.init_from),
    ):
        inputs += [store.Input(label, Path(value))] if value else []
    store.check_apart(folder, inputs, fix)
    return lambda target: store.check_replaceable(target, layout.PREPARED, fix)


def prepared_lock(cfg: Config) -> AbstractContextManager[Any]:
    """The lock of cfg's prepared folder, where a prepare may replace it; what is refused anyway is
    refused first (an input, a folder bertcli did not write, which no prepare replaces)."""
    folder = Path(cfg.data.prepared_dir).expanduser().resolve()
    prepared_guard(cfg, folder)
    return nullcontext() if store.not_owned(folder, layout.PREPARED) is not None else store.prepared_lock(folder)


def _held_out_count(units: list[dict[str, Any]], stride: int) -> int:
    """Documents held out with every `stride`-th document of each unit."""
    return sum(
        (sum(u["splits"][s]["documents"] for s in SPLITS) + unit_phase(u["content"], stride)) // stride for u in units
    )


def check_sizes(manifest: dict[str, Any], data: DataConfig) -> None:
    """Enough documents for examples in each split: 2 with sentence pairs (a random next sentence comes
    from another document), 1 without. Every fix suggested is one that works."""
    train, valid = manifest["splits"]["train"]["documents"], manifest["splits"]["valid"]["documents"]
    total, need = train + valid, 2 if data.pairs else 1
    if total == 0:
        raise UsageError(f"data.corpus={data.corpus!r}: the corpus is empty (no text after reading and tokenizing)")
    why = " (random next sentences come from another document)" if data.pairs else ""
    if data.validation_fraction > 0 and valid < need:
        strides = range(held_out_stride(data.validation_fraction) - 1, 1, -1)
        stride = next((k for k in strides if need <= _held_out_count(manifest["units"], k) <= total - need), None)
        fixes = [f"raise data.validation_fraction to {1 / stride:.4g}"] if stride else []
        fixes += (
            ["set data.validation_fraction: 0 (no held-out evaluation)"]
            if total >= need
            else ["set data.validation_fraction: 0, data.pairs: false and train.nsp_weight: 0"]
            if data.pairs
            else []
        )
        raise UsageError(
            f"data.corpus={data.corpus!r}: {total} document(s) is too small for the held-out split: validation_fraction="
            f"{data.validation_fraction} holds out {valid}, and held-out examples need at least {need}{why}; "
            f"{', or '.join([*fixes, 'add documents (blank lines separate them)'])}"
        )
    if train < need:
        raise UsageError(
            f"data.corpus={data.corpus!r}: {train} training document(s); at least 2 are needed{why}: separate documents with blank lines, or set data.pairs: false and train.nsp_weight: 0 (no NSP)"
        )


def check_enough_documents(units: list[Unit], data: DataConfig) -> None:
    """check_sizes before any tokenizer work, from the documents read (no sentence splitting) only until
    there are enough: a corpus that has them costs a few documents, one that has not one reading. The
    counts are upper bounds (tokenizing can only empty a document): the shards are checked again."""
    need, fraction, stride = 2 if data.pairs else 1, data.validation_fraction, held_out_stride(data.validation_fraction)
    counted, total = [], {"train": 0, "valid": 0}
    for unit in units:
        counts = {"train": {"documents": 0}, "valid": {"documents": 0}}
        for item in read_sentences(list(unit.parts), split=False):
            if item is None:
                split = (
                    "valid"
                    if is_held_out(sum(c["documents"] for c in counts.values()), fraction, unit.phase(stride))
                    else "train"
                )
                counts[split]["documents"] += 1
                total[split] += 1
                if total["train"] >= need and (fraction == 0 or total["valid"] >= need):
                    return
        counted.append({"content": unit.content, "splits": counts})
    check_sizes({"splits": {s: {"documents": total[s]} for s in SPLITS}, "units": counted}, data)


def check_vocab_size(cfg: Config, run_tokenizer: Path | None = None) -> None:
    """Refuse (exit 2) a model.vocab_size the run's tokenizer will not have: a fixed one's size, or more
    than data.tokenizer.vocab_size where a tokenizer is to be trained into a new prepared folder."""
    from bertcli.config import with_vocab

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
    """What `pretrain` would refuse once its data is prepared, where the files show it at once: a
    model.vocab_size the tokenizer will not have; a prepared_dir to be prepared that bertcli did not
    write; a corpus under scan.UNIT_BYTES of too few documents (a larger one is refused where prepared)."""
    check_vocab_size(cfg, run_tokenizer)
    if stands_in(cfg):  # the corpus is not here: its prepared data is checked where it is used
        return
    folder = Path(cfg.data.prepared_dir)
    if folder.is_dir() and prep.read_manifest(folder)[0] is None:
        prepared_guard(cfg, folder)(folder)
    with console.silent():  # what it says of the corpus, preparing says
        files = corpus_files(corpus_path(cfg))
        sizes = [f.stat().st_size for f in files]
        if sum(sizes) < scan.UNIT_BYTES:  # one unit's worth: no file is cut into parts
            entries = [{"bytes": size, "sha256": store.sha256_of(f)} for f, size in zip(files, sizes)]
            check_enough_documents(plan_units(files, entries, "", cfg.data), cfg.data)
