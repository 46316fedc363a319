"""Time to the first step and resident memory of `pretrain` against the size of the prepared corpus.

    python scripts/make_prepared.py /work/big/run-10m --tokens 1e7
    python scripts/make_prepared.py /work/big/run-1b --tokens 1e9
    python scripts/bench_bigdata.py /work/big/run-10m /work/big/run-1b [--steps 20] [--modes w0,w2,eval]
    python scripts/bench_bigdata.py --builder sample /work/big/run-10m /work/big/run-1b
    python scripts/bench_bigdata.py --windows /work/big/run-10m /work/big/run-1b
    add --code DIR to measure the bertcli package in DIR (another version, say) instead of this one

For each run folder (made by make_prepared.py) and each mode, runs `python -m bertcli pretrain` in a
process of its own (the model of the folder's config, the tiny preset unless it was changed;
train.max_steps=--steps, no checkpoint before the end, no TensorBoard, a fresh output folder) and
reports:
  imports    seconds from the process start to the end of the imports `pretrain` makes (torch with
             the parts it imports on first use, tokenizers, bertcli's modules; the same whatever
             the corpus)
  first      seconds from the end of the imports to the log line of step 1 (so it includes one
             training step: a fraction of a second with this model, more on a loaded machine),
             and to `start`, the line that follows building the run (prepared data checked,
             model, held-out batches); cpu: the CPU seconds the training process spent in that
             time (less sensitive than wall time to other work on the machine)
  trainer    peak resident memory of the training process (RSS), and of it the part that is not
             file-backed (anon: smaps_rollup's Anonymous; the memory-mapped shards are file pages)
  worker     the same for each example worker (train.data_workers), the largest of them; anon
             includes the pages a forked worker shares with the trainer until either writes them,
             so `private` (Private_Dirty: what the worker wrote itself) is given too
Memory is sampled every 20 ms from /proc/PID/smaps_rollup of the process and its children.
Modes: w0 = train.data_workers 0 (the CPU default), wN = N workers, eval = the held-out evaluation
on (train.eval_every as configured, so its fixed held-out batches are built before step 1); the
others set train.eval_every=0. Every mode starts from a cold output folder but a warm page cache
(the shards are read once first), so that the disk's speed is not measured.

--builder: the example builder alone, in this process, on the tiny preset's settings: CPU seconds
of a fresh builder's first batch of 64 (which cuts the first window) and batches of 64 per CPU
second over the next 60 steps, best of 3; `sample` is the bundled sample, prepared in a
temporary folder.
--windows: how well the estimated chunk counts place each window (chunks.Windows): over every
window of epoch 0 (seed 42), the sum of |chunks - positions| as a share of the epoch's positions
(half of it, roughly, chunks left out, half repeated ones) and the largest share in one window.
`mixed` is a corpus made to be hard for the estimate: a million one-sentence documents of 5-14
tokens, then 10,000 documents of 20-199 sentences of 30-59 tokens (2.1M sentences).
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WRAPPER = """
import sys, time
import torch, tokenizers, numpy
import torch._dynamo, torch.distributed.fsdp  # imported on first use by the optimizer and the runtime
import bertcli.cli, bertcli.trainer, bertcli.data.prepare, bertcli.data.examples
print(f"BENCH imports {time.time():.6f} {time.process_time():.3f}", file=sys.stderr, flush=True)
bertcli.cli.main(sys.argv[1:])
"""


def rollup(pid: int) -> dict[str, int] | None:
    """smaps_rollup of process `pid` in KiB, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out = {}
    for line in text.splitlines()[1:]:
        key, _, value = line.partition(":")
        out[key] = int(value.split()[0]) if value.split() else 0
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


