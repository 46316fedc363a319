"""Training metrics: a batch's `LossStats`, the sums between two log steps (`MetricsWindow`: tokens/s, MFU), and
where they go (`MetricsLogger`: metrics.jsonl, TensorBoard, a tqdm bar on a terminal, else a line on stderr)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tqdm import tqdm

from bertcli import console, layout, store
from bertcli.config import Config
from bertcli.sizes import flops_per_token

if TYPE_CHECKING:  # imported where tensors are made: inspect reads metrics.jsonl without torch
    import torch

# Dense bf16 matrix peak of known GPUs, TFLOP/s, for MFU (logging.peak_tflops overrides).
PEAK_BF16_TFLOPS = {"H100 SXM": 989.0, "H100 80GB HBM3": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.0}
PEAK_BF16_TFLOPS |= {"A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 125.0}  # matched by part: L40S before L4
MAX_RECORD_BYTES = 1 << 16  # a metrics record is a few hundred bytes: a longer line is damage, never kept whole
SHOWN = ("loss", "mlm_loss", "mlm_acc", "nsp_acc", "perplexity", "lr", "tokens_per_s")  # in the progress line
LABELS = {"mlm_loss": "mlm", "perplexity": "ppl", "tokens_per_s": "tok/s"}


class LossStats(NamedTuple):
    """What one batch's loss reports: 0-d tensors on the device (floats once summed and read)."""

    loss: Any  # mlm_weight * mlm_loss + nsp_weight * nsp_loss
    mlm_loss: Any  # mean over the batch's real predictions (in training: its share of the step's mean)
    nsp_loss: Any  # mean over the batch's NSP rows (0 without sentence pairs; in training: its share)
    mlm_correct: Any  # predictions right
    mlm_count: Any  # real predictions
    nsp_correct: Any  # NSP rows right
    nsp_count: Any  # NSP rows


def peak_tflops(device: torch.device, override: float) -> float | None:
    """The device's dense bf16 peak (TFLOP/s), None when unknown (CPUs, unlisted GPUs)."""
    import torch

    if override > 0 or device.type != "cuda":
        return override if override > 0 else None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


