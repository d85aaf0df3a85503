"""Word spans of a text, for the tasks that label words (QA answers, word tagging).

`basic_tokens` splits text where the tokenizer contract (`models.tokenizer`) splits it — on
whitespace, and around every punctuation and CJK character — and keeps each word's character
offsets, so answers and word labels map back to the text. The in-graph preprocessor itself
is `models.preprocessor.TextPreprocessor`.
"""

from __future__ import annotations

import functools
import re


# ---------------------------------------------------------------------------
# Extractive QA features (SQuAD, with doc stride)
# ---------------------------------------------------------------------------
@functools.cache
def word_split_patterns(dialect: str = "python") -> tuple[str, str]:
    """(delimiters, kept delimiters) of the word split, for Python's `re` or RE2 (serving)."""
    from models import tokenizer

    classes = tokenizer.character_classes()
    own = tokenizer.regex_class(classes["punctuation"] + classes["cjk"], dialect)
    space = tokenizer.regex_class(classes["space"], dialect)
    return f"{space}+|{own}", own


@functools.cache
def _word_pattern():
    from models import tokenizer

    classes = tokenizer.character_classes()
    apart = tokenizer.regex_class(classes["punctuation"] + classes["cjk"] + classes["space"])
    return re.compile(f"{word_split_patterns()[1]}|[^{apart[1:]}+")


def basic_tokens(text: str) -> list[tuple[str, int, int]]:
    """Words and single punctuation/CJK characters with their character spans.

    >>> basic_tokens("Hi, you.")
    [('Hi', 0, 2), (',', 2, 3), ('you', 4, 7), ('.', 7, 8)]
    """
    return [(m.group(), m.start(), m.end()) for m in _word_pattern().finditer(text)]
