"""Tests of pipeline.training.inputs: the tf.data reader, static masks passed through, and dynamic
masking (the Beam job's rule applied per batch, new masks every epoch)."""

from __future__ import annotations

import collections
import random

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from beam_jobs import (
    example_encoder,
    instances,  # noqa: E402
    transforms,  # noqa: E402
)
from pipeline.training import inputs  # noqa: E402

SEQ, PRED, VOCAB = 48, 8, 500
PAD, CLS, SEP, MASK = 0, 2, 3, 4
PIECES = tuple(range(400, 500))  # "##" continuation ids


def write_records(path, num, seed=0, masked=False):
    """Unmasked instances `[CLS] A [SEP] B [SEP]` (ids 10..499, ~30% "##" pieces) as a
    TFRecord file; returns the token lists."""
    rng = random.Random(seed)
    encoder = example_encoder.ExampleEncoder(SEQ, PRED, VOCAB)
    special = instances.SpecialIds(pad=PAD, unk=1, cls=CLS, sep=SEP, mask=MASK, vocab_size=VOCAB,
                                   continuation=frozenset(PIECES))
    sequences = []
    with open(path, "wb") as handle:
        for _ in range(num):
            length = rng.randint(8, SEQ)
            len_a = rng.randint(1, length - 4)
            body = [rng.choice(PIECES) if rng.random() < 0.3 else rng.randint(10, 399)
                    for _ in range(length - 3)]
            tokens = [CLS, *body[:len_a], SEP, *body[len_a:], SEP]
            positions, labels = [], []
            if masked:
                tokens, positions, labels, _ = instances.create_masked_lm_predictions(
                    tokens, 0.15, PRED, special, rng, a_length=len_a + 2)
            handle.write(transforms.tfrecord_frame(encoder.encode(
                tokens, len_a + 2, positions, labels, rng.randint(0, 1))))
            sequences.append(tokens)
    return sequences


def masking(whole_word=False, seed=0):
    return inputs.DynamicMasking(vocab_size=VOCAB, mask_id=MASK, special_ids=(CLS, SEP, PAD),
                                 whole_word=whole_word, continuation_ids=PIECES, seed=seed)


def batches(path, count, **kwargs):
    dataset = inputs.pretraining_dataset(str(path), 64, SEQ, PRED, **kwargs)
    return [tuple(tf.nest.map_structure(lambda t: t.numpy(), b))
            for b in dataset.take(count)]


def rows(batch_list):
    """(original ids, masked ids, positions, labels, weights) per sequence."""
    for x, y, w in batch_list:
        for i in range(len(x["token_ids"])):
            weights = w["mlm"][i]
            masked = x["token_ids"][i]
            positions = x["mask_positions"][i]
            original = masked.copy()
            original[positions[weights > 0]] = y["mlm"][i][weights > 0]
            yield original, masked, positions, y["mlm"][i], weights, x["padding_mask"][i]


def test_static_records_pass_through(tmp_path):
    path = tmp_path / "static.tfrecord"
    sequences = write_records(path, 64, masked=True)
    (x, y, w), = batches(path, 1, training=False)
    assert [list(ids[ids > 0]) for ids in x["token_ids"]] == sequences  # unchanged
    assert w["mlm"].sum() > 0 and set(np.unique(w["nsp"])) == {1.0}


def test_dynamic_masking_follows_the_rule(tmp_path):
    path = tmp_path / "unmasked.tfrecord"
    write_records(path, 1024)
    branches = collections.Counter()
    masked_total = tokens_total = 0
    for original, masked, positions, labels, weights, real in rows(
            batches(path, 16, training=False, masking=masking())):
        length = int(real.sum())
        expected = min(PRED, max(1, round(length * 0.15)))
        chosen = positions[weights > 0]
        assert len(chosen) == expected
        assert list(chosen) == sorted(set(chosen)) and (positions[weights == 0] == 0).all()
        assert (labels[weights > 0] == original[chosen]).all() and (labels[weights == 0] == 0).all()
        assert not np.isin(original[chosen], (CLS, SEP, PAD)).any() and (chosen < length).all()
        untouched = np.ones(SEQ, bool)
        untouched[chosen] = False
        assert (masked[untouched] == original[untouched]).all()
        for p in chosen:
            branches["mask" if masked[p] == MASK else "keep" if masked[p] == original[p]
                     else "random"] += 1
        masked_total += len(chosen)
        tokens_total += length
    assert 0.13 < masked_total / tokens_total < 0.17
    # (a random id can equal the original: ~1/500 of the 10% counts as "keep")
    assert abs(branches["mask"] / masked_total - 0.8) < 0.02
    assert abs(branches["random"] / masked_total - 0.1) < 0.015
    assert abs(branches["keep"] / masked_total - 0.1) < 0.015


