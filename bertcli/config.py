"""The run configuration's schema: typed nested dataclasses, their impossible values (`problems()`), and the
presets. Each field's docstring is its YAML comment (`field_docs()`); loading is config_load, writing config_write."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import re
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal, Optional

from bertcli.errors import UsageError

Problem = tuple[str, str]  # ("train.max_steps", "must be at least 1, got 0"); types are checked before


def failing(checks: list[tuple[bool, str, str]]) -> list[Problem]:
    """(path, message) of every check (holds, path, message) that does not hold, in order."""
    return [(path, message) for holds, path, message in checks if not holds]


def at_least(path: str, value: float, low: float, why: str = "") -> tuple[bool, str, str]:
    return value >= low, path, f"{'must not be negative' if low == 0 else f'must be at least {low}'}{why}, got {value}"


def from_to(path: str, value: int, low: int, high: int, *, why: str = "") -> tuple[bool, str, str]:
    return low <= value <= high, path, f"must be from {low:,} to {high:,}{why}, got {value:,}"


def positive(path: str, value: float) -> tuple[bool, str, str]:
    return value > 0, path, f"must be positive, got {value}"


def within(path: str, value: float, low: float, high: float, *, ends: str = "[]") -> tuple[bool, str, str]:
    """The check that `value` lies between `low` and `high`, each end in or out as `ends` says ("[)": low in)."""
    holds = (low <= value if ends[0] == "[" else low < value) and (value <= high if ends[1] == "]" else value < high)
    return holds, path, f"must be in {ends[0]}{low:g}, {high:g}{ends[1]}, got {value}"


HiddenAct = Literal["gelu", "gelu_new", "gelu_pytorch_tanh", "relu"]
Parallel = Literal["ddp", "fsdp"]
Device = Literal["auto", "cpu", "cuda", "cuda:N"]  # "cuda:N": any index; the loader takes a string, problems() its form
DEVICE_NAMES = "auto, cpu, cuda or cuda:N"  # in words, for messages
PRECISIONS = ("fp32", "bf16", "fp16")  # resolved precisions; precision.mode adds auto
CORPUS_GLOBS = ("*.txt", "*.jsonl")  # data.include's default: the names read as corpus text


def is_device_name(name: str) -> bool:
    """Whether `name` is a Device: auto, cpu, cuda, or cuda:N with N a device index."""
    return name in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:[0-9]+", name) is not None


@cache
def torch_build() -> tuple[str, str] | None:
    """("cpu" or "gpu", version) of the installed PyTorch from torch/version.py, without importing it; else None."""
    try:
        spec = importlib.util.find_spec("torch")
        text = Path(spec.origin).with_name("version.py").read_text() if spec and spec.origin else ""
        values = {
            target.id: node.value.value
            for node in ast.parse(text).body
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant)
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        }
    except (OSError, ValueError, SyntaxError, ImportError):
        return None
    if "cuda" not in values:
        return None
    gpu = values.get("cuda") is not None or values.get("hip") is not None
    return ("gpu" if gpu else "cpu"), str(values.get("__version__", "unknown version"))


def check_gpu_build(name: str, what: str) -> None:
    """Refuse a CUDA device name with a CPU build of PyTorch, before torch is imported."""
    build = torch_build() if name.startswith("cuda") else None
    if build is not None and build[0] == "cpu":
        fix = f"use {what} cpu, or install a CUDA build of torch"
        raise UsageError(f"{what} {name!r}: the installed PyTorch ({build[1]}) is a CPU build, without CUDA; {fix}")


NAME_MAX, PATH_MAX = 255, 4096  # bytes of one file name, and of a whole path (Linux; macOS allows fewer)


def path_problem(value: str) -> str | None:
    """Why `value` can name no file here (None: it can), said before the system refuses it after work."""
    encoded = value.encode("utf-8", "surrogateescape")
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if "\0" in value:
        return "holds a NUL character, which no path can"
    if longest > NAME_MAX or len(encoded) > PATH_MAX:
        return f"is no usable path: {len(encoded):,} bytes, a name of {longest:,} (at most {NAME_MAX}, {PATH_MAX:,} in all)"
    return None


@dataclass
class ModelConfig:
    """The architecture; field names and meanings are Hugging Face `BertConfig`'s."""

    vocab_size: Optional[int] = None
    """Number of token ids (the tokenizer's size); null = take it from the tokenizer."""
    pad_vocab_multiple: int = 64
    """Pad embedding and decoder rows to a multiple of this, for speed (1 = none; never targets)."""
    init_from: str = ""
    """Start from these weights: a Hugging Face BERT folder or a bertcli checkpoint (empty = fresh)."""
    hidden_size: int = 768
    """Width of the embeddings and of every encoder layer."""
    num_hidden_layers: int = 12
    """Number of transformer encoder layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide hidden_size."""
    intermediate_size: int = 3072
    """Width of the feed-forward block inside each layer."""
    hidden_act: HiddenAct = "gelu"
    """Activation of the feed-forward block and the MLM head (relu = the d2l textbook)."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and on every residual branch."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention weights."""
    max_position_embeddings: int = 512
    """Longest sequence the learned position embeddings cover."""
    type_vocab_size: int = 2
    """Number of segment ids (2: sentence A and sentence B)."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of weights."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm."""
    pad_token_id: int = 0
    """Token id of [PAD]."""

    def layer_index(self, layer: int) -> int:
        """`layer` as a count of blocks run: 0 the embeddings' output, L the last block's, -1 = L, -(L+1) = 0."""
        L = self.num_hidden_layers
        index = layer if layer >= 0 else L + 1 + layer
        if not 0 <= index <= L:
            raise IndexError(f"layer {layer} out of range: the model has {L} layers (0 to {L}, or -1 to -{L + 1})")
        return index

    def pad_problem(self, pad_id: int, source: str) -> str | None:
        """Why pad_token_id is not `source`'s [PAD] id `pad_id` (None: it is): the padding row never learns."""
        if self.pad_token_id == pad_id:
            return None
        pad = f"[PAD] is token {pad_id} of the tokenizer of {source}"
        return f"model.pad_token_id={self.pad_token_id} but {pad}; set model.pad_token_id: {pad_id}"

    def problems(self) -> list[Problem]:
        m = self
        divides = m.hidden_size < 1 or m.num_attention_heads < 1 or m.hidden_size % m.num_attention_heads == 0
        pad = f"must be a token id below vocab_size={m.vocab_size}" if m.vocab_size else "must not be negative"
        heads = f"{m.hidden_size} is not divisible by model.num_attention_heads={m.num_attention_heads}"
        checks = [
            at_least("model.vocab_size", m.vocab_size or 8, 8, " (5 special tokens and some words)"),
            (0 <= m.pad_token_id < (m.vocab_size or 2**31), "model.pad_token_id", f"{pad}, got {m.pad_token_id}"),
            at_least("model.pad_vocab_multiple", m.pad_vocab_multiple, 1),
            positive("model.hidden_size", m.hidden_size),
            at_least("model.num_hidden_layers", m.num_hidden_layers, 1),
            at_least("model.num_attention_heads", m.num_attention_heads, 1),
            (divides, "model.hidden_size", heads),
            positive("model.intermediate_size", m.intermediate_size),
            within("model.hidden_dropout_prob", m.hidden_dropout_prob, 0, 1, ends="[)"),
            within("model.attention_probs_dropout_prob", m.attention_probs_dropout_prob, 0, 1, ends="[)"),
            positive("model.max_position_embeddings", m.max_position_embeddings),
            at_least("model.type_vocab_size", m.type_vocab_size, 2, " (segments A and B)"),
            positive("model.initializer_range", m.initializer_range),
            positive("model.layer_norm_eps", m.layer_norm_eps),
        ]
        return failing(checks)


