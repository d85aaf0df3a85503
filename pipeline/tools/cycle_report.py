"""The review page of one `bert-pipeline cycle` (pipeline/cycle.py): for each task the new model's
test metric against the registered champion's on the same test split, the decision, the
fine-tuning curves and the confusion matrix; the pretraining of the cycle (its new text, the
held-out MLM accuracy before and after, its training curves). Written as cycle_report.html (the
images inside it, so the MLflow UI's artifact view shows the whole page) and cycle_report.md with
the PNGs beside it; logged on the cycle's parent run (the page at the top, the rest in report/).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from pathlib import Path

import mlflow

from pipeline import artifacts
from pipeline.tracking import outbox
from pipeline.tracking import runs as tracking

# Metrics where lower is better (every task's own metric is higher-is-better).
LOWER_IS_BETTER = ("loss", "mse", "mae", "rmse", "perplexity")


def higher_is_better(metric: str) -> bool:
    return not any(metric == m or metric.endswith("_" + m) for m in LOWER_IS_BETTER)


def split_id(splits: dict) -> str:
    """The test split's id, as the finetune stage tags registered versions with it
    (pipeline/finetuning/outputs.py): the same splits give the same id."""
    return hashlib.sha256(json.dumps(splits, sort_keys=True).encode()).hexdigest()[:16]


def task_result(folder: Path, metric: str, where: str) -> dict:
    """What a finetune output folder says about its test split: the promotion metric's value
    (`metric`, "" = the task's own), the other test metrics, baselines, curves, split id."""
    folder = Path(folder)
    results = json.loads(artifacts.require(folder / "metrics.json", "the fine-tuned model's "
                                           "metrics", "finetune").read_text())
    splits = json.loads((folder / "splits.json").read_text())
    metric = metric or results.get("metric", "accuracy")
    test = {k: v for k, v in results.get("test", {}).items() if isinstance(v, (int, float))}
    if metric not in test:
        raise ValueError(f"{where}.metric = {metric!r} is not a test metric of this task (it "
                         f"has {', '.join(sorted(test))}); choose one of those")
    return {"metric": metric, "value": float(test[metric]), "test": test,
            "baselines": {name: {k: v for k, v in b.items() if isinstance(v, (int, float))}
                          for name, b in results.get("baselines", {}).items()},
            "best_baseline": results.get("best_baseline"),
            "history": results.get("history", []), "split_id": split_id(splits),
            "task_metric": results.get("metric", metric), "best_epoch": results.get("best_epoch"),
            "serving": (folder / "saved_model").is_dir(),
            "confusion_matrix": str(folder / "confusion_matrix.png")
            if (folder / "confusion_matrix.png").is_file() else ""}


def champion(name: str, metric: str) -> dict | None:
    """The version holding the champion alias of `name` and its logged test score (None: no
    champion, or no such model yet)."""
    client = mlflow.MlflowClient()
    try:
        holder = client.get_model_version_by_alias(name, tracking.CHAMPION)
    except mlflow.exceptions.MlflowException:
        return None
    value = holder.tags.get(f"eval.test_{metric}")
    return {"version": str(holder.version), "value": float(value) if value else float("nan"),
            "test_split": holder.tags.get("eval.test_split", ""),
            "cycle": holder.tags.get("cycle.number", ""), "run_id": holder.run_id or ""}


def compare(result: dict, holder: dict | None) -> str:
    """One line: how the new model's score stands against the champion's (the rule
    `tracking.promote_if_better` applies)."""
    metric, value = f"test_{result['metric']}", result["value"]
    if holder is None:
        return f"{metric} {value:.4f}; no champion yet"
    if holder["test_split"] != result["split_id"]:
        return (f"{metric} {value:.4f}; champion v{holder['version']} was evaluated on another "
                f"test split ({holder['test_split'] or 'unknown'}): not comparable")
    if math.isnan(holder["value"]):
        return f"{metric} {value:.4f}; champion v{holder['version']} has no {metric}"
    higher = higher_is_better(result["metric"])
    better = value > holder["value"] if higher else value < holder["value"]
    return (f"{metric} {value:.4f} {'beats' if better else 'does not beat'} champion "
            f"v{holder['version']}'s {holder['value']:.4f} ({value - holder['value']:+.4f})")


def compare_direct(result: dict, direct: dict) -> str:
    """One line: the adapted model against the published checkpoint fine-tuned directly on
    the same task (the first champion-to-be)."""
    metric, value, theirs = f"test_{result['metric']}", result["value"], direct["value"]
    if direct["split_id"] != result["split_id"]:
        return (f"{metric} {value:.4f}; the direct fine-tune was evaluated on another test "
                f"split: not comparable")
    higher = higher_is_better(result["metric"])
    better = value > theirs if higher else value < theirs
    return (f"{metric} {value:.4f} {'beats' if better else 'does not beat'} the checkpoint "
            f"fine-tuned directly, {theirs:.4f} ({value - theirs:+.4f})")


def curves_png(history: list, metric: str, out: Path) -> Path | None:
    """The fine-tuning curves (training loss, validation metric per epoch) as a small PNG."""
    if not history:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 2.6), dpi=80)
    FigureCanvasAgg(figure)
    epochs = [h["epoch"] for h in history]
    for index, key in enumerate(("train_loss", f"val_{metric}")):
        axes = figure.add_subplot(1, 2, index + 1)
        axes.plot(epochs, [h.get(key, float("nan")) for h in history], marker="o")
        axes.set_xlabel("epoch")
        axes.set_title(key.replace("_", " "), fontsize=10)
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out)
    return out


