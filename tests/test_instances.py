"""Tests of beam_jobs.instances: masking, truncation and NSP/SOP/MLM instances, in plain
Python (no Beam; the job that runs them: tests/test_pretraining_data.py).

Faithfulness: `reference_*` below restate google-research/bert's
create_pretraining_data.py step by step (shuffle all candidates, delete tokens one
at a time, ...); the job's faster equivalents must draw the same distributions.
"""

from __future__ import annotations

import collections
import random

import pytest

from beam_jobs import instances

MAX_SEQ, MAX_PRED = 64, 10


def special_ids(vocab_size=1000, continuation=()):
    return instances.SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103, vocab_size=vocab_size,
                                continuation=frozenset(continuation))


# ---------------------------------------------------------------------------
# Masking and instances vs the reference semantics
# ---------------------------------------------------------------------------
def reference_truncate(tokens_a, tokens_b, max_num_tokens, rng):
    """The reference's truncate_seq_pair: one token at a time."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def reference_masking(tokens, prob, max_pred, special, rng, whole_word):
    """The reference's create_masked_lm_predictions (ids instead of strings)."""
    cand = []
    for i, token in enumerate(tokens):
        if token in (special.cls, special.sep):
            continue
        if whole_word and cand and token in special.continuation and cand[-1][-1] == i - 1:
            cand[-1].append(i)
        else:
            cand.append([i])
    rng.shuffle(cand)
    output = list(tokens)
    count = min(max_pred, max(1, int(round(len(tokens) * prob))))
    masked = []
    for index_set in cand:
        if len(masked) >= count:
            break
        if len(masked) + len(index_set) > count:
            continue
        for index in index_set:
            if rng.random() < 0.8:
                output[index] = special.mask
            elif rng.random() >= 0.5:
                output[index] = rng.randint(0, special.vocab_size - 1)
            masked.append(index)
    return output, sorted(masked)


def test_truncate_seq_pair_is_the_reference():
    for seed in range(300):
        rng = random.Random(seed)
        a, b = list(range(rng.randint(1, 50))), list(range(100, 100 + rng.randint(1, 50)))
        a2, b2 = list(a), list(b)
        instances.truncate_seq_pair(a, b, 20, random.Random(seed))
        reference_truncate(a2, b2, 20, random.Random(seed))
        assert (a, b) == (a2, b2)
        assert len(a) + len(b) <= 20 and a and b


def random_pair(rng, special, continuation=()):
    len_a, len_b = rng.randint(1, 60), rng.randint(1, 60)
    body = lambda n: [rng.choice(continuation) if continuation and rng.random() < 0.3  # noqa
                      else rng.randint(200, 999) for _ in range(n)]
    tokens_a, tokens_b = body(len_a), body(len_b)
    return [special.cls, *tokens_a, special.sep, *tokens_b, special.sep], len_a + 2


@pytest.mark.parametrize("whole_word", [False, True])
def test_masking_proportions_and_rules_match_the_reference(whole_word):
    continuation = list(range(104, 200)) if whole_word else []
    special = special_ids(continuation=continuation)
    rng, ref_rng = random.Random(7), random.Random(8)
    branches = collections.Counter()
    ours_total = ref_total = tokens_total = 0
    capped = 0
    for _ in range(4000):
        tokens, a_length = random_pair(rng, special, continuation)
        output, positions, labels, kinds = instances.create_masked_lm_predictions(
            tokens, 0.15, MAX_PRED, special, rng, whole_word=whole_word,
            a_length=None if whole_word else a_length)
        expected = min(MAX_PRED, max(1, round(len(tokens) * 0.15)))
        if whole_word:
            assert len(positions) <= expected
            words = instances.word_candidates(tokens, special, True)
            chosen = set(positions)
            for word in words:  # never splits a word
                assert chosen.isdisjoint(word) or chosen.issuperset(word), (tokens, positions)
        else:
            assert len(positions) == expected <= MAX_PRED
        capped += expected == MAX_PRED
        assert positions == sorted(set(positions))
        assert labels == [tokens[p] for p in positions]
        for p, kind in zip(positions, kinds):
            assert tokens[p] not in (special.cls, special.sep)
            if kind == instances.MASK:
                assert output[p] == special.mask
            elif kind == instances.KEEP:
                assert output[p] == tokens[p]
            else:
                assert 0 <= output[p] < special.vocab_size
        assert all(output[i] == t for i, t in enumerate(tokens) if i not in set(positions))
        branches.update(kinds)
        ours_total += len(positions)
        tokens_total += len(tokens)
        ref_total += len(reference_masking(tokens, 0.15, MAX_PRED, special, ref_rng,
                                           whole_word)[1])
    assert capped > 0  # the cap was exercised
    assert abs(ours_total - ref_total) / ref_total < 0.02  # same count rule as the reference
    assert 0.12 < ours_total / tokens_total < 0.16
    assert abs(branches[instances.MASK] / ours_total - 0.8) < 0.015
    assert abs(branches[instances.RANDOM] / ours_total - 0.1) < 0.01
    assert abs(branches[instances.KEEP] / ours_total - 0.1) < 0.01