MAX_SYNTHETIC_TOKENS = 20_000_000  # 100x the default's; generated token by token in Python (about 6 s, 440 MB)
MAX_BRANCHING = 1024  # successors per token: a table of vocab_size x branching ids


@dataclass
class SyntheticConfig:
    """A generated corpus with learnable structure: a seeded random Markov chain over the vocabulary."""

    num_documents: int = 2000
    """Documents in the generated corpus."""
    min_sentences: int = 2
    """Fewest sentences (segments) per document."""
    max_sentences: int = 12
    """Most sentences (segments) per document."""
    min_sentence_length: int = 4
    """Fewest tokens per sentence."""
    max_sentence_length: int = 24
    """Most tokens per sentence."""
    branching: int = 4
    """Successors each token can have in the chain (fewer = easier to learn)."""
    num_topics: int = 64
    """Vocabulary bands; each document stays in one (makes random next sentences detectable)."""
    seed: int = 1234
    """Seed of the generated corpus (independent of train.seed)."""

    def problems(self) -> list[Problem]:
        s, p, length_sum = self, "data.synthetic", self.min_sentence_length + self.max_sentence_length
        expected = s.num_documents * (s.min_sentences + s.max_sentences) * length_sum / 4  # both drawn uniformly
        size = f"about {expected:,.0f} tokens (num_documents x the mean sentences x the mean length); the synthetic corpus is for quick checks, of at most {MAX_SYNTHETIC_TOKENS:,}: lower them"
        lengths = f"need 1 <= min_sentence_length <= max_sentence_length, got {s.min_sentence_length} and {s.max_sentence_length}"
        sentences = f"need 1 <= min_sentences <= max_sentences, got {s.min_sentences} and {s.max_sentences}"
        checks = [
            at_least(f"{p}.num_documents", s.num_documents, 2, " (random next sentences need another document)"),
            (1 <= s.min_sentences <= s.max_sentences, f"{p}.min_sentences", sentences),
            (1 <= s.min_sentence_length <= s.max_sentence_length, f"{p}.min_sentence_length", lengths),
            (expected <= MAX_SYNTHETIC_TOKENS, p, size),
            from_to(f"{p}.branching", s.branching, 1, MAX_BRANCHING),
            at_least(f"{p}.num_topics", s.num_topics, 1),
            at_least(f"{p}.seed", s.seed, 0),
        ]
        return failing(checks)


