"""One door to MLflow: outside pipeline/tracking/ (the outbox and run helpers), pipeline/serving/
(MLflow models) and pipeline/tools/ (which read runs back), no module of pipeline/ imports
mlflow, so everything a stage logs goes through pipeline/tracking/outbox.py and survives a
tracking outage. Read from the source (every import statement, in-function ones included)."""

from __future__ import annotations

import ast
from pathlib import Path

from pipeline import artifacts

PIPELINE = artifacts.PROJECT_ROOT / "pipeline"
# The packages that may talk to MLflow directly.
MLFLOW_ALLOWED = ("pipeline/tracking/", "pipeline/serving/", "pipeline/tools/")


def mlflow_imports(path: Path) -> list[int]:
    """The line numbers of `import mlflow[...]` / `from mlflow[...] import ...` in `path`."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "mlflow" or name.startswith("mlflow.") for name in names):
            lines.append(node.lineno)
    return lines


def offenders(root: Path) -> dict[str, list[int]]:
    """{path relative to the project: lines} for each module under `root` (pipeline/) that
    imports mlflow outside the allowed packages and the temporary exemptions."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root.parent).as_posix()
        if name.startswith(MLFLOW_ALLOWED):
            continue
        lines = mlflow_imports(path)
        if lines:
            found[name] = lines
    return found


def test_only_tracking_serving_and_tools_import_mlflow():
    found = offenders(PIPELINE)
    assert not found, (
        "these modules import mlflow; log through pipeline.tracking.outbox (or a helper in "
        "pipeline/tracking/) instead: "
        + ", ".join(f"{name}:{','.join(map(str, lines))}" for name, lines in found.items()))


def test_the_check_sees_every_kind_of_import(tmp_path):
    """The reader catches the forms a module could use, top-level or inside a function."""
    root = tmp_path / "pipeline"
    (root / "stages").mkdir(parents=True)
    (root / "tracking").mkdir()
    (root / "stages" / "a.py").write_text("import os\nimport mlflow\n")
    (root / "stages" / "b.py").write_text("def f():\n    from mlflow.tracking import fluent\n")
    (root / "stages" / "c.py").write_text("import mlflow.pyfunc as pf, json\n")
    (root / "stages" / "d.py").write_text("from pipeline.serving import mlflow_model\n"
                                          "import mlflowish\n")
    (root / "tracking" / "e.py").write_text("import mlflow\n")
    assert offenders(root) == {"pipeline/stages/a.py": [2], "pipeline/stages/b.py": [2],
                               "pipeline/stages/c.py": [1]}
