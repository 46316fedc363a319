"""WordPiece (Hugging Face `tokenizers`): trained (special tokens first, then the "##c" pieces in code-point order),
or loaded from a tokenizer.json or vocab.txt; every one loaded is `unpadded`, so no [PAD] or cut gets into the shards."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertcli import store
from bertcli.config import TokenizerConfig
from bertcli.data.corpus import SpecialTokens
from bertcli.errors import UsageError
from bertcli.layout import TOKENIZER_CONFIG, TOKENIZER_FILES, TOKENIZER_JSON, VOCAB

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONTINUATION = "##"


@dataclass(frozen=True, kw_only=True)
class Casing:
    """BERT's normalisation settings, named as in tokenizer_config.json, with BertTokenizer's defaults."""

    do_lower_case: bool = True
    strip_accents: bool | None = None  # None: follow do_lower_case (as BertTokenizer does)
    tokenize_chinese_chars: bool = True  # put spaces around CJK characters: one token each


def casing_of(folder: Path) -> Casing | None:
    """The casing of the tokenizer_config.json in `folder`, as BertTokenizer reads it; None without one."""
    file = Path(folder) / TOKENIZER_CONFIG
    if not file.is_file():
        return None
    raw = store.read_json(file)
    if not str(raw.get("tokenizer_class") or "BertTokenizer").removesuffix("Fast").endswith("BertTokenizer"):
        return None
    defaults = Casing()
    values = {f.name: raw.get(f.name, getattr(defaults, f.name)) for f in fields(Casing)}
    for key, value in values.items():
        if not (isinstance(value, bool) or (key == "strip_accents" and value is None)):
            raise UsageError(f"{file}: {key} is {value!r}; expected true or false")
    return Casing(**values)


def _normalizer(casing: Casing, clean_text: bool = True) -> normalizers.BertNormalizer:
    chinese, accents, lower = casing.tokenize_chinese_chars, casing.strip_accents, casing.do_lower_case
    return normalizers.BertNormalizer(clean_text, handle_chinese_chars=chinese, strip_accents=accents, lowercase=lower)


def _bert_pipeline(tok: Tokenizer, casing: Casing) -> Tokenizer:
    tok.normalizer = _normalizer(casing)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=CONTINUATION)
    return tok


def _add_post_processor(tok: Tokenizer) -> Tokenizer:
    """[CLS] A [SEP] and [CLS] A [SEP] B [SEP] with segment ids, as BERT expects."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def _new_tokenizer(cfg: TokenizerConfig) -> Tokenizer:
    return _bert_pipeline(
        Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix=CONTINUATION)),
        Casing(do_lower_case=cfg.lowercase, strip_accents=cfg.strip_accents),
    )


# Bits of scan_characters' table, one byte per code point.
_KNOWN, _REMOVED, _STARTS_WORD, _ENDS_WORD, _SETTLED = 1, 2, 4, 8, 16


@dataclass(frozen=True)
class Characters:
    inner: list[str]  # the characters that continue a word: the c of every "##c" the trainer makes, in code-point order
    every: list[str]  # every character of every word (punctuation too) once normalised, in code-point order
    count: int  # characters read but line breaks (which read_text adds): the same however the corpus is cut