def owned_documents(num, rng, sentences=(2, 20)):
    """Each document uses its own id range (and ids increase within it), so the source
    document and order of every token are known."""
    documents = []
    for d in range(num):
        base, doc = 1000 + d * 1000, []
        position = 0
        for _ in range(rng.randint(*sentences)):
            length = rng.randint(3, 25)
            doc.append([base + position + i for i in range(length)])
            position += length
        documents.append(((f"doc{d:03d}", 0), doc))
    return documents


def unmask(instance):
    tokens = list(instance.token_ids)
    for p, label in zip(instance.masked_lm_positions, instance.masked_lm_ids):
        tokens[p] = label
    return tokens


def check_layout(instance, special):
    tokens = unmask(instance)
    assert len(tokens) <= MAX_SEQ and len(instance.segment_ids) == len(tokens)
    assert tokens[0] == special.cls and tokens[-1] == special.sep
    first_sep = tokens.index(special.sep)
    assert tokens.count(special.sep) == 2 and 2 <= first_sep < len(tokens) - 2
    assert first_sep + 1 == instance.a_length
    assert instance.segment_ids == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
    return tokens[1:first_sep], tokens[first_sep + 1:-1]


def test_nsp_instances_segments_and_balance():
    special = special_ids(vocab_size=400_000)
    documents = owned_documents(300, random.Random(3))
    settings = instances.InstanceSettings(max_seq_length=MAX_SEQ, max_predictions_per_seq=MAX_PRED,
                                          dupe_factor=2, seed=11)
    made = list(instances.create_instances_for_group(documents, 0, settings, special))
    assert len(made) > 2000
    owner = lambda token: (token - 1000) // 1000  # noqa: E731
    random_next = 0
    for inst in made:
        tokens_a, tokens_b = check_layout(inst, special)
        a_docs, b_docs = {owner(t) for t in tokens_a}, {owner(t) for t in tokens_b}
        assert len(a_docs) == 1 and len(b_docs) == 1
        if inst.is_random_next:
            random_next += 1
            assert a_docs != b_docs or inst.random_from_same_document
        else:
            assert a_docs == b_docs and max(tokens_a) < min(tokens_b)  # B continues A
        assert inst.features()["next_sentence_labels"] == [inst.label]
    # 50/50, plus the chunks with a single sentence, which always get a random B
    assert 0.45 < random_next / len(made) < 0.6
    # the same inputs give the same instances; another seed gives others
    again = list(instances.create_instances_for_group(list(reversed(documents)), 0, settings, special))
    assert [i.features() for i in again] == [i.features() for i in made]
    other = dataclasses_replace(settings, seed=12)
    assert [i.features() for i in instances.create_instances_for_group(documents, 0, other, special)] \
        != [i.features() for i in made]


def dataclasses_replace(settings, **changes):
    import dataclasses

    return dataclasses.replace(settings, **changes)