@dataclass
class TokenizerConfig:
    path: str = ""
    """An existing tokenizer.json or BERT vocab.txt to use; empty = train one on the corpus (with model.init_from: that model's own, whose embeddings need its ids)."""
    vocab_size: int = 30522
    """Size of the vocabulary to train (the result can be smaller on a small corpus)."""
    min_frequency: int = 2
    """Fewest occurrences for a merged piece to enter the trained vocabulary."""
    lowercase: bool = True
    """Lower-case text before tokenizing (an 'uncased' model); a loaded tokenizer.json, or a vocab.txt with a tokenizer_config.json beside it, keeps its own."""
    strip_accents: bool = True
    """Remove accents before tokenizing (as lowercase: a loaded tokenizer keeps its own)."""
    sample_chars: int = 4_000_000
    """Characters of text that train the vocabulary: a larger corpus trains it on a sample of its lines from all over it (chosen by a hash of each line: the same in every run), so memory stays bounded (the trainer takes about 6 MB per million characters); 0 = the whole corpus."""

    def problems(self) -> list[Problem]:
        checks = [
            at_least("data.tokenizer.vocab_size", self.vocab_size, 16),
            at_least("data.tokenizer.min_frequency", self.min_frequency, 1),
            at_least("data.tokenizer.sample_chars", self.sample_chars, 0, " (0 = the whole corpus)"),
        ]
        return failing(checks)


