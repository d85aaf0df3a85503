"""BERT's tokenizer contract: the rules, written once, and their pure-Python implementation.

Every part of the project tokenizes by these rules: the Beam jobs (vocabulary and
pretraining data, with `Tokenizer` below: no TensorFlow), and fine-tuning, inspection, the
converters and every raw-text SavedModel (with `models.preprocessor.TokenizerLayer`, the same
rules in TensorFlow ops, built from the character tables of this module). Tests hold all of
them to zero differing ids against Google's `tokenization.py` on a stress corpus of every
Unicode category (tests/test_tokenizer.py).

The rules are Google's (google-research/bert `tokenization.py`, `FullTokenizer`):

1. **Clean.** Delete NUL, U+FFFD and every control or format character (general category Cc or
   Cf: soft hyphen, zero-width space and joiners, bidi marks...), except tab, newline and
   carriage return, which are whitespace. Private-use and unassigned characters are kept.
2. **Words.** Split on whitespace: space, tab, newline, carriage return, every space separator
   (Zs) and the line/paragraph separators U+2028/U+2029.
3. **Casing.** Uncased (`lowercase=True`): lowercase each word (Python's `str.lower`: full case
   mapping, Greek final sigma), decompose it (NFD) and delete the nonspacing marks (Mn), so
   "Café" is "cafe". Nothing else is folded: no compatibility (NFKC) mapping, so "ﬁ", "²",
   "½", "Ⅻ" and full-width letters stay what they are, and "ß" stays "ß". Cased: words are
   left exactly as written.
4. **Punctuation and CJK.** Every punctuation character (categories P*, and every ASCII
   character that is not a letter, digit or space: `$ + < = > ^ ` | ~` too) and every CJK
   ideograph (Google's blocks: U+4E00-9FFF, 3400-4DBF, 20000-2A6DF, 2A700-2B73F, 2B740-2B81F,
   2B820-2CEAF, F900-FAFF, 2F800-2FA1F) is a word of its own.
5. **WordPiece.** Each word becomes the longest vocabulary entry that starts it, then the
   longest `##`-prefixed entry that continues it, and so on. A word of more than 200
   characters (`MAX_WORD_CHARS`, counted in characters, not bytes), or one with a remainder
   that no entry matches, is a single [UNK].
6. **Special tokens** (only with `special_tokens_in_strings`, used by the inspection tools):
   "[CLS]", "[SEP]", "[MASK]", "[PAD]" and "[UNK]" written in the text, in capitals, are those
   tokens; anything else in brackets is split as usual ("[mask]" is "[", "mask", "]").

A vocab.txt is read one token per line, in id order, trailing whitespace dropped
(`read_vocab`, the one reader; a repeated token keeps its last id, as Google's `load_vocab`).
The character classes come from Python's `unicodedata` (Unicode `UNICODE_VERSION`); the
in-graph tokenizer uses the same classes and corrects its ICU library where ICU's case
mapping or decomposition disagrees with them.

Where Hugging Face's tokenizers differ from Google (tests/test_tokenizer.py lists the cases):
they delete private-use, unassigned and surrogate characters (Google keeps them), limit words
to 100 characters by default (Google: 200), and the Rust `BertTokenizerFast` lowercases without
the Greek final sigma and uses its own Unicode tables.

    >>> tok = Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s",
    ...                  "."], lowercase=True)
    >>> tok.tokenize(["The cats.", "Dogs"])
    [[5, 6, 7, 8], [1]]
    >>> basic_words("Ａ½ ﬁne Straße… [MASK]", lowercase=True)
    ['ａ½', 'ﬁne', 'straße', '…', '[', 'mask', ']']
"""

from __future__ import annotations

import array
import functools
import io
import itertools
import re
import unicodedata
from typing import Iterable, Sequence

MAX_WORD_CHARS = 200
SUFFIX = "##"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
UNICODE_VERSION = unicodedata.unidata_version
TOKEN_CACHE_WORDS = 1_000_000  # words whose ids a Tokenizer keeps (about 100 MB at most)

CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_ASCII_PUNCTUATION = frozenset(c for c in range(33, 127) if not chr(c).isalnum())


def vocab_tokens(text: str) -> list[str]:
    """The tokens of a vocab.txt's text, in id order: one a line (\\n, \\r\\n or \\r ends it),
    trailing whitespace dropped, as keras-hub and tf-text read a vocabulary file."""
    return [line.rstrip() for line in io.StringIO(text, newline=None)]


def read_vocab(path, open_binary=None) -> list[str]:
    """A vocab.txt's tokens in id order (`vocab_tokens`): the one reader of a vocabulary file,
    for the Beam jobs, the checkpoint converters and the pipeline alike, so a token means the
    same id everywhere. `open_binary(path)` opens the file for reading bytes: a local file by
    default; the Beam jobs pass their file systems' `open` (gs://, s3://). OSError if it
    cannot be opened; ValueError, naming the file and the byte offset, if it is not UTF-8."""
    opener = open_binary or (lambda name: open(name, "rb"))
    with opener(str(path)) as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"vocab file {path}: not valid UTF-8 at byte offset {err.start} "
                         f"({err.reason}); re-encode it as UTF-8") from None
    return vocab_tokens(text)


