"""`bertcli encode`: a vector per line, a window of lines at a time (bounded memory), batched by length, in order."""

from __future__ import annotations

import dataclasses
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
from torch.nn.utils.rnn import pad_sequence
from torch.overrides import TorchFunctionMode

from bertcli import checkpoint, console, encode_io, hf_import, layout, runtime, sniff
from bertcli.config import ModelConfig
from bertcli.data.tokenizer import read_tokenizer_json
from bertcli.encode_io import Line, ReadAhead, Writer, check_layer, may_stall, read_lines, stream_full
from bertcli.errors import RunError, UsageError
from bertcli.export import check_model_path, described, read_checkpoint
from bertcli.model import BertForPreTraining, padding_mask
from bertcli.resume import set_aside_note
from bertcli.sbert import DEFAULT_POOLING, NotReproducible, SentenceModel, lowercase_first

WINDOW_BATCHES = 32
WINDOW_CHARS = 1 << 20  # a window's bound in characters too: memory stays bounded whatever --batch-size asks
# A CPU batch's widest activation (token slots x intermediate_size x itemsize) stays under this: it stays in cache.
CPU_BATCH_BYTES = 8 << 20
# A slow producer's (tail -f) lines are written when none comes for STALL_SECONDS or the oldest waited MAX_WAIT_SECONDS.
STALL_SECONDS, MAX_WAIT_SECONDS = 0.15, 1.0
# A text past PREFIX_START characters per token of the limit is tokenized from a prefix, grown up to PREFIX_CAP.
PREFIX_START, PREFIX_CAP = 8, 1000
PAIR_WHOLE_CHARS = 100_000  # a pair's side tokenized whole up to this: truncation needs to know the longer side


@dataclass
class Encoder:
    model: BertForPreTraining
    tokenizer: Tokenizer
    rt: runtime.Runtime  # device and precision (autocast) of the forward passes
    sentence: SentenceModel | None = None  # a sentence-transformers folder's own settings
    fresh: tuple[str, ...] = ()  # parts a Hugging Face folder lacked, initialised at random: "pooler", ...
    source: Path | None = None  # the folder or checkpoint the weights came from
    trained_length: int | None = None  # positions trained, where fewer than it has: encode stops there by default

    @property
    def max_length(self) -> int:
        return self.model.config.max_position_embeddings


def load_encoder(
    path: Path, device: torch.device, precision: str = "fp32", hf: hf_import.EncoderFolder | None = None
) -> Encoder:
    """A run (best checkpoint, else newest), checkpoint or Hugging Face folder (`hf`: read already) on `device`."""
    path = Path(path)
    hf = hf or hf_import.read_encoder_folder(path)
    check_model_path(path, hf)
    if hf is not None:
        tokenizer, model, sentence = hf.tokenizer, _uninitialised(hf.config), hf.sentence
        fresh, source = tuple(hf_import.load_into(model, hf.folder, uninitialised=True)), hf.folder
        trained = (sentence and sentence.max_seq_length) or hf_import.tokenizer_limit(hf.folder)
    else:  # a run's checkpoint, pruned while read, is chosen again
        source, (model, tokenizer) = read_checkpoint(path, _load_checkpoint)
        fresh, trained, sentence = (), checkpoint.checkpoint_trained_length(source), None
    model.to(device).eval()
    limited = trained is not None and trained < model.config.max_position_embeddings
    rt, trained_length = runtime.Runtime(device, precision), trained if limited else None
    return Encoder(model, tokenizer, rt, sentence=sentence, fresh=fresh, source=source, trained_length=trained_length)


