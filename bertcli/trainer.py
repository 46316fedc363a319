"""The loop: `pretrain` runs `build_run` (a `Run`), then `fit` (per step `train_step`, then `after_step`: log, evaluate,
save). A step's examples and dropout are a function of (seed, step), so resuming is exact; sums stay on the device."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from tokenizers import Tokenizer

from bertcli import __version__, checkpoint, console, hf_import, layout, parallel, resume, runtime, sizes, store
from bertcli.config import Config, TrainConfig, to_dict, with_vocab
from bertcli.console import info, log
from bertcli.data import Corpus, Dataset, load_data
from bertcli.data.examples import IGNORE, Batch, ExampleBuilder, StepBatches
from bertcli.data.loader import data_workers, loader
from bertcli.dropout import seed_step
from bertcli.encode import Encoder
from bertcli.errors import Interrupted, RunError
from bertcli.labeled import read_labeled
from bertcli.metrics import LossStats, MetricsLogger, MetricsWindow, peak_tflops
from bertcli.model import BertForPreTraining, PretrainingOutput
from bertcli.optim import build_optimizer, fused_adamw, lr_at, step_if_finite
from bertcli.probe import probe
from bertcli.stopping import Stopper, stopping

PERPLEXITY_CAP = 700.0  # the largest held-out loss shown as perplexity e^loss (e^709.78 overflows a float)
PROBE_FIGURES = ("accuracy", "macro_f1", "majority")  # the probe's figures logged at each evaluation


class Losses(NamedTuple):
    total: torch.Tensor  # () what backward() sees
    stats: LossStats  # detached, this batch's own figures


def pretraining_loss(
    out: PretrainingOutput,
    batch: Batch,
    mlm_weight: float,
    nsp_weight: float,
    nsp: bool = True,
    step_counts: torch.Tensor | None = None,
    world_size: int = 1,
) -> Losses:
    """mlm_weight * MLM + nsp_weight * NSP cross-entropy in fp32 (NSP 0 without `nsp`); IGNORE labels add nothing.
    With `step_counts` (2,), the step's over all processes, each term is sum / count x world_size (DDP averages)."""
    mlm_logits = out.mlm_logits.float().flatten(0, -2)  # (B*P, V)
    labels = batch.mlm_labels.reshape(-1)  # (B*P,)
    real = labels != IGNORE
    mlm_sum = F.cross_entropy(mlm_logits, labels, ignore_index=IGNORE, reduction="sum")
    mlm = mlm_sum / real.sum().clamp(min=1)
    nsp_logits = out.nsp_logits.float()
    nsp_rows = batch.nsp_labels != IGNORE
    nsp_sum = mlm.new_zeros(())
    if nsp:  # False for unpaired rows (no NSP labels) and models without an NSP head: nothing to compute
        nsp_sum = F.cross_entropy(nsp_logits, batch.nsp_labels, ignore_index=IGNORE, reduction="sum")
    nsp_loss = nsp_sum / nsp_rows.sum().clamp(min=1)
    if step_counts is None:
        total, shown = mlm_weight * mlm + nsp_weight * nsp_loss, (mlm, nsp_loss)
    else:
        counts = step_counts.clamp(min=1)
        total = mlm_weight * (mlm_sum * world_size / counts[0]) + nsp_weight * (nsp_sum * world_size / counts[1])
        shown = (mlm_sum / counts[0], nsp_sum / counts[1])
    with torch.no_grad():  # counted on the device: no host copy
        stats = LossStats(
            loss=mlm_weight * shown[0].detach() + nsp_weight * shown[1].detach(),
            mlm_loss=shown[0].detach(),
            nsp_loss=shown[1].detach(),
            mlm_correct=((mlm_logits.argmax(-1) == labels) & real).sum().float(),
            mlm_count=real.sum().float(),
            nsp_correct=((nsp_logits.argmax(-1) == batch.nsp_labels) & nsp_rows).sum().float(),
            nsp_count=nsp_rows.sum().float(),
        )
    return Losses(total, stats)


