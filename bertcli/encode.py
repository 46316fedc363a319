"""`bertcli encode`: lines of text in, one vector per line out, streamed.

Lines are read a window at a time (32 batches, or 1M characters), tokenized together, sorted by length inside the
window so that each batch carries little padding, run through the encoder under
torch.inference_mode, and written back in input order before the next window is read: memory is
bounded whatever the input's length, and a consumer sees rows while the input still flows. A
window is written early when the input stalls (STALL_SECONDS), so a slow producer sees its rows.
"""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from torch.overrides import TorchFunctionMode

from bertcli import checkpoint, console, hf_import, layout, runtime, sniff
from bertcli.config import ModelConfig
from bertcli.data.tokenizer import read_tokenizer_json
from bertcli.encode_io import (
    END,
    LINE_BYTES,
    Direct,
    Line,
    ReadAhead,
    Writer,
    check_layer,
    may_stall,
    read_lines,
    stream_full,
)
from bertcli.errors import RunError, UsageError
from bertcli.export import check_model_path, read_checkpoint
from bertcli.model import BertForPreTraining, padding_mask
from bertcli.resume import set_aside_note
from bertcli.sbert import NotReproducible, SentenceModel, lowercase_first

WINDOW_BATCHES = 32
# A window ends at WINDOW_BATCHES batches or at WINDOW_CHARS characters of text, whichever comes first:
# memory stays bounded whatever --batch-size asks (a 10 MB input at --batch-size 100000000 was read
# whole, 2.9 GB; the default window of 1,024 ordinary lines is far below the bound).
WINDOW_CHARS = 1 << 20
# On a CPU a batch's widest activation (token slots x intermediate_size x 4 bytes) stays under this,
# so long texts come fewer per batch (1,365 token slots at MiniLM's 1,536: 64 texts up to 21 tokens).
# The matrix products run as fast from about 640 rows up, while smaller batches of long texts carry
# less padding and their activations stay in cache and below glibc's mmap threshold (a buffer past
# it is mapped, and page-faulted, afresh at every allocation). MiniLM, 1,000 paragraphs, 2 threads:
# 14.0 s with 64 texts per batch, 12.0 s with this cap (scripts/bench_encode.py for whole runs).
CPU_BATCH_BYTES = 8 << 20
# When no line comes for STALL_SECONDS, or the oldest line read has waited MAX_WAIT_SECONDS, the
# lines read so far are encoded and written: a slow producer (tail -f, a pipeline) sees its rows.
# Input that flows fills whole windows.
STALL_SECONDS = 0.15
MAX_WAIT_SECONDS = 1.0
# A text longer than PREFIX_START characters per token of the length limit is tokenized from a prefix
# that provably gives the whole text's first tokens (see Prefixes), grown 4-fold while it does not,
# up to PREFIX_CAP characters per token: beyond that (a line of blanks or of words longer than a
# word piece, say) the prefix is used anyway, and the line counted as truncated unless what follows
# the prefix cannot add a token (see Prefixes.loses).
PREFIX_START = 8
PREFIX_CAP = 1000
# A side of a pair is tokenized whole up to this many characters (a few milliseconds): truncation gives
# the odd token of an odd budget to the longer side, which only whole sides tell. Both sides past it
# are cut, and only there may that token go to the other side than the whole line's.
PAIR_WHOLE_CHARS = 100_000


class NonFiniteOutput(RunError):
    """The model gives NaN or inf for an input (weights finite but so large that its forward pass
    overflows, or fp16's range exceeded): a vector of it would be garbage, so none is written."""

    def __init__(self, source: Path | None, where: str, precision: str) -> None:
        fix = "encode in fp32 or bf16" if precision == "fp16" else "use another checkpoint or model"
        super().__init__(
            f"{source or 'the model'}: its output is NaN or inf for {where}, so its vectors would be meaningless; {fix}"
        )
        self.source, self.where = source, where


