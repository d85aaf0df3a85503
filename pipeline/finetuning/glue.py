"""The GLUE benchmark around fine-tuning: which task folders a GLUE download holds, the
leaderboard's entries and how its score averages them, the unlabelled test files, the
submission files (`<TASK>.tsv`, `index` and `prediction`, the label names the leaderboard
expects), a task fine-tuned per grid point (`fine_tune_task`) and the results table. The glue
stage (pipeline/stages/glue.py) runs the tasks.

Scores, as the benchmark defines them (Wang et al. 2019, GLUE; the leaderboard's columns):

- an entry's score is the mean of its metrics: MRPC and QQP (F1 + accuracy) / 2, STS-B
  (Pearson + Spearman) / 2; CoLA Matthews correlation; SST-2, MNLI-m, MNLI-mm, QNLI, RTE,
  WNLI accuracy;
- a task's score is its entry's, MNLI's the mean of MNLI-m and MNLI-mm;
- the GLUE score is the mean of the nine task scores (WNLI included; AX, the diagnostic set,
  is not scored). From the leaderboard's BERT-Large row this gives its 80.5.

The BERT paper's Table 1 "Average" is another number: nine entries, MNLI-m and MNLI-mm apart,
F1 alone for MRPC and QQP, Spearman alone for STS-B, WNLI left out (BERT-Base: 79.6).

    >>> e = {"CoLA": {"mcc": .5}, "MNLI-m": {"accuracy": .8}, "MNLI-mm": {"accuracy": .7},
    ...      "MRPC": {"f1": .9, "accuracy": .8}}
    >>> sorted((k, round(v, 3)) for k, v in task_scores(e).items())
    [('cola', 0.5), ('mnli', 0.75), ('mrpc', 0.85)]
    >>> round(glue_score(e)["score"], 4), glue_score(e)["complete"]
    (0.7, False)
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import platform
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np

from pipeline import artifacts
from pipeline.config import Config
from pipeline.finetuning import metrics
from pipeline.finetuning.readers import (
    GLUE_TASKS,
    FinetuneDataError,
    TextExample,
    _read_text,
    read_glue,
)

from pipeline.finetuning.sweep import point_config
from pipeline.finetuning.train import fine_tune
from pipeline.tracking import outbox
from pipeline.tracking import runs as tracking

log = logging.getLogger(__name__)


class GlueError(FinetuneDataError):
    """A GLUE folder or task list that cannot be run; the message says how to fix it."""


# Each task's leaderboard entries: (entry, the dev split of `read_glue` that scores it, its
# metrics), in the leaderboard's column order.
ENTRIES = {
    "cola": [("CoLA", "test", ("mcc",))],
    "sst-2": [("SST-2", "test", ("accuracy",))],
    "mrpc": [("MRPC", "test", ("f1", "accuracy"))],
    "sts-b": [("STS-B", "test", ("pearson", "spearman"))],
    "qqp": [("QQP", "test", ("f1", "accuracy"))],
    "mnli": [("MNLI-m", "test", ("accuracy",)), ("MNLI-mm", "test_mismatched", ("accuracy",))],
    "qnli": [("QNLI", "test", ("accuracy",))],
    "rte": [("RTE", "test", ("accuracy",))],
    "wnli": [("WNLI", "test", ("accuracy",))],
}
# Submission file -> the unlabelled test file of the task folder (as the GLUE download script
# writes them). AX.tsv: the MNLI model on the diagnostic set, where one of DIAGNOSTIC exists.
TEST_FILES = {
    "cola": {"CoLA.tsv": "test.tsv"}, "sst-2": {"SST-2.tsv": "test.tsv"},
    "mrpc": {"MRPC.tsv": "test.tsv"}, "sts-b": {"STS-B.tsv": "test.tsv"},
    "qqp": {"QQP.tsv": "test.tsv"},
    "mnli": {"MNLI-m.tsv": "test_matched.tsv", "MNLI-mm.tsv": "test_mismatched.tsv"},
    "qnli": {"QNLI.tsv": "test.tsv"}, "rte": {"RTE.tsv": "test.tsv"},
    "wnli": {"WNLI.tsv": "test.tsv"},
}
DIAGNOSTIC = ("diagnostic/diagnostic.tsv", "diagnostic.tsv")
AX_FROM = {"mnli"}  # the GLUE task whose model predicts the diagnostic set
# What the leaderboard accepts in `prediction`: label names, or STS-B's score range.
SUBMISSION_LABELS = {
    "cola": {"0", "1"}, "sst-2": {"0", "1"}, "mrpc": {"0", "1"}, "qqp": {"0", "1"},
    "wnli": {"0", "1"}, "mnli": {"entailment", "neutral", "contradiction"},
    "qnli": {"entailment", "not_entailment"}, "rte": {"entailment", "not_entailment"},
    "sts-b": (0.0, 5.0),
}
# The BERT paper: "every trained system that's been submitted to GLUE has performed worse than
# the 65.1 baseline accuracy of predicting the majority class [on WNLI] ... For our GLUE
# submission, we always predicted the majority class." So do we (no model is trained).
MAJORITY_CLASS_TASKS = ("wnli",)
# The BERT paper's Table 1 "Average": these entries and metrics, WNLI left out.
PAPER_ENTRIES = (("MNLI-m", "accuracy"), ("MNLI-mm", "accuracy"), ("QQP", "f1"),
                 ("QNLI", "accuracy"), ("SST-2", "accuracy"), ("CoLA", "mcc"),
                 ("STS-B", "spearman"), ("MRPC", "f1"), ("RTE", "accuracy"))
METRIC_NAMES = {"mcc": "Matthews corr.", "accuracy": "accuracy", "f1": "F1",
                "pearson": "Pearson", "spearman": "Spearman"}


# ---------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------
def entry_score(values: dict, entry_metrics) -> float:
    return statistics.fmean(values[m] for m in entry_metrics)


def task_scores(entries: dict) -> dict:
    """GLUE task -> its score, for the tasks all of whose entries are in `entries`
    ({entry: {metric: value}})."""
    out = {}
    for task, specs in ENTRIES.items():
        if all(name in entries for name, _, _ in specs):
            out[task] = statistics.fmean(entry_score(entries[name], m) for name, _, m in specs)
    return out


def glue_score(entries: dict) -> dict:
    """{"score": the mean task score (None without any task), "tasks": [...], "complete":
    all nine tasks are in}: the GLUE score when complete, else a partial average."""
    scores = task_scores(entries)
    return {"score": statistics.fmean(scores.values()) if scores else None,
            "tasks": list(scores), "complete": len(scores) == len(ENTRIES)}


def paper_average(entries: dict) -> dict:
    """The BERT paper's Table 1 average over the entries present (`complete`: all nine)."""
    values = [entries[name][m] for name, m in PAPER_ENTRIES if name in entries]
    return {"score": statistics.fmean(values) if values else None, "entries": len(values),
            "complete": len(values) == len(PAPER_ENTRIES)}