def scan_characters(texts: Iterable[str], cfg: TokenizerConfig) -> Characters:
    """The characters of `texts` (the corpus in blocks) once normalised, each distinct one once (a table by code
    point); one continues a word where its normal form starts with a word character and the previous one's ends so."""
    tok = _new_tokenizer(cfg)
    normalizer, pre_tokenizer = tok.normalizer, tok.pre_tokenizer

    @cache
    def in_word(ch: str) -> bool:  # neither white space nor punctuation (nor CJK, which is padded with spaces)
        return len(pre_tokenizer.pre_tokenize_str(f"a{ch}a")) == 1

    @cache
    def kept(ch: str) -> bool:  # part of a word or a word itself (punctuation, CJK): not white space
        return bool(pre_tokenizer.pre_tokenize_str(ch))

    table = np.zeros(0x110000, dtype=np.uint8)  # _KNOWN | ... per code point
    inner: set[str] = set()
    every: set[str] = set()
    count = 0
    previous = np.array([ord(" ")], dtype=np.uint32)  # the last kept character so far: nothing yet
    table[previous] = _KNOWN | _SETTLED
    for text in texts:
        count += len(text) - text.count("\n")
        points = np.concatenate([previous, np.frombuffer(text.encode("utf-32-le"), dtype="<u4")])
        kind = table[points]
        new = np.unique(points[kind == 0]).tolist()
        for point in new:  # characters not met before: a few, mostly in the first block
            normal = normalizer.normalize_str(chr(point))  # "" for removed ones (control characters, accents)
            word = [in_word(ch) for ch in normal]
            inner.update(ch for j, ch in enumerate(normal) if j and word[j] and word[j - 1])
            every.update(ch for ch in normal if kept(ch))
            bits = _KNOWN | (_STARTS_WORD if word and word[0] else _SETTLED) | (_ENDS_WORD if word and word[-1] else 0)
            table[point] = bits | (0 if normal else _REMOVED)
        if new:
            kind = table[points]
        open_ = np.flatnonzero((kind[1:] & _SETTLED) == 0) + 1  # might continue a word (0 was judged before)
        before = open_ - 1
        while len(before):  # step back over removed characters: they join their neighbours
            gone = (kind[before] & _REMOVED) != 0
            if not gone.any():
                break
            before[gone] -= 1
        hits = np.unique(points[open_[(kind[before] & _ENDS_WORD) != 0]])
        table[hits] |= _SETTLED
        inner.update(normalizer.normalize_str(chr(point))[0] for point in hits.tolist())
        last = len(points) - 1
        while kind[last] & _REMOVED:  # position 0 is always kept
            last -= 1
        previous = points[last : last + 1].copy()
    return Characters(inner=sorted(inner), every=sorted(every), count=count)


def train_wordpiece(sentences: Iterable[str], cfg: TokenizerConfig, chars: Characters) -> Tokenizer:
    """A WordPiece vocabulary trained on `sentences`; every character of the corpus (`chars`) gets its pieces.
    tokenizers gives "##c" ids in hash-map order (huggingface/tokenizers#1794): registered as special tokens
    after the real ones, their ids are fixed, then they are turned back into ordinary pieces."""
    continuations = [CONTINUATION + ch for ch in chars.inner]
    tok = _new_tokenizer(cfg)
    trainer = trainers.WordPieceTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=[*SPECIAL, *continuations],
        initial_alphabet=chars.every,
        continuing_subword_prefix=CONTINUATION,
        show_progress=False,
    )
    tok.train_from_iterator(sentences, trainer=trainer)
    spec = json.loads(tok.to_str())  # the model's vocabulary holds every piece; only SPECIAL stay added tokens
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in SPECIAL]
    return _add_post_processor(Tokenizer.from_str(json.dumps(spec)))


