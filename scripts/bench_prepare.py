"""Speed and memory of `bertcli prepare`, side by side with the bare `tokenizers` batch encoding, and
at scale on a generated corpus.

    python scripts/bench_prepare.py [--corpus ../shared/corpora/python-docs.txt] [--repeat 3]
    python scripts/bench_prepare.py --scale 100MB [--cache DIR] [--seed 0] [--repeat 2] [--compare-sample 4]

In one run, on the same text and with the same trained tokenizer:
  bare       tokenizers' own batch encoding (encode_batch_fast where available) of the corpus
             lines, already in memory, in batches of the size prepare uses: the tokenizer alone
  encode     `prepare` with that tokenizer (reading, UTF-8 checks, sentence splitting, encoding,
             writing shards and manifest): the whole pipeline minus tokenizer training
  full       `prepare` from scratch, training the tokenizer too
Reports median tokens/s over --repeat runs and encode/bare (the goal is >= 0.5). Then peak
resident memory of `bertcli prepare` as a separate process, on the corpus and on a copy four
times its size, next to the memory of a process that only imports the same modules.

Scale mode (--scale SIZE: 100MB, 1GB, ... in powers of ten) generates a corpus of SIZE bytes from
--corpus (cached in --cache, reused when there), and runs `bertcli prepare` on it as a separate
process, twice: training the vocabulary (the default settings of the preset) and with that run's
tokenizer given (data.tokenizer.path). For each it reports tokens/s, tokens/s per core (divided by
the cores this process may use) and per CPU second, and the peak resident memory of the whole
process tree (the sum of VmRSS over the process and its descendants, sampled from /proc every
50 ms, so a page shared by two processes counts twice, and never below the largest single process's
ru_maxrss), with the ratio trained/given. When `prepare --help` offers --workers, it also runs the
given-tokenizer preparation with 1 and 2 workers, alternately (--repeat pairs, so that both see
the same machine load), and reports the speed-up of the medians and whether the shards are
byte-identical. --compare-sample F trains two vocabularies in this process on samples of
data.tokenizer.sample_chars and F times as many characters (as `prepare` chooses them) and reports
how much they share and the tokens per word of each on a held-out sample of the corpus's lines.

The generated corpus: the documents of the base corpus (blank-line separated), shuffled again for
each pass over it, with distinct words added as real corpora have them. A corpus of n words holds
about K * n^beta distinct words (Heaps' law); repeating the base would hold its 14k distinct words
at any size. Here beta = 0.6 and K = 11.5, so that 17M words (the size of text8, the first 10^8
bytes of English Wikipedia, cleaned) hold about 254k distinct lower-cased words, text8's count:
about 60k at 10 MB, 240k at 100 MB, 950k at 1 GB (the generator prints its count). Before each document is written, the distinct
words it would leave the corpus short of that curve are made: that many of the document's own
words (not among the base's 300 most frequent, at least 3 letters, chosen by a seeded hash) are
renamed throughout the document, each into a new word, built from it and a serial
number spelled in syllables (`interpreter` -> `interpretemifo`, `nebuinterpreter`, `intezigipreter`),
capitalised as it was. So new words recur within a document as the words they replace did
(about half occur once in the whole corpus, as in real text), their letters are English-like
around an invented part, and lines stay lines of the base. The text is a function of the base
corpus, SIZE and --seed.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bertcli.config_load import preset_config
from bertcli.config_write import preset_header, to_yaml
from bertcli.data.prepare import prepare
from bertcli.data.prepared import load_prepared
from bertcli.data.text import read_sentences, read_text
from bertcli.data.units import ENCODE_BATCH
from bertcli.resolve import resolve

REPO = Path(__file__).resolve().parents[1]


def write_config(folder: Path, corpus: Path, *extra: str, preset: str = "tiny") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    cfg = preset_config(preset, [f"data.corpus={corpus}", *extra])
    path.write_text(to_yaml(cfg, preset_header(preset)))
    return path


# ------------------------------------------------------------------ the generated corpus (--scale)

GENERATOR_VERSION = 1  # part of the cached file's name: a change to the generator makes a new file
HEAPS_K, HEAPS_BETA = 11.5, 0.6  # distinct words ~ K * words^beta (see the module docstring)
COMMON_WORDS = 300  # the base's most frequent words are never renamed
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["th", "ch", "sh", "qu"]
WORD = re.compile(r"([A-Za-z]+)")


def parse_size(text: str) -> int:
    """'100MB' -> 100_000_000 (powers of ten: kB, MB, GB; a bare number is bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)[bB]?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 100MB or 1GB")
    return int(float(match.group(1)) * 10 ** {"": 0, "k": 3, "m": 6, "g": 9}[match.group(2).lower()])


