"""Micro-batches to the training process, built ahead by worker processes on GPUs, in order, pinned. Each item
(`examples.StepBatches`) is a function of (seed, step, rank), so building them ahead changes no bit of training.
"""

from __future__ import annotations

import multiprocessing

import torch

from bertcli.stopping import worker_ignores


def data_workers(device: torch.device, configured: int | None) -> int:
    """Example-building processes: on a GPU four keep the step fed (a BERT-base batch of 256 takes 40 ms on a
    core, longer than an H100 step); on a CPU they would take training's cores."""
    return configured if configured is not None else 4 if device.type == "cuda" else 0


def loader(dataset: torch.utils.data.Dataset, *, workers: int, pin_memory: bool) -> torch.utils.data.DataLoader:
    """Items in order, built a few ahead by `workers` forked processes and pinned for copies to the GPU."""
    fork = "fork" if workers and "fork" in multiprocessing.get_all_start_methods() else None
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        pin_memory=pin_memory,
        prefetch_factor=4 if workers else None,
        multiprocessing_context=fork,
        worker_init_fn=_worker_init,
    )


def _worker_init(worker_id: int) -> None:
    worker_ignores()  # the training process stops gracefully, its workers with it
