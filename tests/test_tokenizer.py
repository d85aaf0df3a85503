"""The tokenizer contract (models/tokenizer.py) against Google's `tokenization.py` and Hugging
Face's two BERT tokenizers, on a seeded stress corpus of every Unicode category and on the demo
corpus; its TensorFlow twin (models/preprocessor.py) and the Beam job against the same ids.

The peers, all installed from PyPI by `make setup` (requirements-test.txt):
- Google: `bert-tensorflow` 1.0.4, google-research/bert's `tokenization.py` (`FullTokenizer`);
- transformers' Python tokenizer (`BertTokenizerLegacy` in transformers 5, `BertTokenizer`
  before) and its Rust one (`BertTokenizerFast`, the `tokenizers` library), both given Google's
  word limit of 200 characters (their default is 100).

Ours must give Google's ids for every string. Where Hugging Face's differ from Google's, the
difference must be one of these listed cases (every differing string is checked to contain one,
and every string without one must agree):
- both delete private-use and unassigned characters (categories Co, Cn): Google keeps them;
- the Python one composes the text (NFC) before splitting it: visible in cased vocabularies;
- the Rust one lowercases character by character: no Greek final sigma ("ΟΔΟΣ" → "οδοσ");
- the Rust one has its own Unicode tables: some characters are punctuation, letters, controls
  or marks there and not in Python's `unicodedata` (found by tokenizing each character alone).
"""

from __future__ import annotations

import collections
import re
import unicodedata

import pytest

from models import tokenizer as rules
from tests import unicode_stress as stress

ISSUE_EXAMPLES = {  # text: (uncased pieces), Google's and Hugging Face's
    "a… b": ["a", "…", "b"], "ﬁne": ["ﬁ", "##ne"], "²": ["²"], "½ cup": ["½", "cup"],
    "Straße": ["st", "##raße"], "Ⅻ": ["[UNK]"],
}


# ---------------------------------------------------------------------------
# The peers
# ---------------------------------------------------------------------------
def google_tokenizer(vocab_file, lowercase):
    from bert import tokenization

    tokenization.FLAGS.mark_as_parsed()  # its absl flags (preserve_unused_tokens: False)
    tokenizer = tokenization.FullTokenizer(str(vocab_file), do_lower_case=lowercase)
    return lambda texts: [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t)) for t in texts]


def hf_python_tokenizer(vocab_file, lowercase):
    import transformers

    cls = getattr(transformers, "BertTokenizerLegacy", None)
    if cls is None:
        from transformers.models.bert.tokenization_bert_legacy import (
            BertTokenizerLegacy as cls,
        )
    tokenizer = cls(str(vocab_file), do_lower_case=lowercase)
    tokenizer.wordpiece_tokenizer.max_input_chars_per_word = rules.MAX_WORD_CHARS
    return lambda texts: [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t)) for t in texts]


def hf_rust_tokenizer(vocab, lowercase):
    import transformers

    tokenizer = transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)},
                                               do_lower_case=lowercase, strip_accents=lowercase)
    tokenizer.backend_tokenizer.model.max_input_chars_per_word = rules.MAX_WORD_CHARS
    assert tokenizer.convert_tokens_to_ids(vocab) == list(range(len(vocab)))
    return lambda texts: tokenizer(list(texts), add_special_tokens=False)["input_ids"]


def graph_tokenizer(vocab, lowercase):
    import tensorflow as tf

    from models.preprocessor import TokenizerLayer

    layer = TokenizerLayer(vocab, lowercase=lowercase)
    call = tf.function(layer, input_signature=[tf.TensorSpec([None], tf.string)])

    def tokenize(texts):
        out = []
        for start in range(0, len(texts), 4096):
            out.extend(call(tf.constant(texts[start:start + 4096])).to_list())
        return out
    return tokenize


# ---------------------------------------------------------------------------
# The listed differences of Hugging Face's tokenizers
# ---------------------------------------------------------------------------
def _other(text):
    return any(unicodedata.category(c) in ("Co", "Cn") for c in text)


def _nfc_matters(text):
    cleaned = "".join(c for c in text if unicodedata.category(c)[0] != "C" or c in "\t\n\r")
    return unicodedata.normalize("NFC", cleaned) != cleaned