@torch.no_grad()
def evaluate(
    model: BertForPreTraining,
    batches: list[Batch],
    rt: runtime.Runtime,
    tc: TrainConfig,
    nsp: bool,
    stop: Callable[[], bool] = lambda: False,
) -> dict[str, float] | None:
    """MLM and NSP loss and accuracy on the held-out batches; None if `stop()` says so between two batches."""
    model.eval()
    sums = torch.zeros(5, device=rt.device)  # mlm loss*count, mlm correct, mlm count, nsp loss*rows, nsp correct
    rows = 0
    for host in batches:
        if stop():
            model.train()
            return None
        batch = host.to(rt.device)
        with rt.autocast():
            lens = batch.valid_lens if host.has_padding() else None
            out = model(batch.input_ids, batch.token_type_ids, lens, batch.pred_positions)
        s = pretraining_loss(out, batch, mlm_weight=tc.mlm_weight, nsp_weight=tc.nsp_weight, nsp=nsp).stats
        sums += torch.stack(
            [s.mlm_loss * s.mlm_count, s.mlm_correct, s.mlm_count, s.nsp_loss * s.nsp_count, s.nsp_correct]
        )
        rows += len(batch.nsp_labels)
    model.train()
    rt.all_reduce_sum(sums).div_(rt.world_size)  # the same batches everywhere: every process decides the same best
    mlm_loss_sum, mlm_correct, mlm_count, nsp_loss_sum, nsp_correct = sums.tolist()
    mlm = mlm_loss_sum / mlm_count
    metrics = {"mlm_loss": mlm, "mlm_acc": mlm_correct / mlm_count, "perplexity": math.exp(min(mlm, PERPLEXITY_CAP))}
    if nsp:
        metrics.update(nsp_loss=nsp_loss_sum / rows, nsp_acc=nsp_correct / rows)
    return metrics


def most_frequent_token_accuracy(train: Corpus, batches: list[Batch]) -> float:
    """MLM accuracy on `batches` of always predicting the training corpus's most frequent regular token."""
    counts = np.zeros(train.vocab_size, dtype=np.int64)
    end = min(train.num_tokens, 50_000_000)  # plenty to find the top token
    for lo in range(0, end, 1 << 20):  # in blocks: never an int64 copy of the 50M tokens (400 MB)
        block = np.asarray(train.tokens[lo : min(lo + (1 << 20), end)])
        counts += np.bincount(block, minlength=train.vocab_size)[: train.vocab_size]
    counts[[train.special.pad, train.special.unk, train.special.cls, train.special.sep, train.special.mask]] = 0
    labels = torch.cat([b.mlm_labels[b.mlm_labels != IGNORE] for b in batches])
    return float((labels == int(counts.argmax())).float().mean())


def pretrain(
    cfg: Config, resume: str = "auto", quiet: bool = False, stop_at: int | None = None, *, start: Start | None = None
) -> dict[str, Any]:
    """Train per resolved `cfg` until `stop_at` (the schedule follows max_steps); the last metrics and checkpoint."""
    rt = runtime.setup(cfg.train.device, cfg.precision)
    try:
        # Rank 0 locks output_dir for the whole run: a second pretrain (or a prepare) on it refuses to start.
        lock = store.run_lock(Path(cfg.output_dir)) if rt.is_main else contextlib.nullcontext()
        with console.quiet(quiet), lock, stopping("nothing half-written was kept (writes are atomic)") as stopper:
            last_step = min(cfg.train.max_steps, stop_at or cfg.train.max_steps)
            run = build_run(cfg, rt, resume, start or Start(quiet=quiet), last_step=last_step)
            result = run if isinstance(run, dict) else fit(run, last_step, stopper, quiet)
        # Together: a process that ended while rank 0 still saved would make torchrun SIGTERM rank 0 mid-save.
        rt.barrier()
        return result
    finally:
        rt.close()


def stop_asked(stopper: Stopper, rt: runtime.Runtime, at_log: bool) -> bool:
    """Whether to stop after this step: a host flag alone; under torchrun agreed at log steps (they sync anyway)."""
    if rt.distributed and at_log:
        return float(rt.all_reduce_sum(torch.tensor([float(stopper.signum or 0)], device=rt.device))[0]) > 0
    return not rt.distributed and stopper.signum is not None