@dataclass
class DataConfig:
    corpus: str = "sample"
    """sample (the bundled text), synthetic, or a text/JSONL file or folder (relative to this file)."""
    prepared_dir: str = "data"
    """Folder for the tokenizer and token shards made by `prepare`, relative to this file."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """The WordPiece tokenizer."""
    split_sentences: bool = True
    """Split lines into sentences (lines may be whole paragraphs)."""
    document: Literal["blank_line", "file"] = "blank_line"
    """What a document is in a text file: blank_line (a blank line ends one) or file (the whole file; an uncompressed file over 4 MiB: each part of about 4 MiB, cut at a blank line). A JSONL record is always one document."""
    include: list[str] = field(default_factory=lambda: list(CORPUS_GLOBS))
    """Globs of the files read in a corpus folder, matched without regard to case against each file's path in the folder and its name, with or without .gz, .bz2 or .xz; a file not named *.txt or *.jsonl is read where it holds UTF-8 text (README, NEWS.gz: ['*'] takes every such file), else skipped."""
    exclude: list[str] = field(default_factory=list)
    """Globs of the files left out of a corpus folder, matched as data.include's."""
    validation_fraction: float = 0.02
    """Share of documents held out for evaluation (whole documents; 0 = none)."""
    max_seq_length: int = 128
    """Tokens per example, [CLS] and [SEP]s included."""
    pairs: bool = True
    """Build [CLS] A [SEP] B [SEP] pairs for NSP; false = one span per example, documents packed into full rows with a [SEP] after each (RoBERTa's FULL-SENTENCES; needs train.nsp_weight 0)."""
    short_seq_prob: float = 0.1
    """Probability of a shorter target length for a sentence pair (Google BERT's short_seq_prob); rows without pairs are packed full."""
    random_next_prob: float = 0.5
    """Probability that sentence B comes from another document (NSP label 1)."""
    masked_lm_prob: float = 0.15
    """Share of non-special tokens chosen for MLM prediction."""
    max_predictions_per_seq: int = 20
    """Cap on the number of chosen tokens per example."""
    whole_word_mask: bool = False
    """Choose all the pieces of a word together."""
    mask_token_prob: float = 0.8
    """Of the chosen tokens, the share replaced by [MASK]."""
    random_token_prob: float = 0.1
    """Of the chosen tokens, the share replaced by a random token (the rest stay unchanged)."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    """Settings of the synthetic corpus (used when corpus is synthetic)."""

    def problems(self) -> list[Problem]:
        d, replaced = self, self.mask_token_prob + self.random_token_prob
        once = " (data.max_seq_length: a token is predicted at most once)"
        too_many = f"data.mask_token_prob + data.random_token_prob must be at most 1, got {replaced}"
        checks = [
            at_least("data.max_seq_length", d.max_seq_length, 5, " ([CLS] A [SEP] B [SEP])"),
            within("data.masked_lm_prob", d.masked_lm_prob, 0, 1, ends="()"),
            from_to("data.max_predictions_per_seq", d.max_predictions_per_seq, 1, max(d.max_seq_length, 1), why=once),
            within("data.mask_token_prob", d.mask_token_prob, 0, 1),
            within("data.random_token_prob", d.random_token_prob, 0, 1),
            within("data.random_next_prob", d.random_next_prob, 0, 1),
            (replaced <= 1.0 + 1e-9, "data.random_token_prob", too_many),
            (d.corpus.strip() != "", "data.corpus", "is empty; use sample, synthetic, or a text/JSONL file or folder"),
            within("data.validation_fraction", d.validation_fraction, 0, 0.5),
            within("data.short_seq_prob", d.short_seq_prob, 0, 1),
        ]
        return failing(checks) + d.tokenizer.problems() + d.synthetic.problems()


@dataclass
class TrainConfig:
    seed: int = 42
    """Seed of initialisation, data order, masks and dropout."""
    max_steps: int = 1_000_000
    """Optimizer steps to train for."""
    batch_size: int = 32
    """Examples per optimizer step over all processes (the recipe's batch; how a step splits is the machine's)."""
    micro_batch_size: Optional[int] = None
    """Examples a process runs forward and backward at once, a divisor of its share of the step; null = the largest
    that fits the device's memory (on a CPU a quarter of it), chosen where the run starts."""
    mlm_weight: float = 1.0
    """Weight of the masked-LM loss in the total loss."""
    nsp_weight: float = 1.0
    """Weight of the next-sentence loss in the total loss (0 turns NSP off)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value (0 = no clipping)."""
    max_nonfinite_steps: int = 20
    """A step with a NaN or inf loss or gradient is skipped (nothing changes); this many in a row stop the run."""
    device: Device = "auto"
    """Where to train: auto (CUDA when available), cpu, cuda or cuda:N."""
    data_workers: Optional[int] = None
    """Processes that build examples (pairs, masking) ahead of the step; null = 4 on GPUs, 0 on CPUs (their cores train)."""
    compile: bool = False
    """Run each encoder layer under torch.compile: faster steps on GPUs after a minute or two of compiling."""
    parallel: Parallel = "ddp"
    """Under torchrun: ddp (a whole model per process) or fsdp (FSDP2: parameters, gradients and optimizer state sharded)."""
    unpad: Optional[bool] = None
    """Run the encoder on the real tokens only, skipping padding (its attention has no dropout, so only with model.attention_probs_dropout_prob 0); null = on GPUs when that holds and a micro-batch has at least 16,384 token slots (where it pays)."""
    eval_every: int = 1000
    """Evaluate on the held-out examples every N steps (and at the end); 0 = never."""
    eval_examples: int = 512
    """Size of the fixed held-out example set (the same examples and masks every time)."""

    def problems(self) -> list[Problem]:
        t, workers = self, 0 if self.data_workers is None else self.data_workers
        processes = " or null (each is a process holding a copy of the example builder; 4 keep a GPU fed)"
        evaluated = " (each evaluation builds and runs them all)"
        checks = [
            at_least("train.seed", t.seed, 0),
            at_least("train.max_steps", t.max_steps, 1),
            at_least("train.eval_every", t.eval_every, 0, " (0 = never)"),
            from_to("train.eval_examples", t.eval_examples, 1, MAX_EVAL_EXAMPLES, why=evaluated),
            at_least("train.batch_size", t.batch_size, 1),
            at_least(
                "train.micro_batch_size", 1 if t.micro_batch_size is None else t.micro_batch_size, 1, " (or null)"
            ),
            (t.batch_size % (t.micro_batch_size or 1) == 0, "train.micro_batch_size", "must divide train.batch_size"),
            at_least("train.mlm_weight", t.mlm_weight, 0),
            at_least("train.nsp_weight", t.nsp_weight, 0),
            (t.mlm_weight > 0 or t.nsp_weight > 0, "train.mlm_weight", "is 0 as is train.nsp_weight: nothing to learn"),
            at_least("train.max_nonfinite_steps", t.max_nonfinite_steps, 1),
            at_least("train.max_grad_norm", t.max_grad_norm, 0, " (0 = no clipping)"),
            from_to("train.data_workers", workers, 0, MAX_DATA_WORKERS, why=processes),
            (is_device_name(t.device), "train.device", f"must be auto, cpu, cuda or cuda:N, got {t.device!r}"),
        ]
        return failing(checks)