def pretraining_summary(cycle_dir: Path) -> dict:
    """The cycle's pretraining from its outputs: held-out MLM accuracy at the first and last
    probe (the first is before any update of this cycle), final eval, the curves PNG."""
    paths = artifacts.Artifacts(cycle_dir)
    out = {"curves": str(paths.pretrain_dir / "training_curves.png")
           if (paths.pretrain_dir / "training_curves.png").is_file() else ""}
    if paths.pretrain_eval.is_file():
        ev = json.loads(paths.pretrain_eval.read_text())
        out.update(steps=ev.get("step"), mlm_accuracy=ev.get("eval_mlm_accuracy"))
    if paths.heldout_curve.is_file():
        curve = json.loads(paths.heldout_curve.read_text()).get("curve") or []
        if curve:
            out.update(heldout_first=curve[0], heldout_last=curve[-1])
    return out


def _cell(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _tables(record: dict, pretraining: dict, tasks: dict) -> list[tuple[str, list, list]]:
    """(title, header, rows) of each table of the page."""
    new_bytes = sum(f["bytes"] for f in record["files"])
    rows = [["new text", f"{len(record['files'])} file(s), {new_bytes:,} bytes"],
            ["started from", f"cycle {record['base']}'s encoder" if record.get("base")
             else "scratch (first cycle)"],
            ["steps", pretraining.get("steps", "")]]
    if "heldout_first" in pretraining:
        first, last = pretraining["heldout_first"], pretraining["heldout_last"]
        rows.append(["held-out MLM accuracy", (f"{first[2]:.4f} at step {first[0]} → "
                                              f"{last[2]:.4f} at step {last[0]}")])
    tables = [("Pretraining", ["", ""], rows)]
    rows = []
    for name, task in tasks.items():
        result, holder = task["result"], task.get("champion")
        rows.append([name, task["registered_model"], f"test_{result['metric']}",
                     _cell(result["value"]),
                     f"v{holder['version']}: {_cell(holder['value'])}" if holder else "none",
                     task.get("decision") or task["comparison"]])
    tables.append(("Against the champion (same test split)",
                   ["task", "registered model", "metric", "this cycle", "champion", "decision"],
                   rows))
    for name, task in tasks.items():
        direct, result = task.get("direct_result"), task["result"]
        if direct:
            keys = sorted(set(result["test"]) & set(direct["test"]))
            tables.append((f"{name}: direct vs adapted (the published checkpoint fine-tuned as "
                           f"it is, and after this cycle's pretraining; same test split)",
                           ["model", *keys],
                           [["direct", *(_cell(direct["test"][k]) for k in keys)],
                            ["adapted", *(_cell(result["test"][k]) for k in keys)]]))
    rows = []
    for name, task in tasks.items():
        best = task["result"].get("best_baseline")
        if best:
            model = task["result"]["test"].get(best["metric"], float("nan"))
            rows.append([name, f"test_{best['metric']}", _cell(model),
                         f"{best['name']}: {_cell(best['value'])}",
                         f"{best['margin_points']:+.1f}" +
                         (" (the model LOSES)" if best["margin_points"] < 0 else "")])
    if rows:
        tables.append(("Against the strongest baseline (same test split; settings chosen on "
                       "validation)", ["task", "metric", "this cycle", "best baseline",
                                       "margin (points)"], rows))
    for name, task in tasks.items():
        result = task["result"]
        keys = sorted(result["test"])
        rows = [["this cycle", *(_cell(result["test"][k]) for k in keys)]]
        rows += [[f"baseline {b}", *(_cell(v.get(k, "")) for k in keys)]
                 for b, v in result["baselines"].items()]
        tables.append((f"{name}: every test metric", ["model", *keys], rows))
    return tables


def write(cycle_dir: Path, record: dict, names: list) -> Path:
    """Writes cycle_report.html, cycle_report.md and their PNGs into <cycle_dir>/report/ (whole or
    not at all) for the tasks `names` of the cycle's `record`, and logs them and each task's test
    metric (and its champion's) on the cycle's run; returns the page's path."""
    out_dir, folder = Path(cycle_dir) / "report", artifacts.Artifacts(cycle_dir).finetune
    pretraining, tasks = pretraining_summary(cycle_dir), {}
    for name in names:
        entry = record["tasks"][name]
        tasks[name] = {**entry, "result": task_result(folder(name).dir, entry["metric"], name)}
        if entry.get("direct", {}).get("done"):
            tasks[name]["direct_result"] = task_result(folder(entry["direct"]["output"]).dir,
                                                       entry["metric"], name)
    title = f"Cycle {record['number']} ({record['opened'][:10]})"
    with artifacts.atomic_dir(Path(out_dir)) as tmp:
        images = []  # (caption, file name)
        if pretraining.get("curves"):
            (tmp / "pretraining_curves.png").write_bytes(Path(pretraining["curves"]).read_bytes())
            images.append(("Pretraining curves (this cycle)", "pretraining_curves.png"))
        for name, task in tasks.items():
            result = task["result"]
            if curves_png(result["history"], result["task_metric"],
                          tmp / f"{name}_finetuning_curves.png"):
                images.append((f"{name}: fine-tuning curves", f"{name}_finetuning_curves.png"))
            if result["confusion_matrix"]:
                (tmp / f"{name}_confusion_matrix.png").write_bytes(
                    Path(result["confusion_matrix"]).read_bytes())
                images.append((f"{name}: confusion matrix (test split)",
                               f"{name}_confusion_matrix.png"))
        tables = _tables(record, pretraining, tasks)
        md = [f"# {title}", ""]
        page = [(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
                f"</title><style>body{{font-family:sans-serif;margin:16px;max-width:1000px}}"
                f"table{{border-collapse:collapse;margin:8px 0 16px}}td,th{{border:1px solid "
                f"#ccc;padding:3px 8px;text-align:left}}th{{background:#f3f3f3}}img{{max-width:"
                f"100%;border:1px solid #eee}}</style></head><body><h1>{html.escape(title)}</h1>")]
        for heading, header, rows in tables:
            md += [f"## {heading}", "", "| " + " | ".join(header) + " |",
                   "|" + "---|" * len(header)]
            md += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows] + [""]
            page.append(f"<h2>{html.escape(heading)}</h2><table><tr>" +
                        "".join(f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr>" +
                        "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row)
                                + "</tr>" for row in rows) + "</table>")
        for caption, file_name in images:
            md += [f"## {caption}", "", f"![{caption}]({file_name})", ""]
            data = base64.b64encode((tmp / file_name).read_bytes()).decode()
            page.append(f"<h2>{html.escape(caption)}</h2>"
                        f"<img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>")
        page.append("</body></html>")
        (tmp / "cycle_report.md").write_text("\n".join(md), encoding="utf-8")
        (tmp / "cycle_report.html").write_text("\n".join(page), encoding="utf-8")
    page_path, run_id = out_dir / "cycle_report.html", record["mlflow_run_id"]
    for path in sorted(out_dir.iterdir()):  # the page at the top, its parts in report/
        outbox.log_artifact(path, None if path == page_path else "report", run_id)
    for name, task in tasks.items():
        outbox.log_metrics({f"{name}.test_{task['metric']}": task["value"]}, run_id=run_id)
        if task.get("champion") and task["champion"]["value"] == task["champion"]["value"]:
            outbox.log_metrics({f"{name}.champion_test_{task['metric']}":
                                task["champion"]["value"]}, run_id=run_id)
    return page_path