class _SkipInit(TorchFunctionMode):
    """Skips parameters' random initialisation while a model is built: every weight is loaded next."""

    SKIPPED = {getattr(torch.nn.init, f) for f in ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_")}
    SKIPPED |= {getattr(torch.Tensor, f) for f in ("normal_", "uniform_", "zero_", "fill_")}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204  (torch's protocol)
        if func in self.SKIPPED:
            return args[0] if args else kwargs["tensor"]  # the tensor, untouched (all work in place)
        return func(*args, **(kwargs or {}))


def _load_checkpoint(ckpt: Path) -> tuple[BertForPreTraining, Tokenizer]:
    """The model and tokenizer of checkpoint folder `ckpt`, checked against each other and its records."""
    cfg = checkpoint.read_config(ckpt).model
    file = ckpt / layout.TOKENIZER_JSON
    if not file.is_file():
        raise UsageError(f"{ckpt}: no tokenizer.json (a synthetic-corpus run); encode a run trained on text")
    checkpoint.check_readable(ckpt)  # files as written (the tokenizer the model was trained with), weights' shapes
    tokenizer = read_tokenizer_json(file)
    hf_import.check_tokenizer(tokenizer, cfg, file)
    model = _uninitialised(cfg)
    checkpoint.load_weights(model, ckpt)  # strict: every weight
    return model, tokenizer


def _uninitialised(cfg: ModelConfig) -> BertForPreTraining:
    with _SkipInit():
        return BertForPreTraining(cfg)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How `encode` turns lines into rows: the flags as asked, then (`resolve`) resolved against the model."""

    pooling: str | None = None  # cls, mean, max or pooler
    normalize: bool | None = None  # rows (or per-token vectors) scaled to unit length
    max_length: int | None = None  # tokens per text, at most the model's positions
    layer: int = -1  # resolved: the count of blocks run, 0 = the embeddings (BertModel.layer_index)
    per_token: bool = False  # a vector per token rather than one pooled row per line
    pairs: bool = False  # a line A<TAB>B is a sentence pair (segment ids 0 and 1)
    strict_pairs: bool = False  # with pairs, a line without a TAB is an error (else one sentence, counted)
    batch_size: int = 32  # texts per forward pass, at most


def resolve(enc: Encoder, **flags) -> Settings:
    """`flags` resolved: as given, else a sentence-transformers folder's own, else DEFAULT_POOLING unnormalised at the
    length trained (eval's probe too). A pooling asked leaves normalisation off: the folder's is for its own."""
    asked, st = Settings(**flags), enc.sentence
    pooling, normalize = asked.pooling, asked.normalize
    if pooling is None and st is not None and not asked.per_token:
        if problem := st.problem():
            raise NotReproducible(st.folder, problem)
        pooling, normalize = st.pooling, st.normalize if normalize is None else normalize
    pooling = pooling or DEFAULT_POOLING
    layer = check_layer(enc.model.config, asked.layer, pooling)
    if pooling == "pooler" and "pooler" in enc.fresh:  # its weights would be random: vectors of nothing learnt
        raise UsageError(f"{enc.source}: has no pooler weights for --pooling pooler; pick cls, mean or max")
    folder_limit = st.max_seq_length if st is not None else enc.trained_length
    limit = min(asked.max_length or folder_limit or enc.max_length, enc.max_length)
    return dataclasses.replace(asked, pooling=pooling, normalize=bool(normalize), max_length=limit, layer=layer)


def _one_of(chars: set[str]) -> str:
    return "[" + "".join(re.escape(c) for c in sorted(chars)) + "]"


def _shortened(breaks: set[str]) -> Callable[[re.Match[str]], str]:
    """What a run of characters that give no token becomes: one that breaks words (of `breaks`), else its first."""
    breaker = re.compile(_one_of(breaks) if breaks else "(?!)")

    def one(m: re.Match[str]) -> str:
        found = breaker.search(m.group())
        return found.group() if found else m.group()[0]

    return one


class Prefixes:
    """Texts far past the limit, cut before tokenizing: under BERT's normaliser and pre-tokenizer a prefix's words but
    its last (and any an added token reaches) are the text's, so more than the limit's tokens of them are its own."""

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
        if self.probe is None:
            self.probe = Tokenizer.from_str(self.source.to_str())
            self.probe.no_truncation()
            self.probe.no_padding()
        return self.probe.encode(text, add_special_tokens=False)

    def _words(self, text: str) -> list[str]:
        normalizer = self.source.normalizer
        text = normalizer.normalize_str(text) if normalizer is not None else text
        return [w for w, _ in self.source.pre_tokenizer.pre_tokenize_str(text)]

    def _stable(self, prefix: str) -> int:
        """How many leading tokens of `prefix` (no special tokens) any text starting with it shares."""
        e = self._encode(prefix)
        words, offsets = e.word_ids, e.offsets
        last, limit, ends = words[-1] if words else None, len(prefix) - self.added, {}
        for word, (_, end) in zip(words, offsets):
            ends[word] = max(ends.get(word, 0), end)
        past = [w == last or (ends[w] if w is not None else end) > limit for w, (_, end) in zip(words, offsets)]
        return next((i for i, stop in enumerate(past) if stop), len(past))

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
        """`text` less what gives no token: runs of characters giving none, words past max_input_chars_per_word."""
        breaks, removed, plain = set(), set(), set()
        for c in set(text):
            words = self._words(f"a{c}b")
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
        """Whether `prefix`, tokenized in place of `text`, can lose tokens of it: not where the rest is white
        space, or more characters of a last word that is one [UNK] for its length (it stays one)."""
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

    def cut(self, item: str | tuple[str, str]) -> tuple[str | tuple[str, str], bool]:
        """A text (or pair) to tokenize in place of `item`, and whether it lost text unproven (truncated)."""
        if not self.enabled:
            return item, False
        if isinstance(item, str):
            return self._cut(item, self.budget[False])  # (short: itself)
        budget, sides = self.budget[True], item
        up_to = max(budget * PREFIX_START, PAIR_WHOLE_CHARS)  # a side tokenized whole
        cuts = [self._cut(x, budget) if len(x) > up_to else (x, False) for x in sides]
        whole = [len(x) == len(side) for (x, _), side in zip(cuts, sides)]
        if whole[0] != whole[1]:  # the cut side must keep more tokens than the whole one has
            kept = 0 if whole[0] else 1  # the side left whole
            cuts[1 - kept] = self._cut(sides[1 - kept], max(budget, len(self._encode(sides[kept]).ids)))
        return (cuts[0][0], cuts[1][0]), cuts[0][1] or cuts[1][1]


def _pool(hidden: torch.Tensor, valid_lens: torch.Tensor, pooling: str, model: BertForPreTraining) -> torch.Tensor:
    """(B, T, H) -> (B, H). mean and max include [CLS] and [SEP], as sentence-transformers does."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "pooler":
        return model.bert.pooler(hidden)
    keep = padding_mask(valid_lens, hidden.shape[1])[:, 0, 0, :, None]  # (B, T, 1)
    if pooling == "mean":
        return (hidden * keep).sum(1) / valid_lens[:, None].to(hidden.dtype)
    return hidden.masked_fill(~keep, float("-inf")).amax(1)


def _forward(enc: Encoder, batch: list, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states of `layer` (0: embeddings) of encodings, padded: (B, T, H) in fp32, (B,) valid lengths."""
    input_ids = pad_sequence([torch.tensor(e.ids) for e in batch], batch_first=True)  # (B, T), 0 past each text
    token_type_ids = pad_sequence([torch.tensor(e.type_ids) for e in batch], batch_first=True)
    device = enc.rt.device
    valid_lens = torch.tensor([len(e) for e in batch], device=device)
    with enc.rt.autocast():
        hidden = enc.model.bert.hidden_states(input_ids.to(device), token_type_ids.to(device), valid_lens, layer=layer)
    return hidden.float(), valid_lens  # bf16 under bf16 autocast: pooled and written in fp32


def _batches(order: list[int], lengths: list[int], rows: int, max_tokens: int | None) -> Iterator[list[int]]:
    """`order` (ascending length) in batches of at most `rows` texts and `max_tokens` slots, one text at least."""
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) == rows or (max_tokens is not None and (len(batch) + 1) * lengths[i] > max_tokens)):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


class _Window:
    """The lines read and not yet written, and the counts (COUNTED) of those written."""

    def __init__(self, enc: Encoder, out: Writer, settings: Settings) -> None:
        self.enc, self.out, self.settings = enc, out, settings
        self.tokenizer = enc.tokenizer
        if enc.sentence is not None and enc.sentence.lowercase:  # sentence_bert_config.json's do_lower_case
            self.tokenizer = Tokenizer.from_str(enc.tokenizer.to_str())  # (the encoder's own is left as it is)
            self.tokenizer.normalizer = lowercase_first(self.tokenizer.normalizer)
        self.tokenizer.enable_truncation(settings.max_length)
        self.prefixes = Prefixes(self.tokenizer, settings.max_length)
        itemsize = (enc.rt.autocast_dtype or torch.float32).itemsize
        slots = CPU_BATCH_BYTES // (itemsize * enc.model.config.intermediate_size)
        self.max_tokens = slots if enc.rt.device.type == "cpu" else None  # token slots whose widest activation fits
        self.counts = {"lines": 0, "truncated": 0, "unpaired": 0, "inner_cr": 0}
        self.lines: list[str] = []
        self.first, self.chars = 0.0, 0  # when the window's first line came, and the characters read into it

    def add(self, line: str) -> bool:
        """Take `line`; whether the window is full."""
        if not self.lines:
            self.first, self.chars = time.monotonic(), 0
        self.lines.append(line)
        self.chars += len(line)
        return len(self.lines) >= self.settings.batch_size * WINDOW_BATCHES or self.chars >= WINDOW_CHARS

    def wait(self) -> float | None:
        """How long to wait for the next line: with lines pending, only while the input flows."""
        return max(min(STALL_SECONDS, self.first + MAX_WAIT_SECONDS - time.monotonic()), 0.0) if self.lines else None

    def where(self, i: int) -> str:
        line = self.lines[i]
        return line.where() if isinstance(line, Line) else f"input line {self.counts['lines'] + i + 1}"

    @torch.inference_mode()
    def flush(self) -> None:
        window, counts = self.lines, self.counts
        if not window:
            return
        inputs = self._pairs() if self.settings.pairs else window
        counts["inner_cr"] += sum(1 for line in window if isinstance(line, Line) and line.inner_cr)
        cuts = [self.prefixes.cut(x) for x in inputs]  # a text far past the limit: only a prefix is tokenized
        encodings = self.tokenizer.encode_batch([x for x, _ in cuts], add_special_tokens=True)
        for line, e, (_, unproven) in zip(window, encodings, cuts):
            counts["truncated"] += bool(e.overflowing or unproven or (isinstance(line, Line) and line.lost))
        for i, row in enumerate(self._rows(encodings)):
            tokens = encodings[i].tokens if self.settings.per_token else None
            self.out.write(counts["lines"] + i + 1, window[i], row, tokens)
        self.out.flush()
        counts["lines"] += len(window)
        window.clear()

    def _pairs(self) -> list:
        """The lines as pairs (A, B) split at their first TAB; a line without one stays one sentence."""
        inputs = [tuple(text.split("\t", 1)) if "\t" in text else text for text in self.lines]
        unpaired = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if late := [i for i in unpaired if isinstance(self.lines[i], Line) and self.lines[i].dropped_tab]:
            raise UsageError(f"{self.where(late[0])}: TAB past {encode_io.LINE_BYTES >> 20} MiB; shorten sentence A")
        if unpaired and self.settings.strict_pairs:
            raise UsageError(f"{self.where(unpaired[0])}: no TAB (--strict-pairs); write A<TAB>B")
        self.counts["unpaired"] += len(unpaired)
        return inputs

    def _rows(self, encodings: list) -> list[np.ndarray]:
        """The row of each encoding, in order: its pooled vector or its (T, H) per-token vectors."""
        enc, settings = self.enc, self.settings
        lengths = [len(e.ids) for e in encodings]
        order = sorted(range(len(encodings)), key=lengths.__getitem__)
        rows: list = [None] * len(encodings)
        for chunk in _batches(order, lengths, settings.batch_size, self.max_tokens):
            hidden, valid = _forward(enc, [encodings[i] for i in chunk], settings.layer)
            if settings.per_token:  # (B, T, H), padding zeroed (cut off below)
                out = hidden.masked_fill(~padding_mask(valid, hidden.shape[1])[:, 0, 0, :, None], 0.0)
            else:
                out = _pool(hidden, valid, settings.pooling, enc.model)  # (B, H)
            bad = (~torch.isfinite(out)).flatten(1).any(1).nonzero()  # (n, 1): one host sync per batch
            if len(bad):
                fix = "encode in fp32 or bf16" if enc.rt.precision == "fp16" else "use another checkpoint or model"
                where = self.where(chunk[int(bad[0])])
                raise RunError(f"{enc.source or 'the model'}: its output is NaN or inf for {where}; {fix}")
            out = F.normalize(out, dim=-1) if settings.normalize else out
            for j, i in enumerate(chunk):
                rows[i] = (out[j, : int(valid[j])] if settings.per_token else out[j]).cpu().numpy()
        return rows


def encode(
    enc: Encoder, lines: Iterator[str], out: Writer, settings: Settings, *, input_may_stall: bool = True
) -> dict[str, int]:
    """Hand `out` the rows of `lines` in order; the counts. Input that may stall is read by a thread of its own."""
    window = _Window(enc, out, settings)
    lines = iter(lines)
    reader = ReadAhead(lines) if input_may_stall else None  # else lines come as fast as they can be read
    try:
        while True:
            try:
                line = reader.get(window.wait()) if reader else next(lines, encode_io.END)
            except queue.Empty:
                window.flush()
                continue
            if line is encode_io.END:
                break
            if window.add(line):
                window.flush()
        window.flush()
    finally:
        if reader:
            reader.close()
        window.tokenizer.no_truncation()
    return window.counts


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
    """`bertcli encode`, its checks done (preflight.encode): load, resolve `flags`, encode into `writer()`."""
    encoder = load_encoder(model, runtime.parse_device(device, "--device"), dtype, hf=hf)
    settings = resolve(encoder, **flags)
    if note := set_aside_note(encoder.source):
        console.error(f"bertcli encode: note: {note}")
    trained, asked = encoder.trained_length, flags.get("max_length")
    if asked is not None and trained is not None and settings.max_length > trained:
        console.error(f"warning: {settings.max_length} tokens (--max-length) is past the length trained at, {trained}")
    stopper.left = f"{output} was not written (what was there is intact)"
    if output is None or sniff.is_stream(output):  # written in place
        stopper.left = f"the rows on {output or 'stdout'} so far are those of the first lines only"
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
    if counts["lines"] and layout.identify(Path(model)).kind is layout.Kind.RUN:  # which of the run's checkpoints
        how = "a vector per token" if settings.per_token else f"{settings.pooling} pooling"
        how += ", normalized" if settings.normalize else ""
        console.error(f"bertcli encode: the vectors of {described(encoder.source)}: {how} (--pooling chooses)")
    why = ", the length trained at (--max-length chooses)" if asked is None and settings.max_length == trained else ""
    for key, said in COUNTED.items():  # the rows a reader may take for what they are not
        if counts[key]:
            console.error(said.format(n=counts[key], lines=counts["lines"], max_length=settings.max_length, why=why))


COUNTED = {
    "truncated": "bertcli encode: {n:,} of {lines:,} lines were truncated to {max_length} tokens{why}",
    "unpaired": "bertcli encode: {n:,} of {lines:,} lines had no TAB, each encoded as one sentence (--strict-pairs)",
    "inner_cr": "warning: {n:,} of {lines:,} lines hold a carriage return (CR); if CR ends lines, tr '\\r' '\\n'",
}
