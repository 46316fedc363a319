"""The pretraining loop.

One function, `pretrain`, reads top to bottom: set up, maybe resume, then for each step
build the step's examples (a pure function of seed and step), run forward/backward over the
micro-batches, clip, step the optimizer; every `log_every` steps log, every `save_every`
steps save. The only host-device syncs are at log steps.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
import yaml

from bertcli import __version__, atomic, checkpoint, runtime
from bertcli.config import Config, TrainConfig, resolve_output_dir, to_dict
from bertcli.data import Batch, ExampleBuilder, build_corpus
from bertcli.data.examples import IGNORE
from bertcli.metrics import MetricsLogger
from bertcli.model import BertForPreTraining, PretrainingOutput
from bertcli.optim import build_optimizer, lr_at


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Losses(NamedTuple):
    total: torch.Tensor  # () what backward() sees
    stats: torch.Tensor  # (7,) detached: total, mlm, nsp, mlm correct, mlm count, nsp correct, nsp count


def pretraining_loss(out: PretrainingOutput, batch: Batch, cfg: TrainConfig) -> Losses:
    """mlm_weight * MLM cross-entropy (mean over real predictions) + nsp_weight * NSP cross-entropy.

    Padded prediction slots carry the label IGNORE, so they add nothing to the loss or to its
    denominator (the textbook's weighting bug cannot happen). Computed in fp32.
    """
    V = out.mlm_logits.shape[-1]
    mlm_logits = out.mlm_logits.float().reshape(-1, V)  # (B*P, V)
    labels = batch.mlm_labels.reshape(-1)  # (B*P,)
    mlm = F.cross_entropy(mlm_logits, labels, ignore_index=IGNORE)
    nsp_logits = out.nsp_logits.float()
    nsp = F.cross_entropy(nsp_logits, batch.nsp_labels)
    total = cfg.mlm_weight * mlm + cfg.nsp_weight * nsp
    with torch.no_grad():
        real = labels != IGNORE
        stats = torch.stack([
            total.detach(), mlm.detach(), nsp.detach(),
            ((mlm_logits.argmax(-1) == labels) & real).sum().float(), real.sum().float(),
            (nsp_logits.argmax(-1) == batch.nsp_labels).sum().float(),
            (batch.nsp_labels >= 0).sum().float(),  # the row count, made on the device: no host copy
        ])
    return Losses(total, stats)


def pretrain(cfg: Config, config_path: Path | None = None, resume: str = "auto", quiet: bool = False,
             stop_at: int | None = None) -> dict[str, Any]:
    """Train per `cfg` (until step `stop_at` if given: the schedule still follows max_steps);
    return the last logged metrics plus where the final checkpoint is."""
    output_dir = resolve_output_dir(cfg, config_path)
    rt = runtime.setup(cfg.train.device, cfg.precision)
    atomic.clean_leftovers(checkpoint.checkpoints_dir(output_dir))  # what a killed run was writing
    resume_from = checkpoint.choose_resume(output_dir, resume, cfg)  # fails before any output
    log(f"bertcli {__version__}: {rt.describe()}; output in {output_dir}")
    log("resolved config:\n" + yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())
    output_dir.mkdir(parents=True, exist_ok=True)

    corpus = build_corpus(cfg)
    builder = ExampleBuilder(corpus, cfg.data)
    torch.manual_seed(cfg.train.seed)
    model = BertForPreTraining(cfg.model).to(rt.device)
    optimizer = build_optimizer(model, cfg.optimizer, fused=rt.device.type == "cuda")
    scaler = rt.grad_scaler(cfg.precision)
    step, tokens_seen, start_time_s = 0, 0, 0.0
    if resume_from is not None:
        checkpoint.load_weights(model, resume_from)
        step = checkpoint.load_training_state(resume_from, optimizer, scaler, rt.device)
        state = checkpoint.read_trainer_state(resume_from)
        tokens_seen, start_time_s = int(state.get("tokens_seen", 0)), float(state.get("train_time_s", 0.0))
        log(f"resuming from {resume_from} (step {step})")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters; corpus: {corpus.num_documents:,} documents, {corpus.num_tokens:,} tokens")

    tc = cfg.train
    B, A = tc.batch_size, tc.grad_accum_steps
    last_step = min(tc.max_steps, stop_at or tc.max_steps)
    logger = MetricsLogger(output_dir, step, tc.max_steps, cfg.logging.tensorboard, quiet)
    stats = torch.zeros(7, device=rt.device)  # summed over the micro-batches since the last log
    window_tokens, window_start = 0, time.perf_counter()
    run_start, last_metrics, last_saved = time.perf_counter(), {}, None
    if rt.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rt.device)
    pin = rt.device.type == "cuda"
    model.train()
    try:
        while step < last_step:
            runtime.seed_step(tc.seed, step)  # dropout of this step: a function of (seed, step)
            lr = lr_at(step, cfg.optimizer, tc.max_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for micro in range(A):
                batch = builder.batch(tc.seed, step, range(micro * B, (micro + 1) * B))
                tokens = int(batch.valid_lens.sum())  # non-padding tokens, counted on the host copy: no sync
                tokens_seen, window_tokens = tokens_seen + tokens, window_tokens + tokens
                batch = (batch.pin_memory() if pin else batch).to(rt.device, non_blocking=pin)
                with rt.autocast():
                    out = model(batch.input_ids, batch.token_type_ids, batch.valid_lens, batch.pred_positions)
                losses = pretraining_loss(out, batch, tc)
                scaler.scale(losses.total / A).backward()
                stats += losses.stats
            scaler.unscale_(optimizer)  # no-op unless fp16
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.max_grad_norm or float("inf"))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            logger.advance()

            if step % cfg.logging.log_every == 0 or step == last_step:
                s = stats.tolist()  # the sync point
                elapsed = time.perf_counter() - window_start
                micro_steps = s[6] / B
                last_metrics = {
                    "loss": s[0] / micro_steps, "mlm_loss": s[1] / micro_steps, "nsp_loss": s[2] / micro_steps,
                    "mlm_acc": s[3] / max(s[4], 1.0), "nsp_acc": s[5] / max(s[6], 1.0),
                    "lr": lr, "grad_norm": float(grad_norm), "tokens_per_s": window_tokens / max(elapsed, 1e-9),
                }
                if rt.device.type == "cuda":
                    last_metrics["peak_mem_gib"] = torch.cuda.max_memory_allocated(rt.device) / 2**30
                logger.log(step, last_metrics)
                stats.zero_()
                window_tokens, window_start = 0, time.perf_counter()

            if step % cfg.checkpoint.save_every == 0 or step == last_step:
                state = {"tokens_seen": tokens_seen, "train_time_s": start_time_s + time.perf_counter() - run_start,
                         "metrics": last_metrics}
                last_saved = checkpoint.save(output_dir, step, model, optimizer, scaler, cfg, state,
                                             cfg.checkpoint.keep_last)
    finally:
        logger.close()
    if last_saved is None and resume_from is not None:
        last_saved = resume_from  # nothing left to train: the run was already complete
        log(f"nothing to do: {resume_from} is already at step {step}")
    return {"step": step, "tokens_seen": tokens_seen, "checkpoint": str(last_saved), "metrics": last_metrics}