@dataclass
class OptimizerConfig:
    lr: float = 1e-4
    """Peak learning rate, reached at the end of warm-up."""
    weight_decay: float = 0.01
    """Decoupled weight decay (never applied to biases and LayerNorm weights)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    eps: float = 1e-6
    """AdamW epsilon."""
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    """Decay after warm-up: linear, cosine or constant."""
    warmup_steps: int = 10_000
    """Steps of linear warm-up from 0 to lr."""
    min_lr_ratio: float = 0.0
    """Floor of the decay, as a share of lr (reached at max_steps, one step past the last update)."""

    def problems(self) -> list[Problem]:
        o = self
        decay = f"times optimizer.lr must be below 1 (each step scales the weights by 1 - lr x weight_decay: 0 or less zeroes or flips them), got {o.weight_decay:g} x {o.lr:g}; the usual value is 0.01"
        checks = [
            positive("optimizer.lr", o.lr),
            at_least("optimizer.weight_decay", o.weight_decay, 0),
            (o.lr * o.weight_decay < 1, "optimizer.weight_decay", decay),
            within("optimizer.beta1", o.beta1, 0, 1, ends="[)"),
            within("optimizer.beta2", o.beta2, 0, 1, ends="[)"),
            positive("optimizer.eps", o.eps),
            at_least("optimizer.warmup_steps", o.warmup_steps, 0),
            within("optimizer.min_lr_ratio", o.min_lr_ratio, 0, 1),
        ]
        return failing(checks)


@dataclass
class PrecisionConfig:
    mode: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """auto = bf16 on GPUs that support it, fp16 + loss scaling on older GPUs, fp32 on CPU (a CPU without bf16 or fp16 instructions emulates them, about 10x slower than fp32: pretrain warns)."""
    allow_tf32: bool = True
    """Let CUDA use TF32 matrix units for fp32 matrix products."""
    fp16_init_scale: float = 65536.0
    """Initial loss scale of the fp16 gradient scaler."""

    def problems(self) -> list[Problem]:
        return failing([positive("precision.fp16_init_scale", self.fp16_init_scale)])


@dataclass
class CheckpointConfig:
    save_every: int = 1000
    """Write a checkpoint every N steps (and always at the end)."""
    keep_last: int = 3
    """Keep only the newest N checkpoints."""
    best_metric: Literal["mlm_loss", "mlm_acc", "probe_accuracy", "probe_macro_f1"] = "mlm_loss"
    """The evaluation metric that chooses checkpoints/best: the held-out MLM loss (lowest) or accuracy, or the probe's (eval.probe) accuracy or macro-F1 (highest)."""

    def problems(self) -> list[Problem]:
        save_every = at_least("checkpoint.save_every", self.save_every, 1)
        return failing([save_every, at_least("checkpoint.keep_last", self.keep_last, 1)])


