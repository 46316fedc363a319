"""Prepared data as `prepare` leaves it, read and checked (`read_manifest`, `verify`) at every use.

  manifest.json   written last (the commit point): corpus files, tokenizer, units in corpus order, totals
  units/KEY/      unit.json, and train/, valid/ with tokens.bin, seg_offsets.bin, doc_offsets.bin (int64)
  index/DIGEST/   train/, valid/: the offsets of the whole corpus (the units in order)
A manifest is data, never a source of paths: shards are read at fixed names (keys of 64 hex digits)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertcli import console, layout, store
from bertcli.config import CORPUS_GLOBS, DataConfig
from bertcli.data.chunks import random_next_share
from bertcli.data.corpus import Corpus, PartTokens, SpecialTokens
from bertcli.data.scan import FORMAT_VERSION, HASH_ALWAYS_BYTES, corpus_files, digest
from bertcli.data.tokenizer import continuation_mask, read_tokenizer_json, special_tokens
from bertcli.errors import UsageError
from bertcli.layout import DOC_OFFSETS, INDEX, KEY, MANIFEST, SEG_OFFSETS, SPLITS, TOKENIZER_FILES, TOKENS, UNITS

COUNTS = ("documents", "segments", "tokens")
OFFSETS = {SEG_OFFSETS: ("segments", "tokens"), DOC_OFFSETS: ("documents", "segments")}  # (entries - 1, values in)
RANDOM_NEXT_MARGIN = 0.1  # warn when the data gives random next sentences this far above random_next_prob


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _int64(path: Path) -> np.ndarray:
    return np.memmap(path, dtype=np.int64, mode="r")


def _key(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(KEY, value) is not None


def _splits_ok(splits: Any) -> bool:
    return (
        isinstance(splits, dict)
        and set(splits) == set(SPLITS)
        and all(isinstance(v, dict) and all(_count(v.get(c)) for c in COUNTS) for v in splits.values())
    )


def unit_ok(unit: Any, in_manifest: bool = True) -> bool:
    """A unit's record: a key of 64 hex digits and counts; in the manifest, its contents' hash too."""
    return (
        isinstance(unit, dict)
        and _key(unit.get("key"))
        and _splits_ok(unit.get("splits"))
        and _count(unit.get("unknown_tokens"))
        and (not in_manifest or _key(unit.get("content")))
    )


def read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, None), (None, why it cannot be used), or (None, None) where there is none; the files: `verify`."""
    path = Path(folder) / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None, None
    try:
        manifest = store.read_own_json(path, "prepare it again")
    except (UsageError, OSError) as exc:
        return None, f"is damaged ({MANIFEST}: {getattr(exc, 'reason', str(exc).split(': ', 1)[-1])})"
    if (version := manifest.get("format_version")) != FORMAT_VERSION:
        return None, f"is of format version {version} (this bertcli reads and writes version {FORMAT_VERSION})"
    splits, tok, units = manifest.get("splits"), manifest.get("tokenizer"), manifest.get("units")
    files = (manifest.get("corpus") or {}).get("files")
    ok = (
        manifest.get("dtype") in ("uint16", "uint32")
        and isinstance(files, list)
        and all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in files)
        and _splits_ok(splits)
        and isinstance(tok, dict)
        and _count(tok.get("vocab_size"))
        and isinstance(tok.get("sha256"), dict)
        and all(isinstance(tok["sha256"].get(name), str) for name in TOKENIZER_FILES)
        and _key(manifest.get("index"))
        and isinstance(units, list)
        and all(unit_ok(u) for u in units)
        and all(sum(u["splits"][s][c] for u in units) == splits[s][c] for s in SPLITS for c in COUNTS)
    )
    return (manifest, None) if ok else (None, f"is damaged ({MANIFEST} lacks fields or has values of the wrong type)")


def check_tokenizer(folder: Path, manifest: dict[str, Any]) -> str | None:
    """What is wrong with tokenizer.json and vocab.txt (regular files, as the manifest records them)."""
    if found := store.digest_change(folder, manifest["tokenizer"]["sha256"], TOKENIZER_FILES):
        return f"{found[0]}: {found[1]}"
    lines = (Path(folder) / layout.VOCAB).read_bytes().count(b"\n")  # a token a line, in id order
    if lines != manifest["tokenizer"]["vocab_size"]:
        return f"vocab.txt: {lines:,} tokens, where {MANIFEST} says {manifest['tokenizer']['vocab_size']:,}"
    return None