def rust_table_characters(chars, vocab, lowercase, google):
    """Characters the Rust tokenizer treats otherwise than Google when alone or inside a word."""
    rust = hf_rust_tokenizer(vocab, lowercase)
    probes = [(c, p) for c in chars if not _other(c) for p in (c, f"a{c}b")]
    texts = [p for _, p in probes]
    return {c for (c, _), a, b in zip(probes, google(texts), rust(texts)) if a != b}


def explain(text, lowercase, peer, table_chars):
    """The listed cases a string triggers for a peer (empty: it must agree with Google)."""
    cases = []
    if _other(text):
        cases.append("deletes Co/Cn")
    if peer == "python" and not lowercase and _nfc_matters(text):
        cases.append("NFC")
    if peer == "rust" and lowercase and "Σ" in text:
        cases.append("no final sigma")
    if peer == "rust" and any(c in table_chars for c in text):
        cases.append("Unicode tables")
    return cases


# ---------------------------------------------------------------------------
# Corpora
# ---------------------------------------------------------------------------
def stress_setup(tmp_path, n):
    corpus = stress.stress_corpus(n, seed=0)
    words_cased = [w for t in corpus for w in rules.basic_words(t, False)]
    words_uncased = [w for t in corpus for w in rules.basic_words(t, True)]
    vocab = stress.stress_vocab(words_cased, words_uncased)
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    return corpus, vocab, vocab_file


def compare_all(corpus, vocab, vocab_file, lowercase, hf_python=True, hf_python_first=None):
    """{peer: [indices of strings whose ids differ from Google's]}, checked against the list.
    `hf_python_first`: Hugging Face's Python tokenizer (the slowest peer) on that many of the
    first strings only (None: all); every other peer on all of them."""
    google = google_tokenizer(vocab_file, lowercase)
    expected = google(corpus)
    got = {
        "ours": rules.Tokenizer(vocab, lowercase).tokenize(corpus),
        "ours, in-graph": graph_tokenizer(vocab, lowercase)(corpus),
        "rust": hf_rust_tokenizer(vocab, lowercase)(corpus),
    }
    if hf_python:
        got["python"] = hf_python_tokenizer(vocab_file, lowercase)(corpus[:hf_python_first])
    assert sum(map(len, expected)) > 5 * len(corpus)  # the vocab splits words into pieces
    assert sum(i == vocab.index("[UNK]") for ids in expected for i in ids) < 0.2 * sum(
        map(len, expected))
    table_chars = rust_table_characters(sorted({c for t in corpus for c in t}), vocab, lowercase,
                                        google)
    differ = {}
    for peer, ids in got.items():
        differ[peer] = [i for i, (a, b) in enumerate(zip(ids, expected)) if a != b]
        shown = [(corpus[i], ids[i], expected[i]) for i in differ[peer][:3]]
        if peer.startswith("ours"):
            assert not differ[peer], f"{peer}: {len(differ[peer])} strings differ: {shown}"
            continue
        unexplained = [i for i in differ[peer]
                       if not explain(corpus[i], lowercase, peer, table_chars)]
        assert not unexplained, (peer, [corpus[i] for i in unexplained[:5]])
        cases = collections.Counter(c for i in differ[peer]
                                    for c in explain(corpus[i], lowercase, peer, table_chars))
        print(f"{peer} lowercase={lowercase}: {len(differ[peer])} of {len(ids)} differ; "
              f"cases {dict(cases)}")
    if table_chars:
        kinds = collections.Counter(unicodedata.category(c) for c in table_chars)
        print(f"Rust table characters (lowercase={lowercase}): {len(table_chars)}, by category "
              f"{dict(kinds.most_common())}, e.g. {sorted(table_chars)[:12]}")
    return differ


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------
def test_issue_examples_follow_google(tmp_path):
    vocab = stress.SPECIALS + ["a", "…", "b", "ﬁ", "##ne", "²", "½", "cup", "st", "##raße",
                               "fine", "2", "1", "xii", "##ras", "##se", "..."]
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    texts = list(ISSUE_EXAMPLES)
    expected = [[vocab.index(p) for p in pieces] for pieces in ISSUE_EXAMPLES.values()]
    assert google_tokenizer(vocab_file, True)(texts) == expected
    assert rules.Tokenizer(vocab, True).tokenize(texts) == expected
    assert graph_tokenizer(vocab, True)(texts) == expected
    assert hf_rust_tokenizer(vocab, True)(texts) == expected


