"""The WordPiece tokenizer (Hugging Face `tokenizers`): train one on a corpus, or load an existing
tokenizer.json or BERT vocab.txt; save both files next to the prepared data and in checkpoints.

bertcli's own vocabularies put the special tokens first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3,
[MASK]=4. A loaded vocabulary keeps its own ids (bert-base-uncased has [PAD]=0, [UNK]=100, ...).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertcli.config import TokenizerConfig
from bertcli.data.corpus import SpecialTokens
from bertcli.errors import UsageError

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONTINUATION = "##"


def _bert_pipeline(tok: Tokenizer, cfg: TokenizerConfig) -> Tokenizer:
    """BERT's normalizer (clean text, split CJK characters, lowercase, strip accents) and pre-tokenizer."""
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=cfg.strip_accents, lowercase=cfg.lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=CONTINUATION)
    return tok


def _add_post_processor(tok: Tokenizer) -> Tokenizer:
    """[CLS] A [SEP] and [CLS] A [SEP] B [SEP] with segment ids, as BERT expects."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def train_tokenizer(sentences: Iterable[str], cfg: TokenizerConfig) -> Tokenizer:
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix=CONTINUATION)), cfg)
    trainer = trainers.WordPieceTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                        special_tokens=list(SPECIAL), continuing_subword_prefix=CONTINUATION,
                                        show_progress=False)
    tok.train_from_iterator(sentences, trainer=trainer)
    return _add_post_processor(tok)


def find_tokenizer_file(path: Path) -> Path:
    """The tokenizer.json or vocab.txt that `path` names (a file, or a folder holding one)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = next((path / n for n in ("tokenizer.json", "vocab.txt") if (path / n).is_file()), path)
    if not path.is_file():
        raise UsageError(f"{path}: no tokenizer here; data.tokenizer.path takes a tokenizer.json, a vocab.txt or a folder with one")
    return path


def load_tokenizer(path: Path, cfg: TokenizerConfig) -> Tokenizer:
    """A tokenizer.json (used as it is) or a vocab.txt (with BERT's pipeline and cfg's casing)."""
    path = find_tokenizer_file(path)
    try:
        if path.suffix == ".json":
            tok = Tokenizer.from_file(str(path))
        else:
            tok = _add_post_processor(_bert_pipeline(Tokenizer(models.WordPiece.from_file(str(path), unk_token="[UNK]")), cfg))
    except Exception as exc:  # tokenizers raises plain Exceptions with its own message
        raise UsageError(f"{path}: cannot load tokenizer ({str(exc).splitlines()[0]})") from None
    missing = [t for t in SPECIAL if tok.token_to_id(t) is None]
    if missing:
        raise UsageError(f"{path}: the vocabulary lacks {', '.join(missing)}; BERT needs all of {', '.join(SPECIAL)}")
    return tok


def save_tokenizer(tok: Tokenizer, folder: Path) -> None:
    """tokenizer.json and vocab.txt (one token per line, in id order) into folder."""
    tok.save(str(Path(folder) / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise UsageError("the tokenizer's ids are not 0..N-1; cannot write vocab.txt")
    (Path(folder) / "vocab.txt").write_text("".join(token + "\n" for token, _ in by_id), encoding="utf-8")


def special_tokens(tok: Tokenizer) -> SpecialTokens:
    ids = [tok.token_to_id(t) for t in SPECIAL]
    return SpecialTokens(pad=ids[0], unk=ids[1], cls=ids[2], sep=ids[3], mask=ids[4])


def continuation_mask(tok: Tokenizer) -> np.ndarray:
    """(V,) True for pieces that continue a word ("##ing"): whole-word masking keeps them with their word."""
    mask = np.zeros(tok.get_vocab_size(with_added_tokens=True), dtype=bool)
    for token, i in tok.get_vocab(with_added_tokens=True).items():
        mask[i] = token.startswith(CONTINUATION)
    return mask