@dataclasses.dataclass
class Run:
    """Everything `fit` trains with, built once by `build_run`."""

    cfg: Config  # resolved, model.vocab_size included
    split: sizes.Split  # a step's examples in micro-batches on this machine
    rt: runtime.Runtime
    data: Dataset
    model: BertForPreTraining  # the weights (on the CPU until parallelize moved or sharded them)
    train_model: torch.nn.Module  # what the step calls: the model, wrapped (DDP, FSDP) or compiled
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    unpad: bool  # the encoder runs on the real tokens only (runtime.unpadded)
    eval_batches: list[Batch]  # the fixed held-out set (empty: no evaluation)
    baseline_acc: float  # held-out MLM accuracy of always predicting the most frequent token
    probe: Callable[[], dict[str, Any]] | None  # eval.probe's figures of the model as it is now (None: no probe)
    checkpoints: checkpoint.CheckpointManager  # resumed from (resumed_from), saves the parts of the training state
    progress: checkpoint.Progress  # step, tokens seen and training time before this process started


@dataclasses.dataclass(frozen=True)
class Start:
    """What pretrain says as it starts (quiet, verbose) and the --set values it records (resume.write_settings)."""

    quiet: bool = False
    verbose: bool = False
    overrides: resume.Overrides = resume.Overrides([], [])


def build_run(cfg: Config, rt: runtime.Runtime, resume_arg: str, start: Start, *, last_step: int) -> Run | dict:
    """Data, model, optimizer and resumed state; at or past `last_step`, pretrain's result (before any model)."""
    output_dir, quiet = Path(cfg.output_dir), start.quiet
    for warning in cfg.warnings():
        log(f"warning: {warning}")
    if kept := start.overrides.kept:  # (said when quiet too: the config file says otherwise)
        log(f"continuing with this run's own --set values: {' '.join(kept)}; give --set KEY=VALUE again to change one")
    if rt.is_main:
        checkpoint.check_run_folder(output_dir, cfg.train.max_steps)
        checkpoint.remove_leftovers(layout.checkpoints_dir(output_dir))
    _check_sizes(cfg, rt)  # before the data, without a vocabulary yet: a lower bound
    resume_from = Path(resume_arg) if resume_arg not in ("auto", "never") else None
    data, tokenizer = _load_data(cfg, rt, quiet, resume_from)
    cfg = with_vocab(cfg, data.vocab_size, cfg.data.corpus, pad_id=data.train.special.pad)
    split = _check_sizes(cfg, rt)
    words = tokenizer.get(layout.TOKENIZER_JSON)
    chosen = resume.choose(cfg, resume_arg, is_main=rt.is_main, last_step=last_step, tokenizer=words)
    if chosen.path is not None and checkpoint.read_trainer_state(chosen.path)["step"] >= last_step:
        return _nothing_to_do(cfg, rt, chosen.path, last_step)
    output_dir.mkdir(parents=True, exist_ok=True)
    eval_batches, baseline = _held_out(cfg, data, split.micro)
    model, train_model, optimizer, scaler, unpad = _build_model(cfg, rt, fresh=chosen.path is None, micro=split.micro)
    probing = _probe(cfg, model, tokenizer)
    best, last = chosen.best, chosen.path
    checkpoints = checkpoint.CheckpointManager(cfg, is_main=rt.is_main, tokenizer=tokenizer, best=best, last=last)
    progress = checkpoints.restore(chosen.path, rt.device, model=model, optimizer=optimizer, scaler=scaler)
    if chosen.path is not None:
        cfg = checkpoints.cfg = _resumed(cfg, rt, chosen.path, step=progress.step, data=data, checkpoints=checkpoints)
    if rt.is_main:  # the settings it trains with: what a plain pretrain of the run continues, and inspect shows
        resume.write_settings(cfg, start.overrides)
    _say_start(cfg, rt, data, start, split=split, last_step=last_step)
    return Run(
        cfg=cfg,
        split=split,
        rt=rt,
        data=data,
        model=model,
        train_model=train_model,
        optimizer=optimizer,
        scaler=scaler,
        unpad=unpad,
        eval_batches=eval_batches,
        baseline_acc=baseline,
        probe=probing,
        checkpoints=checkpoints,
        progress=progress,
    )