def dev_entries(task: str, results: dict) -> dict:
    """{entry: {metric: value}} of a task from a fine-tuning's results (its dev splits)."""
    return {name: {m: float(results[split][m]) for m in entry_metrics}
            for name, split, entry_metrics in ENTRIES[task]}


# ---------------------------------------------------------------------------
# The GLUE folder and its test files
# ---------------------------------------------------------------------------
def canonical(name: str) -> str:
    """"SST2", "sst-2", "STS-B" -> our task names; "" if not a GLUE task."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    return next((task for task in GLUE_TASKS if task.replace("-", "") == key), "")


def select_tasks(glue_dir, names="") -> list[str]:
    """The tasks to run, in the leaderboard's order: those named (a comma-separated string or a
    list), else every task folder present in `glue_dir`."""
    if not str(glue_dir or "").strip():
        raise GlueError("finetune.glue_dir is empty; give the GLUE download folder: "
                        "make glue GLUE_DIR=/path/to/glue_data")
    folder = Path(glue_dir)
    if not folder.is_dir():
        raise GlueError(f"GLUE folder {folder} does not exist; download GLUE (its tasks as "
                        f"CoLA/, SST-2/, ...) and pass GLUE_DIR=<that folder>")
    present = [t for t in ENTRIES if (folder / GLUE_TASKS[t]["folder"]).is_dir()]
    wanted = [n for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not wanted:
        if not present:
            raise GlueError(f"{folder} holds no GLUE task folder (expected some of "
                            f"{', '.join(GLUE_TASKS[t]['folder'] for t in ENTRIES)}); point "
                            f"GLUE_DIR at the folder the GLUE download script wrote")
        return present
    chosen = []
    for name in wanted:
        task = canonical(name)
        if not task:
            raise GlueError(f"unknown GLUE task {name.strip()!r} in TASKS (--tasks); choose from "
                            f"{', '.join(ENTRIES)}")
        if task not in present:
            raise GlueError(f"GLUE task {task!r} was named but {folder / GLUE_TASKS[task]['folder']}"
                            f" does not exist; add that folder to GLUE_DIR or leave {task} out "
                            f"of TASKS")
        chosen.append(task)
    return [t for t in ENTRIES if t in chosen]


def test_files(glue_dir, task: str) -> dict:
    """Submission file -> its test file, for those that exist (AX with MNLI)."""
    folder = Path(glue_dir) / GLUE_TASKS[task]["folder"]
    out = {sub: folder / name for sub, name in TEST_FILES[task].items()
           if (folder / name).is_file()}
    if task in AX_FROM:
        found = [Path(glue_dir) / d for d in DIAGNOSTIC if (Path(glue_dir) / d).is_file()]
        if found:
            out["AX.tsv"] = found[0]
    return out


def missing_test_files(glue_dir, task: str) -> list[str]:
    folder = Path(glue_dir) / GLUE_TASKS[task]["folder"]
    return [str(folder / name) for name in TEST_FILES[task].values()
            if not (folder / name).is_file()]


def read_test(path, task: str) -> tuple[list[str], list[TextExample]]:
    """An unlabelled GLUE test file (header row; `index`, QQP's `id`) -> (indices, examples),
    every row in file order: the submission needs a prediction for each."""
    path, spec = Path(path), GLUE_TASKS[task]
    rows = list(csv.reader(_read_text(path).splitlines(), delimiter="\t",
                           quoting=csv.QUOTE_NONE))
    header = rows[0] if rows else []
    wanted = ["index" if "index" in header else "id",
              spec["text"] if spec.get("header", True) else "sentence", spec.get("pair")]
    missing = [c for c in wanted if c and c not in header]
    if missing:
        raise GlueError(f"{path}:1: the header {header} has no column {missing[0]!r}; a GLUE "
                        f"{task} test file has {', '.join(c for c in wanted if c)}: give the "
                        f"file as the GLUE download has it")
    index, text = header.index(wanted[0]), header.index(wanted[1])
    pair = header.index(wanted[2]) if wanted[2] else None
    indices, examples = [], []
    for n, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise GlueError(f"{path}:{n}: {len(row)} fields but the header has {len(header)}; "
                            f"every test row needs its prediction in the submission, so fix the "
                            f"line (a stray tab or line break inside a sentence?)")
        indices.append(row[index])
        examples.append(TextExample(row[text], row[pair] if pair is not None else None,
                                    source=f"{path}:{n}"))
    if not examples:
        raise GlueError(f"{path} has no rows after the header; give the GLUE test file")
    return indices, examples


def submission_text(indices: list, predictions: list) -> str:
    """The leaderboard's TSV: a header `index<TAB>prediction`, then one row per test example."""
    if len(indices) != len(predictions):
        raise ValueError(f"{len(predictions)} predictions for {len(indices)} test rows")
    return "index\tprediction\n" + "".join(f"{i}\t{p}\n" for i, p in zip(indices, predictions))


def check_labels(task: str, labels) -> None:
    """The model's label names must be those the leaderboard expects for `task`."""
    expected = SUBMISSION_LABELS[task]
    if isinstance(expected, set) and set(labels or ()) != expected:
        raise GlueError(f"the {task} model's labels {labels} are not the GLUE labels "
                        f"{sorted(expected)}; fine-tune it with finetune.labels left empty")


def predictor(model_dir, task: str, chunk: int = 8192, batch_size: int = 128):
    """A fine-tuned model folder (loaded once) as a function: examples -> submission values,
    label names or the score clipped to the task's range (STS-B: [0, 5]), three decimals.
    The features come from the pure-Python preprocessor, as the training features did (the
    Beam job's; the same ids as the in-graph one, tests/test_finetune_records.py): the
    in-graph one traces its tokenizer graph again for every model, about a second each."""
    import models
    from pipeline.finetuning import tasks
    from pipeline.text.packing import PythonPreprocessor
    from pipeline.text.vocab import read_vocab

    paths = artifacts.FinetuneArtifacts(model_dir)
    info = json.loads(paths.task_json.read_text())
    kind = tasks.get(info["task"])
    if kind.label_set:
        check_labels(task, info["labels"])
    model = models.load_keras(paths.model_keras, compile=False)
    pre = PythonPreprocessor(read_vocab(paths.vocab_file), info["lowercase"],
                             info["max_seq_length"])

    def predict(examples: list) -> list[str]:
        parts = []
        for start in range(0, len(examples), chunk):
            part = examples[start:start + chunk]
            x = pre.features([e.text for e in part],
                             [e.text_pair or "" for e in part] if info["pair"] else None)
            # Called eagerly a batch at a time: `model.predict` traces a graph for each model
            # and each new batch shape (a test file's last batch), a second or more each on a
            # CPU, where the eager batches cost little next to the model's own arithmetic.
            for first in range(0, len(part), batch_size):
                batch = {k: v[first:first + batch_size] for k, v in x.items()}
                parts.append(np.asarray(model(batch, training=False)[kind.output], np.float32))
        y = np.concatenate(parts)
        if kind.label_set:
            return [info["labels"][i] for i in y.argmax(-1)]
        low, high = SUBMISSION_LABELS[task]
        return [f"{v:.3f}" for v in np.clip(y.reshape(-1), low, high)]

    return predict


def majority_class(glue_dir, task: str) -> dict:
    """The BERT paper's WNLI: the training set's most frequent label predicted everywhere.
    Returns the task's record (dev entries, and the test predictions of `test_files`)."""
    started = time.time()
    data = read_glue(glue_dir, task)
    counts = Counter(e.label for e in data["train"])
    label = min(counts, key=lambda k: (-counts[k], k))
    gold = np.array([e.label for e in data["test"]])
    entries = {ENTRIES[task][0][0]: {"accuracy": metrics.accuracy(gold,
                                                                  np.full_like(gold, label))}}
    predictions = {}
    for sub, path in test_files(glue_dir, task).items():
        indices, examples = read_test(path, task)
        predictions[sub] = (indices, [label] * len(examples))
    log.info(f"glue: {task}: the majority class of train ({label!r}, {counts[label]} of "
             f"{sum(counts.values())}) predicted everywhere, as the BERT paper did; dev accuracy "
             f"{entries[ENTRIES[task][0][0]]['accuracy']:.4f}")
    return {"method": f"majority class ({label!r}) of train, as the BERT paper", "steps": 0,
            "entries": entries, "seconds": round(time.time() - started, 1),
            "train_seconds": 0.0, "predictions": predictions}


# ---------------------------------------------------------------------------
# One task fine-tuned (the glue stage's step 2-3)
# ---------------------------------------------------------------------------
def fine_tune_task(config: Config, task: str, points: list) -> dict:
    """One fine-tuning per point (nested runs when several); the best by dev score predicts
    the test files. Returns the task's record."""
    started, trials = time.time(), []
    for i, point in enumerate(points, start=1):
        name = f"glue_{task}" + (f"_p{i}" if len(points) > 1 else "")
        task_config = point_config(  # the task's finetune section, validated as the CLI would
            config, point, f"glue task {task}", dataset="glue", glue_task=task, name=name,
            labels=[], baselines=point.get("baselines", config.finetune.baselines),
            task="regression" if GLUE_TASKS[task]["labels"] is None else "classification")
        label = " ".join(f"{k}={v}" for k, v in point.items())
        with (tracking.nested_run(f"glue {task} {i}: {label}", {"pipeline.stage": "glue-point"})
              if len(points) > 1 else contextlib.nullcontext()):
            outbox.log_params({f"finetune.{k}": v for k, v in point.items()})
            result = fine_tune(task_config, write_outputs=True)
        entries = dev_entries(task, result)
        trials.append({"point": point, "model_dir": result["output_dir"], "entries": entries,
                       "score": task_scores(entries)[task],
                       "steps": result["history"][-1]["step"] if result["history"] else 0,
                       "train_seconds": result["train_seconds"]})
        log.info(f"glue: {task} {label or ''} dev score {trials[-1]['score']:.4f}")
    best = max(trials, key=lambda t: t["score"])
    if len(trials) > 1:
        log.info(f"glue: {task}: keeping {best['model_dir']} (dev score {best['score']:.4f})")
    predictions, predict = {}, None
    for sub, path in test_files(config.finetune.glue_dir, task).items():
        indices, examples = read_test(path, "mnli" if sub == "AX.tsv" else task)
        predict = predict or predictor(best["model_dir"], task)
        predictions[sub] = (indices, predict(examples))
        log.info(f"glue: {task}: predicted {len(examples):,} rows of {path} -> {sub}")
    method = "fine-tuned" + (f", best of {len(trials)} by dev score" if len(trials) > 1 else "")
    return {"method": method, **{k: best[k] for k in ("point", "model_dir", "entries",
                                                      "steps", "train_seconds")},
            "trials": [{k: t[k] for k in ("point", "model_dir", "score")} for t in trials],
            "seconds": round(time.time() - started, 1), "predictions": predictions}


def earlier_records(run_dir, init_from: str, chosen: list) -> dict:
    """Records of an earlier glue run on the same encoder for tasks not run now."""
    try:
        old = json.loads((output_dir(run_dir) / "results.json").read_text())["tasks"]
    except (OSError, ValueError, KeyError):
        return {}
    kept = {t: {**r, "earlier": True} for t, r in old.items()
            if t not in chosen and r.get("init_from") == init_from}
    if kept:
        log.info(f"glue: keeping the results of an earlier run for {', '.join(kept)} "
                 f"(same encoder)")
    return kept


def machine() -> str:
    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    return f"{cpu or platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


def log_results(out: Path) -> dict:
    """The results of <run_dir>/glue/ (`out`) to the log and the stage's MLflow run; returns
    results.json."""
    results = json.loads((out / "results.json").read_text())
    for line in table(results["tasks"]):
        log.info(f"glue: {line}")
    log.info(f"glue: wrote {out}/results.md and {out}/submission/ "
             f"(zip its files for the GLUE server)")
    score, paper = results["glue_score"], results["bert_paper_average"]
    outbox.log_metrics({
        **{f"dev_{name.lower()}_{m}": v for r in results["tasks"].values()
           for name, values in r["entries"].items() for m, v in values.items()},
        **({"glue_score_dev": score["score"]} if score["score"] is not None else {}),
        **({"bert_paper_average_dev": paper["score"]} if paper["score"] is not None else {})})
    outbox.set_tags({"glue.tasks": ",".join(results["tasks"]),
                     "glue.complete": str(score["complete"]).lower()})
    for name in ("results.md", "results.json"):
        outbox.log_artifact(out / name, "glue")
    for path in sorted((out / "submission").iterdir()):
        outbox.log_artifact(path, "glue/submission")
    return results


# ---------------------------------------------------------------------------
# The results: <run_dir>/glue/ (results.md, results.json, submission/)
# ---------------------------------------------------------------------------
def output_dir(run_dir) -> Path:
    return artifacts.Artifacts(run_dir).root / "glue"


def table(records: dict) -> list[str]:
    """The markdown table: task, metric(s), dev score (x100), steps, time; then the averages."""
    entries = {name: values for r in records.values() for name, values in r["entries"].items()}
    lines = ["| task | metric | dev score | steps | time (s) | test predictions |",
             "|---|---|---:|---:|---:|---|"]
    for task in [t for t in ENTRIES if t in records]:
        r = records[task]
        for name, _, entry_metrics in ENTRIES[task]:
            values = r["entries"][name]
            shown = " / ".join(f"{100 * values[m]:.1f}" for m in entry_metrics)
            rows = r.get("submission", {}).get(f"{name}.tsv")
            lines.append(f"| {name} | {' / '.join(METRIC_NAMES[m] for m in entry_metrics)} | "
                         f"{shown} | {r['steps']:,} | {r['seconds']:,.0f} | "
                         + (f"{name}.tsv ({rows:,} rows)" if rows is not None else "none")
                         + (" (earlier run)" if r.get("earlier") else "") + " |")
    if "AX.tsv" in records.get("mnli", {}).get("submission", {}):
        lines.append(f"| AX | (diagnostic, scored by the server) | | | | AX.tsv "
                     f"({records['mnli']['submission']['AX.tsv']:,} rows) |")
    glue, paper = glue_score(entries), paper_average(entries)
    if glue["score"] is not None:
        lines.append(f"| **GLUE score** | mean of the task scores | **{100 * glue['score']:.1f}** "
                     f"| | | {len(glue['tasks'])} of {len(ENTRIES)} tasks"
                     f"{'' if glue['complete'] else ' (partial: not the GLUE score)'} |")
    if paper["score"] is not None:
        lines.append(f"| BERT paper average | Table 1's (no WNLI) | {100 * paper['score']:.1f} "
                     f"| | | {paper['entries']} of {len(PAPER_ENTRIES)} entries |")
    return lines


def summary(records: dict) -> dict:
    entries = {name: values for r in records.values() for name, values in r["entries"].items()}
    return {"glue_score": glue_score(entries), "bert_paper_average": paper_average(entries),
            "task_scores": task_scores(entries)}


def write_outputs(run_dir, records: dict, header: dict) -> Path:
    """<run_dir>/glue/ written whole (aside, then moved into place): results.md, results.json
    and submission/<TASK>.tsv. Records of earlier runs (`earlier`) keep their files."""
    final = output_dir(run_dir)
    records = {t: records[t] for t in ENTRIES if t in records}  # the leaderboard's order
    old = {}
    for record in (r for r in records.values() if r.get("earlier")):
        for sub in list(record.get("submission", {})):
            path = final / "submission" / sub
            if path.is_file():
                old[sub] = path.read_text(encoding="utf-8")
            else:  # removed since: the row says "none"
                del record["submission"][sub]
    with artifacts.atomic_dir(final) as tmp:
        (tmp / "submission").mkdir()
        for record in records.values():
            for sub, (indices, predictions) in record.pop("predictions", {}).items():
                (tmp / "submission" / sub).write_text(submission_text(indices, predictions),
                                                      encoding="utf-8")
                record.setdefault("submission", {})[sub] = len(indices)
        for sub, text in old.items():
            (tmp / "submission" / sub).write_text(text, encoding="utf-8")
        result = {**header, **summary(records), "tasks": records}
        (tmp / "results.json").write_text(json.dumps(result, indent=2, default=float))
        (tmp / "results.md").write_text(markdown(header, records), encoding="utf-8")
    return final


def markdown(header: dict, records: dict) -> str:
    grid = header.get("grid") or {}
    lines = [f"# GLUE dev results, {header['date']}", "",
             f"Encoder: `{header['init_from']}`. Command: `{header.get('command', '')}`.",
             f"Machine: {header.get('machine', '')}.", "",
             *table(records), "",
             ("Scores x100 on the dev sets (MNLI: dev_matched / dev_mismatched). They are not "
              "test scores: those come from the GLUE server for the files in submission/."),
             "Each task: the BERT paper's fine-tuning (batch 32, 3 epochs, max_seq_length 128"
             ") at " + (f"the best of {grid} by dev score (as the paper chose its learning "
                        f"rate; optimistic for dev)" if grid else
                        f"learning rate {header.get('learning_rate')}") +
             "; the epoch kept is chosen on a slice of train, never on dev. WNLI: the majority "
             "class, as the paper.", ""]
    return "\n".join(lines)
