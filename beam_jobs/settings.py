"""The declaration of the config keys the Beam jobs read: one `setting(...)` per key (type,
default, allowed values or range, one-line help), and the jobs' flags made from it.

One source for both sides. The vocab and data jobs build their flags from these dataclasses
(`add_flags`, `check_flags`: `vocab.size` is the vocab job's `--vocab_size`), and the config
sections `vocab` and `data` (pipeline/config/sections.py) subclass them, so a key's default,
range and help are written here once. `setting` is also how every other config key is declared
(pipeline/config/sections.py imports it): the pipeline imports beam_jobs, never the reverse.

Pure Python (no Beam, no TensorFlow): the job launchers, the Beam workers and the config layer
import it at no cost.

    >>> VocabSettings().size, flag_of(VocabSettings, "size")
    (8000, 'vocab_size')
    >>> limits(VocabSettings, "size")
    {'ge': 10, 'le': 1000000}
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import typing

# What a declaration may say besides its default and help: a range, or the values allowed.
LIMITS = ("ge", "gt", "le")

# The text formats the jobs read: corpus.format's values (pipeline/config/sections.py) and the
# data job's --input_format.
INPUT_FORMATS = ("google", "text", "jsonl")


def setting(default=dataclasses.MISSING, help: str = "", *, ge=None, gt=None, le=None,
            choices=None, allowed="", flag: str = ""):
    """A config key's declaration, as a dataclass field: its `default` (a list or dict default is
    copied for each instance), a one-line `help`, and what it allows: a range (`ge` >=, `gt` >,
    `le` <=) or `choices`; `allowed`: what a rule in pipeline/config/load.py allows, said
    in words for the docs (e.g. "null or 1..the hidden size"). `flag`: the Beam job's flag name
    where it differs from the key's."""
    metadata = {"help": " ".join(help.split()), "choices": tuple(choices) if choices else None,
                "allowed": allowed, "flag": flag,
                **{name: value for name, value in (("ge", ge), ("gt", gt), ("le", le))
                   if value is not None}}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default),
                                 metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def same_as(cls, name: str, **changes):
    """The declaration of `cls`'s field `name` (default, range, choices, help), with `changes`
    (e.g. help=, default=): a key that means the same as another, declared once."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    default = (field.default_factory() if field.default is dataclasses.MISSING
               else field.default)
    meta = dict(field.metadata)
    given = {**{key: meta.get(key) for key in LIMITS}, "choices": meta["choices"],
             "allowed": meta["allowed"], "flag": meta["flag"], "help": meta["help"],
             "default": default, **changes}
    return setting(**given)


@dataclasses.dataclass
class VocabSettings:
    """The vocab job's settings (beam_jobs/vocab.py), the config's `vocab.*` keys."""

    size: int = setting(8000, "word pieces in the learned vocabulary, the 104 special tokens "
                              "([PAD], [unused0..98], [UNK], [CLS], [SEP], [MASK]) included",
                        ge=10, le=1_000_000, flag="vocab_size")
    lowercase: bool = setting(True, "true: uncased (lowercase and strip accents); false: cased, "
                                    "the text untouched")
    min_word_count: int = setting(2, "words seen fewer times than this are not used to learn "
                                     "word pieces", ge=1)
    max_words: int = setting(200_000, "the learner only looks at this many of the most "
                                      "frequent words", ge=10)
    spill_words: int = setting(100_000, "distinct words a worker counts in memory before it "
                                        "spills them to a sorted run file (how the count is "
                                        "held, not what it makes: not part of the stage's "
                                        "lineage)", ge=1)
    merge_fan_in: int = setting(16, "run files merged at a time (files open at once in a "
                                    "merge; not part of the stage's lineage)", ge=2)


@dataclasses.dataclass
class DataSettings:
    """The data job's settings (beam_jobs/pretraining_data.py), the config's `data.*` keys
    besides the runner's (phases, beam_args, workers, remote_dir)."""

    max_seq_length: int = setting(128, "tokens per instance, [CLS] and [SEP]s included", ge=8)
    max_predictions_per_seq: int = setting(20, "masked positions at most per instance (below "
                                               "max_seq_length - 3)", ge=1)
    masked_lm_prob: float = setting(0.15, "share of the tokens masked", gt=0.0, le=1.0)
    short_seq_prob: float = setting(0.1, "share of the instances given a shorter random target "
                                         "length", ge=0.0, le=1.0)
    dupe_factor: int = setting(1, "passes over the documents, each with different masks (static "
                                  "masking)", ge=1)
    seed: int = setting(12345, "seed of the pairs and masks (the pipeline's held-out split: "
                               "seed + 1)")
    num_shards: int = setting(4, "TFRecord files of the training split (the pipeline's held-out "
                                 "split: one)", ge=1)
    group_size_mb: float = setting(4.0, "documents are hashed into groups of about this much "
                                        "text (MB); an NSP pair's random B comes from the same "
                                        "group, so no worker holds more than one group",
                                   gt=0.0)
    objective: str = setting("nsp", "nsp: B follows A (label 0) or comes from a random document "
                                    "(1); sop (ALBERT's sentence order): B follows A (0) or the "
                                    "two are swapped (1); mlm: one-segment blocks, no label",
                             choices=("nsp", "sop", "mlm"))
    whole_word_masking: bool = setting(False, "mask all the pieces of a word (a token and its ## "
                                              "continuations) together")
    masking: str = setting("static", "static: masks written in the TFRecords (dupe_factor "
                                     "passes); dynamic: records written unmasked, tf.data "
                                     "masks every batch anew each epoch",
                           choices=("static", "dynamic"))