def _build_model(
    cfg: Config, rt: runtime.Runtime, *, fresh: bool, micro: int
) -> tuple[BertForPreTraining, torch.nn.Module, torch.optim.Optimizer, torch.amp.GradScaler, bool]:
    """The model (model.init_from's weights if `fresh`), what the step calls, optimizer, scaler, and unpad."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    model = BertForPreTraining(cfg.model)  # on the CPU; with FSDP only each process's shards reach the device
    if cfg.model.init_from and fresh:
        _init_from(model, Path(cfg.model.init_from))
    pairs = cfg.data.pairs
    train_model = parallel.parallelize(model, rt, parallel=tc.parallel, every_parameter_used=pairs, compile=tc.compile)
    optimizer = build_optimizer(model, cfg.optimizer, fused=fused_adamw(rt.device))
    dropout, tokens = cfg.model.attention_probs_dropout_prob, micro * cfg.data.max_seq_length
    unpad, why_not = runtime.unpadded(
        tc.unpad, device=rt.device, precision=rt.precision, attention_dropout=dropout, micro_batch_tokens=tokens
    )
    if why_not:
        log(why_not)
    return model, train_model, optimizer, rt.grad_scaler(cfg.precision), unpad


def _check_sizes(cfg: Config, rt: runtime.Runtime) -> sizes.Split:
    """This machine's micro-batches; refuses a model or batch its memory cannot train, or a disk without room for a
    checkpoint."""
    sizes.check_memory(cfg.model, rt.placement(), cfg.train.parallel)
    split = sizes.check_batch(cfg, rt.placement())
    if rt.is_main:  # the process that writes checkpoints
        sizes.check_disk(cfg.model, Path(cfg.output_dir))
    if rt.distributed and cfg.train.micro_batch_size is None:  # one split for all: the smallest any device allows
        micro = torch.tensor([split.micro], device=rt.device)
        torch.distributed.all_reduce(micro, op=torch.distributed.ReduceOp.MIN)
        share = cfg.train.batch_size // rt.world_size
        split = dataclasses.replace(split, micro=int(micro), accum=share // int(micro))
    return split


def _say_start(
    cfg: Config, rt: runtime.Runtime, data: Dataset, start: Start, *, split: sizes.Split, last_step: int
) -> None:
    """What the run is, in a few lines (quiet: errors, warnings and the final summary only)."""
    if slow := runtime.slow_autocast(rt):
        log(f"warning: precision.mode={slow}; use fp32 (or auto) on this CPU")
    if start.quiet:
        return
    tc, m, opt, train, valid = cfg.train, cfg.model, cfg.optimizer, data.train, data.valid
    processes = f"{rt.world_size} processes ({tc.parallel})" if rt.distributed else "1 process"
    shape = f"{m.num_hidden_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads"
    held_out = f"{valid.num_documents:,} documents held out" if valid is not None else "none held out"
    micro = f"{split.accum} micro-batch(es) of {split.micro:,} on each of {rt.world_size} process(es)"
    until = f", stopping at {last_step:,}" if last_step < tc.max_steps else ""
    every = f"evaluation every {tc.eval_every:,}" if tc.eval_every and valid is not None else "no evaluation"
    log(f"bertcli {__version__}: {rt.describe()}; {processes}")
    log(f"model: {shape}, vocabulary {m.vocab_size:,}: {sizes.parameter_count(m):,} parameters")
    log(f"data: {cfg.data.corpus}: {train.num_documents:,} documents, {train.num_tokens:,} tokens; {held_out}")
    log(f"batch: {tc.batch_size:,} sequences a step of up to {cfg.data.max_seq_length} tokens: {micro} ({split.why})")
    schedule = f"learning rate {opt.lr:g}, {opt.warmup_steps:,} warmup, {opt.schedule}"
    log(f"steps: {tc.max_steps:,}{until}; {schedule}; {every}, a checkpoint every {cfg.checkpoint.save_every:,}")
    log(f"output: {cfg.output_dir}; the whole config: {Path(cfg.output_dir) / layout.RUN_SETTINGS}")
    if start.verbose:
        log("resolved config:\n" + yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())


def _init_from(model: BertForPreTraining, source: Path) -> None:
    """A fresh run's weights from model.init_from: a bertcli checkpoint, or a Hugging Face folder."""
    if layout.identify(source).kind is layout.Kind.CHECKPOINT:
        from bertcli.export import described

        checkpoint.load_weights(model, source)
        info(f"initialised from {described(source)}")  # its step: a run's best moves
    elif fresh := hf_import.load_into(model, source):  # a caveat, said when quiet too
        log(f"initialised from {source}; not in it, so trained from scratch: {', '.join(fresh)}")
    else:
        info(f"initialised from {source}")


