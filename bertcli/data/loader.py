"""Micro-batches to the training process: built ahead by worker processes on GPUs, in order, pinned.

Each item of the dataset (`examples.StepBatches`) is a pure function of (seed, step, rank), so
workers building them ahead change no bit of training.
"""

from __future__ import annotations

import multiprocessing
import signal

import torch

from bertcli.errors import STOP_SIGNALS


def data_workers(device: torch.device, configured: int | None) -> int:
    """Example-building processes: on a GPU four keep the step fed (a BERT-base batch of 256 takes 40 ms on a
    core, longer than an H100 step); on a CPU they would take training's cores."""
    if configured is not None:
        return configured
    return 4 if device.type == "cuda" else 0


def loader(dataset: torch.utils.data.Dataset, *, workers: int, pin_memory: bool) -> torch.utils.data.DataLoader:
    """Items in order, built by `workers` forked processes (which share the memory-mapped corpus)
    a few items ahead, and pinned for asynchronous copies to the GPU."""
    fork = "fork" if workers and "fork" in multiprocessing.get_all_start_methods() else None
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        pin_memory=pin_memory,
        prefetch_factor=4 if workers else None,
        multiprocessing_context=fork,
        worker_init_fn=_ignore_stop_signals,
    )


def _ignore_stop_signals(worker_id: int) -> None:
    """Stop signals reach the whole process group: the workers leave the graceful stop to the training process
    (which needs batches to finish its step) and end when it shuts the loader down, or dies."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