# ---------------------------------------------------------------------------
# Character classes (lists of inclusive code point ranges)
# ---------------------------------------------------------------------------
def _ranges(code_points: Iterable[int]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for cp in sorted(code_points):
        if out and cp == out[-1][1] + 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return tuple((a, b) for a, b in out)


def _classify(cp: int) -> str | None:
    """The class of one code point under rules 1-4 (delete, space, mark, punctuation,
    unassigned), or None for the rest."""
    char = chr(cp)
    category = unicodedata.category(char)
    if cp in (0, 0xFFFD) or (category in ("Cc", "Cf") and char not in "\t\n\r"):
        return "delete"
    if category == "Zs" or char.isspace():
        return "space"
    if category == "Mn":
        return "mark"
    if category[0] == "P" or cp in _ASCII_PUNCTUATION:
        return "punctuation"
    if category == "Cn":
        return "unassigned"
    return None


@functools.cache
def character_classes() -> dict[str, tuple[tuple[int, int], ...]]:
    """The rules' character classes from this Python's Unicode tables, as code point ranges.

    delete (rule 1), space (2), mark (Mn, 3), punctuation and cjk (4), and for the
    in-graph tokenizer: unassigned (Cn), cased and case_ignorable (as `str.lower` sees them
    for the final sigma). Takes about a second, once per process; text that is all ASCII
    never needs it (`_ascii_patterns`).
    """
    members: dict[str, list[int]] = {"delete": [], "space": [], "mark": [], "punctuation": [],
                                     "unassigned": []}
    for cp in itertools.chain(range(0xD800), range(0xE000, 0x110000)):
        kind = _classify(cp)
        if kind is not None:
            members[kind].append(cp)
    cased, ignorable = _sigma_context()
    return {**{kind: _ranges(cps) for kind, cps in members.items()},
            "cjk": tuple(sorted(CJK_RANGES)), "cased": _ranges(cased),
            "case_ignorable": _ranges(ignorable)}


def _sigma_context() -> tuple[list[int], list[int]]:
    """Characters `str.lower` counts as cased / case-ignorable around a capital sigma.

    A capital sigma lowercases to final "ς" when a cased letter precedes it (skipping
    case-ignorable characters) and none follows it; read off Python's own `str.lower`.
    """
    cased, ignorable = [], []
    for cp in itertools.chain(range(0xD800), range(0xE000, 0x110000)):
        char = chr(cp)
        if unicodedata.category(char) in ("Cn", "Co"):
            continue
        if (char + "Σ").lower()[-1] == "ς":
            cased.append(cp)
        elif ("A" + char + "Σ").lower()[-1] == "ς":
            ignorable.append(cp)
    return cased, ignorable


def regex_class(ranges, dialect: str = "python") -> str:
    """A `[...]` character class of code point ranges, for Python's `re` or for RE2."""
    def char(cp: int) -> str:
        return f"\\x{{{cp:x}}}" if dialect == "re2" else f"\\U{cp:08x}"
    return "[" + "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges) + "]"


def _compile(classes) -> tuple:
    delete = re.compile(regex_class(classes["delete"]))
    space = re.compile(regex_class(classes["space"]) + "+")
    mark = re.compile(regex_class(classes["mark"])) if classes["mark"] else None
    # Punctuation and CJK characters are words of their own: capture them in the split.
    splitter = re.compile("(" + regex_class(classes["punctuation"] + classes.get("cjk", ()))
                          + ")")
    return delete, space, mark, splitter


@functools.cache
def _patterns():
    """(delete, space, mark, splitter) regexes for any text."""
    return _compile(character_classes())


@functools.cache
def _ascii_patterns():
    """The same regexes for text that is all ASCII, from the same rules applied to the 128
    ASCII code points only: a millisecond instead of the second the full tables take, so a
    process that tokenizes only ASCII text (most English corpora) never builds them."""
    members: dict[str, list[int]] = {"delete": [], "space": [], "mark": [], "punctuation": []}
    for cp in range(128):
        kind = _classify(cp)
        if kind in members:
            members[kind].append(cp)
    return _compile({kind: _ranges(cps) for kind, cps in members.items()})


def special_tokens_pattern(tokens: Sequence[str] = SPECIAL_TOKENS) -> str:
    return "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))