class Sampler(threading.Thread):
    """Peak RSS, Anonymous and Private_Dirty (MiB) of a process and of each of its children."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.stop = pid, threading.Event()
        self.peaks: dict[int, dict[str, float]] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in [self.pid, *children(self.pid)]:
                r = rollup(pid)
                if r is None:
                    continue
                peak = self.peaks.setdefault(pid, {"rss": 0.0, "anon": 0.0, "private": 0.0})
                for name, key in (("rss", "Rss"), ("anon", "Anonymous"), ("private", "Private_Dirty")):
                    peak[name] = max(peak[name], r.get(key, 0) / 1024)
            time.sleep(0.02)


def measure(run_folder: Path, mode: str, steps: int, code: Path) -> dict[str, float]:
    """Run pretrain once in `mode`; its timings and peaks."""
    out = Path(tempfile.mkdtemp(prefix="bench_bigdata."))
    try:
        overrides = [
            f"train.max_steps={steps}",
            "logging.log_every=1",
            "logging.tensorboard=false",
            f"checkpoint.save_every={steps}",
            f"output_dir={out}",
            "optimizer.warmup_steps=1",
        ]
        if mode != "eval":
            overrides.append("train.eval_every=0")
        if mode.startswith("w"):
            overrides.append(f"train.data_workers={int(mode[1:])}")
        command = [sys.executable, "-c", WRAPPER, "pretrain", "--config", str(run_folder / "config.yaml")]
        for item in overrides:
            command += ["--set", item]
        env = {**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        started = time.time()
        proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        sampler = Sampler(proc.pid)
        sampler.start()
        marks: dict[str, float] = {}
        tail: list[str] = []
        for line in proc.stderr:
            now = time.time()
            tail = (tail + [line])[-20:]
            if line.startswith("BENCH imports"):
                marks["imports"], marks["imports_cpu"] = float(line.split()[2]), float(line.split()[3])
            elif line.startswith("model: ") and "parameters" in line and "start" not in marks:
                marks["start"] = now
            elif line.startswith("step 1/") and "first" not in marks:
                marks["first"] = now
                marks["first_cpu"] = cpu_seconds(proc.pid)
        code = proc.wait()
        sampler.stop.set()
        sampler.join()
        if code != 0 or "first" not in marks:
            sys.exit(f"bench_bigdata: pretrain failed on {run_folder} ({mode}), exit {code}:\n" + "".join(tail))
        trainer = sampler.peaks.pop(proc.pid)
        workers = list(sampler.peaks.values())
        biggest = max(workers, key=lambda p: p["anon"]) if workers else {}
        return {
            "imports": marks["imports"] - started,
            "start": marks["start"] - marks["imports"],
            "first": marks["first"] - marks["imports"],
            "first_cpu": marks["first_cpu"] - marks["imports_cpu"],
            "trainer_rss": trainer["rss"],
            "trainer_anon": trainer["anon"],
            "workers": len(workers),
            "worker_rss": biggest.get("rss", 0.0),
            "worker_anon": biggest.get("anon", 0.0),
            "worker_private": biggest.get("private", 0.0),
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


def tokens_of(run_folder: Path) -> int:
    import json

    splits = json.loads((run_folder / "data" / "manifest.json").read_text())["splits"]
    return sum(s["tokens"] for s in splits.values())


def warm(run_folder: Path) -> None:
    """Read the shards once, so that every mode finds them in the page cache."""
    for path in sorted((run_folder / "data").rglob("*.bin")):
        with open(path, "rb") as fh:
            while fh.read(1 << 24):
                pass


def corpus_of(name: str):
    """(the training corpus, the data settings) of a run folder, the bundled sample, or `mixed`."""
    from bertcli.config_load import preset_config
    from bertcli.data import load_data
    from bertcli.resolve import load_run

    if name == "mixed":
        import numpy as np

        from bertcli.data.corpus import Corpus, SpecialTokens

        rng = np.random.default_rng(0)
        short = np.ones(1_000_000, dtype=np.int64)  # one-sentence documents of 5-14 tokens, then
        long = rng.integers(20, 200, size=10_000)  # documents of 20-199 sentences of 30-59 tokens
        lengths = np.concatenate([rng.integers(5, 15, size=len(short)), rng.integers(30, 60, size=int(long.sum()))])
        seg = np.concatenate([[0], np.cumsum(lengths)])
        corpus = Corpus(
            np.full(int(seg[-1]), 5, dtype=np.uint16),
            seg,
            np.concatenate([[0], np.cumsum(np.concatenate([short, long]))]),
            100,
            SpecialTokens(),
        )
        return corpus, preset_config("tiny").data
    if name == "sample":
        folder = tempfile.mkdtemp(prefix="bench_bigdata.")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        cfg = preset_config("tiny", [f"data.prepared_dir={folder}"])
    else:
        cfg = load_run(Path(name) / "config.yaml")
    return load_data(cfg, quiet=True).train, cfg.data


def builder_speed(names: list[str]) -> None:
    from bertcli.data.examples import ExampleBuilder

    print("corpus  segments  first_batch_cpu_s  batches_per_cpu_s")
    for name in names:
        corpus, data = corpus_of(name)
        firsts, rates = [], []
        for _ in range(3):
            builder = ExampleBuilder(corpus, data, 64)
            start = time.process_time()
            builder.batch(42, 0, range(64))
            firsts.append(time.process_time() - start)
            start = time.process_time()
            for step in range(1, 61):
                builder.batch(42, step, range(64))
            rates.append(60 / (time.process_time() - start))
        print(f"{name}  {corpus.num_segments:,}  {min(firsts):.3f}  {max(rates):.1f}", flush=True)


def window_placement(names: list[str]) -> None:
    from bertcli.data.examples import ExampleBuilder

    print("corpus  segments  windows  positions  |chunks-positions|/positions  worst_window")
    for name in names:
        corpus, data = corpus_of(name)
        windows = ExampleBuilder(corpus, data, 64).windows
        if windows.num_windows == 1:
            print(f"{name}  {corpus.num_segments:,}  1  (one window: epoch 0's exact count)")
            continue
        starts = windows.window_slots(windows.order(42, 0, 0))
        off, worst = 0, 0.0
        for w in range(windows.num_windows):
            slots = int(starts[w + 1] - starts[w])
            miss = abs(len(windows.window(42, 0, 0, w).first) - slots)
            off, worst = off + miss, max(worst, miss / slots)
        print(
            f"{name}  {corpus.num_segments:,}  {windows.num_windows}  {int(starts[-1]):,}  {off / starts[-1]:.2%}  "
            f"{worst:.2%}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="run folders made by scripts/make_prepared.py (or sample)")
    parser.add_argument("--builder", action="store_true", help="the example builder's speed instead")
    parser.add_argument("--windows", action="store_true", help="the placement of the windows instead")
    parser.add_argument("--code", type=Path, default=REPO, help="folder holding the bertcli package to measure")
    parser.add_argument("--steps", type=int, default=20, help="train.max_steps of each run")
    parser.add_argument("--modes", default="w0,w2,eval", help="comma-separated: w0, w2 (wN: N data workers), eval")
    args = parser.parse_args()
    sys.path.insert(0, str(args.code.resolve()))  # the bertcli measured, here and in the pretrain processes
    if args.builder or args.windows:
        (builder_speed if args.builder else window_placement)(args.folders)
        return
    rows = []
    for folder in map(Path, args.folders):
        warm(folder)
        for mode in args.modes.split(","):
            r = measure(folder.resolve(), mode, args.steps, args.code.resolve())
            rows.append((f"{tokens_of(folder) / 1e6:,.0f}M", mode, r))
            print(f"{rows[-1][0]} {mode}: {r}", file=sys.stderr, flush=True)
    print(
        "tokens  mode  imports_s  start_s  first_step_s  first_step_cpu_s  trainer_rss_MiB  trainer_anon_MiB  "
        "workers  worker_rss_MiB  worker_anon_MiB  worker_private_MiB"
    )
    for tokens, mode, r in rows:
        print(
            f"{tokens:>6}  {mode:<4}  {r['imports']:9.1f}  {r['start']:7.1f}  {r['first']:12.1f}  {r['first_cpu']:16.1f}  "
            f"{r['trainer_rss']:15.0f}  {r['trainer_anon']:16.0f}  {r['workers']:7d}  {r['worker_rss']:14.0f}  "
            f"{r['worker_anon']:15.0f}  {r['worker_private']:18.0f}"
        )


if __name__ == "__main__":
    main()
