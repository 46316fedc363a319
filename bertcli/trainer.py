"""The pretraining loop.

One function, `pretrain`, reads top to bottom: set up, maybe resume, then for each step
build the step's examples (a pure function of seed and step), run forward/backward over the
micro-batches, clip, step the optimizer; every `log_every` steps log, every `save_every`
steps save. A step whose gradients are not finite is skipped and counted; too many in a row
stop the run. The only host-device syncs are at log, evaluation and save steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from bertcli import __version__, atomic, checkpoint, hf, runtime
from bertcli.config import Config, TrainConfig, resolve_output_dir, to_dict
from bertcli.data import Corpus, load_data
from bertcli.data.examples import IGNORE, Batch, ExampleBuilder, StepBatches
from bertcli.errors import Interrupted, RunError, UsageError
from bertcli.metrics import MetricsLogger, log
from bertcli.model import BertForPreTraining, PretrainingOutput, flops_per_token
from bertcli.optim import build_optimizer, lr_at, step_if_finite


class Losses(NamedTuple):
    total: torch.Tensor  # () what backward() sees
    stats: torch.Tensor  # (7,) detached: total, mlm, nsp, mlm correct, mlm count, nsp correct, nsp count


def pretraining_loss(out: PretrainingOutput, batch: Batch, mlm_weight: float, nsp_weight: float,
                     nsp: bool = True, step_counts: torch.Tensor | None = None, world_size: int = 1) -> Losses:
    """mlm_weight * MLM cross-entropy (mean over real predictions) + nsp_weight * NSP cross-entropy.

    Padded prediction slots carry the label IGNORE, so they add nothing to the loss or to its
    denominator (the textbook's weighting bug cannot happen). Computed in fp32. Without
    sentence pairs (`nsp=False`) the NSP terms are zero. Without `step_counts` both terms are
    means over this batch. In training, `step_counts` is (2,): the real predictions and NSP rows of
    the whole optimizer step (every micro-batch, every process); each term is then this batch's
    sum over that count (times world_size, since DDP and FSDP average gradients over processes),
    so the gradients summed over the step's micro-batches and processes are exactly those of one
    batch holding them all: accumulation and processes change nothing but float rounding.
    The stats are this batch's own means whatever the normalisation (what is logged).
    """
    V = out.mlm_logits.shape[-1]
    mlm_logits = out.mlm_logits.float().reshape(-1, V)  # (B*P, V)
    labels = batch.mlm_labels.reshape(-1)  # (B*P,)
    real = labels != IGNORE
    mlm_sum = F.cross_entropy(mlm_logits, labels, ignore_index=IGNORE, reduction="sum")
    mlm = mlm_sum / real.sum().clamp(min=1)  # this batch's mean (what is logged)
    nsp_logits = out.nsp_logits.float()
    nsp_rows = batch.nsp_labels != IGNORE
    nsp_sum = (F.cross_entropy(nsp_logits, batch.nsp_labels, ignore_index=IGNORE, reduction="sum") if nsp
               else mlm.new_zeros(()))
    nsp_loss = nsp_sum / nsp_rows.sum().clamp(min=1)
    if step_counts is None:
        total = mlm_weight * mlm + nsp_weight * nsp_loss
    else:
        counts = step_counts.clamp(min=1)
        total = mlm_weight * (mlm_sum * world_size / counts[0]) + nsp_weight * (nsp_sum * world_size / counts[1])
    with torch.no_grad():
        stats = torch.stack([
            mlm_weight * mlm.detach() + nsp_weight * nsp_loss.detach(), mlm.detach(), nsp_loss.detach(),
            ((mlm_logits.argmax(-1) == labels) & real).sum().float(), real.sum().float(),
            ((nsp_logits.argmax(-1) == batch.nsp_labels) & nsp_rows).sum().float(),
            nsp_rows.sum().float(),  # counted on the device: no host copy
        ])
    return Losses(total, stats)


def step_counts(batches: list[Batch]) -> torch.Tensor:
    """(2,) float: real MLM predictions and NSP rows in `batches`, counted where they are (no sync)."""
    return torch.stack([torch.stack([(b.mlm_labels != IGNORE).sum(), (b.nsp_labels != IGNORE).sum()])
                        for b in batches]).sum(0).float()


def metrics_from(stats: list[float], micro_steps: float, nsp: bool) -> dict[str, float]:
    """Averages from summed Losses.stats: losses per micro-batch, accuracies per prediction
    (NaN when every step of the window was skipped)."""
    micro_steps = micro_steps or math.nan
    metrics = {"loss": stats[0] / micro_steps, "mlm_loss": stats[1] / micro_steps,
               "mlm_acc": stats[3] / max(stats[4], 1.0)}
    if nsp:
        metrics.update(nsp_loss=stats[2] / micro_steps, nsp_acc=stats[5] / max(stats[6], 1.0))
    return metrics


@torch.no_grad()
def evaluate(model: BertForPreTraining, batches: list[Batch], rt: runtime.Runtime, tc: TrainConfig,
             nsp: bool) -> dict[str, float]:
    """MLM and NSP loss and accuracy on the fixed held-out batches (weighted by predictions)."""
    model.eval()
    sums = torch.zeros(5, device=rt.device)  # mlm loss*count, mlm correct, mlm count, nsp loss*rows, nsp correct
    rows = 0
    for batch in batches:
        batch = batch.to(rt.device)
        with rt.autocast():
            out = model(batch.input_ids, batch.token_type_ids, batch.valid_lens, batch.pred_positions)
        s = pretraining_loss(out, batch, tc.mlm_weight, tc.nsp_weight, nsp).stats
        sums += torch.stack([s[1] * s[4], s[3], s[4], s[2] * s[6], s[5]])
        rows += len(batch.nsp_labels)
    model.train()
    if rt.distributed:  # every process evaluated the same batches: averaging makes their figures, and so the
        rt.all_reduce_sum(sums).div_(rt.world_size)  # best-checkpoint decision (a collective with FSDP), identical
    mlm_loss_sum, mlm_correct, mlm_count, nsp_loss_sum, nsp_correct = sums.tolist()
    metrics = {"mlm_loss": mlm_loss_sum / mlm_count, "mlm_acc": mlm_correct / mlm_count,
               "perplexity": math.exp(min(mlm_loss_sum / mlm_count, 50.0))}
    if nsp:
        metrics.update(nsp_loss=nsp_loss_sum / rows, nsp_acc=nsp_correct / rows)
    return metrics


def most_frequent_token_accuracy(train: Corpus, batches: list[Batch]) -> float:
    """MLM accuracy on `batches` of always predicting the most frequent regular token of the
    training corpus: the bar a model must clear to have learned anything beyond unigrams."""
    sample = np.asarray(train.tokens[: 50_000_000], dtype=np.int64)  # plenty to find the top token
    counts = np.bincount(sample, minlength=train.vocab_size)
    counts[[train.special.pad, train.special.unk, train.special.cls, train.special.sep, train.special.mask]] = 0
    top = int(counts.argmax())
    labels = torch.cat([b.mlm_labels[b.mlm_labels != IGNORE] for b in batches])
    return float((labels == top).float().mean())


def resolve_vocab(cfg: Config, vocab_size: int, source: str) -> Config:
    """model.vocab_size from the tokenizer (null), or checked against it."""
    if cfg.model.vocab_size is None:
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab_size))
    if cfg.model.vocab_size != vocab_size:
        raise UsageError(f"model.vocab_size={cfg.model.vocab_size} but the tokenizer of {source} has {vocab_size:,} "
                         "tokens; set model.vocab_size: null to take the size from the tokenizer")
    return cfg


def pretrain(cfg: Config, config_path: Path | None = None, resume: str = "auto", quiet: bool = False,
             stop_at: int | None = None) -> dict[str, Any]:
    """Train per `cfg` (until step `stop_at` if given: the schedule still follows max_steps);
    return the last logged metrics plus where the final checkpoint is."""
    output_dir = resolve_output_dir(cfg, config_path)
    rt = runtime.setup(cfg.train.device, cfg.precision)
    try:
        # Rank 0 locks output_dir for the whole run: a second pretrain on it refuses to start.
        with checkpoint.OutputLock(output_dir) if rt.is_main else contextlib.nullcontext(), StopOnSignal() as stopper:
            return _pretrain(cfg, config_path, resume, quiet, stop_at, output_dir, rt, stopper)
    finally:
        rt.close()


class StopOnSignal:
    """SIGINT and SIGTERM ask the loop to finish the current step, write a checkpoint and stop
    (exit 130 or 143); a second SIGINT stops at once (the last complete checkpoint stays valid)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        log(f"{signal.Signals(signum).name}: stopping after this step with a checkpoint (Ctrl-C again stops at once)")

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _pretrain(cfg: Config, config_path: Path | None, resume: str, quiet: bool, stop_at: int | None,
              output_dir: Path, rt: runtime.Runtime, stopper: StopOnSignal) -> dict[str, Any]:
    log_ = log if rt.is_main else (lambda message: None)  # only rank 0 speaks
    if rt.is_main:
        atomic.clean_leftovers(checkpoint.checkpoints_dir(output_dir))  # what a killed run was writing
        checkpoint.check_replaceable(output_dir, cfg.train.max_steps)  # refused now, not at a save hours later
    init_path = None
    if cfg.model.init_from:
        init_path = Path(cfg.model.init_from).expanduser()
        if not init_path.is_absolute() and config_path is not None:
            init_path = config_path.resolve().parent / init_path
        cfg = hf.adopt_imported(cfg, init_path)  # the architecture (and tokenizer) of the imported model
    checked = cfg.model.vocab_size is not None
    if checked:  # before the data too: a synthetic corpus is as large as the vocabulary
        runtime.check_memory(cfg.model, rt, cfg.train.parallel)
    if rt.is_main:
        data = load_data(cfg, config_path, quiet)  # prepares text corpora first when needed (cached)
    rt.barrier()
    if not rt.is_main:
        data = load_data(cfg, config_path, quiet=True)  # prepared by rank 0 by now
    cfg = resolve_vocab(cfg, data.vocab_size, cfg.data.corpus)
    if not checked:  # the size of the vocabulary came from the tokenizer
        runtime.check_memory(cfg.model, rt, cfg.train.parallel)
    resume_from = checkpoint.choose_resume(output_dir, resume, cfg, rt.is_main)
    if resume_from is not None and data.tokenizer_files:
        checkpoint.check_same_tokenizer(resume_from, data.tokenizer_files[0])
    processes = f"{rt.world_size} processes ({cfg.train.parallel})" if rt.distributed else "1 process"
    log_(f"bertcli {__version__}: {rt.describe()}; {processes}; output in {output_dir}")
    log_("resolved config:\n" + yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())
    output_dir.mkdir(parents=True, exist_ok=True)

    corpus, nsp = data.train, cfg.data.pairs
    tc = cfg.train
    builder = ExampleBuilder(corpus, cfg.data, tc.batch_size * tc.grad_accum_steps * rt.world_size)
    eval_batches: list[Batch] = []
    if data.valid is not None and tc.eval_every > 0:
        # A fixed held-out set: the same examples and masks at every evaluation.
        held_out = ExampleBuilder(data.valid, cfg.data, tc.eval_examples)  # one step of the EVAL stream
        eval_batches = [held_out.batch(tc.seed, 0, range(i, min(i + tc.batch_size, tc.eval_examples)), ExampleBuilder.EVAL)
                        for i in range(0, tc.eval_examples, tc.batch_size)]
        baseline = most_frequent_token_accuracy(corpus, eval_batches)
    torch.manual_seed(cfg.train.seed)
    model = BertForPreTraining(cfg.model)  # on the CPU; with FSDP only each process's shards reach the device
    step, tokens_seen, start_time_s = 0, 0, 0.0
    best = checkpoint.best_eval_loss(output_dir)
    if init_path is not None and resume_from is None:
        fresh = hf.init_from(model, init_path)
        log_(f"initialised from {init_path}" + (f"; not in it, so trained from scratch: {', '.join(fresh)}" if fresh else ""))
    if resume_from is not None:
        checkpoint.load_weights(model, resume_from)
    train_model = runtime.parallelize(model, rt, tc.parallel, every_parameter_used=nsp, compile=tc.compile)
    optimizer = build_optimizer(model, cfg.optimizer, fused=rt.device.type == "cuda")
    scaler = rt.grad_scaler(cfg.precision)
    if resume_from is not None:
        step = checkpoint.load_training_state(resume_from, model, optimizer, scaler, rt.device)
        state = checkpoint.read_trainer_state(resume_from)
        tokens_seen, start_time_s = int(state.get("tokens_seen", 0)), float(state.get("train_time_s", 0.0))
        log_(f"resuming from {resume_from} (step {step})")
    n_params = sum(p.numel() for p in model.parameters())
    log_(f"model: {n_params:,} parameters; corpus: {corpus.num_documents:,} documents, {corpus.num_tokens:,} tokens")

    B, A, W = tc.batch_size, tc.grad_accum_steps, rt.world_size
    last_step = min(tc.max_steps, stop_at or tc.max_steps)
    if resume_from is not None and step >= last_step:  # already there (or past it): nothing to train
        limit = f"--stop-at {stop_at}" if stop_at is not None and stop_at < tc.max_steps else f"train.max_steps={tc.max_steps}"
        log_(f"nothing to do: {resume_from} is already at step {step}, at or past {limit}; raise it to train further")
        return {"step": step, "tokens_seen": tokens_seen, "checkpoint": str(resume_from),
                "metrics": checkpoint.read_trainer_state(resume_from).get("metrics") or {}, "is_main": rt.is_main}
    logger = MetricsLogger(output_dir, step, tc.max_steps, cfg.logging.tensorboard, quiet) if rt.is_main else None
    peak = runtime.peak_tflops(rt.device, cfg.logging.peak_tflops)
    tokens_since_start = 0  # this process's, summed over processes when saved
    stats = torch.zeros(7, device=rt.device)  # summed over the applied steps' micro-batches since the last log
    step_stats = torch.zeros(7, device=rt.device)  # this step's, added to `stats` unless the step is skipped
    skipped = torch.zeros((), device=rt.device)  # steps skipped (non-finite) since the last log
    nonfinite_run = torch.zeros((), device=rt.device)  # skipped steps in a row, up to this one
    window_tokens, window_start, window_step = 0, time.perf_counter(), step
    start_tokens = tokens_seen
    run_start, last_metrics, last_saved = time.perf_counter(), {}, None
    if rt.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rt.device)
    pin = rt.device.type == "cuda"
    unpad, why_not = runtime.unpadded(tc.unpad, rt.device, cfg.model.attention_probs_dropout_prob,
                                      tc.batch_size * cfg.data.max_seq_length, rt.precision)
    if why_not:
        log_(why_not)
    micro_batches = StepBatches(builder, tc.seed, step, last_step, B, A, rt.rank, W)
    batches = iter(runtime.loader(micro_batches, runtime.data_workers(rt.device, tc.data_workers), pin))
    model.train()
    try:
        while step < last_step:
            runtime.seed_step(tc.seed, step, rt.rank)  # dropout of this step: a function of (seed, step, rank)
            lr = lr_at(step, cfg.optimizer, tc.max_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            step_batches = []
            for _ in range(A):
                batch = next(batches)  # this process's share of one micro-batch of the step (pinned on GPUs)
                tokens = int(batch.valid_lens.sum())  # non-padding tokens, counted on the host copy: no sync
                tokens_since_start, window_tokens = tokens_since_start + tokens, window_tokens + tokens
                step_batches.append(batch.to(rt.device, non_blocking=pin))
            # The losses are means over the whole step (all micro-batches, all processes): count its
            # predictions and NSP rows before the first backward (on the device, async under torchrun).
            denominators = rt.all_reduce_sum(step_counts(step_batches))
            for micro, batch in enumerate(step_batches):
                with runtime.gradient_sync(train_model, micro == A - 1):  # reduced on the last micro-batch only
                    with rt.autocast():
                        out = train_model(batch.input_ids, batch.token_type_ids, batch.valid_lens, batch.pred_positions,
                                          batch.packed if unpad else None)
                    losses = pretraining_loss(out, batch, tc.mlm_weight, tc.nsp_weight, nsp, denominators, W)
                    scaler.scale(losses.total).backward()
                step_stats += losses.stats
            scaler.unscale_(optimizer)  # no-op unless fp16
            grad_norm = runtime.local(torch.nn.utils.clip_grad_norm_(model.parameters(), tc.max_grad_norm or float("inf")))
            finite = torch.isfinite(grad_norm)  # a NaN or inf loss makes the norm non-finite too
            step_if_finite(optimizer, scaler, finite)  # a skipped step changes nothing
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            # On the device, no sync: a skipped step adds nothing to the averages and extends the run.
            stats += torch.where(finite, step_stats, 0.0)
            step_stats.zero_()
            skipped += (~finite).float()
            nonfinite_run = torch.where(finite, 0.0, nonfinite_run + 1)
            step += 1
            if logger:
                logger.advance()

            # Every process reaches the blocks below at the same steps: their collectives match.
            at_log = step % cfg.logging.log_every == 0 or step == last_step
            saving = step % cfg.checkpoint.save_every == 0 or step == last_step
            evaluating = bool(eval_batches) and (step % tc.eval_every == 0 or step == last_step)
            # The run of skipped steps is read where the host syncs anyway (every step on a CPU,
            # where reading costs nothing); every process holds the same gradient norm.
            if at_log or saving or evaluating or rt.device.type == "cpu":
                run = int(nonfinite_run)
                if run >= tc.max_nonfinite_steps:
                    last_good = last_saved or resume_from
                    raise RunError(
                        f"step {step}: the loss or gradients were NaN or inf for {run} steps in a row (steps "
                        f"{step - run + 1}-{step}, skipped), so training stopped; the last checkpoint is "
                        f"{last_good or 'none yet'}; lower optimizer.lr or raise optimizer.warmup_steps (with fp16, try "
                        "bf16), or raise train.max_nonfinite_steps to skip more")
            stop_now = stopper.signum is not None and not rt.distributed  # a host flag: no device sync
            if rt.distributed and at_log:  # the processes agree on stopping where they sync anyway
                flag = torch.tensor([float(stopper.signum or 0)], device=rt.device)
                stop_now = float(rt.all_reduce_sum(flag)[0]) > 0
            if at_log:
                counts = rt.all_reduce_sum(torch.tensor([window_tokens], dtype=torch.float64, device=rt.device))
                rt.all_reduce_sum(stats)
                elapsed = time.perf_counter() - window_start
                micro_steps = (step - window_step) * A * W
                s_ = stats.tolist()  # the sync point
                n_skipped = int(skipped)
                last_metrics = metrics_from(s_, micro_steps - n_skipped * A * W, nsp)
                tokens_per_s = float(counts[0]) / max(elapsed, 1e-9)
                last_metrics.update(lr=lr, grad_norm=float(grad_norm), skipped_steps=n_skipped, tokens_per_s=tokens_per_s)
                if n_skipped:
                    log_(f"step {step}: skipped {n_skipped} step(s) of the last {step - window_step}: "
                         "loss or gradients NaN or inf")
                # Model FLOPs at the measured mean sequence length and share of tokens predicted.
                flops = flops_per_token(cfg.model, float(counts[0]) / (micro_steps * B), s_[4] / max(float(counts[0]), 1.0))
                last_metrics["model_tflops"] = tokens_per_s * flops / 1e12
                if peak:
                    last_metrics["mfu"] = last_metrics["model_tflops"] / (peak * W)
                if rt.device.type == "cuda":
                    last_metrics["peak_mem_gib"] = torch.cuda.max_memory_allocated(rt.device) / 2**30
                if logger:
                    logger.log(step, last_metrics)
                stats.zero_()
                skipped.zero_()
                window_tokens, window_start, window_step = 0, time.perf_counter(), step

            saving = saving or stop_now
            if not (saving or evaluating):
                continue
            seen = rt.all_reduce_sum(torch.tensor([tokens_since_start], dtype=torch.float64, device=rt.device))
            tokens_seen = start_tokens + int(seen[0])
            state = {"tokens_seen": tokens_seen, "train_time_s": start_time_s + time.perf_counter() - run_start,
                     "metrics": last_metrics}
            if evaluating:
                eval_start = time.perf_counter()
                state["eval_metrics"] = {**evaluate(model, eval_batches, rt, tc, nsp), "mlm_acc_baseline": baseline}
                if logger:
                    logger.log(step, state["eval_metrics"], split="eval")
                window_start += time.perf_counter() - eval_start  # keep evaluation out of tokens/s
            new_best = evaluating and (best is None or state["eval_metrics"]["mlm_loss"] < best)
            gathered = checkpoint.gather(model, optimizer) if saving or new_best else None  # every process: FSDP gathers
            if new_best:
                best = state["eval_metrics"]["mlm_loss"]
                if rt.is_main:
                    checkpoint.save(output_dir, step, gathered, scaler, cfg, state, cfg.checkpoint.keep_last,
                                    data.tokenizer_files, name=checkpoint.BEST)
            if saving and rt.is_main:
                last_saved = checkpoint.save(output_dir, step, gathered, scaler, cfg, state, cfg.checkpoint.keep_last,
                                             data.tokenizer_files)
            if stop_now:
                signum = stopper.signum or signal.SIGTERM
                raise Interrupted(f"stopped by {signal.Signals(signum).name} at step {step}; checkpoint {last_saved}; "
                                  "run the same command again to resume", signum)
    finally:
        del batches  # stops the worker processes
        if logger:
            logger.close()
    return {"step": step, "tokens_seen": tokens_seen, "checkpoint": str(last_saved), "metrics": last_metrics,
            "is_main": rt.is_main}