@dataclasses.dataclass
class ProgressSettings:
    """The jobs' progress flag (beam_jobs/progress.py), no config key: the vocab and data
    stages and fine-tuning's features (pipeline/finetuning/records.py) pass it when the job's
    workers run on this machine (pipeline/beam_progress.py)."""

    progress_dir: str = setting("", "a local folder where the workers write how much of their "
                                    "input they have done (for the launcher's progress bar); "
                                    "only for workers on this machine; the outputs are the "
                                    "same with or without it; empty: none")


def flag_of(cls, name: str) -> str:
    """The job's flag (without --) of `cls`'s field `name`."""
    return {f.name: f for f in dataclasses.fields(cls)}[name].metadata["flag"] or name


def limits(cls, name: str) -> dict:
    """{"ge"/"gt"/"le": bound} of `cls`'s field `name`."""
    meta = {f.name: f for f in dataclasses.fields(cls)}[name].metadata
    return {key: meta[key] for key in LIMITS if key in meta}


def parse_bool(text) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("true", "1", "yes", "y"):
        return True
    if lowered in ("false", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def add_flags(parser: argparse.ArgumentParser, cls, names=None) -> None:
    """One flag per field of `cls` (or of `names`): `--<flag>`, with the declaration's type,
    default, choices and help; the parsed value lands under the flag's name."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if names is not None and field.name not in names:
            continue
        kind = {bool: parse_bool, int: int, float: float}.get(hints[field.name], str)
        parser.add_argument(f"--{flag_of(cls, field.name)}", type=kind, default=field.default,
                            choices=field.metadata["choices"],
                            help=f"{field.metadata['help']} (default: {_shown(field.default)})")


def limit_error(value, bounds: dict) -> str:
    """Why `value` is outside `bounds` ("must be >= 10"), or ""."""
    if "ge" in bounds and value < bounds["ge"]:
        return f"must be >= {bounds['ge']}"
    if "gt" in bounds and value <= bounds["gt"]:
        return f"must be > {bounds['gt']}"
    if "le" in bounds and value > bounds["le"]:
        return f"must be <= {bounds['le']}"
    return ""


def check_flags(parser: argparse.ArgumentParser, args, cls, names=None) -> None:
    """parser.error (exit 2, one line) for the first flag of `cls` outside its declared range."""
    for field in dataclasses.fields(cls):
        if names is not None and field.name not in names:
            continue
        flag = flag_of(cls, field.name)
        problem = limit_error(getattr(args, flag), limits(cls, field.name))
        if problem:
            parser.error(f"--{flag} {getattr(args, flag)} {problem}")