@dataclass(kw_only=True)
class Encoder:
    model: BertForPreTraining
    tokenizer: Tokenizer
    rt: runtime.Runtime  # device and precision (autocast) of the forward passes
    sentence: SentenceModel | None = None  # a sentence-transformers folder's own settings
    fresh: tuple[str, ...] = ()  # parts a Hugging Face folder lacked, initialised at random: "pooler", ...
    source: Path | None = None  # the folder or checkpoint the weights came from
    # Positions the model was trained at, where fewer than it has (None: all): a run from scratch's
    # data.max_seq_length, an export's or a folder's tokenizer model_max_length. The positions past it
    # hold their random initialisation, so encode stops there unless asked.
    trained_length: int | None = None

    @property
    def max_length(self) -> int:
        return self.model.config.max_position_embeddings


def load_encoder(
    path: Path, device: torch.device, precision: str = "fp32", hf: hf_import.EncoderFolder | None = None
) -> Encoder:
    """A run folder (best checkpoint, else newest), a checkpoint folder, or a Hugging Face BERT
    folder (a sentence-transformers folder's settings come along), to run on `device` in
    `precision` (fp32, bf16 or fp16: see runtime). `hf`: the folder already read (read_encoder_folder)."""
    path = Path(path)
    hf = hf or hf_import.read_encoder_folder(path)
    check_model_path(path, hf)
    sentence = hf.sentence if hf else None
    if hf is not None:
        tokenizer, model = hf.tokenizer, _uninitialised(hf.config)
        fresh, source = tuple(hf_import.load_into(model, hf.folder, uninitialised=True)), hf.folder
        trained = hf_import.tokenizer_limit(hf.folder) if sentence is None else None  # (its own settings say)
    else:
        # A checkpoint holds every weight (loaded strictly); a run's, pruned while read, is chosen again.
        source, (model, tokenizer) = read_checkpoint(path, _load_checkpoint)
        fresh, trained = (), checkpoint.checkpoint_trained_length(source)
    model.to(device).eval()
    return Encoder(
        trained_length=trained if trained is not None and trained < model.config.max_position_embeddings else None,
        model=model,
        tokenizer=tokenizer,
        rt=runtime.Runtime(device, precision),
        sentence=sentence,
        fresh=fresh,
        source=source,
    )