# ---------------------------------------------------------------------------
# Rules 1-4: text -> words
# ---------------------------------------------------------------------------
def basic_words(text: str, lowercase: bool) -> list[str]:
    """Rules 1-4: text → the words WordPiece sees (no special tokens)."""
    delete, space, mark, splitter = _ascii_patterns() if text.isascii() else _patterns()
    if delete.search(text):
        text = delete.sub("", text)
    out: list[str] = []
    for word in space.split(text):
        if not word:
            continue
        if lowercase:
            word = word.lower()
            if not word.isascii():
                word = mark.sub("", unicodedata.normalize("NFD", word))
        if word.isalnum() and word.isascii():
            out.append(word)
        else:
            out.extend(piece for piece in splitter.split(word) if piece)
    return out


def wordpiece(word: str, index: dict[str, int], unk_id: int, longest: int = 1 << 30) -> list[int]:
    """Rule 5: one word → its WordPiece ids (`longest`: the longest entry, a shortcut)."""
    if len(word) > MAX_WORD_CHARS:
        return [unk_id]
    ids, start, n = [], 0, len(word)
    while start < n:
        end = min(n, start + longest)
        while end > start:
            piece = word[start:end] if start == 0 else SUFFIX + word[start:end]
            found = index.get(piece)
            if found is not None:
                ids.append(found)
                break
            end -= 1
        else:
            return [unk_id]
        start = end
    return ids


# ---------------------------------------------------------------------------
# Tokenizer: the rules with a word cache (the Beam jobs' tokenizer)
# ---------------------------------------------------------------------------
class Tokenizer:
    """Text → WordPiece ids by the rules above, in pure Python, with a cache of words seen.

    Text splits on whitespace into words whose ids do not depend on their neighbours, so
    each distinct word is tokenized once and then looked up (at most `cache_words` kept, as
    packed ids). `special_tokens_in_strings` turns rule 6 on.
    """

    def __init__(self, vocab: Sequence[str], lowercase: bool,
                 cache_words: int = TOKEN_CACHE_WORDS, special_tokens_in_strings: bool = False):
        self.vocab = list(vocab)
        self.lowercase = lowercase
        self.index = {token: i for i, token in enumerate(self.vocab)}  # a repeat keeps its last id
        if "[UNK]" not in self.index:
            raise ValueError("the vocabulary has no [UNK] token; a BERT vocab needs "
                             + ", ".join(SPECIAL_TOKENS))
        self.unk_id = self.index["[UNK]"]
        self._longest = max(len(t[len(SUFFIX):] if t.startswith(SUFFIX) else t)
                            for t in self.vocab)
        self.typecode = "H" if len(self.vocab) <= 1 << 16 else "I"  # array type of the ids
        self._cache: dict[str, bytes] = {"": b""}
        self._cache_words = cache_words
        self._special = None
        if special_tokens_in_strings:
            present = [t for t in SPECIAL_TOKENS if t in self.index]
            self._special = re.compile("(" + special_tokens_pattern(present) + ")")

    def word_ids(self, word: str) -> list[int]:
        """Ids of one whitespace-free string (rules 1, 3-5)."""
        return [i for piece in basic_words(word, self.lowercase)
                for i in wordpiece(piece, self.index, self.unk_id, self._longest)]

    def _pack(self, ids: list[int]) -> bytes:
        return array.array(self.typecode, ids).tobytes()

    def tokenize_packed(self, texts: Sequence[str]) -> list[bytes]:
        """[text] → the ids of each as packed machine integers (array(self.typecode))."""
        if self._special is not None:
            return [b"".join(self._pack([self.index[part]]) if k % 2 else self._text_packed(part)
                             for k, part in enumerate(self._special.split(text)))
                    for text in texts]
        return [self._text_packed(text) for text in texts]

    def _text_packed(self, text: str) -> bytes:
        cache = self._cache
        words = text.split() if text.isascii() and text.isprintable() else self._split(text)
        out = []
        for word in words:
            packed = cache.get(word)
            if packed is None:
                packed = self._pack(self.word_ids(word))
                if len(cache) < self._cache_words:
                    cache[word] = packed
            out.append(packed)
        return b"".join(out)

    def _split(self, text: str) -> list[str]:
        delete, space, _, _ = _ascii_patterns() if text.isascii() else _patterns()
        if delete.search(text):  # deleting joins what it separated ("a\x1cb" is "ab")
            text = delete.sub("", text)
        return space.split(text)

    def tokenize_arrays(self, texts: Sequence[str]) -> list[array.array]:
        """[text] → [array of ids] (empty for a text without tokens)."""
        out = []
        for data in self.tokenize_packed(texts):
            ids = array.array(self.typecode)
            ids.frombytes(data)
            out.append(ids)
        return out

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """[text] → [[id, ...]] (empty for a text without tokens)."""
        return [ids.tolist() for ids in self.tokenize_arrays(texts)]

    def tokens(self, text: str) -> list[str]:
        """One text → its WordPiece strings (for reading, not for speed)."""
        return [self.vocab[i] for i in self.tokenize([text])[0]]