def _resumed(
    cfg: Config, rt: runtime.Runtime, path: Path, step: int, data: Dataset, checkpoints: checkpoint.CheckpointManager
) -> Config:
    """Say what resuming `path` changes; return cfg with the checkpoint's tokenizer settings (those in use)."""
    saved, trainer = checkpoint.read_config(path), checkpoint.read_trainer_state(path)
    recorded = trainer.get("examples_per_step")
    batches = (recorded if isinstance(recorded, int) else None, cfg.train.batch_size)
    then, now = trainer.get(checkpoint.PREPARED_DATA), data.identity
    for line in resume.differences(saved, cfg, step=step, where=path.name, batches=batches, then=then, now=now):
        log(line)
    if checkpoints.best is not None and resume.best_of_other_set(Path(cfg.output_dir), cfg, data.identity):
        checkpoints.best = None
        best = layout.checkpoints_dir(Path(cfg.output_dir)) / layout.BEST
        log(f"{best} is replaced at this run's next evaluation: its {cfg.checkpoint.best_metric} was of the set before")
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=saved.data.tokenizer))


def _load_data(
    cfg: Config, rt: runtime.Runtime, quiet: bool, resume_from: Path | None = None
) -> tuple[Dataset, dict[str, bytes]]:
    """The data and its tokenizer's files (name -> bytes), rank 0 preparing it first, all under the prepared lock."""
    from bertcli.data.prepare import prepared_lock

    text = cfg.data.corpus != "synthetic"
    lock = prepared_lock(cfg) if rt.is_main and text else contextlib.nullcontext()

    def vocab_check(vocab_size: int) -> None:  # the disk's room for a checkpoint, before the corpus is tokenized
        sizes.check_disk(dataclasses.replace(cfg.model, vocab_size=vocab_size), Path(cfg.output_dir))

    with lock:
        if rt.is_main:
            run_tokenizer = resume.run_tokenizer(cfg, resume_from, say=True)
            data = load_data(cfg, quiet, run_tokenizer=run_tokenizer, vocab_check=vocab_check)
        rt.barrier()
        if not rt.is_main:
            data = load_data(cfg, quiet=True)
        # Read once: every checkpoint holds the bytes of the ids trained on, whatever happens to the folder.
        fix = "remove the link, then run the same command again"
        tokenizer = {path.name: store.read_own(path, fix) for path in data.tokenizer_files}
        if text:
            rt.barrier()  # every process has read the folder: rank 0 may let it go
    return data, tokenizer


def _probe(cfg: Config, model: BertForPreTraining, tokenizer: dict[str, bytes]) -> Callable[[], dict] | None:
    """eval.probe of `model`'s weights now: labeled data read once, fp32 vectors at the length trained."""
    if not cfg.eval.probe:
        return None
    train = read_labeled(Path(cfg.eval.probe), flag="eval.probe")
    test = read_labeled(Path(cfg.eval.probe_test), flag="eval.probe_test") if cfg.eval.probe_test else None
    words = Tokenizer.from_str(tokenizer[layout.TOKENIZER_JSON].decode("utf-8"))
    device = next(model.parameters()).device
    enc = Encoder(model, words, runtime.Runtime(device, "fp32"), trained_length=cfg.data.max_seq_length)
    return functools.partial(probe, enc, tokenizer=None, train=train, test=test, seed=cfg.train.seed)


def _held_out(cfg: Config, data: Dataset, size: int) -> tuple[list[Batch], float]:
    """The fixed held-out batches of `size` and the most-frequent-token accuracy on them ([] without evaluation)."""
    tc = cfg.train
    if data.valid is None or tc.eval_every == 0:
        return [], math.nan
    held_out = ExampleBuilder(data.valid, cfg.data, tc.eval_examples)  # one step of the EVAL stream
    n = tc.eval_examples
    batches = [held_out.batch(tc.seed, 0, range(i, min(i + size, n)), ExampleBuilder.EVAL) for i in range(0, n, size)]
    return batches, most_frequent_token_accuracy(data.train, batches)