def _hash(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "little")


def _spelled(serial: int) -> str:
    """A serial number as syllables: a part of a word that no other serial shares."""
    out, n = [], serial + 1
    while n:
        n, r = divmod(n, len(SYLLABLES))
        out.append(SYLLABLES[r])
    return "".join(out)


def _new_word(word: str, serial: int, seed: int) -> str:
    """A word made from `word` (lower case) and `serial`: a suffix, a prefix or an infix."""
    part, h = _spelled(serial), _hash(seed, serial, word)
    if h % 3 == 0:
        return word[: max(2, len(word) - 1 - (h >> 2) % 3)] + part
    if h % 3 == 1:
        return part + word
    k = 1 + (h >> 2) % max(1, len(word) - 1)
    return word[:k] + part + word[k + 1 :]


def generate_corpus(base: Path, size: int, out: Path, seed: int = 0) -> dict[str, int]:
    """Write the generated corpus of about `size` bytes (whole documents; see the module docstring)
    to `out` atomically; return its counts (words, distinct lower-cased words, words made)."""
    docs = [d.strip() for d in re.split(r"\n\s*\n", base.read_text(encoding="utf-8")) if d.strip()]
    frequency = collections.Counter(w.lower() for w in WORD.findall("\n".join(docs)))
    common = {w for w, _ in frequency.most_common(COMMON_WORDS)}
    parsed = []  # (pieces: text between words and words alternately, {lower-cased word: its spellings}, words)
    for doc in docs:
        pieces = WORD.split(doc)
        forms: dict[str, set[str]] = {}
        for w in pieces[1::2]:
            forms.setdefault(w.lower(), set()).add(w)
        parsed.append((pieces, forms, len(pieces) // 2))
    rng = random.Random(seed)
    seen: set[str] = set()  # base words written so far (lower case)
    made = words = written = 0
    tmp = out.with_name(f".tmp-{out.name}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        for copy in range(1 << 62):
            order = list(range(len(parsed)))
            rng.shuffle(order)
            for j in order:
                pieces, forms, count = parsed[j]
                fresh = sum(1 for w in forms if w not in seen)
                quota = int(HEAPS_K * (words + count) ** HEAPS_BETA) - len(seen) - made - fresh
                renamed: dict[str, str] = {}
                if quota > 0:
                    candidates = sorted(
                        (w for w in forms if w not in common and len(w) >= 3), key=lambda w: _hash(seed, copy, j, w)
                    )
                    for w in candidates[:quota]:
                        new = _new_word(w, made, seed)
                        made += 1
                        for form in forms[w]:
                            renamed[form] = new.capitalize() if form[0].isupper() else new
                seen.update(forms)
                text = "".join([renamed.get(p, p) for p in pieces]) + "\n\n"
                fh.write(text)
                written += len(text.encode("utf-8"))
                words += count
                if written >= size:
                    break
            if written >= size:
                break
    os.replace(tmp, out)
    return {"bytes": written, "words": words, "distinct_words": len(seen) + made, "made": made}


def scale_corpus(base: Path, size: int, cache: Path, seed: int) -> Path:
    """The generated corpus of `size` bytes from `base`, made once and kept in `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"scale-{size}-seed{seed}-{base.stem}-{base.stat().st_size}-v{GENERATOR_VERSION}.txt"
    if path.is_file():
        print(f"corpus: {path} (cached)", file=sys.stderr)
        return path
    start = time.perf_counter()
    counts = generate_corpus(base, size, path, seed)
    (path.with_suffix(".json")).write_text(json.dumps(counts) + "\n")
    print(
        f"corpus: generated {path} in {time.perf_counter() - start:.0f} s: {counts['bytes']:,} bytes, "
        f"{counts['words']:,} words, about {counts['distinct_words']:,} distinct ({counts['made']:,} made)",
        file=sys.stderr,
    )
    return path


# ------------------------------------------------------------------ measuring a process tree


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc/*/stat (this kernel has no /proc/PID/task/TID/children)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # the name may hold spaces and parentheses
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kib(root: int) -> int:
    """Resident memory of the descendants of `root` (sum of VmRSS, KiB)."""
    tree, total = _children(), 0
    todo = list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        total += _rss_kib(pid)
        todo += tree.get(pid, [])
    return total


# Runs a command and prints what the kernel counted for it (its own children only, unlike this
# process's RUSAGE_CHILDREN, which keeps the largest of every run so far).
_WRAPPER = (
    "import json, resource, subprocess, sys; rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)"
    ".returncode; u = resource.getrusage(resource.RUSAGE_CHILDREN); "
    "print(json.dumps({'rc': rc, 'maxrss_kib': u.ru_maxrss, 'cpu_s': u.ru_utime + u.ru_stime}))"
)


def run_measured(command: list[str]) -> dict[str, float]:
    """Run `command`: its wall time, CPU time (user + system, its whole tree) and peak resident
    memory of its whole process tree in MiB: the largest sum sampled every 50 ms, and never below
    the largest single process's ru_maxrss (exact, from the kernel)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRAPPER, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss_kib(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    result = json.loads(out) if proc.returncode == 0 and out.strip() else {"rc": proc.returncode}
    if result["rc"] != 0:
        sys.exit(f"bench_prepare: {' '.join(command)} failed ({result['rc']}):\n{err}")
    return {
        "wall_s": wall,
        "cpu_s": result["cpu_s"],
        "peak_mib": max(peak[0], result["maxrss_kib"]) / 1024,
        "largest_process_mib": result["maxrss_kib"] / 1024,
        "stderr": err,
    }


def peak_rss_mib(command: list[str]) -> float:
    """Peak resident memory of `command`, in MiB, measured by a wrapper process of its own (so one
    measurement never sees another's children; ru_maxrss is in KiB on Linux)."""
    wrapper = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", wrapper, *command], check=True, capture_output=True, text=True)
    return int(out.stdout) / 1024


# ------------------------------------------------------------------ scale mode


def prepare_command(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bertcli", "prepare", "--config", str(config), "--quiet", "--force", *extra]


def accepts_workers() -> bool:
    """Whether this bertcli's `prepare` has a --workers option."""
    out = subprocess.run(
        [sys.executable, "-m", "bertcli", "prepare", "--help"], capture_output=True, text=True, check=False
    )
    return "--workers" in out.stdout


def prepared_tokens(folder: Path) -> int:
    manifest = json.loads((folder / "manifest.json").read_text())
    return sum(split["tokens"] for split in manifest["splits"].values())


def same_shards(a: Path, b: Path) -> bool:
    """Whether two prepared folders hold the same files, byte for byte, but for the manifest's timings."""

    def files(folder: Path) -> dict[str, bytes]:
        out = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        manifest = json.loads(out.pop("manifest.json"))
        out["manifest.json"] = json.dumps(
            {k: v for k, v in manifest.items() if k not in ("created", "seconds", "prepared_tokens", "tokens_per_s")}
        ).encode()
        return out

    return files(a) == files(b)


def unit_stamps(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every file of a prepared folder's units: a file rewritten changes both."""
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in (folder / "units").rglob("*")
        if p.is_file()
    }


def new_text(base: Path, size: int, seed: int) -> str:
    """About `size` bytes of the base corpus's documents, in an order of their own (text that no unit of
    the generated corpus holds as it is)."""
    docs = [d for d in base.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    random.Random(f"added:{seed}").shuffle(docs)
    out, total = [], 0
    for doc in docs:
        if total >= size:
            break
        out.append(doc)
        total += len(doc.encode()) + 2
    return "\n\n".join(out) + "\n"


def compare_sample(corpus: Path, factor: int, preset: str) -> None:
    """Vocabularies trained on samples of data.tokenizer.sample_chars and `factor` times as many
    characters, as `prepare` chooses them: pieces shared, and tokens per word on held-out lines
    (lines in neither sample: the samples nest, since both keep the lines whose hash is below a
    threshold; about 2 MB of them, picked by another hash)."""
    from bertcli.data.text import LineSample
    from bertcli.data.tokenizer import scan_characters, train_wordpiece

    cfg = preset_config(preset).data
    t = cfg.tokenizer
    start = time.perf_counter()
    chars = scan_characters(read_text([corpus]), t)
    print(
        f"\nvocabulary samples ({preset} preset: vocab_size {t.vocab_size:,}; corpus {chars.count:,} characters; "
        f"scan {time.perf_counter() - start:.1f} s)"
    )
    budgets = [t.sample_chars, factor * t.sample_chars]
    tokenizers, larger = [], None
    for budget in budgets:
        lines = LineSample(budget, chars.count)
        start = time.perf_counter()
        tokenizers.append(
            train_wordpiece(
                (x for x in read_sentences([corpus], cfg.split_sentences, keep=lines) if x is not None), t, chars
            )
        )
        larger = lines
        print(
            f"  sample_chars {budget:>13,}: trained on {lines.chars:,} characters ({lines.lines:,} lines, "
            f"{100 * lines.chars / chars.count:.1f}%) in {time.perf_counter() - start:.0f} s"
        )
    held_out, size = [], 0
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line and not larger(line) and _hash("held-out", line) % 50 == 0 and size < 2_000_000:
                held_out.append(line)
                size += len(line)
    words = sum(len(line.split()) for line in held_out)
    vocabularies = [set(tok.get_vocab()) for tok in tokenizers]
    shared = len(vocabularies[0] & vocabularies[1])
    print(
        f"  pieces in both: {shared:,} of {len(vocabularies[0]):,} and {len(vocabularies[1]):,} "
        f"({100 * shared / len(vocabularies[0]):.1f}%)"
    )
    for budget, tok in zip(budgets, tokenizers):
        ids = [e.ids for e in tok.encode_batch(held_out, add_special_tokens=False)]
        count, unk = sum(map(len, ids)), sum(row.count(tok.token_to_id("[UNK]")) for row in ids)
        print(
            f"  sample_chars {budget:>13,}: {count / words:.4f} tokens per word, [UNK] {100 * unk / count:.3f}% "
            f"({len(held_out):,} held-out lines, {words:,} words)"
        )


def scale(args: argparse.Namespace) -> None:
    corpus = scale_corpus(args.corpus, args.scale, args.cache, args.seed)
    work = Path(tempfile.mkdtemp(prefix="bench_prepare.scale.", dir=args.work))
    cores = len(os.sched_getaffinity(0))
    size = corpus.stat().st_size
    print(f"corpus: {corpus} ({size / 1e6:,.1f} MB); {args.preset} preset; {cores} cores; prepared in {work}")
    runs = {}
    config = write_config(work / "trained", corpus, preset=args.preset)
    runs["trained vocabulary"] = (run_measured(prepare_command(config)), work / "trained" / "data")
    tokenizer = work / "tokenizer.json"
    tokenizer.write_bytes((work / "trained" / "data" / "tokenizer.json").read_bytes())
    given = write_config(work / "given", corpus, f"data.tokenizer.path={tokenizer}", preset=args.preset)
    runs["given tokenizer"] = (run_measured(prepare_command(given)), work / "given" / "data")
    workers = accepts_workers()
    corpus_dir = work / "corpus"  # a folder holding the corpus (a link to it), so that a file can be added
    corpus_dir.mkdir()
    (corpus_dir / corpus.name).symlink_to(corpus)
    if workers:
        folders = {
            n: write_config(work / f"workers{n}", corpus_dir, f"data.tokenizer.path={tokenizer}", preset=args.preset)
            for n in (1, 2)
        }
        times: dict[int, list[float]] = {1: [], 2: []}
        for r in range(args.repeat):  # alternately, each first in turn, so both see the same load
            for n in (1, 2) if r % 2 == 0 else (2, 1):
                result = run_measured(prepare_command(folders[n], "--workers", str(n)))
                times[n].append(result["wall_s"])
                runs[f"given tokenizer, {n} worker(s), run {r + 1}"] = (result, work / f"workers{n}" / "data")
    print(
        f"{'run':<40} {'tokens':>12} {'wall s':>8} {'tokens/s':>10} {'per core':>9} {'per CPU s':>10} "
        f"{'peak MiB':>9} {'largest':>8}"
    )
    for name, (r, folder) in runs.items():
        tokens = prepared_tokens(folder)
        print(
            f"{name:<40} {tokens:>12,} {r['wall_s']:>8.1f} {tokens / r['wall_s']:>10,.0f} "
            f"{tokens / r['wall_s'] / cores:>9,.0f} {tokens / r['cpu_s']:>10,.0f} {r['peak_mib']:>9.0f} "
            f"{r['largest_process_mib']:>8.0f}"
        )
    lines = [line for line in runs["trained vocabulary"][0]["stderr"].splitlines() if "trained on" in line]
    print("\n".join(lines) or "the vocabulary was trained on the whole corpus")
    trained, plain = runs["trained vocabulary"][0]["peak_mib"], runs["given tokenizer"][0]["peak_mib"]
    print(
        f"peak memory, trained vocabulary / given tokenizer: {trained:.0f} / {plain:.0f} MiB = {trained / plain:.2f}x "
        "(goal: at most 1.5x and 400 MiB)"
    )
    if workers:
        one, two = statistics.median(times[1]), statistics.median(times[2])
        same = same_shards(work / "workers1" / "data", work / "workers2" / "data")
        print(
            f"1 -> 2 workers: {one:.1f} s -> {two:.1f} s (medians of {args.repeat}), speed-up {one / two:.2f}x "
            f"(goal >= 1.7x); shards byte-identical: {same}"
        )
        # Prepared once: a 1 MB file added to the corpus folder, prepared again (2 workers, the same tokenizer).
        (corpus_dir / "added.txt").write_text(new_text(args.corpus, 1_000_000, args.seed), encoding="utf-8")
        before = unit_stamps(work / "workers2" / "data")
        result = run_measured(
            [sys.executable, "-m", "bertcli", "prepare", "--config", str(folders[2]), "--quiet", "--workers", "2"]
        )
        after = unit_stamps(work / "workers2" / "data")
        rewritten = sum(after.get(rel) != stamp for rel, stamp in before.items())
        print(
            f"adding a 1 MB file and preparing again: {result['wall_s']:.1f} s = "
            f"{100 * result['wall_s'] / two:.1f}% of the full preparation with 2 workers (goal <= 5%); files of "
            f"untouched units rewritten: {rewritten} of {len(before)}; "
            f"{next((line for line in result['stderr'].splitlines() if 'preparing' in line), '')}"
        )
    else:
        print("prepare has no --workers option: the 1 -> 2 worker speed-up is not measured")
    if args.compare_sample:
        compare_sample(corpus, args.compare_sample, args.preset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--corpus",
        type=Path,
        default=REPO.parent / "shared" / "corpora" / "python-docs.txt",
        help="the corpus (in --scale mode: the base of the generated one)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind (in --scale mode: 1/2-worker pairs)")
    parser.add_argument(
        "--scale", type=parse_size, help="generate a corpus of this size (100MB, 1GB) and measure on it"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "bertcli-bench-corpora",
        help="folder of the generated corpora (default: %(default)s)",
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="folder for the prepared data (default: a temporary one)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated corpus")
    parser.add_argument("--preset", default="tiny", help="preset of the configs (default: %(default)s)")
    parser.add_argument(
        "--compare-sample",
        type=int,
        metavar="F",
        default=0,
        help="also compare vocabularies trained on data.tokenizer.sample_chars and F times as many",
    )
    args = parser.parse_args()
    if not args.corpus.is_file():
        sys.exit(f"bench_prepare: {args.corpus} not found; pass --corpus")
    if args.scale:
        scale(args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench_prepare."))
    corpus_bytes = args.corpus.stat().st_size

    full, encode, bare = [], [], []
    trained = None
    for r in range(args.repeat):
        config = write_config(work / f"full{r}", args.corpus)
        start = time.perf_counter()
        folder = prepare(
            resolve(
                preset_config(
                    "tiny", [f"data.corpus={args.corpus}", f"data.prepared_dir={work / f'full{r}' / 'data'}"]
                ),
                config.parent,
            ),
            quiet=True,
            force=True,
        )
        elapsed = time.perf_counter() - start
        tokens = sum(s["tokens"] for s in load_prepared(folder).manifest["splits"].values())
        full.append(tokens / elapsed)
        trained = trained or folder / "tokenizer.json"

        cfg = preset_config(
            "tiny",
            [f"data.corpus={args.corpus}", f"data.tokenizer.path={trained}", f"data.prepared_dir={work / f'enc{r}'}"],
        )
        start = time.perf_counter()
        folder = prepare(resolve(cfg, write_config(work / f"enc{r}cfg", args.corpus).parent), quiet=True, force=True)
        elapsed = time.perf_counter() - start
        encode_tokens = sum(s["tokens"] for s in load_prepared(folder).manifest["splits"].values())
        encode.append(encode_tokens / elapsed)

        tokenizer = load_prepared(folder).tokenizer
        fast = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        lines = [s for s in read_sentences([args.corpus]) if s is not None]  # the same sentences, in memory
        start = time.perf_counter()
        count = 0
        for i in range(0, len(lines), ENCODE_BATCH):
            count += sum(len(e.ids) for e in fast(lines[i : i + ENCODE_BATCH], add_special_tokens=False))
        bare.append(count / (time.perf_counter() - start))

    big = work / "corpus-x4.txt"
    text = args.corpus.read_bytes()
    big.write_bytes(text + b"\n\n" + text + b"\n\n" + text + b"\n\n" + text)
    imports = peak_rss_mib([sys.executable, "-c", "import bertcli.cli, bertcli.data.prepare, tokenizers, numpy"])
    mem1 = peak_rss_mib(
        [
            sys.executable,
            "-m",
            "bertcli",
            "prepare",
            "--config",
            str(write_config(work / "mem1", args.corpus)),
            "--quiet",
            "--force",
        ]
    )
    mem4 = peak_rss_mib(
        [
            sys.executable,
            "-m",
            "bertcli",
            "prepare",
            "--config",
            str(write_config(work / "mem4", big)),
            "--quiet",
            "--force",
        ]
    )

    med = statistics.median
    print(f"corpus: {args.corpus} ({corpus_bytes / 1e6:.2f} MB, {encode_tokens:,} tokens), {args.repeat} runs, median")
    print(f"{'what':<44} {'tokens/s':>12}")
    print(f"{'bare tokenizers batch encoding':<44} {med(bare):>12,.0f}")
    print(f"{'bertcli prepare, given the tokenizer':<44} {med(encode):>12,.0f}")
    print(f"{'bertcli prepare, training the tokenizer too':<44} {med(full):>12,.0f}")
    print(f"ratio prepare/bare: {med(encode) / med(bare):.2f} (goal >= 0.5)")
    print(
        f"peak RSS: imports only {imports:.0f} MiB; prepare {mem1:.0f} MiB on {corpus_bytes / 1e6:.1f} MB; "
        f"{mem4:.0f} MiB on {4 * corpus_bytes / 1e6:.1f} MB (4x)"
    )


if __name__ == "__main__":
    main()
