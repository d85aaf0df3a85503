"""A seeded stress corpus for tokenizers: every Unicode general category, and the hard cases.

`stress_corpus(n, seed)` returns n strings mixing: letters of many scripts with their
combining marks (Mn/Mc/Me), every other general category drawn from this Python's
`unicodedata` (numbers, all punctuation and symbol classes, space separators, control and
format characters, private-use and unassigned code points), CJK ideographs, emoji with ZWJ
sequences and skin tones, compatibility characters (ligatures, super- and subscripts,
fractions, Roman numerals, full-width forms, ellipsis), special casings (ß, ẞ, İ, ı, Greek
capital sigma in every context, ǅ, ŉ), U+FFFD, every kind of whitespace, and words of
100-250 characters. `stress_vocab(words)` makes a vocabulary in which those strings tokenize
into many pieces (not all [UNK]). Surrogates are left out: they cannot be written in UTF-8.
"""

from __future__ import annotations

import collections
import itertools
import random
import unicodedata

SPECIALS = ["[PAD]"] + [f"[unused{i}]" for i in range(3)] + ["[UNK]", "[CLS]", "[SEP]",
                                                                "[MASK]"]

_SCRIPTS = {  # (first, last) code points of some scripts' letters, with their own marks
    "latin": (0x41, 0x24F), "greek": (0x370, 0x3FF), "cyrillic": (0x400, 0x52F),
    "armenian": (0x531, 0x58A), "hebrew": (0x591, 0x5F4), "arabic": (0x600, 0x6FF),
    "devanagari": (0x900, 0x97F), "bengali": (0x980, 0x9FF), "thai": (0xE00, 0xE7F),
    "tibetan": (0xF00, 0xFDA), "georgian": (0x10A0, 0x10FF), "hangul": (0xAC00, 0xD7A3),
    "hiragana": (0x3041, 0x309F), "katakana": (0x30A0, 0x30FF), "ethiopic": (0x1200, 0x137F),
    "tamil": (0xB80, 0xBFF), "khmer": (0x1780, 0x17FF), "latin_ext": (0x1E00, 0x1EFF),
    "greek_ext": (0x1F00, 0x1FFF), "cherokee": (0x13A0, 0x13FD), "deseret": (0x10400, 0x1044F),
    "vithkuqi": (0x10570, 0x105BC), "osage": (0x104B0, 0x104FB), "adlam": (0x1E900, 0x1E95F),
}
COMPATIBILITY = ("ﬀﬁﬂﬃﬄﬅﬆ ⁰¹²³⁴⁵⁶⁷⁸⁹ⁱⁿ ₀₁₂₃₄₅₆₇₈₉ₐₑ ½⅓⅔¼¾⅕⅙⅛⅜⅝⅞⅟↉ ⅠⅡⅢⅣⅤⅥⅦⅧⅨⅩⅪⅫⅬⅭⅮⅯⅰⅱⅲⅻ "
                 "ＡＢＣａｂｃ０１２！？（）．，：；＂＇ｰ ‥…⁇⁈ ㎏㎞㍱ ℡™℃℉ Ⓐⓐ ㊀㊙ ĳŀŉǆǈǉǌ ſ ẞß İı Kﬓ Å")
SPECIAL_CASING = ["ΣΑΣ", "ΟΔΟΣ", "ΑΣ.Α", "ΑΣ'Σ", "Σ", "ΑΣΣ", "σΣ", "ʰΣ", "ΑΣ\u00adΑ", "ΑΣ\u0301",
                  "Σ\u0301Α", "ǅUNGLA", "İSTANBUL", "ŉ", "ﬃ", "ΐ", "ẞTRASSE", "STRAẞE", "Ωmega",
                  "KELVIN", "ÅNGSTRÖM", "ǰ", "ΆΣ", "ĲSSEL"]
EMOJI = ["👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "😀", "🤷‍♀️", "🧑🏿‍💻", "#️⃣", "©", "™"]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u2000", "\u2003", "\u200a", "\u202f",
              "\u205f", "\u3000", "\u1680", "\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x1f",
              "\x85", "\u200b"]


def _by_category() -> dict[str, list[str]]:
    pools: dict[str, list[str]] = collections.defaultdict(list)
    for cp in itertools.chain(range(0xD800), range(0xE000, 0x110000)):
        char = chr(cp)
        category = unicodedata.category(char)
        if category == "Cn" and not (cp < 0x40000 or 0xE0000 <= cp < 0xE1000):
            continue  # planes 4-13 are all unassigned: keep the pool about other planes' size
        pools[category].append(char)
    return pools