def _files_problem(folder: Path, rel: str, names: tuple[str, ...]) -> str | None:
    """Whether folder/rel/{train,valid}/NAME are regular files in regular folders (no links)."""
    for path in (rel, *(f"{rel}/{s}" for s in SPLITS)):
        if os.path.islink(folder / path) or not (folder / path).is_dir():
            return f"{path}: {'a symbolic link' if os.path.islink(folder / path) else 'missing or not a folder'}"
    for path in (f"{rel}/{s}/{n}" for s in SPLITS for n in names):
        if problem := store.file_problem(folder / path):
            return f"{path}: {problem}"
    return None


def _rising(offsets: np.ndarray, last: int, block: int = 1 << 20) -> bool:
    """Whether `offsets` rises from 0 to `last` (read in blocks: no temporary array grows with the corpus)."""
    if offsets[0] != 0 or offsets[-1] != last:
        return False
    return all((np.diff(offsets[lo : lo + block + 1]) > 0).all() for lo in range(0, len(offsets) - 1, block))


def _wrong_size(folder: Path, path: str, size: int) -> str | None:
    actual = (folder / path).stat().st_size
    return f"{path} holds {actual:,} bytes where {MANIFEST} implies {size:,}" if actual != size else None


def check_unit(folder: Path, key: str, record: dict[str, Any], dtype_name: str, vocab_size: int) -> str | None:
    """What is wrong with the shards of unit `key` (naming the file), None where whole."""
    rel, dtype = f"{UNITS}/{key}", np.dtype(dtype_name)
    if problem := _files_problem(folder, rel, layout.SHARD_FILES):
        return problem
    for split, counts in record["splits"].items():
        base = f"{rel}/{split}"
        sizes = {TOKENS: counts["tokens"] * dtype.itemsize} | {n: (counts[e] + 1) * 8 for n, (e, _) in OFFSETS.items()}
        for name, size in sizes.items():
            if problem := _wrong_size(folder, f"{base}/{name}", size):
                return problem
        for name, (_, values) in OFFSETS.items():
            if not _rising(_int64(folder / base / name), counts[values]):
                return f"{base}/{name} does not rise from 0 to {counts[values]:,}: its offsets are damaged"
        if counts["tokens"] and vocab_size <= np.iinfo(dtype).max:
            if (top := int(np.memmap(folder / base / TOKENS, dtype=dtype, mode="r").max())) >= vocab_size:
                return f"{base}/tokens.bin holds token id {top:,}, past the vocabulary of {vocab_size:,}"
    return None


def check_index(folder: Path, manifest: dict[str, Any]) -> tuple[str, str | None] | None:
    """(what is wrong with the index, the key of the unit it disagrees with: either may be damaged); None: whole."""
    rel = f"{INDEX}/{manifest['index']}"
    if problem := _files_problem(folder, rel, layout.INDEX_FILES):
        return problem, None
    for split, counts in manifest["splits"].items():
        base, offsets = f"{rel}/{split}", {}
        for name, (entries, _) in OFFSETS.items():
            if problem := _wrong_size(folder, f"{base}/{name}", (counts[entries] + 1) * 8):
                return problem, None
            offsets[name] = _int64(folder / base / name)
        start = dict.fromkeys(COUNTS, 0)  # of the units before this one
        for unit in manifest["units"]:
            own, unit_counts = f"{UNITS}/{unit['key']}/{split}", unit["splits"][split]
            problem = _files_problem(folder, f"{UNITS}/{unit['key']}", layout.INDEX_FILES)
            for name, (entries, _) in OFFSETS.items():
                problem = problem or _wrong_size(folder, f"{own}/{name}", (unit_counts[entries] + 1) * 8)
            if problem is not None:
                return problem, unit["key"]
            for name, (entries, values) in OFFSETS.items():
                if not _holds_shifted(offsets[name], start[entries], _int64(folder / own / name), start[values]):
                    what = f"{base}/{name} does not hold the offsets of {own} from its entry {start[entries]:,}"
                    return f"{what}: one of the two is damaged", unit["key"]
            start = {c: start[c] + unit_counts[c] for c in COUNTS}  # (read_manifest checked the totals)
    return None