def test_dynamic_whole_word_masking_never_splits_a_word(tmp_path):
    path = tmp_path / "unmasked.tfrecord"
    write_records(path, 512, seed=1)
    total = expected_total = 0
    for original, masked, positions, labels, weights, real in rows(
            batches(path, 8, training=False, masking=masking(whole_word=True))):
        length = int(real.sum())
        expected = min(PRED, max(1, round(length * 0.15)))
        chosen = set(positions[weights > 0].tolist())
        assert 0 < len(chosen) <= expected
        for p in range(2, length):
            if original[p] in PIECES and original[p - 1] not in (CLS, SEP):
                assert (p in chosen) == (p - 1 in chosen)
        assert not any(original[p] in (CLS, SEP, PAD) for p in chosen)
        total += len(chosen)
        expected_total += expected
    assert total / expected_total > 0.9  # the skip rule rarely leaves the count unfilled


def test_dynamic_masks_change_every_epoch_and_repeat_with_the_seed(tmp_path):
    path = tmp_path / "unmasked.tfrecord"
    write_records(path, 128, seed=2)
    kwargs = dict(training=True, shuffle_buffer=1, masking=masking(seed=7))
    first = list(rows(batches(path, 4, **kwargs)))  # 2 epochs of 2 batches
    epoch_1, epoch_2 = first[:128], first[128:]
    assert all((a[0] == b[0]).all() for a, b in zip(epoch_1, epoch_2))  # same sequences
    same_masks = sum((a[2] == b[2]).all() for a, b in zip(epoch_1, epoch_2))
    assert same_masks < 10  # ... masked differently
    again = list(rows(batches(path, 4, **kwargs)))
    assert all((a[1] == b[1]).all() and (a[2] == b[2]).all() for a, b in zip(first, again))
    other = list(rows(batches(path, 2, **{**kwargs, "masking": masking(seed=8)})))
    assert sum((a[2] == b[2]).all() for a, b in zip(epoch_1, other)) < 10


def test_masking_from_vocab(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    m = inputs.DynamicMasking.from_vocab(str(tmp_path / "vocab.txt"), 0.2, whole_word=True)
    assert (m.vocab_size, m.mask_id, m.special_ids, m.continuation_ids) == (7, 4, (2, 3, 0), (6,))
    (tmp_path / "bad.txt").write_text("[PAD]\na\n")
    with pytest.raises(ValueError, match="no \\[CLS\\], \\[SEP\\], \\[MASK\\]"):
        inputs.DynamicMasking.from_vocab(str(tmp_path / "bad.txt"))


def test_training_masking_rate_leaves_the_heldout_masks(tmp_path):
    """train.masked_lm_prob / max_predictions_per_seq mask the training batches at their own
    rate and count; the held-out batches keep data.masked_lm_prob and the records' count."""
    from pipeline import artifacts
    from pipeline import config as config_lib
    from pipeline.training import records

    run = tmp_path / "run"
    paths = artifacts.Artifacts(run)
    paths.vocab_file.parent.mkdir(parents=True)
    paths.vocab_file.write_text("\n".join(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)])
        + "\n")
    keys = [f"run_dir={run}", "data.masking=dynamic", "data.max_seq_length=48",
            "data.max_predictions_per_seq=8"]
    config = config_lib.load("configs/test_tiny.yaml", keys + [
        "train.masked_lm_prob=0.4", "train.max_predictions_per_seq=24"])
    train = records.masking_args(config, paths, training=True)["masking"]
    heldout = records.masking_args(config, paths)["masking"]
    assert (train.masked_lm_prob, train.max_predictions_per_seq) == (0.4, 24)
    assert (heldout.masked_lm_prob, heldout.max_predictions_per_seq) == (0.15, 0)

    path = tmp_path / "unmasked.tfrecord"
    write_records(path, 256, seed=3)
    for masks, rate, slots in ((train, 0.4, 24), (heldout, 0.15, PRED)):
        counted = 0
        for original, masked, positions, labels, weights, real in rows(
                batches(path, 4, training=False, masking=masks)):
            assert len(positions) == slots
            expected = min(slots, max(1, round(int(real.sum()) * rate)))
            assert int(weights.sum()) == expected
            counted += 1
        assert counted == 256

    with pytest.raises(config_lib.ConfigError, match=r"train.masked_lm_prob = 0.3 applies to "
                       r"masks drawn in training only, and data.masking is 'static'"):
        config_lib.load("configs/test_tiny.yaml", [f"run_dir={run}", "data.masking=static",
                                                   "train.masked_lm_prob=0.3"])
    with pytest.raises(config_lib.ConfigError, match=r"train.max_predictions_per_seq = 46 must "
                       r"be below data.max_seq_length - 3 = 45"):
        config_lib.load("configs/test_tiny.yaml", keys + ["train.max_predictions_per_seq=46"])
