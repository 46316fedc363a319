"""Where metrics go: output_dir/metrics.jsonl (one JSON object per log step), TensorBoard,
and a progress line on stderr (a tqdm bar on a terminal, one plain line per log step otherwise).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bertcli import atomic


def log(message: str) -> None:
    """A line for the user on stderr (stdout is for data)."""
    print(message, file=sys.stderr, flush=True)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl; a torn last line (crash mid-write) is skipped."""
    records = []
    if not Path(path).is_file():
        return records
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _short(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.3g}"


class MetricsLogger:
    def __init__(self, output_dir: Path, start_step: int, max_steps: int, tensorboard: bool, quiet: bool) -> None:
        self.jsonl_path = Path(output_dir) / "metrics.jsonl"
        # After a resume, drop what a crashed run logged past the checkpoint: those steps are redone.
        kept = [r for r in read_metrics(self.jsonl_path) if r.get("step", 0) <= start_step]
        atomic.write_text(self.jsonl_path, "".join(json.dumps(r) + "\n" for r in kept))
        self.jsonl = open(self.jsonl_path, "a", encoding="utf-8")
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when used

            self.writer = SummaryWriter(str(Path(output_dir) / "tensorboard"),
                                        purge_step=start_step + 1 if start_step else None)
        self.quiet, self.max_steps = quiet, max_steps
        self.bar = None
        if not quiet and sys.stderr.isatty():
            self.bar = tqdm(total=max_steps, initial=start_step, unit="step", file=sys.stderr, dynamic_ncols=True)

    def advance(self) -> None:
        """One optimizer step done (no device sync)."""
        if self.bar is not None:
            self.bar.update(1)

    def log(self, step: int, metrics: dict[str, float], split: str = "train") -> None:
        """One record: metrics.jsonl ({"step", "split", ...}), TensorBoard (split/key), the progress line."""
        record = {"step": step, "split": split, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(f"{split}/{key}", value, step)
            self.writer.flush()
        shown = {"loss": "loss", "mlm_loss": "mlm", "mlm_acc": "mlm_acc", "nsp_acc": "nsp_acc", "perplexity": "ppl",
                 "tokens_per_s": "tok/s"}
        summary = {label: (_short(metrics[k]) if k == "tokens_per_s" else f"{metrics[k]:.4g}")
                   for k, label in shown.items() if k in metrics}
        if self.bar is not None:
            if split == "train":
                self.bar.set_postfix(summary, refresh=True)
            else:
                self.bar.write(f"{split} at step {step}: " + ", ".join(f"{k} {v}" for k, v in summary.items()),
                               file=sys.stderr)
        elif not self.quiet:
            fields = " | ".join(f"{k} {v}" for k, v in summary.items())
            prefix = "step" if split == "train" else f"{split} at step"
            print(f"{prefix} {step}/{self.max_steps} | {fields}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
        self.jsonl.close()