class NonFiniteGuard:
    """Steps skipped in a row for NaN or inf gradients, counted on the device and read where the host syncs anyway."""

    def __init__(self, limit: int, device: torch.device) -> None:
        self.limit = limit
        self.in_a_row = torch.zeros((), device=device)
        self.loss_finite = torch.ones((), dtype=torch.bool, device=device)  # the last step's loss

    def update(self, finite: torch.Tensor, loss_finite: torch.Tensor) -> None:
        self.in_a_row = torch.where(finite, 0.0, self.in_a_row + 1)
        self.loss_finite = loss_finite

    def check(self, step: int, last_checkpoint: Path | None, *, last: bool) -> None:
        """Stop at `limit` skipped steps in a row, and at the `last` step where the loss is NaN or inf."""
        run, saved = int(self.in_a_row), last_checkpoint or "none yet"
        if run >= self.limit:
            why, fix = f"loss or gradients NaN or inf {run} steps in a row", "train.max_nonfinite_steps"
        elif last and run and not bool(self.loss_finite):
            steps = f"the last {run} steps (steps {step - run + 1}-{step})"
            why, fix = f"the model's loss is NaN or inf, so {steps} were skipped", "optimizer.warmup_steps"
        else:
            return
        raise RunError(f"step {step}: {why}; last checkpoint {saved}; lower optimizer.lr or raise {fix}")


@dataclasses.dataclass
class Loop:
    """What the loop keeps between steps (the logger: rank 0 only)."""

    window: MetricsWindow
    guard: NonFiniteGuard
    logger: MetricsLogger | None
    metrics: dict[str, float]
    start: float
    tokens_seen: int

    def log(self, step: int, rt: runtime.Runtime, lr: float, grad_norm: torch.Tensor) -> dict[str, float]:
        """The window's figures, logged (a collective: every process reads the window)."""
        self.metrics = self.window.read(step, rt, lr, grad_norm)
        if self.logger:
            self.logger.log(step, self.metrics)
        return self.metrics


def _start_loop(run: Run, quiet: bool, last_step: int) -> Loop:
    """The loop's state at run.progress.step: an empty window, no step skipped, the logger on rank 0."""
    cfg, rt, step = run.cfg, run.rt, run.progress.step
    window = MetricsWindow(rt.device, step, cfg, peak_tflops=peak_tflops(rt.device, cfg.logging.peak_tflops))
    logger = None
    if rt.is_main:
        own, tb = not resume.is_foreign(run.checkpoints.last_saved, Path(cfg.output_dir)), cfg.logging.tensorboard
        logger = MetricsLogger(cfg.output_dir, step, cfg.train.max_steps, tb, quiet=quiet, own=own, end=last_step)
    if rt.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rt.device)
    guard = NonFiniteGuard(cfg.train.max_nonfinite_steps, rt.device)
    return Loop(window, guard, logger, {}, start=time.perf_counter(), tokens_seen=run.progress.tokens_seen)


def fit(run: Run, last_step: int, stopper: Stopper, quiet: bool) -> dict[str, Any]:
    """Train to `last_step` (a stop signal: to the end of the step, saved); the last metrics and checkpoint."""
    step = run.progress.step
    loop = _start_loop(run, quiet, last_step)
    batches = _train_batches(run, first_step=step, last_step=last_step)
    run.model.train()
    try:
        with stopper.until("after_step"):
            while step < last_step:
                lr, grad_norm = train_step(run, step, batches=batches, window=loop.window, guard=loop.guard)
                step += 1
                if loop.logger:
                    loop.logger.advance()
                if after_step(run, loop, step, last_step, stopper=stopper, lr=lr, grad_norm=grad_norm):
                    run.rt.barrier()  # every process stopped at this step, its checkpoint written
                    signum = stopper.signum or signal.SIGTERM
                    name, saved = signal.Signals(signum).name, run.checkpoints.last_saved
                    said = f"stopped by {name} at step {step}; checkpoint {saved}; run the same command again to resume"
                    raise Interrupted(said, signum)
    finally:
        del batches  # stops the worker processes
        if loop.logger:
            loop.logger.close()
    return _result(step, loop.tokens_seen, ckpt=run.checkpoints.last_saved, metrics=loop.metrics, rt=run.rt)