class MetricsWindow:
    """Figures between two log steps, summed on the device until `read` (the one sync point) averages them."""

    def __init__(self, device: torch.device, step: int, cfg: Config, *, peak_tflops: float | None) -> None:
        import torch

        self.device, self.batch_size = device, cfg.train.batch_size  # examples a step, all processes
        self.model, self.nsp, self.peak = cfg.model, cfg.data.pairs, peak_tflops
        self.sums = torch.zeros(len(LossStats._fields), device=device)  # LossStats summed over steps
        self.skipped = torch.zeros((), device=device)  # steps skipped (non-finite) in this window
        self.tokens = 0  # this process's non-padding tokens in this window
        self.tokens_since_start = 0  # and since this process started (saved, summed over processes)
        self.start_s, self.start_step = time.perf_counter(), step

    def add_tokens(self, count: int) -> None:
        self.tokens += count
        self.tokens_since_start += count

    def add_step(self, step_sums: torch.Tensor, finite: torch.Tensor) -> None:
        """One optimizer step's summed LossStats (stacked); a skipped step adds nothing but its count."""
        self.sums += step_sums.where(finite, 0.0)
        self.skipped += (~finite).float()

    def exclude(self, seconds: float) -> None:
        """Keep time spent on something else (evaluation) out of tokens/s."""
        self.start_s += seconds

    def read(self, step: int, rt: Any, lr: float, grad_norm: torch.Tensor) -> dict[str, float]:
        """The window's metrics, summed over processes (a collective: every process calls it)."""
        import torch

        tokens = float(rt.all_reduce_sum(torch.tensor([self.tokens], dtype=torch.float64, device=self.device))[0])
        rt.all_reduce_sum(self.sums)
        elapsed = time.perf_counter() - self.start_s
        s = LossStats(*self.sums.tolist())  # the sync point
        skipped = int(self.skipped)
        applied = (step - self.start_step - skipped) or math.nan  # steps whose losses are summed (NaN: all skipped)
        mlm_acc = s.mlm_correct / max(s.mlm_count, 1.0)
        metrics = {"loss": s.loss / applied, "mlm_loss": s.mlm_loss / applied, "mlm_acc": mlm_acc}
        if self.nsp:
            metrics.update(nsp_loss=s.nsp_loss / applied, nsp_acc=s.nsp_correct / max(s.nsp_count, 1.0))
        tokens_per_s = tokens / max(elapsed, 1e-9)
        metrics.update(lr=lr, grad_norm=float(grad_norm), skipped_steps=skipped, tokens_per_s=tokens_per_s)
        # Model FLOPs at the measured mean sequence length and share of tokens predicted.
        flops = flops_per_token(
            self.model, tokens / ((step - self.start_step) * self.batch_size), s.mlm_count / max(tokens, 1.0)
        )
        metrics["model_tflops"] = tokens_per_s * flops / 1e12
        if self.peak:
            metrics["mfu"] = metrics["model_tflops"] / (self.peak * rt.world_size)
        if self.device.type == "cuda":
            metrics["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self.sums.zero_()
        self.skipped.zero_()
        self.tokens, self.start_s, self.start_step = 0, time.perf_counter(), step
        return metrics


def read_metrics_checked(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """Records of a metrics.jsonl and, in words, its damaged lines (None: none but a torn last line, a crash's)."""
    records: list[dict[str, Any]] = []
    if not Path(path).is_file():
        return records, None
    bad: list[str] = []
    torn = False  # the last line read did not parse: dropped silently if it is the file's last
    with open(path, "rb") as fh:
        for number, line in enumerate(iter(lambda: fh.readline(MAX_RECORD_BYTES + 1), b""), 1):
            long = len(line) > MAX_RECORD_BYTES and not line.endswith(b"\n")
            while long and (rest := fh.readline(MAX_RECORD_BYTES)) and not rest.endswith(b"\n"):
                pass  # the rest of an over-long line, read and dropped
            try:
                record = None if long else json.loads(line.decode("utf-8", errors="replace"))
            except (ValueError, RecursionError):
                record = None
            torn = record is None and not long and bool(line.strip())
            if isinstance(record, dict) and type(record.get("step")) is int:
                records.append(record)
            elif line.strip():
                bad.append(str(number))
    if torn:
        bad.pop()
    if not bad:
        return records, None
    shown = ", ".join(bad[:5]) + (", ..." if len(bad) > 5 else "")
    return records, f"{path}: {len(bad)} damaged line(s) skipped (line {shown}): not JSON objects with a step"


def _keep_left_behind(path: Path, records: list[dict[str, Any]]) -> bool:
    """Append `records` to `path`, written whole; False, leaving it alone, where it is no file of bertcli's."""
    if store.file_problem(path) not in (None, "missing"):  # a link, a folder: not ours
        return False
    earlier, bad = read_metrics_checked(path)
    if bad:
        return False
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")  # when they were left out: histories left behind stay apart
    rows = earlier + [{**r, "left_behind": stamp} for r in records]
    store.write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return True


def _rewrite_history(path: Path, until: int) -> None:
    """Drop metrics.jsonl's records past `until` (-1: all), said, keeping them in metrics.left-behind.jsonl."""
    records, damaged = read_metrics_checked(path)
    if damaged:
        console.log(f"{damaged}; left out of the file from now on")
    kept = [r for r in records if r["step"] <= until]
    if dropped := [r for r in records if r["step"] > until]:
        steps = sorted({r["step"] for r in dropped})
        span = f" {steps[0]:,}" if len(steps) == 1 else f"s {steps[0]:,}-{steps[-1]:,}"
        why = f"past step {until:,}, where this run resumes" if until > 0 else "of a history this run does not continue"
        left = path.with_name(layout.METRICS_LEFT)
        kept_in = f"kept in {left}" if _keep_left_behind(left, dropped) else f"not kept ({left} is not bertcli's)"
        console.log(f"{path}: {len(dropped):,} record(s) of step{span} left out: {why}; {kept_in}")
    store.write_text(path, "".join(json.dumps(r) + "\n" for r in kept))


class MetricsLogger:
    """Rank 0's metrics to metrics.jsonl, TensorBoard, stderr; `own` False: no record there is the run's own."""

    def __init__(
        self, output: Path, step: int, max_steps: int, tensorboard: bool, quiet: bool, own: bool = True, end: int = 0
    ) -> None:
        self.jsonl_path = Path(output) / layout.METRICS
        _rewrite_history(self.jsonl_path, step if own else -1)
        self.jsonl = open(self.jsonl_path, "a", encoding="utf-8")
        self.writer = None
        self.tensorboard_dir = Path(output) / layout.TENSORBOARD
        self.event_files: list[Path] = []  # what this writer made: removed if the run fails before it logs
        self.made_tensorboard_dir, self.scalars_written = not self.tensorboard_dir.exists(), False
        if tensorboard:
            self._open_tensorboard((step + 1 if own else 1) if step else None)
        self.quiet, self.max_steps, self.end = quiet, max_steps, end or max_steps
        self.start_step, self.start = step, time.perf_counter()
        self.bar = None
        if not quiet and sys.stderr.isatty():
            self.bar = tqdm(total=max_steps, initial=step, unit="step", file=sys.stderr, dynamic_ncols=True)

    def _open_tensorboard(self, purge_step: int | None) -> None:
        before = set(self.tensorboard_dir.iterdir()) if self.tensorboard_dir.is_dir() else set()
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when used

        self.excepthook = threading.excepthook
        threading.excepthook = self._quiet_writer_thread
        try:
            with store.writing(self.tensorboard_dir):
                self.writer = SummaryWriter(str(self.tensorboard_dir), purge_step=purge_step)
            self.event_files = sorted(set(self.tensorboard_dir.iterdir()) - before)
        except BaseException:
            threading.excepthook = self.excepthook
            self.jsonl.close()
            raise

    def advance(self) -> None:
        """One optimizer step done (no device sync)."""
        if self.bar is not None:
            self.bar.update(1)

    def log(self, step: int, metrics: dict[str, float], split: str = "train") -> None:
        """One record: metrics.jsonl ({"step", "split", ...}), TensorBoard (split/key), the progress line."""
        record = {"step": step, "split": split, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        with store.writing(self.jsonl_path):
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        if self.writer is not None:
            with store.writing(self.tensorboard_dir):  # a failed write of its thread comes out here
                for key, value in metrics.items():
                    self.writer.add_scalar(f"{split}/{key}", value, step)
                self.writer.flush()
            self.scalars_written = True
        fields = [
            f"{LABELS.get(k, k)} {metrics[k]:{',.0f' if k == 'tokens_per_s' else '.4g'}}" for k in SHOWN if k in metrics
        ]
        if split == "train":  # the time so far, and left at this pace (evaluations included)
            elapsed = time.perf_counter() - self.start
            left = elapsed / max(step - self.start_step, 1) * max(self.end - step, 0)
            fields.append(f"{tqdm.format_interval(elapsed)} elapsed, ~{tqdm.format_interval(left)} left")
        line = f"{'step' if split == 'train' else split + ' at step'} {step}/{self.max_steps} | " + " | ".join(fields)
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        elif not self.quiet:
            console.log(line)

    def _quiet_writer_thread(self, args: Any) -> None:
        """TensorBoard's thread keeps quiet on a failed write (a full disk): the next flush reports it."""
        if type(args.thread).__name__ != "_AsyncWriterThread":
            self.excepthook(args)

    def close(self) -> None:
        leaving_on_error = sys.exc_info()[1] is not None  # then that error is the one to report, not a flush's
        try:
            if self.bar is not None:
                self.bar.close()
            if self.writer is not None:
                with store.writing(self.tensorboard_dir):
                    self.writer.close()
            with store.writing(self.jsonl_path):
                self.jsonl.close()
        except Exception:
            if not leaving_on_error:
                raise
        finally:
            self.jsonl.close()
            if self.writer is not None:
                threading.excepthook = self.excepthook
                if leaving_on_error and not self.scalars_written:
                    self._remove_event_files()

    def _remove_event_files(self) -> None:
        """A run that failed before its first log leaves no event file (a header only), nor a tensorboard/ it made."""
        with contextlib.suppress(OSError):
            for path in self.event_files:
                path.unlink()
            if self.made_tensorboard_dir:
                self.tensorboard_dir.rmdir()  # only when empty