@dataclass
class EvalConfig:
    probe: str = ""
    """Labeled data for a linear probe on the model's pooled vectors (JSONL {"text", "label"} or TSV text<TAB>label), relative to the config file; empty = no probe."""
    probe_test: str = ""
    """Labeled data the probe is scored on; empty = a fixed fifth of eval.probe."""

    def problems(self) -> list[Problem]:
        return failing([(bool(self.probe) or not self.probe_test, "eval.probe_test", "is set but eval.probe is not")])


@dataclass
class LoggingConfig:
    log_every: int = 10
    """Log metrics every N steps (the only steps that wait for the GPU)."""
    tensorboard: bool = True
    """Write TensorBoard event files to output_dir/tensorboard/."""
    peak_tflops: float = 0.0
    """Device peak (dense bf16 TFLOP/s) for MFU; 0 = known GPUs' datasheet value, none on CPU."""

    def problems(self) -> list[Problem]:
        peak = at_least("logging.peak_tflops", self.peak_tflops, 0, " (0 = auto)")
        return failing([at_least("logging.log_every", self.log_every, 1), peak])


@dataclass
class Config:
    output_dir: str = "."
    """Folder for checkpoints, TensorBoard logs and metrics.jsonl, relative to the config file."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The architecture."""
    data: DataConfig = field(default_factory=DataConfig)
    """The corpus and example construction."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW and the learning-rate schedule."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Mixed precision."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Logging."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """The downstream probe."""

    def problems(self) -> list[Problem]:
        """Every impossible value: each section's, then the checks that read two sections."""
        m, d, t, e = self.model, self.data, self.train, self.eval
        sections = (m, d, t, self.optimizer, self.precision, self.checkpoint, self.logging, e)
        positions = f"{d.max_seq_length} is above model.max_position_embeddings={m.max_position_embeddings}"
        pairs = "is false (single spans, no sentence pairs) but train.nsp_weight is not 0: NSP needs pairs"
        synthetic = "the synthetic corpus has no tokenizer: set model.vocab_size (e.g. 1024)"
        probe = f"is {self.checkpoint.best_metric} but eval.probe is not set"
        probe_runs = "runs at each evaluation: set train.eval_every and data.validation_fraction above 0"
        checks = [
            (d.max_seq_length <= m.max_position_embeddings, "data.max_seq_length", positions),
            (d.corpus != "synthetic" or m.vocab_size is not None, "model.vocab_size", synthetic),
            (d.pairs or t.nsp_weight == 0, "data.pairs", pairs),
            (bool(e.probe) or not self.checkpoint.best_metric.startswith("probe"), "checkpoint.best_metric", probe),
            (not e.probe or d.corpus != "synthetic", "eval.probe", "needs a text corpus (a tokenizer)"),
            (not e.probe or t.parallel != "fsdp", "eval.probe", "runs under train.parallel ddp, not fsdp"),
            (not e.probe or (t.eval_every > 0 and d.validation_fraction > 0), "eval.probe", probe_runs),
        ]
        own, paths = [problem for section in sections for problem in section.problems()], flat(self)
        return own + failing(checks) + [(key, why) for key in PATH_KEYS if (why := path_problem(paths[key]))]

    def warnings(self) -> list[str]:
        """Values possible but likely not meant, a line each (not errors: a run may raise max_steps and resume)."""
        o, t = self.optimizer, self.train
        if o.warmup_steps <= t.max_steps:
            return []
        past = f"optimizer.warmup_steps={o.warmup_steps:,} is past train.max_steps={t.max_steps:,}"
        rises = f"the learning rate rises to {t.max_steps / o.warmup_steps:.0%} of optimizer.lr and never decays"
        return [f"{past}: {rises}; lower warmup_steps unless you mean to raise max_steps and resume"]