def test_rules_edge_cases():
    assert rules.basic_words("ΑΣ.Α ΟΔΟΣ ΑΣ'Σ", True) == ["ασ", ".", "α", "οδος", "ασ", "'", "ς"]
    assert rules.basic_words("a\x1cb\u200bc\x00d e\u2028f\u3000g", False) == ["abcd", "e", "f",
                                                                                 "g"]
    assert rules.basic_words("İstanbul a≠b 中文x", True) == ["istanbul", "a", "=", "b", "中",
                                                             "文", "x"]
    index = {"[UNK]": 0, "a": 1, "##a": 2}
    assert rules.wordpiece("a" * 200, index, 0) == [1] + [2] * 199
    assert rules.wordpiece("a" * 201, index, 0) == [0]


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_stress_corpus_small(tmp_path, lowercase):
    corpus, vocab, vocab_file = stress_setup(tmp_path, 5_000)
    compare_all(corpus, vocab, vocab_file, lowercase)


@pytest.mark.slow
def test_stress_corpus_100k_cased_and_uncased(tmp_path):
    """Ours (Python and in-graph), Google's and the Rust tokenizer on all 100k strings, both
    casings; Hugging Face's Python tokenizer, the slowest peer (over a quarter of the time
    on all of them), on the first 20k (test_stress_corpus_small runs it on 5k as well)."""
    corpus, vocab, vocab_file = stress_setup(tmp_path, 100_000)
    assert len(corpus) >= 100_000 - 50
    for lowercase in (True, False):
        differ = compare_all(corpus, vocab, vocab_file, lowercase, hf_python_first=20_000)
        assert len(differ["python"]) > 0 and max(differ["python"]) < 20_000
        assert max(differ["rust"]) > 20_000  # the other peers did see every string


def _demo(tmp_path, lowercase, sentences, hf_python=True):
    from beam_jobs.vocab import learn_wordpiece
    from pipeline import artifacts
    from pipeline.text.sources import read_brown

    if not artifacts.BROWN_TARBALL.is_file():
        pytest.fail(f"{artifacts.BROWN_TARBALL} missing: run `make setup` first")
    lines = [s for _, doc in read_brown(artifacts.BROWN_TARBALL) for s in doc][:sentences]
    counts = collections.Counter(w for line in lines for w in rules.basic_words(line, lowercase))
    vocab = learn_wordpiece(counts.items(), vocab_size=4000)
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    differ = compare_all(lines, vocab, vocab_file, lowercase, hf_python)
    assert not any(differ.values())  # the demo corpus has none of the listed cases


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_demo_corpus_sample(tmp_path, lowercase):
    _demo(tmp_path, lowercase, 3_000)


@pytest.mark.slow
@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_demo_corpus_whole(tmp_path, lowercase):
    """All 57,340 sentences; Hugging Face's Python tokenizer only on the sample (it is the
    slowest peer, and Google's own code is here)."""
    _demo(tmp_path, lowercase, 10**9, hf_python=False)


def test_special_tokens_in_strings(tmp_path):
    """Rule 6 (the inspection tools): literal [MASK] etc. are their tokens, as in Hugging Face."""
    vocab = stress.SPECIALS + ["hello", "world", "[", "mask", "]", "ας", "ασ", "."]
    texts = ["Hello [MASK] world [SEP] [CLS]", "[mask] [MASK][MASK]", "ΑΣ[MASK] ΑΣ.[MASK]"]
    ours = rules.Tokenizer(vocab, True, special_tokens_in_strings=True).tokenize(texts)
    from models.preprocessor import TokenizerLayer

    graph = TokenizerLayer(vocab, lowercase=True, special_tokens_in_strings=True)(texts)
    assert graph.to_list() == ours
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    assert ours == hf_python_tokenizer(vocab_file, True)(texts)
    assert ours[1] == [vocab.index(t) for t in ["[", "mask", "]", "[MASK]", "[MASK]"]]