def _result(step: int, tokens_seen: int, ckpt: Path | None, metrics: dict, rt: runtime.Runtime) -> dict[str, Any]:
    return dict(step=step, tokens_seen=tokens_seen, checkpoint=str(ckpt), metrics=metrics, is_main=rt.is_main)


def after_step(
    run: Run, loop: Loop, step: int, last_step: int, *, stopper: Stopper, lr: float, grad_norm: torch.Tensor
) -> bool:
    """Log, evaluate, save where due after `step` (on every process alike: collectives match); whether to stop."""
    cfg, rt, tc, checkpoints = run.cfg, run.rt, run.cfg.train, run.checkpoints
    at_log = step % cfg.logging.log_every == 0 or step == last_step
    saving = checkpoints.due(step, last_step)
    evaluating = bool(run.eval_batches) and (step % tc.eval_every == 0 or step == last_step)
    if at_log or saving or evaluating or rt.device.type == "cpu":  # at_log: the last step too
        loop.guard.check(step, checkpoints.last_saved, last=step == last_step)
    stop = stop_asked(stopper, rt, at_log)
    if at_log or stop:  # a stop logs its window too: the steps since the last log are in metrics.jsonl
        loop.log(step, rt, lr, grad_norm)
    if saving or evaluating or stop:
        state = _trainer_state(run, loop.window, loop.metrics, loop.start)
        loop.tokens_seen = state["tokens_seen"]
        if evaluating:
            # Alone, a signal ends the evaluation; under torchrun every process evaluates every batch (collectives).
            asked = (lambda: stopper.signum is not None) if not rt.distributed else (lambda: False)
            if (held_out := _evaluate(run, step, loop.window, loop.logger, stop=asked)) is not None:
                state["eval_metrics"] = held_out
            if asked() and not (at_log or stop):  # stopped during the evaluation: the step's window is logged too
                state["metrics"] = loop.log(step, rt, lr, grad_norm)
            stop = stop or asked()
        checkpoints.save(step, state, periodic=saving or stop)
    return stop


def _nothing_to_do(cfg: Config, rt: runtime.Runtime, resumed_from: Path, last_step: int) -> dict[str, Any]:
    """pretrain's result for a run resumed at or past `last_step`: the checkpoint's own, said."""
    state, tc = checkpoint.read_trainer_state(resumed_from), cfg.train
    step = state["step"]
    limit = f"the stop step asked for, {last_step}" if last_step < tc.max_steps else f"train.max_steps={tc.max_steps}"
    log(f"nothing to do: {resumed_from} is already at step {step}, at or past {limit}; raise it to train further")
    return _result(step, state.get("tokens_seen", 0), ckpt=resumed_from, metrics=state.get("metrics") or {}, rt=rt)


def _train_batches(run: Run, *, first_step: int, last_step: int) -> Iterator[Batch]:
    """This process's micro-batches of steps first_step+1 .. last_step: a function of (seed, step, rank)."""
    cfg, rt, tc = run.cfg, run.rt, run.cfg.train
    micro_batches = StepBatches(
        ExampleBuilder(run.data.train, cfg.data, tc.batch_size),
        seed=tc.seed,
        first_step=first_step,
        last_step=last_step,
        batch_size=run.split.micro,
        accum_steps=run.split.accum,
        rank=rt.rank,
        world_size=rt.world_size,
    )
    workers = data_workers(rt.device, tc.data_workers)
    return iter(loader(micro_batches, workers=workers, pin_memory=rt.device.type == "cuda"))