MAX_DATA_WORKERS = 64
MAX_EVAL_EXAMPLES = 100_000  # at 1e5 one evaluation of the tiny preset took 212-289 s on 2 cores


PRESETS: dict[str, dict[str, Any]] = {
    # What each differs from the defaults in. tiny: the d2l textbook's, a few minutes on a laptop CPU.
    "tiny": {
        "model": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256},
        "data": {
            "max_seq_length": 64,
            "max_predictions_per_seq": 10,
            "tokenizer": {"vocab_size": 8000},
            "validation_fraction": 0.05,
        },
        "train": {"max_steps": 500, "batch_size": 64, "eval_every": 100},
        "optimizer": {"lr": 2e-3, "warmup_steps": 100},
        "checkpoint": {"save_every": 100},
    },
    "small": {
        "model": {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 2048},
        "train": {"max_steps": 100_000, "batch_size": 256},
        "optimizer": {"lr": 5e-4, "warmup_steps": 2_000},
    },
    # BERT-base and BERT-large at sequence 128 with the global batch of the paper (256).
    "base": {"train": {"batch_size": 256}},
    "large": {
        "model": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
        "train": {"batch_size": 256},
    },
}


# The tests' debug flavour (torchtitan's debugmodel, config_load.debug_config): tiny, milliseconds a step.
DEBUG: dict[str, dict[str, Any]] = {
    "model": {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "max_position_embeddings": 64},
    "data": {
        "corpus": "synthetic",
        "max_seq_length": 32,
        "max_predictions_per_seq": 5,
        "synthetic": {"num_documents": 100, "num_topics": 4},
    },
    "train": {"batch_size": 8, "max_steps": 12},
    "optimizer": {"warmup_steps": 2},
    "logging": {"log_every": 4},
    "checkpoint": {"save_every": 4, "keep_last": 2},
}


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass `cls` (attribute docstrings, read from source)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    return {
        stmt.target.id: " ".join(str(nxt.value.value).split())
        for stmt, nxt in zip(body, body[1:])
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
    }


@cache
def field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def flat(cfg: Config | dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config (or its dict) as {"section.key": value}."""
    tree = to_dict(cfg) if isinstance(cfg, Config) else cfg
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def changes_line(changes: list[tuple[str, Any, Any]]) -> str:
    """Settings that changed, (key, then, now), in words: the one wording of "what changed"."""
    return ", ".join(f"{key} {then!r} -> {now!r}" for key, then, now in changes)


PATH_KEYS = tuple(
    "output_dir data.corpus data.prepared_dir data.tokenizer.path model.init_from eval.probe eval.probe_test".split()
)


def with_vocab(cfg: Config, vocab_size: int, source: str, pad_id: int | None = None) -> Config:
    """`cfg` with model.vocab_size from `source`'s tokenizer (or checked against it), pad_token_id checked."""
    m, has = cfg.model, f"the tokenizer of {source} has {vocab_size:,} tokens"
    if m.vocab_size is not None and m.vocab_size != vocab_size:
        if m.init_from:  # the size is the weights', which "set null" does not change
            rows = f"the weights of model.init_from ({m.init_from}) have {m.vocab_size:,} rows"
            raise UsageError(f"{has} but {rows}: drop data.tokenizer.path to use the model's own tokenizer")
        fix = "set model.vocab_size: null to take the size from the tokenizer"
        raise UsageError(f"model.vocab_size={m.vocab_size} but {has}; {fix}")
    if pad_id is not None and (problem := cfg.model.pad_problem(pad_id, source)):
        raise UsageError(problem)
    return dataclasses.replace(cfg, model=dataclasses.replace(m, vocab_size=vocab_size))