def test_sop_pairs_are_in_order_or_really_swapped():
    special = special_ids(vocab_size=400_000)
    documents = owned_documents(200, random.Random(4), sentences=(1, 12))
    settings = instances.InstanceSettings(max_seq_length=MAX_SEQ, max_predictions_per_seq=MAX_PRED,
                                          objective="sop", seed=5, dupe_factor=3)
    counters: dict = {}
    made = list(instances.create_instances_for_group(documents, 0, settings, special,
                                                     counters=counters))
    assert len(made) > 1000
    swapped = 0
    for inst in made:
        tokens_a, tokens_b = check_layout(inst, special)
        owners = {(t - 1000) // 1000 for t in tokens_a + tokens_b}
        assert len(owners) == 1  # never a random document
        if inst.label == instances.SOP_SWAPPED:
            swapped += 1
            assert min(tokens_a) > max(tokens_b)  # A's text comes after B's
        else:
            assert inst.label == instances.SOP_IN_ORDER and max(tokens_a) < min(tokens_b)
        assert not inst.random_from_same_document
    assert 0.46 < swapped / len(made) < 0.54


def test_mlm_blocks_cover_each_document_once_in_order():
    special = special_ids(vocab_size=400_000)
    documents = owned_documents(150, random.Random(6))
    settings = instances.InstanceSettings(max_seq_length=MAX_SEQ, max_predictions_per_seq=MAX_PRED,
                                          objective="mlm", seed=7, dupe_factor=2,
                                          short_seq_prob=0.2)
    made = list(instances.create_instances_for_group(documents, 0, settings, special))
    pieces = sorted(t for _, doc in documents for sentence in doc for t in sentence)
    passes, seen, short = [[]], [], 0
    for inst in made:
        tokens = unmask(inst)
        assert tokens[0] == special.cls and tokens[-1] == special.sep
        assert special.sep not in tokens[1:-1] and len(tokens) <= MAX_SEQ
        assert inst.segment_ids == [0] * len(tokens) and inst.label == 0
        block = tokens[1:-1]
        assert block == sorted(block) and len({(t - 1000) // 1000 for t in block}) == 1
        assert 1 <= len(inst.masked_lm_positions) <= MAX_PRED
        assert not {0, len(tokens) - 1} & set(inst.masked_lm_positions)
        short += len(block) < MAX_SEQ - 2
        seen.extend(block)
        passes[-1].append(block)
        if len(seen) >= len(pieces):  # a pass ends: every piece once, none cut or repeated
            assert sorted(seen) == pieces
            passes.append([])
            seen = []
    assert len(passes) == 3 and passes[-1] == []
    assert short > 0.1 * len(made)  # the short blocks and each document's last one
    assert passes[0] != passes[1]  # the two passes cut the documents in other places


def test_instance_distribution_matches_the_reference_algorithm():
    """Count, lengths and NSP balance of our instances vs a step-by-step restatement of
    the reference over the same documents (different random streams)."""
    special = special_ids(vocab_size=400_000)
    documents = owned_documents(1000, random.Random(6))
    settings = instances.InstanceSettings(max_seq_length=MAX_SEQ, max_predictions_per_seq=MAX_PRED,
                                          seed=2, dupe_factor=2)
    ours = list(instances.create_instances_for_group(documents, 0, settings, special))
    docs = [d for _, d in documents]
    rng = random.Random(9)
    ref = []
    for index in list(range(len(docs))) * 2:  # the reference, its own truncate and masking
        document, target = docs[index], MAX_SEQ - 3
        if rng.random() < 0.1:
            target = rng.randint(2, MAX_SEQ - 3)
        chunk, length, i = [], 0, 0
        while i < len(document):
            chunk.append(document[i])
            length += len(document[i])
            if i == len(document) - 1 or length >= target:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                tokens_a = [t for s in chunk[:a_end] for t in s]
                if len(chunk) == 1 or rng.random() < 0.5:
                    is_random = True
                    for _ in range(10):
                        r = rng.randint(0, len(docs) - 1)
                        if r != index:
                            break
                    tokens_b = []
                    for s in docs[r][rng.randint(0, len(docs[r]) - 1):]:
                        tokens_b.extend(s)
                        if len(tokens_b) >= target - len(tokens_a):
                            break
                    i -= len(chunk) - a_end
                else:
                    is_random, tokens_b = False, [t for s in chunk[a_end:] for t in s]
                reference_truncate(tokens_a, tokens_b, MAX_SEQ - 3, rng)
                tokens = [special.cls, *tokens_a, special.sep, *tokens_b, special.sep]
                reference_masking(tokens, 0.15, MAX_PRED, special, rng, False)
                ref.append((len(tokens), is_random))
                chunk, length = [], 0
            i += 1
    assert abs(len(ours) - len(ref)) / len(ref) < 0.03
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert abs(mean([len(i.token_ids) for i in ours]) - mean([n for n, _ in ref])) < 1.0
    assert abs(mean([i.is_random_next for i in ours]) - mean([r for _, r in ref])) < 0.03
    full = lambda xs: mean([n == MAX_SEQ for n in xs])  # noqa: E731
    assert abs(full([len(i.token_ids) for i in ours]) - full([n for n, _ in ref])) < 0.04