def test_beam_job_tokenizes_by_the_contract(tmp_path):
    """The data job's DoFn (setup from the vocab file, as on a worker) gives Google's ids."""
    import apache_beam as beam

    from beam_jobs import transforms

    corpus, _, vocab_file = stress_setup(tmp_path, 2_000)
    expected = google_tokenizer(vocab_file, True)(corpus)
    fn = transforms.TokenizeDocumentsFn(str(vocab_file), True)
    fn.setup()
    documents = [((f"doc{i}", 0), [text]) for i, text in enumerate(corpus)]
    out = dict(item for item in fn.process(documents)
               if not isinstance(item, beam.pvalue.TaggedOutput))
    assert {doc_id: sentences[0] for doc_id, sentences in out.items()} == {
        (f"doc{i}", 0): ids for i, ids in enumerate(expected) if ids}


def test_every_vocab_reader_drops_trailing_whitespace(tmp_path):
    """A vocab.txt whose lines end in spaces, a tab, \\r\\n or \\r means the same tokens (and so
    the same ids) to the data job's workers, the checkpoint converters and the pipeline: all
    of them read it with the contract's one reader."""
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems

    from beam_jobs import transforms
    from models import convert
    from pipeline.text import vocab as vocab_lib

    lines = ["[PAD]", "[UNK] ", "[CLS]", "[SEP]\t", "[MASK]", "the  ", "cat", "##s \r", "."]
    path = tmp_path / "vocab.txt"
    path.write_bytes(("\n".join(lines[:6]) + "\r\n" + "\n".join(lines[6:]) + "\n").encode())
    expected = [line.strip() for line in lines]
    assert rules.read_vocab(path) == expected
    assert rules.read_vocab(str(path), FileSystems.open) == expected  # the Beam jobs' way
    assert convert.read_vocab(path) == expected  # the converters'
    assert vocab_lib.read_vocab(path) == expected  # the pipeline's (checks the special tokens)
    fn = transforms.TokenizeDocumentsFn(str(path), True)  # a data job worker, set up
    fn.setup()
    out = [item for item in fn.process([(("d", 0), ["The cats."])])
           if not isinstance(item, beam.pvalue.TaggedOutput)]
    assert out == [(("d", 0), [[5, 6, 7, 8]])]
    path.write_bytes(b"[PAD]\n\xe9t\xe9\n")  # Latin-1, not UTF-8: one message naming the file
    with pytest.raises(ValueError, match=re.escape(f"vocab file {path}: not valid UTF-8 at "
                                                   f"byte offset 6")):
        rules.read_vocab(path)
    with pytest.raises(vocab_lib.TextError, match="not valid UTF-8"):
        vocab_lib.read_vocab(path)


def test_ascii_patterns_are_the_full_rules_on_ascii():
    """The ASCII fast path's regexes classify each of the 128 ASCII code points as the full
    Unicode tables do, and a process that tokenizes only ASCII text never builds the tables
    (they cost about a second per Beam worker)."""
    ascii_patterns, full = rules._ascii_patterns(), rules._patterns()
    for cp in range(128):
        for name, small, big in zip(("delete", "space", "mark", "splitter"), ascii_patterns,
                                    full):
            found = bool(small.search(chr(cp))) if small is not None else False
            assert found == bool(big.search(chr(cp))), (name, cp)
    script = (
        "from models import tokenizer as rules\n"
        "tok = rules.Tokenizer(['[PAD]', '[UNK]', 'the', 'cat', '##s', '.', ','], True)\n"
        "ids = tok.tokenize(['The cats.', 'the\\tcat , x\\x01y', 'Cats'])\n"
        "assert rules.basic_words('Tab\\there, (ok)!', True) == "
        "['tab', 'here', ',', '(', 'ok', ')', '!']\n"
        "print(ids, rules.character_classes.cache_info().currsize)\n")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=str(__import__("pathlib").Path(__file__).parent.parent))
    assert out.stdout.split()[-1] == "0", out.stdout  # the full tables were never built
    assert "[[2, 3, 4, 5], [2, 3, 6, 1], [3, 4]]" in out.stdout
    # Non-ASCII text still goes through the full tables.
    assert rules.basic_words("Café ½", True) == ["cafe", "½"]
