"""What adapting costs: the held-out MLM accuracy on general text beside the domain's.

Continued pretraining on a domain moves the encoder towards its text; how much it forgets of
the rest is what `train.general_heldout` shows. Set to `brown` (the demo corpus: general
English from newspapers, fiction, science and government texts) or a comma-separated glob
of raw-text files (documents separated by blank lines, split into sentences as
corpus.format=text does), the held-out probe (`callbacks.HeldOutProbe`) scores a fixed
sample of that text with every probe of the domain's held-out text: MLflow gets
`general_mlm_accuracy` at the same steps as `heldout_mlm_accuracy`, and the stage's summary
says the accuracy before adapting (step 0, or, when the checkpoint had no MLM head, the end of
the head warm-up: the new head on the encoder as published), at the end, and the difference
(`general_mlm_forgetting`, points lost; negative: gained).

The sample: up to `MAX_DOCUMENTS` documents (a seeded choice, sorted by name, so every run
scores the same), tokenized with the run's vocab and casing, cut into `[CLS] block [SEP]`
sequences of data.max_seq_length (as data.objective=mlm cuts them) and masked once with the
data section's rate, seeded: `train.heldout_batches` batches of train.batch_size (8 batches
when that key is 0). Nothing is written to disk.

    >>> documents = [("a", ["the cat sat .", "the dog ran ."]), ("b", ["a cat ran ."])]
    >>> [name for name, _ in sample(documents, 1, seed=3)]
    ['b']
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np

from beam_jobs import schema
from beam_jobs.instances import InstanceSettings, SpecialIds, create_single_segment_instances
from pipeline import artifacts
from pipeline.text import sources

log = logging.getLogger(__name__)

MAX_DOCUMENTS = 200
BROWN = "brown"


class GeneralTextError(ValueError):
    """train.general_heldout names no readable text: one line, exit 2."""


def documents(spec: str) -> list[tuple[str, list[str]]]:
    """[(name, [sentence])] of `spec`: "brown" (the demo corpus) or a glob of raw-text files."""
    if spec == BROWN:
        return list(sources.read_brown(artifacts.BROWN_TARBALL, fetch=True))
    try:
        files = sources.expand_globs(spec)
    except sources.CorpusError as err:
        raise GeneralTextError(f"train.general_heldout: {err}; give a glob of raw-text files, "
                               f"'brown' (the demo corpus) or '' (off)") from err
    out: list[tuple[str, list[str]]] = []
    for path in files:
        out.extend(sources.read_text_format(path, "blank_line", sources.split_sentences,
                                            100_000, "skip", {}))
    if not any(sentences for _, sentences in out):
        raise GeneralTextError(f"train.general_heldout = {spec!r}: its files hold no text; give "
                               f"raw-text files (documents separated by blank lines) or '' (off)")
    return out


def sample(docs: list, count: int, seed: int) -> list:
    """A seeded choice of `count` documents, in name order."""
    docs = sorted(docs, key=lambda item: item[0])
    if len(docs) > count:
        docs = sorted(random.Random(seed).sample(docs, count), key=lambda item: item[0])
    return docs


def batches(spec: str, vocab_file: Path, lowercase: bool, config) -> list:
    """The general text's held-out batches, (x, y, sample_weight) as the pretrainer takes them."""
    import tensorflow as tf

    from pipeline.text.tokenizer import Tokenizer
    from pipeline.training.inputs import to_model_inputs

    tc, dc = config.train, config.data
    tokenizer = Tokenizer(vocab_file, lowercase)
    special = SpecialIds.from_vocab(tokenizer.vocab, str(vocab_file))
    settings = InstanceSettings(
        max_seq_length=dc.max_seq_length, max_predictions_per_seq=dc.max_predictions_per_seq,
        masked_lm_prob=dc.masked_lm_prob, short_seq_prob=0.0, dupe_factor=1, seed=tc.seed,
        objective="mlm", whole_word_masking=dc.whole_word_masking, masking="static")
    wanted = (tc.heldout_batches or 8) * tc.batch_size
    rng = random.Random(f"{tc.seed}/general")
    instances = []
    for _, sentences in sample(documents(spec), MAX_DOCUMENTS, tc.seed):
        pieces = [ids for ids in tokenizer.ids(sentences) if ids]
        if pieces:
            instances.extend(create_single_segment_instances(pieces, settings, special, rng))
        if len(instances) >= wanted:
            break
    instances = [i for i in instances[:wanted] if i.masked_lm_positions]
    if not instances:
        raise GeneralTextError(f"train.general_heldout = {spec!r} makes no masked sequence; give "
                               f"more text or '' (off)")
    padded = [schema.pad_instance(i.features(), dc.max_seq_length, dc.max_predictions_per_seq)
              for i in instances]
    features = {name: np.asarray([p[name] for p in padded],
                                 dtype=np.float32 if name in schema.FLOAT_FEATURES else np.int64)
                for name in padded[0]}
    data = tf.data.Dataset.from_tensor_slices(features).batch(tc.batch_size).map(to_model_inputs)
    log.info(f"pretrain: general text {spec}: {len(instances):,} held-out sequences scored with "
             f"every probe (what adapting costs)")
    return list(data)


def summary(curve: list, unfrozen_at: int | None) -> dict:
    """{before, after, forgetting} of a general curve [(step, accuracy)]: before = step 0's,
    or the unfreeze step's when the warm-up trained new heads; forgetting in points."""
    if not curve:
        return {}
    at = dict(curve)
    before_step = unfrozen_at if unfrozen_at is not None and unfrozen_at in at else curve[0][0]
    before, after = at[before_step], curve[-1][1]
    return {"before_step": before_step, "before": before, "after_step": curve[-1][0],
            "after": after, "forgetting": round(100 * (before - after), 2)}


def for_run(config, paths) -> list | None:
    """The general batches of a pretraining run (None: train.general_heldout off, or the
    domain corpus is that same text)."""
    spec = config.train.general_heldout
    if not spec:
        return None
    if spec == BROWN and config.corpus.source == BROWN:
        log.info("pretrain: train.general_heldout = brown is the corpus itself: no second probe")
        return None
    return batches(spec, paths.vocab_file, config.vocab.lowercase, config)


def report(spec: str, curve: list, warmup, chief: bool, prefix: str) -> dict:
    """Logs (and, the chief, sends to MLflow) what adapting cost on the general text."""
    from pipeline.tracking import outbox

    warmed = warmup is not None and warmup.steps  # new heads trained alone first
    said = summary(curve, warmup.unfrozen_at if warmed else None)
    if not said:
        return {}
    when = ("the end of the head warm-up: the new head on the encoder as published"
            if warmed and said["before_step"] else "step 0")
    change = ("lost" if said["forgetting"] > 0 else "gained")
    log.info(f"{prefix}: general text ({spec}): MLM accuracy {said['before']:.4f} at step "
             f"{said['before_step']} ({when}) -> {said['after']:.4f} at step "
             f"{said['after_step']}: {abs(said['forgetting']):.2f} points {change} while adapting")
    if chief:
        outbox.log_metrics({"general_mlm_forgetting": said["forgetting"]},
                           step=said["after_step"])
        outbox.set_tags({"pretrain.general_heldout": spec})
    return {"text": spec, "curve": curve, **said}