def _script_letters() -> dict[str, list[str]]:
    out = {}
    for name, (first, last) in _SCRIPTS.items():
        chars = [chr(cp) for cp in range(first, last + 1)
                 if unicodedata.category(chr(cp))[0] in "LM"]
        out[name] = chars
    return out


def stress_corpus(n: int = 100_000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pools = _by_category()
    categories = sorted(pools)
    scripts = _script_letters()
    marks = pools["Mn"] + pools["Mc"] + pools["Me"]
    cjk = [chr(cp) for cp in itertools.chain(range(0x4E00, 0x4F00), range(0x3400, 0x3440),
                                              range(0x20000, 0x20040), range(0xF900, 0xF940),
                                              range(0x2F800, 0x2F840))]

    def word() -> str:
        kind = rng.random()
        if kind < 0.40:  # a word of one script, mixed case, with marks now and then
            letters = scripts[rng.choice(sorted(scripts))]
            out = []
            for _ in range(rng.randint(1, 10)):
                char = rng.choice(letters)
                out.append(char.upper() if rng.random() < 0.3 else char)
                if rng.random() < 0.15:
                    out.append(rng.choice(marks))
            return "".join(out)
        if kind < 0.65:  # characters of any general category
            return "".join(rng.choice(pools[rng.choice(categories)])
                           for _ in range(rng.randint(1, 6)))
        if kind < 0.73:
            return "".join(rng.choice(COMPATIBILITY) for _ in range(rng.randint(1, 4)))
        if kind < 0.80:
            return rng.choice(SPECIAL_CASING)
        if kind < 0.86:
            return "".join(rng.choice(cjk) for _ in range(rng.randint(1, 4)))
        if kind < 0.91:
            return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 3)))
        if kind < 0.94:
            return rng.choice(["\ufffd", "a\ufffdb", "\x00", "x\x00y", "\u00ad", "a\u200db"])
        if kind < 0.942:  # 100-250 characters: around both tokenizers' word limits
            letters = scripts[rng.choice(["latin", "cyrillic", "greek", "hangul", "deseret"])]
            return "".join(rng.choice(letters) for _ in range(rng.randint(100, 250)))
        return "".join(rng.choice("abcdefghij.,;:!?'\"-()[]{}<>$%^&*+=|~`@#/\\_0123456789")
                       for _ in range(rng.randint(1, 8)))

    corpus = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 8)):
            parts.append(word())
            parts.append(rng.choice(WHITESPACE) if rng.random() < 0.8 else "")
        corpus.append("".join(parts))
    return [text for text in corpus if not any(s in text for s in SPECIALS)]


def stress_vocab(words_cased, words_uncased, size: int = 20_000, seed: int = 0) -> list[str]:
    """A vocab over the basic words of a corpus: every character (also as ##x), frequent
    words and some prefixes/suffixes of them, so greedy matching splits words into pieces."""
    rng = random.Random(seed)
    counts = collections.Counter(itertools.chain(words_cased, words_uncased))
    chars = sorted({c for w in counts for c in w})
    tokens = dict.fromkeys(chars + ["##" + c for c in chars])
    for w, _ in counts.most_common():
        if len(tokens) >= size:
            break
        if len(w) > 2 and rng.random() < 0.5:
            cut = rng.randint(1, len(w) - 1)
            tokens.setdefault(w[:cut])
            tokens.setdefault("##" + w[cut:])
        else:
            tokens.setdefault(w)
    return SPECIALS + [t for t in tokens if t not in SPECIALS]


def assert_saved_model_tokenizes_by_the_contract(folder, vocab, lowercase: bool, n: int = 2000):
    """A raw-text SavedModel's `tokenize` signature gives `models.tokenizer.Tokenizer`'s ids on
    stress strings (and a few plain ones)."""
    from models.tokenizer import Tokenizer
    from pipeline.serving.export import saved_model_token_ids

    texts = ["The cat sat.", "Café au lait, s'il vous plaît!", "中文 ΟΔΟΣ ﬁne ½"]
    texts += stress_corpus(n, seed=11)
    got = saved_model_token_ids(folder, texts)
    expected = Tokenizer(vocab, lowercase).tokenize(texts)
    wrong = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
    assert not wrong, [(texts[i], got[i], expected[i]) for i in wrong[:3]]