def find_tokenizer_file(path: Path) -> Path:
    """The tokenizer.json or vocab.txt that `path` names (a file, or a folder holding one)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = next((path / n for n in TOKENIZER_FILES if (path / n).is_file()), path)
    if not path.is_file():
        raise UsageError(f"{path}: no tokenizer here; data.tokenizer.path takes a tokenizer.json or vocab.txt")
    return path


def unpadded(tok: Tokenizer) -> Tokenizer:  # bertcli pads and truncates itself
    tok.no_padding()
    tok.no_truncation()
    return tok


def read_tokenizer_json(path: Path) -> Tokenizer:
    """A tokenizer.json that bertcli wrote (prepared data, checkpoints), padding and truncation off."""
    try:
        return unpadded(Tokenizer.from_file(str(path)))
    except Exception as exc:  # tokenizers raises plain Exceptions with its own message
        raise UsageError(f"{path}: damaged ({str(exc).splitlines()[0] if str(exc) else exc!r}); restore it") from None


def load_tokenizer(path: Path, cfg: TokenizerConfig) -> Tokenizer:
    """A tokenizer.json or a vocab.txt (with BERT's pipeline), unpadded; a tokenizer_config.json beside it
    decides the casing, as in transformers (a vocab.txt without one takes cfg's)."""
    path = find_tokenizer_file(path)
    casing = casing_of(path.parent)
    try:
        if path.suffix == ".json":
            tok = Tokenizer.from_file(str(path))
            if casing is not None and isinstance(tok.normalizer, normalizers.BertNormalizer):
                tok.normalizer = _normalizer(casing, tok.normalizer.clean_text)
        else:
            casing = casing or Casing(do_lower_case=cfg.lowercase, strip_accents=cfg.strip_accents)
            tok = _add_post_processor(
                _bert_pipeline(Tokenizer(models.WordPiece.from_file(str(path), unk_token="[UNK]")), casing)
            )
            # as in BertTokenizer: "[MASK]" in the text is that token, never lower-cased and split
            tok.add_special_tokens([t for t in SPECIAL if tok.token_to_id(t) is not None])
    except Exception as exc:  # tokenizers raises plain Exceptions with its own message
        raise UsageError(f"{path}: cannot load tokenizer ({str(exc).splitlines()[0]})") from None
    missing = [t for t in SPECIAL if tok.token_to_id(t) is None]
    if missing:
        raise UsageError(f"{path}: the vocabulary lacks {', '.join(missing)}; BERT needs all of {', '.join(SPECIAL)}")
    if tok.get_vocab_size(with_added_tokens=True) <= len(SPECIAL):
        raise UsageError(f"{path}: the vocabulary holds only the special tokens; use a vocabulary with words in it")
    return unpadded(tok)


def describe(tok: Tokenizer) -> dict[str, Any]:
    """A tokenizer's size and, for BERT's normalizer, its casing."""
    info: dict[str, Any] = {"vocab_size": tok.get_vocab_size(with_added_tokens=True)}
    if isinstance(norm := tok.normalizer, normalizers.BertNormalizer):
        lower = bool(norm.lowercase)
        strip = lower if norm.strip_accents is None else bool(norm.strip_accents)
        info |= {"lowercase": lower, "strip_accents": strip, "tokenize_chinese_chars": bool(norm.handle_chinese_chars)}
    return info


def casing_clashes(tok: Tokenizer, cfg: TokenizerConfig) -> str:
    """The casing settings of `cfg` that loaded tokenizer `tok` does not follow; '' where none."""
    casing = describe(tok)
    return ", ".join(
        f"data.tokenizer.{key}={str(getattr(cfg, key)).lower()} (the tokenizer: {str(casing[key]).lower()})"
        for key in ("lowercase", "strip_accents")
        if key in casing and casing[key] != getattr(cfg, key)
    )


def save_tokenizer(tok: Tokenizer, folder: Path) -> None:
    """tokenizer.json and vocab.txt (one token per line, in id order) into folder."""
    tokenizer_json, vocab = Path(folder) / TOKENIZER_JSON, Path(folder) / VOCAB
    with store.writing(tokenizer_json):  # a full disk named, whatever tokenizers calls it
        tok.save(str(tokenizer_json))
    store.write_inside(vocab, vocab_text(tok))


def check_ids(tok: Tokenizer, path: Path) -> None:
    """Refuse tokenizer file `path` unless its ids are 0..N-1 (as vocab.txt needs), naming a token given twice."""
    ids = sorted(tok.get_vocab(with_added_tokens=True).values())
    if ids == list(range(len(ids))):
        return
    if Path(path).suffix != ".json":
        seen: dict[str, int] = {}
        with open(path, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                token = line.rstrip()
                if token in seen:
                    raise UsageError(f"{path}: token {token!r} is on lines {seen[token]:,} and {number:,}: remove one")
                seen[token] = number
    missing = next(i for i, id_ in enumerate([*ids, -1]) if i != id_)
    raise UsageError(f"{path}: the token ids are not 0..N-1 (id {missing:,} is missing); use one whose ids are")


def vocab_text(tok: Tokenizer) -> str:
    """One token a line, in id order."""
    by_id = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise UsageError("the tokenizer's ids are not 0..N-1; cannot write vocab.txt")
    return "".join(token + "\n" for token, _ in by_id)


def tokenizer_identity(tok: Tokenizer) -> str:
    """What fixes the token ids of text, hashed: the vocabulary in id order, the normaliser, the pre-tokenizer."""
    spec = json.loads(tok.to_str())
    vocab = [t for t, _ in sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])]
    key = {"vocab": vocab, "normalizer": spec.get("normalizer"), "pre_tokenizer": spec.get("pre_tokenizer")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def special_tokens(tok: Tokenizer) -> SpecialTokens:
    ids = [tok.token_to_id(t) for t in SPECIAL]
    return SpecialTokens(pad=ids[0], unk=ids[1], cls=ids[2], sep=ids[3], mask=ids[4])


def continuation_mask(tok: Tokenizer) -> np.ndarray:
    """(V,) True for pieces that continue a word ("##ing"): whole-word masking keeps them with their word."""
    mask = np.zeros(tok.get_vocab_size(with_added_tokens=True), dtype=bool)
    mask[[i for token, i in tok.get_vocab(with_added_tokens=True).items() if token.startswith(CONTINUATION)]] = True
    return mask
