"""Fine-tuning data: labelled files → examples → fixed seeded splits → fixed-length features.

Readers: pipeline/finetuning/readers.py.

`load_task(config)` picks the reader from `finetune.dataset`, fixes the label set (from
`finetune.labels` or the training data; a validation/test label outside it is an error that
names the file and the label), and makes the splits: the given files, or seeded splits of the
training file (by document for Brown, so no document is on both sides), recorded in
`TaskData.splits` (the stage writes them to splits.json).

Features: models/preprocessor.py (text and text pairs, in-graph) and
pipeline/finetuning/features.py (token classification and QA).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from pipeline.finetuning import tasks
from pipeline.finetuning.readers import (
    GLUE_TASKS,
    FinetuneDataError,
    QAExample,
    TaskData,
    TokenExample,
    read_brown_genre,
    read_brown_pos,
    read_glue,
)


# ---------------------------------------------------------------------------
# Labels and splits
# ---------------------------------------------------------------------------
def label_of(example):
    return example.tags if isinstance(example, TokenExample) else example.label


def span(examples: list) -> str:
    """Where examples come from, for messages: "file:first-last" (lines) when they were read
    from one file, else the first example's `source`."""
    paths, lines = set(), []
    for example in examples:
        head, _, line = (example.source or "").rpartition(":")
        paths.add(head)
        if line.isdigit():
            lines.append(int(line))
    if len(paths) == 1 and lines and len(lines) == len(examples) and head:
        first, last = min(lines), max(lines)
        return f"{head}:{first}" + (f"-{last}" if last != first else "")
    return (examples[0].source if examples else "") or "the training data"


def label_set(train: list, configured: list | None = None) -> list:
    """The configured labels, or the sorted distinct labels of the training examples.

    Either way the training examples must hold at least two distinct labels: a label column
    that is all one class trains a classifier that always answers it. The error names the
    file, its lines, the label and the key of the column."""
    if configured:
        duplicates = sorted({str(x) for x in configured if configured.count(x) > 1})
        if duplicates:
            raise FinetuneDataError(f"finetune.labels {configured} lists {duplicates[0]!r} more "
                                    f"than once; list each label once")
    seen = set()
    for example in train:
        value = label_of(example)
        seen.update(value if isinstance(value, list) else [value])
    seen.discard(None)
    if len(seen) < 2:
        tokens = bool(train) and isinstance(train[0], TokenExample)
        key = "finetune.conll_label_column" if tokens else "finetune.label_column"
        what = (f"every training example has label {min(seen)!r}" if seen else
                "no training example has a label")
        raise FinetuneDataError(
            f"{span(train)}: {what} (the column of {key}), but a classifier needs at least 2 "
            f"distinct labels; check that {key} names the label column, or add examples of "
            f"the other classes")
    return [str(x) for x in configured] if configured else sorted(seen)


def check_labels(examples: list, labels: list, split: str) -> None:
    """Raises FinetuneDataError naming the first example whose label is not in `labels`."""
    known = set(labels)
    for example in examples:
        value = label_of(example)
        for i, v in enumerate(value if isinstance(value, list) else [value]):
            if v not in known:
                where = example.source or split
                head, _, line = where.rpartition(":")
                if isinstance(value, list) and line.isdigit():  # CoNLL: a word per line
                    where = f"{head}:{int(line) + i}"
                raise FinetuneDataError(
                    f"{where}: label {v!r} is not in the label set "
                    f"{labels[:20]}{' ...' if len(labels) > 20 else ''} ({split} split; the "
                    f"labels are finetune.labels, else those of the training data); add it to "
                    f"finetune.labels or fix the label")


def split_by_group(examples: list, validation_fraction: float, test_fraction: float,
                   seed: int, stratify: bool = True) -> tuple[list, list, list, dict]:
    """Seeded split of the examples' groups (documents) into train / validation / test.

    Groups are shuffled with `random.Random(seed)` — within each label when `stratify` (a
    group's label, or `stratum` if set, is its first example's) — and the first
    `test_fraction` of every label's groups go to test, the next `validation_fraction` to
    validation. Every label with at least 3 groups gets at least one group on each side.
    Returns the three lists and a record of the groups per split.
    """
    groups: dict[str, list] = {}
    for example in examples:
        groups.setdefault(example.group, []).append(example)
    strata: dict = {}
    for name, members in groups.items():
        key = (getattr(members[0], "stratum", "") or label_of(members[0])) \
            if stratify and not isinstance(members[0], TokenExample) else "all"
        key = "all" if isinstance(key, float) else key
        strata.setdefault(key, []).append(name)
    rng = random.Random(seed)
    assigned = {"train": [], "validation": [], "test": []}
    for key in sorted(strata, key=str):
        names = sorted(strata[key])
        rng.shuffle(names)
        n = len(names)
        n_test = int(round(n * test_fraction))
        n_val = int(round(n * validation_fraction))
        if n >= 3:
            n_test = max(n_test, 1 if test_fraction > 0 else 0)
            n_val = max(n_val, 1 if validation_fraction > 0 else 0)
        assigned["test"] += names[:n_test]
        assigned["validation"] += names[n_test:n_test + n_val]
        assigned["train"] += names[n_test + n_val:]
    fractions = {"validation": validation_fraction, "test": test_fraction}
    for split in ("train", "validation", "test"):
        if assigned[split] or not fractions.get(split, 1.0):
            continue
        what = f"{len(examples)} example(s)" + (f" in {len(groups)} groups (documents)"
                                                 if len(groups) != len(examples) else "")
        fix = (f"raise finetune.{split}_fraction (now {fractions[split]}) or give "
               f"finetune.{split}_file" if split != "train" else
               "lower finetune.validation_fraction / test_fraction")
        raise FinetuneDataError(
            f"{span(examples)}: the {split} split cut from these {what} is empty (a label needs "
            f"3 or more to reach every split); add examples, or {fix}")
    out = {split: [e for g in sorted(names) for e in groups[g]] for split, names in
           assigned.items()}
    record = {"method": "seeded split by group" + (" stratified by label" if stratify else ""),
              "seed": seed, "validation_fraction": validation_fraction,
              "test_fraction": test_fraction,
              "groups": {split: sorted(names) for split, names in assigned.items()}}
    return out["train"], out["validation"], out["test"], record


