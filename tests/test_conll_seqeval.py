"""Our CoNLL entity F1 (pipeline/finetuning/metrics.py: conlleval's chunking) against seqeval
1.2.2, the library people report NER scores with, in its default (conlleval-compatible) mode:
the same chunks sentence by sentence and the same micro precision, recall and F1, on
hand-picked edge cases and on random tag sequences.

What "ours" means, as conlleval defines it: an I- tag after O (or after another type) starts a
chunk (IOB1 data, and IOB2 predictions that forgot the B-); B- always starts one, so adjacent
entities of one type are two chunks in IOB2 and in IOB1; E- and S- (IOBES) end one.
seqeval's strict IOB2 mode scores the B-less chunks as invalid instead; that is not ours.
"""

from __future__ import annotations

import numpy as np
import pytest
from seqeval.metrics import f1_score, precision_score, recall_score
from seqeval.metrics.sequence_labeling import get_entities
from seqeval.scheme import IOB2

from pipeline.finetuning import metrics

CASES = {
    "exact": (["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "I-PER", "O", "B-LOC"]),
    "partial boundary": (["B-PER", "I-PER", "O"], ["B-PER", "O", "O"]),
    "wrong type": (["B-PER", "I-PER", "O"], ["B-ORG", "I-ORG", "O"]),
    "I- without B- (IOB1 / a sloppy IOB2 prediction)": (
        ["I-PER", "I-PER", "O", "I-LOC"], ["B-PER", "I-PER", "O", "B-LOC"]),
    "I- after another type": (["B-PER", "I-LOC", "I-LOC"], ["B-PER", "B-LOC", "I-LOC"]),
    "adjacent entities of one type (IOB2)": (
        ["B-PER", "B-PER", "I-PER", "O"], ["B-PER", "I-PER", "I-PER", "O"]),
    "adjacent entities of one type (IOB1)": (
        ["I-PER", "I-PER", "B-PER", "I-PER"], ["I-PER", "I-PER", "I-PER", "I-PER"]),
    "adjacent entities of two types": (["B-PER", "B-LOC", "O"], ["I-PER", "I-LOC", "O"]),
    "entity at the end": (["O", "O", "B-MISC", "I-MISC"], ["O", "O", "B-MISC", "I-MISC"]),
    "IOBES": (["S-PER", "B-LOC", "I-LOC", "E-LOC", "O", "S-ORG"],
              ["S-PER", "B-LOC", "E-LOC", "S-LOC", "O", "B-ORG"]),
    "E- and I- without B-": (["E-PER", "O", "I-LOC", "E-LOC"], ["S-PER", "O", "B-LOC", "E-LOC"]),
    "no entity in the gold": (["O", "O"], ["B-PER", "O"]),
}


@pytest.mark.filterwarnings("ignore:Recall is ill-defined")  # seqeval, no gold entity
@pytest.mark.parametrize("name", list(CASES))
def test_chunks_and_scores_match_seqeval(name):
    gold, predicted = CASES[name]
    for tags in (gold, predicted):
        assert metrics.conll_chunks(tags) == set(get_entities(tags)), tags
    ours = metrics.conll_f1([gold], [predicted])
    assert ours["precision"] == pytest.approx(precision_score([gold], [predicted]), abs=1e-12)
    assert ours["recall"] == pytest.approx(recall_score([gold], [predicted]), abs=1e-12)
    assert ours["f1"] == pytest.approx(f1_score([gold], [predicted]), abs=1e-12)


def random_sentences(rng, tags, count):
    return [list(rng.choice(tags, size=int(rng.integers(1, 12)))) for _ in range(count)]


@pytest.mark.parametrize("tags", [
    ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],  # IOB2 and IOB1 alike
    ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-ORG", "E-ORG", "S-ORG"],  # IOBES
])
def test_random_corpora_score_as_seqeval(tags):
    rng = np.random.default_rng(42)
    for _ in range(20):
        gold = random_sentences(rng, tags, 30)
        predicted = [[t if rng.random() < 0.7 else str(rng.choice(tags)) for t in sentence]
                     for sentence in gold]
        ours = metrics.conll_f1(gold, predicted)
        assert ours["precision"] == pytest.approx(precision_score(gold, predicted), abs=1e-12)
        assert ours["recall"] == pytest.approx(recall_score(gold, predicted), abs=1e-12)
        assert ours["f1"] == pytest.approx(f1_score(gold, predicted), abs=1e-12)


def test_strict_iob2_is_not_ours():
    """seqeval's strict IOB2 mode drops the B-less chunk that conlleval (ours) counts."""
    gold, predicted = ["B-PER", "I-PER", "O"], ["I-PER", "I-PER", "O"]
    assert metrics.conll_f1([gold], [predicted])["f1"] == 1.0
    assert f1_score([gold], [predicted]) == 1.0
    assert f1_score([gold], [predicted], mode="strict", scheme=IOB2) == 0.0
