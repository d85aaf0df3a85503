"""Lineage and caching: what each stage's output depends on, fingerprinted.

A stage's *key* hashes everything its output depends on: its config sections,
its code (the source files that implement it), and its inputs (the upstream
stages' outputs, or for the corpus stage the input files' sizes and
modification times). When a stage completes, a marker `.stage.json` is
written into its output folder with the key, the MLflow run that produced it,
and the input hashes. A later invocation whose key equals the marker's reuses
the output instead of recomputing it (`--force` overrides).

The dependency rules follow how people use continued pretraining:

    corpus   ← corpus.* settings, input files (size + mtime), code
    vocab    ← vocab.* settings, corpus.source/path (not the corpus contents: a
               vocabulary stays fixed when new text arrives, so models keep their ids), code
    data     ← data.* settings, prepared corpus (manifest hash), vocab.txt hash, code
    pretrain ← model.* / train.* settings, data stats + shards listing, vocab.txt hash, code
    finetune, sweep, multitask, distill ← always run (any model, any labelled set); their keys record config + code

The sections and upstream stages come from pipeline/stage_spec.py. A stage's code is the
source of its module and of every project module it imports, directly or through others
(`code_files`, found from the import statements, in-function ones included), so a change
anywhere the stage reaches re-runs it.

So touching the corpus re-runs corpus → data → pretrain (and what follows), not the vocab.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from pathlib import Path

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.stage_spec import STAGES

PROJECT_PACKAGES = ("pipeline", "models", "beam_jobs")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def output_dir(stage: str, paths: Artifacts) -> Path:
    return paths.output_dir(stage)


def marker_path(stage: str, paths: Artifacts) -> Path:
    """<output dir>/.stage.json (the sweep shares finetune/ and keeps its own marker there)."""
    return output_dir(stage, paths) / STAGES[stage].marker


def _source(module: str, root: Path) -> Path | None:
    """The file of a project module (a .py file or a package's __init__.py), else None."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=1024)
def _import_statements(source: str) -> tuple:
    """The import statements of a source text, anywhere in it: (level, module, names) each.
    Parsing is most of a code hash's time (~90 files a stage, every stage fingerprinted on each
    invocation), so a text is parsed once per process; an edited file is a new text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.append((0, None, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module, tuple(alias.name for alias in node.names)))
    return tuple(found)


def _imported_modules(path: Path, module: str, root: Path) -> set[str]:
    """The project modules that `path` (the source of `module`) imports, anywhere in it."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for level, imported, aliases in _import_statements(path.read_text(encoding="utf-8")):
        if imported is None and not level:  # `import a.b`
            names = list(aliases)
        else:
            base = imported or ""
            if level:  # relative: `from . import x`, `from .a import b`
                parents = package.split(".")[:len(package.split(".")) - level + 1]
                base = ".".join(parents + ([base] if base else []))
            # `from a import b` imports a, and a.b as well when b is a module.
            names = [base] + [f"{base}.{alias}" for alias in aliases]
        found.update(name for name in names
                     if name.split(".")[0] in PROJECT_PACKAGES and _source(name, root))
    return found


def code_files(stage: str, root: Path | None = None) -> list[Path]:
    """The source of the stage's module and of every project module it imports, directly or
    through others (in-function imports included), with their packages' __init__.py."""
    root = Path(root or artifacts.PROJECT_ROOT)
    seen: set[str] = set()
    todo = [STAGES[stage].module]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages it is in
        todo += sorted(_imported_modules(_source(module, root), module, root) - seen)
    return sorted(_source(module, root) for module in seen)


def code_hash(stage: str, root: Path | None = None) -> str:
    """sha256 over the paths and contents of `code_files(stage)`."""
    root = Path(root or artifacts.PROJECT_ROOT)
    sha = hashlib.sha256()
    for path in code_files(stage, root):
        sha.update(path.relative_to(root).as_posix().encode())
        sha.update(path.read_bytes())
    return sha.hexdigest()


# Config keys that change how a stage runs, never its output (tests/test_operations.py checks
# that changing them reuses the outputs).
HOW_NOT_WHAT = ("data.beam_args", "data.workers", "vocab.spill_words", "vocab.merge_fan_in")


def config_hash(stage: str, config: config_lib.Config) -> str:
    flat = config_lib.to_flat_dict(config)
    chosen = {k: v for k, v in flat.items()
              if any(k == key or k.startswith(key + ".") for key in STAGES[stage].config)}
    for key in HOW_NOT_WHAT:  # where and how it runs does not change what it makes
        chosen.pop(key, None)
    return sha256_bytes(json.dumps(chosen, sort_keys=True).encode())


def input_hashes(stage: str, config: config_lib.Config, paths: Artifacts) -> dict | None:
    """The hashes of a stage's inputs, or None if an input is missing (the stage will say which)."""
    if stage == "corpus":
        if config.corpus.source == "brown":
            files = [artifacts.BROWN_TARBALL]
        else:
            from pipeline.text.sources import expand_globs

            try:
                files = expand_globs(config.corpus.path)
            except ValueError:
                return None
        if not all(f.exists() for f in files):
            return None
        stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        return {"corpus_files": sha256_bytes(json.dumps(stats).encode()),
                "corpus_file_count": len(files)}
    if not STAGES[stage].cached:
        return None  # fine-tuning always runs (its inputs: any model, any labelled set)
    if stage == "vocab":
        if config.vocab.from_file:
            given = Path(config.vocab.from_file)
            return {"vocab_file": artifacts.sha256_file(given)} if given.exists() else None
        return {}
    needed = {"data": {"corpus_manifest": paths.corpus_manifest, "vocab": paths.vocab_file},
              "pretrain": {"data_stats": paths.data_stats, "vocab": paths.vocab_file}}[stage]
    if not all(p.exists() for p in needed.values()):
        return None
    hashes = {name: artifacts.sha256_file(path) for name, path in needed.items()}
    if stage == "pretrain":
        shards = sorted((p.relative_to(paths.data_dir).as_posix(), p.stat().st_size)
                        for p in paths.data_dir.rglob("*.tfrecord"))  # data/ and data/phase*/
        hashes["data_shards"] = sha256_bytes(json.dumps(shards).encode())
    return hashes


def fingerprint(stage: str, config: config_lib.Config, paths: Artifacts) -> dict:
    """{"key": ..., "config_hash", "code_hash", "inputs": {...}, "upstream_runs": {...}}."""
    inputs = input_hashes(stage, config, paths)
    upstream_runs = {}
    for up in STAGES[stage].upstream:
        marker = read_marker(up, paths)
        if marker:
            upstream_runs[up] = marker.get("mlflow_run_id", "")
    parts = {"stage": stage, "config": config_hash(stage, config), "code": code_hash(stage),
             "inputs": inputs}
    key = sha256_bytes(json.dumps(parts, sort_keys=True).encode())[:16] if inputs is not None else None
    return {"key": key, "config_hash": parts["config"], "code_hash": parts["code"],
            "inputs": inputs or {}, "upstream_runs": upstream_runs}


def read_marker(stage: str, paths: Artifacts) -> dict | None:
    marker = marker_path(stage, paths)
    try:
        return json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_marker(stage: str, paths: Artifacts, fp: dict, run_id: str) -> None:
    artifacts.write_text_atomic(marker_path(stage, paths),
                                json.dumps({**fp, "mlflow_run_id": run_id}, indent=2))


def is_current(stage: str, paths: Artifacts, fp: dict) -> dict | None:
    """The marker if the stage's output is complete and was made from exactly these inputs."""
    marker = read_marker(stage, paths)
    if not marker or fp["key"] is None or marker.get("key") != fp["key"]:
        return None
    if stage == "pretrain" and not (paths.model_keras.exists() and paths.pretrain_eval.exists()):
        return None
    return marker


def tags(stage: str, fp: dict) -> dict:
    """MLflow tags recording where a stage's output came from."""
    out = {"lineage.config_hash": fp["config_hash"], "lineage.code_hash": fp["code_hash"],
           "lineage.key": fp["key"] or ""}
    out.update({f"lineage.input.{name}": str(value) for name, value in fp["inputs"].items()})
    out.update({f"lineage.upstream.{name}": run for name, run in fp["upstream_runs"].items()})
    return out