def train_step(
    run: Run, step: int, batches: Iterator[Batch], window: MetricsWindow, guard: NonFiniteGuard
) -> tuple[float, torch.Tensor]:
    """Optimizer step `step` over its micro-batches, skipped if gradients are not finite; (lr, grad norm)."""
    cfg, rt, tc = run.cfg, run.rt, run.cfg.train
    seed_step(tc.seed, step, rt.rank)  # dropout of this step: a function of (seed, step, rank)
    lr = lr_at(step, cfg.optimizer, tc.max_steps)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    step_batches, key_lens = [], []
    for _ in range(run.split.accum):
        batch = next(batches)  # this process's share of one micro-batch of the step (pinned on GPUs)
        window.add_tokens(int(batch.valid_lens.sum()))  # non-padding tokens, counted on the host copy: no sync
        step_batches.append(batch.to(rt.device, non_blocking=rt.device.type == "cuda"))
        key_lens.append(step_batches[-1].valid_lens if batch.has_padding() else None)  # (host copy) None: no mask
    # The losses are means over the whole step (micro-batches and processes): count before the first backward.
    counts = [torch.stack([(b.mlm_labels != IGNORE).sum(), (b.nsp_labels != IGNORE).sum()]) for b in step_batches]
    denominators = rt.all_reduce_sum(torch.stack(counts).sum(0).float())  # (2,): real MLM predictions, NSP rows
    step_sums = torch.zeros(len(LossStats._fields), device=rt.device)
    for micro, batch in enumerate(step_batches):
        with parallel.gradient_sync(run.train_model, micro == run.split.accum - 1):  # reduced on the last only
            with rt.autocast():
                packed = batch.packed if run.unpad else None
                out = run.train_model(
                    batch.input_ids, batch.token_type_ids, key_lens[micro], batch.pred_positions, packed=packed
                )
            weights = {"mlm_weight": tc.mlm_weight, "nsp_weight": tc.nsp_weight, "nsp": cfg.data.pairs}
            losses = pretraining_loss(out, batch, **weights, step_counts=denominators, world_size=rt.world_size)
            run.scaler.scale(losses.total).backward()
        step_sums += torch.stack(losses.stats)
    run.scaler.unscale_(run.optimizer)  # no-op unless fp16
    grad_norm = parallel.local(torch.nn.utils.clip_grad_norm_(run.model.parameters(), tc.max_grad_norm or float("inf")))
    finite = torch.isfinite(grad_norm)  # a NaN or inf loss makes the norm non-finite too
    step_if_finite(run.optimizer, run.scaler, finite)  # a skipped step changes nothing
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    window.add_step(step_sums, finite)  # on the device, no sync: a skipped step adds nothing to the averages
    guard.update(finite, torch.isfinite(step_sums).all())
    return lr, grad_norm


def _trainer_state(run: Run, window: MetricsWindow, metrics: dict[str, float], run_start: float) -> dict[str, Any]:
    """What a checkpoint's trainer_state.json records (tokens summed over processes: a collective)."""
    cfg, progress = run.cfg, run.progress
    seen = run.rt.all_reduce_sum(torch.tensor([window.tokens_since_start], dtype=torch.float64, device=run.rt.device))
    return {
        "tokens_seen": progress.tokens_seen + int(seen[0]),
        "train_time_s": progress.train_time_s + time.perf_counter() - run_start,
        "examples_per_step": cfg.train.batch_size,  # what a resume on other processes compares
        checkpoint.TRAINED_LENGTH: max(progress.trained_length, cfg.data.max_seq_length),  # a resume may shorten them
        "metrics": metrics,
        **({checkpoint.PREPARED_DATA: run.data.identity} if run.data.identity is not None else {}),
    }


def _evaluate(
    run: Run, step: int, window: MetricsWindow, logger: MetricsLogger | None, *, stop: Callable[[], bool]
) -> dict[str, float] | None:
    """Held-out metrics at `step`, logged; their time is kept out of tokens/s. None: `stop` said to stop."""
    start = time.perf_counter()
    held_out = evaluate(run.model, run.eval_batches, rt=run.rt, tc=run.cfg.train, nsp=run.cfg.data.pairs, stop=stop)
    metrics = None if held_out is None else {**held_out, "mlm_acc_baseline": run.baseline_acc}
    if metrics is not None and run.probe is not None:
        probed = run.probe()
        figures = torch.tensor([probed[key] for key in PROBE_FIGURES], dtype=torch.float64, device=run.rt.device)
        run.rt.all_reduce_sum(figures).div_(run.rt.world_size)  # (as evaluate's) every process decides alike
        metrics.update({f"probe_{key}": value for key, value in zip(PROBE_FIGURES, figures.tolist())})
    window.exclude(time.perf_counter() - start)
    if logger and metrics is not None:
        logger.log(step, metrics, split="eval")
    return metrics