def _holds_shifted(index: np.ndarray, at: int, own: np.ndarray, shift: int, block: int = 1 << 20) -> bool:
    """Whether index[at : at + len(own)] == own + shift, read in blocks."""
    if at + len(own) > len(index):
        return False
    return all(
        np.array_equal(index[at + lo : at + lo + len(own[lo : lo + block])], own[lo : lo + block] + shift)
        for lo in range(0, len(own), block)
    )


def verify(folder: Path, manifest: dict[str, Any]) -> list[str]:
    """What is damaged in prepared data, each as "FILE: REASON": tokenizer files, units, then the index."""
    if problem := check_tokenizer(folder, manifest):
        return [problem]
    dtype, vocab_size = manifest["dtype"], manifest["tokenizer"]["vocab_size"]
    units = {u["key"]: u for u in manifest["units"]}.values()  # a unit twice (two equal files): checked once
    damage = [p for u in units if (p := check_unit(folder, u["key"], u, dtype_name=dtype, vocab_size=vocab_size))]
    if not damage and (found := check_index(folder, manifest)):
        damage.append(found[0])
    return damage


# ------------------------------------------------------------------------------------------ using it
@dataclass
class PreparedData:
    """Prepared data, memory-mapped: what training and `inspect` read."""

    folder: Path
    manifest: dict[str, Any]
    tokenizer: Tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def special(self) -> SpecialTokens:
        return special_tokens(self.tokenizer)

    @property
    def identity(self) -> dict[str, Any]:
        """What the examples and the held-out set are drawn from, as a checkpoint records it."""
        m = self.manifest  # read_manifest checked its units and splits
        held_out = digest([u["key"] for u in m["units"] if u["splits"]["valid"]["documents"]])
        documents = sum(m["splits"][s]["documents"] for s in SPLITS)
        return {"index": m["index"], "held_out": held_out, "documents": documents}

    def corpus(self, split: str) -> Corpus | None:
        """One split, memory-mapped (each unit now, so that one a later `prepare` removes stays readable)."""
        if self.manifest["splits"][split]["documents"] == 0:
            return None
        dtype, units = self.manifest["dtype"], self.manifest["units"]
        pieces = [
            np.memmap(self.folder / UNITS / u["key"] / split / TOKENS, dtype=dtype, mode="r")
            for u in units
            if u["splits"][split]["tokens"]
        ]
        base = self.folder / INDEX / self.manifest["index"] / split
        return Corpus(
            tokens=pieces[0] if len(pieces) == 1 else PartTokens(pieces),
            seg_offsets=_int64(base / SEG_OFFSETS),
            doc_offsets=_int64(base / DOC_OFFSETS),
            vocab_size=self.vocab_size,
            special=self.special,
            continuation=continuation_mask(self.tokenizer),
        )


class NotPrepared(UsageError):
    """No usable prepared data in `folder`: the prepare to run, after its corpus (`gone`) comes back."""

    def __init__(self, folder: Path, problem: str, config: Path | None, gone: str | None = None) -> None:
        again = f"run `bertcli prepare --config {config or 'CONFIG'}` (--force prepares everything again)"
        super().__init__(f"{folder}: {problem}; " + (f"put its corpus, {gone}, back, then {again}" if gone else again))


def load_prepared(folder: Path, verified: bool = False) -> PreparedData:
    """Prepared data, verified unless `verified` (prepare verified it just now)."""
    manifest, why_not = read_manifest(folder)
    config = folder.parent / layout.RUN_CONFIG if (folder.parent / layout.RUN_CONFIG).is_file() else None
    if manifest is None:
        raise NotPrepared(folder, f"the prepared data {why_not}" if why_not else "no prepared data here", config)
    if not verified and (damage := verify(folder, manifest)):
        raise NotPrepared(folder, f"the prepared data is damaged ({damage[0]})", config, corpus_gone(manifest))
    return PreparedData(folder=folder, manifest=manifest, tokenizer=read_tokenizer_json(folder / layout.TOKENIZER_JSON))