# ---------------------------------------------------------------------------
# Loading a task from the config
# ---------------------------------------------------------------------------
def load_task(fc, brown_tarball=None) -> TaskData:
    """The examples, label set, splits and selection metric for `config.finetune` (`fc`)."""
    from pipeline import artifacts

    task, dataset = tasks.get(fc.task, fc), fc.dataset
    files = {}
    extra_tests = {}
    metric = task.selection_metric(dataset)
    pair = bool(fc.text_pair_column)
    if dataset in ("brown_genre", "brown_pos"):
        tarball = Path(brown_tarball or artifacts.BROWN_TARBALL)
        if dataset == "brown_genre":
            examples = read_brown_genre(tarball, fc.sentences_per_example, fc.brown_labels)
        else:
            examples = read_brown_pos(tarball)
        files["train"] = tarball
        given = {"train": examples}
    elif dataset == "glue":
        glue = read_glue(fc.glue_dir, fc.glue_task)
        spec = GLUE_TASKS[fc.glue_task]
        metric = spec["metric"]
        pair = "pair" in spec
        given = {"train": glue["train"], "test": glue["test"]}
        extra_tests = {k: v for k, v in glue.items() if k.startswith("test_")}
        files = {"glue_dir": Path(fc.glue_dir)}
        if not fc.labels and spec["labels"]:
            fc = dataclasses.replace(fc, labels=list(spec["labels"]))
    else:
        given = {}
        for split in ("train", "validation", "test"):
            path = getattr(fc, f"{split}_file")
            if path:
                files[split] = Path(path)
                given[split] = task.read_file(path, fc)
    pair = pair or task.always_pair
    train = given["train"]
    validation, test = given.get("validation"), given.get("test")
    splits: dict = {"files": {k: {"path": str(v), "sha256": artifacts.sha256_file(Path(v))}
                              if Path(v).is_file() else {"path": str(v)}
                              for k, v in files.items()}}
    if validation is None or test is None:
        fractions = (0.0 if validation is not None else fc.validation_fraction,
                     0.0 if test is not None else fc.test_fraction)
        tr, va, te, record = split_by_group(train, *fractions, fc.split_seed,
                                            stratify=task.stratify)
        train = tr
        validation = validation if validation is not None else va
        test = test if test is not None else te
        splits["split"] = record
    if fc.max_examples:
        rng = random.Random(fc.split_seed)
        train, validation, test = (
            rng.sample(s, fc.max_examples) if len(s) > fc.max_examples else s
            for s in (train, validation, test))
        splits["max_examples"] = fc.max_examples
    for name, split in (("train", train), ("validation", validation), ("test", test)):
        if not split:
            key = "test" if name == "test" else "validation"
            raise FinetuneDataError(f"{files.get('train', fc.dataset)}: the {name} split is "
                                    f"empty (finetune.{key}_fraction = "
                                    f"{getattr(fc, key + '_fraction')}, no finetune.{key}_file); "
                                    f"raise finetune.{key}_fraction or give finetune.{key}_file")
    labels = None
    if task.label_set:
        # Splits cut from one file share its label inventory (a rare tag may fall in test
        # only); separately given validation/test files must use the training labels.
        inventory = given["train"] if "split" in splits else train
        labels = label_set(inventory, fc.labels)
        for name, split in (("train", train), ("validation", validation), ("test", test),
                            *extra_tests.items()):
            check_labels(split, labels, name)
    splits["counts"] = {"train": len(train), "validation": len(validation), "test": len(test),
                        **{k: len(v) for k, v in extra_tests.items()}}
    return TaskData(train, validation, {"test": test, **extra_tests}, labels, splits, metric, pair)


def training_text(data: TaskData) -> list[str]:
    """The raw text of the training split, one document per example, for task-adaptive
    pretraining (`python -m pipeline adapt`): a text and its pair, a tagged sentence's words,
    a question and its context. Never the validation or test text."""
    out = []
    for e in data.train:
        if isinstance(e, TokenExample):
            parts = [" ".join(e.words)]
        elif isinstance(e, QAExample):
            parts = [e.question, e.context]
        else:
            parts = [e.text, e.text_pair or ""]
        text = "\n".join(p.strip() for p in parts if p and p.strip())
        if text:
            out.append(text)
    return out