class _SkipInit(TorchFunctionMode):
    """While a model is built, its parameters' random initialisation is skipped (they are left as
    allocated): every weight is loaded next, and drawing them costs 0.5 s at MiniLM size (58M random
    numbers: modules initialise in their constructors, then BertForPreTraining again). The meta
    device would skip the drawing too, but initialising there imports torch._dynamo (2 s)."""

    SKIPPED = {
        torch.nn.init.normal_,
        torch.nn.init.uniform_,
        torch.nn.init.kaiming_uniform_,
        torch.nn.init.zeros_,
        torch.nn.init.ones_,
        torch.Tensor.normal_,
        torch.Tensor.uniform_,
        torch.Tensor.zero_,
        torch.Tensor.fill_,
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204  (torch's protocol)
        if func in self.SKIPPED:
            return args[0] if args else kwargs["tensor"]  # the tensor, untouched (all work in place)
        return func(*args, **(kwargs or {}))


def _load_checkpoint(ckpt: Path) -> tuple[BertForPreTraining, Tokenizer]:
    """The model and tokenizer of checkpoint folder `ckpt`, checked against each other and its records."""
    cfg = checkpoint.read_config(ckpt).model
    file = ckpt / layout.TOKENIZER_JSON
    if not file.is_file():
        raise UsageError(f"{ckpt}: no tokenizer.json (a synthetic-corpus run has no tokenizer to encode text with)")
    checkpoint.check_readable(ckpt)  # files as written (the tokenizer the model was trained with), weights' shapes
    tokenizer = read_tokenizer_json(file)
    hf_import.check_tokenizer(tokenizer, cfg, file)
    model = _uninitialised(cfg)
    checkpoint.load_weights(model, ckpt)  # strict: every weight
    return model, tokenizer


def _uninitialised(cfg: ModelConfig) -> BertForPreTraining:
    """A model whose weights are all about to be loaded: built without drawing them (see _SkipInit)."""
    with _SkipInit():
        return BertForPreTraining(cfg)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How `encode` turns lines into rows, every default resolved and checked against the model
    (`resolve` makes them)."""

    pooling: str  # cls, mean, max or pooler
    normalize: bool  # rows (or per-token vectors) scaled to unit length
    max_length: int  # tokens per text, at most the model's positions
    from_folder: bool  # pooling and normalisation are the sentence-transformers folder's
    layer: int  # the layer read, as a count of blocks run: 0 = the embeddings (BertModel.layer_index)
    per_token: bool  # a vector per token rather than one pooled row per line
    pairs: bool  # a line A<TAB>B is a sentence pair (segment ids 0 and 1)
    strict_pairs: bool  # with pairs, a line without a TAB is an error (else one sentence, counted)
    batch_size: int  # texts per forward pass, at most


def resolve(
    enc: Encoder,
    *,
    pooling: str | None = None,
    layer: int = -1,
    normalize: bool | None = None,
    max_length: int | None = None,
    per_token: bool = False,
    pairs: bool = False,
    strict_pairs: bool = False,
    batch_size: int = 32,
) -> Settings:
    """Explicit values win. Otherwise a sentence-transformers folder's pooling with its
    normalisation, and its max_seq_length; else cls, no normalisation and the length the model was
    trained at (Encoder.trained_length), else its limit.
    Choosing a pooling leaves normalisation off unless asked: the folder's applies to its pooling
    (and per-token vectors are not pooled). Every check of the settings against the model is here."""
    st = enc.sentence
    from_folder = pooling is None and st is not None and not per_token
    if from_folder:
        problem = st.problem()
        if problem:
            raise NotReproducible(st.folder, problem)
        pooling, normalize = st.pooling, st.normalize if normalize is None else normalize
    pooling = pooling or "cls"
    index = check_layer(enc.model.config, layer, pooling)
    if pooling == "pooler" and "pooler" in enc.fresh:  # its weights would be random: vectors of nothing learnt
        raise UsageError(
            f"{enc.source}: has no pooler weights, so --pooling pooler would be random; pick cls, mean or max"
        )
    folder_limit = st.max_seq_length if st is not None else enc.trained_length
    limit = min(max_length or folder_limit or enc.max_length, enc.max_length)
    return Settings(
        pooling=pooling,
        normalize=bool(normalize),
        max_length=limit,
        from_folder=from_folder,
        layer=index,
        per_token=per_token,
        pairs=pairs,
        strict_pairs=strict_pairs,
        batch_size=batch_size,
    )


def _one_of(chars: set[str]) -> str:
    """A regular-expression class of `chars`."""
    return "[" + "".join(re.escape(c) for c in sorted(chars)) + "]"


def _shortened(breaks: set[str]) -> Callable[[re.Match[str]], str]:
    """What a run of characters that give no token becomes: one that breaks words (of `breaks`), else its first."""
    breaker = re.compile(_one_of(breaks) if breaks else "(?!)")

    def one(m: re.Match[str]) -> str:
        found = breaker.search(m.group())
        return found.group() if found else m.group()[0]

    return one


class Prefixes:
    """Texts far longer than the length limit can use, cut before tokenizing: tokenizing a whole line
    costs time and memory in its length (an 18.8 MB line: 19 s and 3.1 GB for one 256-token vector).

    A prefix gives the whole text's first tokens, and so its truncated encoding, when more than the
    limit's tokens of it come from words that it holds whole. BERT's normaliser and pre-tokenizer
    decide word boundaries character by character, so every word of a prefix but its last is one of
    the whole text's, tokenized alike; an added token ([MASK]) could start within its own length of
    the end and continue past it, so words reaching into those last characters are not counted
    either. The tokens of a prefix that count are read from its encoding (word ids, offsets).
    Tokenizers of other kinds are never cut. A pair's sides are cut alone; where one is cut and the
    other whole, the cut one must also keep more tokens than the other has, so that truncation
    (longest first) still sees which is longer. A side is cut only past PAIR_WHOLE_CHARS: both sides
    cut, which one keeps the odd token of an odd budget follows their prefixes, the one way the
    vectors can differ from the whole line's."""

    def __init__(self, tok: Tokenizer, max_length: int) -> None:
        added = list(tok.get_added_tokens_decoder().values())
        self.enabled = (
            isinstance(tok.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
            and (tok.normalizer is None or isinstance(tok.normalizer, normalizers.BertNormalizer))
            and not any(a.normalized for a in added)
        )
        self.added = max((len(a.content) for a in added), default=0)
        self.budget = {pair: max(1, max_length - tok.num_special_tokens_to_add(pair)) for pair in (False, True)}
        self.source, self.probe = tok, None  # probe: a copy that does not truncate, made at the first long text

    def _encode(self, text: str):  # noqa: ANN202  (a tokenizers Encoding)
        """`text` tokenized whole, without special tokens."""
        if self.probe is None:
            self.probe = Tokenizer.from_str(self.source.to_str())
            self.probe.no_truncation()
            self.probe.no_padding()
        return self.probe.encode(text, add_special_tokens=False)

    def _stable(self, prefix: str) -> int:
        """How many leading tokens of `prefix` (no special tokens) any text starting with it shares."""
        e = self._encode(prefix)
        words, offsets = e.word_ids, e.offsets
        if not words:
            return 0
        last, limit, ends = words[-1], len(prefix) - self.added, {}
        for word, (_, end) in zip(words, offsets):
            ends[word] = max(ends.get(word, 0), end)
        count = 0
        for word, (_, end) in zip(words, offsets):
            if word == last or (ends[word] if word is not None else end) > limit:
                break
            count += 1
        return count

    def _cut(self, text: str, need: int) -> tuple[str, bool]:
        """`text`, or a prefix of it with more than `need` tokens shared with it; True: cut at the cap, unproven."""
        size = need * PREFIX_START
        while size < len(text):
            prefix = text[:size]
            if self._stable(prefix) > need:
                return prefix, False
            if size >= need * PREFIX_CAP:
                shorter = self._compact(text)  # runs of blanks or removed characters: few tokens in many characters
                if len(shorter) < len(text):
                    return self._cut(shorter, need)  # (once: a compacted text compacts to itself)
                return prefix, self.loses(text, prefix)
            size = min(4 * size, need * PREFIX_CAP)
        return text, False

    def _compact(self, text: str) -> str:
        """`text` shortened where its length buys no token, so that a prefix reaches the words after:
        each run of characters that give no token (white space, and what the normaliser removes:
        controls, format characters such as U+200B and U+FEFF, accents it strips) becomes one character
        of the same effect (one that breaks words where the run holds one, else its first); and each
        run of plain word characters past WordPiece's max_input_chars_per_word (a base64 blob, 70,000
        letters), which is one [UNK] however long, keeps one character more than that limit. It
        tokenizes as `text` does: each character is classed by the tokenizer itself (normalised and
        pre-tokenized between two letters; plain: it stays in the word as one character or more, so
        a run of `keep` of them is still past the limit), and the
        classes are per character (BERT's normaliser and pre-tokenizer decide character by
        character). Not where an added token holds such characters: matched on the raw text, it could change."""
        pre, normalizer = self.source.pre_tokenizer, self.source.normalizer
        breaks, removed, plain = set(), set(), set()
        for c in set(text):
            words = [
                w
                for w, _ in pre.pre_tokenize_str(
                    normalizer.normalize_str(f"a{c}b") if normalizer is not None else f"a{c}b"
                )
            ]
            if words == ["a", "b"]:
                breaks.add(c)
            elif words == ["ab"]:
                removed.add(c)
            elif len(words) == 1 and len(words[0]) >= 3:  # one character of the word, or more (Hangul: 3 jamo)
                plain.add(c)
        added = [set(a.content) for a in self.source.get_added_tokens_decoder().values()]
        longest = getattr(self.source.model, "max_input_chars_per_word", None)
        quiet = breaks | removed
        if quiet and not any(chars & quiet for chars in added):
            text = re.compile(_one_of(quiet) + "{2,}").sub(_shortened(breaks), text)
        keep = (longest or 0) + 1  # plain characters a word keeps: still more than the limit, still one [UNK]
        if plain and longest is not None and not any(chars <= plain or len(chars) >= keep for chars in added):
            # A plain character with the removed ones after it (x + U+0301 ...): one character of the word.
            unit = _one_of(plain) + (_one_of(removed) + "*" if removed else "")
            text = re.compile(f"((?:{unit}){{{keep}}})(?:{unit})+").sub(r"\1", text)
        return text

    def loses(self, text: str, prefix: str) -> bool:
        """Whether `prefix`, tokenized in place of `text` (cut at the cap, unproven), can lose tokens of it.
        It cannot when the rest is white space, nor when the rest is more of the prefix's last word (only
        characters that word holds, then white space) and that word is one [UNK] for being longer than
        WordPiece's max_input_chars_per_word: longer still, it stays one [UNK]. That is the line of blanks,
        or of one enormous word, which gives the whole line's tokens (two or three) and lost nothing.
        Word boundaries are decided character by character (see above), so a character the last word
        holds never starts another word; an added token made only of such characters could, so then it
        may lose. Bounded work: the prefix's encoding, and scans of the rest at C speed."""
        rest = text[len(prefix) :]
        if rest.isspace():
            return False
        e = self._encode(prefix)
        if not e.ids or e.word_ids[-1] is None:
            return True
        last = [i for i, w in enumerate(e.word_ids) if w == e.word_ids[-1]]
        model, normalizer = self.source.model, self.source.normalizer
        if len(last) != 1 or e.tokens[last[0]] != getattr(model, "unk_token", None):
            return True
        start, end = e.offsets[last[0]]
        word = prefix[start:end]
        longest = getattr(model, "max_input_chars_per_word", len(text))
        if len(normalizer.normalize_str(word) if normalizer is not None else word) <= longest:
            return True  # an [UNK] of its pieces: more of the word could give pieces
        chars = "".join(set(word))
        # After the word, up to the cut (characters the normaliser removed) and after it: only its characters.
        if prefix[end:].lstrip(chars) or rest.rstrip().lstrip(chars):
            return True  # another character: another word, or a break
        return any(set(a.content) <= set(chars) for a in self.source.get_added_tokens_decoder().values())

    def _long(self, text: str, *, pair: bool) -> bool:
        start = self.budget[pair] * PREFIX_START
        return len(text) > (max(start, PAIR_WHOLE_CHARS) if pair else start)

    def cut(self, item: str | tuple[str, str]) -> tuple[str | tuple[str, str], bool]:
        """A text (or pair) to tokenize in place of `item`, and whether it lost text unproven (truncated)."""
        if not self.enabled:
            return item, False
        if isinstance(item, str):
            return self._cut(item, self.budget[False]) if self._long(item, pair=False) else (item, False)
        budget, sides = self.budget[True], item
        cuts = [self._cut(x, budget) if self._long(x, pair=True) else (x, False) for x in sides]
        whole = [len(x) == len(side) for (x, _), side in zip(cuts, sides)]
        if whole[0] != whole[1]:  # the cut side must keep more tokens than the whole one has
            kept = 0 if whole[0] else 1  # the side left whole
            cuts[1 - kept] = self._cut(sides[1 - kept], max(budget, len(self._encode(sides[kept]).ids)))
        return (cuts[0][0], cuts[1][0]), cuts[0][1] or cuts[1][1]


def _pool(hidden: torch.Tensor, valid_lens: torch.Tensor, pooling: str, model: BertForPreTraining) -> torch.Tensor:
    """(B, T, H) -> (B, H). mean and max run over every non-padding position, [CLS] and [SEP]
    included (the convention of sentence-embedding libraries)."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "pooler":
        return model.bert.pooler(hidden)
    keep = padding_mask(valid_lens, hidden.shape[1])[:, 0, 0, :, None]  # (B, T, 1)
    if pooling == "mean":
        return (hidden * keep).sum(1) / valid_lens[:, None].to(hidden.dtype)
    return hidden.masked_fill(~keep, float("-inf")).amax(1)


def _forward(
    enc: Encoder, ids: list[list[int]], types: list[list[int]], layer: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states of `layer` (0 = embeddings, L = last; BertModel.layer_index) for a batch of
    token-id lists, padded: (B, T, H) and the (B,) valid lengths (called under torch.inference_mode)."""
    B, T = len(ids), max(len(x) for x in ids)
    input_ids = torch.zeros((B, T), dtype=torch.long)
    token_type_ids = torch.zeros((B, T), dtype=torch.long)
    for row, (x, t) in enumerate(zip(ids, types)):
        input_ids[row, : len(x)] = torch.tensor(x)
        token_type_ids[row, : len(t)] = torch.tensor(t)
    device = enc.rt.device
    valid_lens = torch.tensor([len(x) for x in ids], device=device)
    with enc.rt.autocast():
        hidden = enc.model.bert.hidden_states(input_ids.to(device), token_type_ids.to(device), valid_lens, layer=layer)
    return hidden.float(), valid_lens  # bf16 under bf16 autocast (model.LayerNorm): pooled and written in fp32


def _batches(order: list[int], lengths: list[int], rows: int, max_tokens: int | None) -> Iterator[list[int]]:
    """The texts of `order` (indices, by ascending length) cut into batches of at most `rows` texts
    and, with max_tokens, at most that many token slots (texts x the longest): at least one text."""
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) == rows or (max_tokens is not None and (len(batch) + 1) * lengths[i] > max_tokens)):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def encode(
    enc: Encoder, lines: Iterator[str], out: Writer, settings: Settings, *, input_may_stall: bool = True
) -> dict[str, int]:
    """Encode every line as `settings` say (see `resolve`) and hand the rows to `out` in input
    order; return counts. With pairs, a line without a TAB is one sentence (counted in "unpaired"),
    or an error when strict. `input_may_stall` (see `may_stall`; False for regular files): lines
    are read by a thread of their own, and those read are written when no more come for STALL_SECONDS."""
    per_token, pairs, strict_pairs, batch_size = (
        settings.per_token,
        settings.pairs,
        settings.strict_pairs,
        settings.batch_size,
    )
    tokenizer = enc.tokenizer
    if enc.sentence is not None and enc.sentence.lowercase:  # sentence_bert_config.json's do_lower_case
        tokenizer = Tokenizer.from_str(tokenizer.to_str())  # (the encoder's own is left as it is)
        tokenizer.normalizer = lowercase_first(tokenizer.normalizer)
    tokenizer.enable_truncation(settings.max_length)
    prefixes = Prefixes(tokenizer, settings.max_length)
    max_tokens = None
    if enc.rt.device.type == "cpu":  # token slots whose widest activation fits CPU_BATCH_BYTES (2 bytes under autocast)
        itemsize = (enc.rt.autocast_dtype or torch.float32).itemsize
        max_tokens = CPU_BATCH_BYTES // (itemsize * enc.model.config.intermediate_size)
    counts = {"lines": 0, "truncated": 0, "unpaired": 0, "inner_cr": 0}
    window: list[str] = []

    def where(i: int) -> str:  # window[i], for a message
        line = window[i]
        return (
            f"{line.source}: line {line.number}" if isinstance(line, Line) else f"input line {counts['lines'] + i + 1}"
        )

    @torch.inference_mode()
    def flush() -> None:
        if not window:
            return
        inputs: list = _pair_up(window, where, strict=strict_pairs) if pairs else window
        counts["unpaired"] += sum(1 for x in inputs if isinstance(x, str)) if pairs else 0
        counts["inner_cr"] += sum(1 for line in window if isinstance(line, Line) and line.inner_cr)
        cuts = [prefixes.cut(x) for x in inputs]  # a text far past the limit: only a prefix is tokenized
        encodings = tokenizer.encode_batch([x for x, _ in cuts], add_special_tokens=True)
        counts["truncated"] += sum(
            1
            for line, e, (_, unproven) in zip(window, encodings, cuts)
            if e.overflowing or unproven or (isinstance(line, Line) and line.lost)
        )
        rows = _rows(enc, encodings, settings, max_tokens=max_tokens, where=where)
        for i, row in enumerate(rows):
            out.write(counts["lines"] + i + 1, window[i], row, encodings[i].tokens if per_token else None)
        out.flush()
        counts["lines"] += len(window)
        window.clear()

    reader = ReadAhead(lines) if input_may_stall else Direct(lines)
    try:
        first, chars = 0.0, 0  # when the window's first line came, and the characters read into it
        while True:
            try:  # with lines pending, wait for more only while the input flows (a slow producer: tail -f)
                wait = min(STALL_SECONDS, first + MAX_WAIT_SECONDS - time.monotonic()) if window else None
                line = reader.get(max(wait, 0.0) if wait is not None else None)
            except queue.Empty:
                flush()
                continue
            if line is END:
                break
            if not window:
                first, chars = time.monotonic(), 0
            window.append(line)
            chars += len(line)
            if len(window) >= batch_size * WINDOW_BATCHES or chars >= WINDOW_CHARS:
                flush()
        flush()
    finally:
        reader.close()
        tokenizer.no_truncation()
    return counts


def _pair_up(window: list[str], where: Callable[[int], str], *, strict: bool) -> list:
    """The lines of `window` as pairs (A, B) split at their first TAB; a line without one stays a
    string (one sentence), or is an error when `strict`, or when its TAB was past what read_lines kept."""
    inputs = [tuple(text.split("\t", 1)) if "\t" in text else text for text in window]
    unpaired = [i for i, x in enumerate(inputs) if isinstance(x, str)]
    late = [i for i in unpaired if isinstance(window[i], Line) and window[i].dropped_tab]
    if late:
        raise UsageError(
            f"{where(late[0])}: its TAB comes after the first {LINE_BYTES >> 20} MiB, the most of a line "
            "encode reads; put the two sentences of a pair within that"
        )
    if unpaired and strict:
        raise UsageError(
            f"{where(unpaired[0])}: no TAB between the two sentences (--strict-pairs); write A<TAB>B, or drop "
            "--strict-pairs to encode such lines alone"
        )
    return inputs


def _rows(
    enc: Encoder, encodings: list, settings: Settings, *, max_tokens: int | None, where: Callable[[int], str]
) -> list[np.ndarray]:
    """The row of each encoding, in order: its pooled vector, or its (T, H) per-token vectors, from
    forward passes over batches of similar length (at most settings.batch_size texts and, on a CPU,
    `max_tokens` token slots). A non-finite vector is an error (NonFiniteOutput) naming `where(i)`."""
    lengths = [len(e.ids) for e in encodings]
    order = sorted(range(len(encodings)), key=lengths.__getitem__)
    rows: list = [None] * len(encodings)
    for chunk in _batches(order, lengths, settings.batch_size, max_tokens):
        hidden, valid = _forward(
            enc, [encodings[i].ids for i in chunk], [encodings[i].type_ids for i in chunk], settings.layer
        )
        if settings.per_token:
            for j, i in enumerate(chunk):
                vectors = hidden[j, : int(valid[j])].float()
                if not bool(torch.isfinite(vectors).all()):
                    raise NonFiniteOutput(enc.source, where(i), enc.rt.precision)
                rows[i] = (F.normalize(vectors, dim=-1) if settings.normalize else vectors).cpu().numpy()
            continue
        pooled = _pool(hidden, valid, settings.pooling, enc.model).float()
        bad = (~torch.isfinite(pooled)).any(1).nonzero()  # (n, 1): one host sync per batch
        if len(bad):
            raise NonFiniteOutput(enc.source, where(chunk[int(bad[0])]), enc.rt.precision)
        if settings.normalize:
            pooled = F.normalize(pooled, dim=-1)
        for j, i in enumerate(chunk):
            rows[i] = pooled[j].cpu().numpy()
    return rows


def run(
    model: Path,
    *,
    hf: hf_import.EncoderFolder | None,
    inputs: list[str],
    writer: Callable[[], Writer],
    output: Path | None,
    stopper,
    device: str,
    dtype: str,
    errors: str,
    **flags,
) -> None:
    """`bertcli encode`, its checks done (preflight.encode): load the model, resolve the settings (`flags`:
    those of `resolve`), encode every line into `writer()`, put the output into place and say what
    stderr should know (truncated lines, unpaired ones, CRs inside lines)."""
    encoder = load_encoder(model, runtime.parse_device(device, "--device"), dtype, hf=hf)
    if slow := runtime.slow_autocast(encoder.rt):
        console.error(f"warning: --dtype {slow}; use --dtype fp32 on this CPU")
    settings = resolve(encoder, **flags)
    if note := set_aside_note(encoder.source):
        console.error(f"bertcli encode: note: {note}")
    _say_settings(settings, model=model, max_length=flags.get("max_length"), trained_length=encoder.trained_length)
    stopper.left = (
        f"{output} was not written (what was there is intact)"
        if output is not None and not sniff.is_stream(output)
        else f"the rows on {output or 'stdout'} so far are those of the first lines only"
    )
    out = writer()
    try:
        counts = encode(encoder, read_lines(inputs, errors), out, settings, input_may_stall=may_stall(inputs))
        stopper.left = f"{output or 'the output'} is complete"
        with stopper.until("held"):  # the output goes into place whole
            out.close(encoder.model.config.hidden_size)
    except BaseException as exc:
        out.abort()
        if (full := stream_full(exc, output)) is not None:
            raise full from None
        raise
    _say_counts(counts, encoder, settings, model=model, max_length=flags.get("max_length"))


def _say_settings(settings: Settings, *, model: Path, max_length: int | None, trained_length: int | None) -> None:
    """What encode says of its settings before it starts."""
    if max_length is not None and max_length > settings.max_length:
        console.error(
            f"bertcli encode: --max-length {max_length} is past the model's {settings.max_length} positions; texts are truncated there"
        )
    if max_length is not None and trained_length is not None and settings.max_length > trained_length:
        console.error(
            f"warning: texts are encoded up to {settings.max_length} tokens (--max-length), past the length the model "
            f"was trained at, {trained_length}: the positions past it were never trained"
        )
    if settings.from_folder:
        console.error(
            f"bertcli encode: {model} is a sentence-transformers model: {settings.pooling} pooling, "
            f"{'normalized' if settings.normalize else 'not normalized'}, up to {settings.max_length} tokens (its own "
            "settings; --pooling, --normalize/--no-normalize and --max-length choose otherwise)"
        )


def _say_counts(
    counts: dict[str, int], encoder: Encoder, settings: Settings, *, model: Path, max_length: int | None
) -> None:
    """What encode says once the rows are written: the checkpoint a run gave, lines truncated, unpaired, with a CR."""
    from bertcli.export import described

    lines = counts["lines"]
    if lines and layout.identify(Path(model)).kind is layout.Kind.RUN:
        how = "a vector per token" if settings.per_token else f"{settings.pooling} pooling"
        console.error(
            f"bertcli encode: the vectors of {described(encoder.source)}: {how}{', normalized' if settings.normalize else ''} (--pooling chooses)"
        )
    if counts["truncated"]:
        trained = max_length is None and settings.max_length == encoder.trained_length and not settings.from_folder
        why = ", the length the model was trained at (--max-length chooses)" if trained else ""
        console.error(
            f"bertcli encode: {counts['truncated']:,} of {lines:,} lines were truncated to {settings.max_length} tokens{why}"
        )
    if counts["unpaired"]:
        console.error(
            f"bertcli encode: {counts['unpaired']:,} of {lines:,} lines had no TAB and were encoded as one sentence each (--strict-pairs makes that an error)"
        )
    if counts["inner_cr"]:
        console.error(
            f"warning: {counts['inner_cr']:,} of {lines:,} lines hold a carriage return (CR) inside: a line ends at LF, "
            "so each was encoded as one text; if CR ends your lines, convert them (tr '\\r' '\\n')"
        )