def corpus_gone(manifest: dict[str, Any] | None) -> str | None:
    """The corpus prepared data was made from, where it is gone (or an empty folder: not mounted)."""
    source = manifest.get("corpus", {}).get("source") if isinstance(manifest, dict) else None
    if not isinstance(source, str) or source in ("sample", "synthetic"):
        return None
    path = Path(source)
    return source if not path.exists() or (path.is_dir() and not any(path.iterdir())) else None


def corpus_drift(manifest: dict[str, Any]) -> str | None:
    """How the corpus's files differ now from those prepared, by name, size and time; None: none differs."""
    source = manifest["corpus"].get("source")
    if not isinstance(source, str) or source in ("sample", "synthetic"):
        return None
    if corpus_gone(manifest):
        return f"the corpus, {source}, is not there now"
    with console.silent():
        try:
            files = corpus_files(Path(source), manifest.get("include", CORPUS_GLOBS), manifest.get("exclude", []))
        except (UsageError, OSError):
            return None
    then = {e.get("path"): (e.get("bytes"), e.get("mtime_ns")) for e in manifest["corpus"]["files"]}
    now = {str(f.resolve()): (st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()]}
    counts = {"added": len(now.keys() - then.keys()), "gone": len(then.keys() - now.keys())}
    counts["written to"] = sum(now[p] != then[p] for p in now.keys() & then.keys())
    if changed := ", ".join(f"{n} {w}" for w, n in counts.items() if n):
        return f"the corpus's files differ from those prepared ({changed}): the next prepare updates it"
    return None


def cache_check(corpus_bytes: int) -> str:
    """What the cache check compares for a corpus of `corpus_bytes`, in words (for `inspect`)."""
    gib = HASH_ALWAYS_BYTES >> 30
    if corpus_bytes <= HASH_ALWAYS_BYTES:
        return f"the same SHA-256 for every corpus file (all hashed again at each start: at most {gib} GiB)"
    return f"the same size and modification time for every corpus file (over {gib} GiB: an edit keeping both is missed)"


def sample_line(sample: dict[str, Any]) -> str:
    """What trained the vocabulary (manifest["tokenizer"]["sample"]), in words after "trained on"."""
    budget = f"data.tokenizer.sample_chars={sample['sample_chars']:,}"
    if sample["whole"]:
        return f"the whole corpus ({sample['corpus_chars']:,} characters, {budget})"
    share = 100 * sample["chars"] / max(sample["corpus_chars"], 1)
    chars = f"{sample['chars']:,} of the corpus's {sample['corpus_chars']:,} characters ({share:.1f}%)"
    return f"a sample of {sample['lines']:,} lines, {chars}, chosen by a hash of each line ({budget}; 0: all)"


def vocabulary_sample(manifest: dict[str, Any]) -> str | None:
    """sample_line of prepared data; None for a given tokenizer, or a malformed record."""
    sample = manifest["tokenizer"].get("sample")
    keys = ("sample_chars", "corpus_chars", "lines", "chars")
    ok = isinstance(sample, dict) and isinstance(sample.get("whole"), bool) and all(_count(sample.get(k)) for k in keys)
    return sample_line(sample) if ok else None


def random_next(folder: Path, manifest: dict[str, Any], data: DataConfig, seed: int) -> tuple[float | None, str | None]:
    """The share of training pairs with a random next sentence (None without pairs), and a warning if high."""
    if not data.pairs or manifest["splits"]["train"]["documents"] == 0:
        return None, None
    base = folder / INDEX / manifest["index"] / "train"
    share = random_next_share(_int64(base / SEG_OFFSETS), _int64(base / DOC_OFFSETS), data, seed)
    if share <= data.random_next_prob + RANDOM_NEXT_MARGIN:
        return share, None
    warning = f"warning: {100 * share:.1f}% of the NSP pairs will have a random next sentence (short documents)"
    return share, f"{warning}: put several sentences in each document, or set data.pairs: false and train.nsp_weight: 0"
