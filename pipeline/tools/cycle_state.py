"""What `bert-pipeline cycle` keeps in its run directory: which incoming files it trained on, and
the record of each cycle (pipeline/cycle.py runs the steps; docs/scheduling.md).

    <run_dir>/cycle/state.json          the files trained on: path -> sha256, bytes, mtime, cycle
    <run_dir>/cycles/<NNNN>/cycle.json  one cycle: its new files, its MLflow run, its steps
    <run_dir>/cycles/<NNNN>/incoming/   a copy of the new text it trains on (the source may change)
    <run_dir>/cycles/<NNNN>/...         the stages' outputs (the cycle folder is their run_dir),
                                        configs/ (the exact config of each step), report/

A file is new when its path was not trained on, or its contents changed (then it is taken whole
again); a file whose size and modification time are as recorded is not read again. A file with
the contents of one already trained on (renamed, copied) is not new. Files modified in the last
`cycle.settle_seconds` are left for the next cycle (they may still be being written).

A cycle is open from the moment its files are copied until its promote step ends; a killed cycle
is continued by the next invocation with the same files (its completed steps are not redone).
Every file here is written aside and moved into place.
"""

from __future__ import annotations

import datetime
import glob
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from pipeline import artifacts

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def incoming_files(patterns: str, base: Path) -> list[Path]:
    """The files matched by `patterns` (a glob, or comma-separated globs; `**` recurses; a
    relative one below `base`, the run root), sorted, without hidden files or ones an uploader
    is still writing (*.tmp, *.part)."""
    found = set()
    for pattern in (p.strip() for p in patterns.split(",") if p.strip()):
        for name in glob.glob(str(Path(base) / os.path.expanduser(pattern)), recursive=True):
            path = Path(name)
            if (path.is_file() and not path.name.startswith(".")
                    and path.suffix not in (".tmp", ".part", ".partial")):
                found.add(path.resolve())
    return sorted(found)


class Cycles:
    """The cycles of one run directory (`root`)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.state_file = self.root / "cycle" / "state.json"
        self.cycles_dir = self.root / "cycles"

    # -- state ----------------------------------------------------------------------------------
    def state(self) -> dict:
        try:
            state = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {"consumed": {}}
        except (OSError, ValueError) as err:
            raise ValueError(f"{self.state_file} is not readable ({err}); it lists the files "
                             f"the cycles trained on: restore it, or move the run directory "
                             f"{self.root} aside to start over from the first cycle") from None
        return state

    def records(self) -> list[dict]:
        """Every cycle's record, oldest first."""
        out = []
        for folder in sorted(self.cycles_dir.glob("[0-9][0-9][0-9][0-9]")):
            try:
                out.append(json.loads((folder / "cycle.json").read_text()))
            except (OSError, ValueError):
                continue  # a folder whose opening was killed before its record was written
        return out

    def open_cycle(self) -> dict | None:
        """The cycle under way (opened, its promote step not done), if any."""
        records = [r for r in self.records() if r.get("status") != "done"]
        return records[-1] if records else None

    def last_done(self) -> dict | None:
        records = [r for r in self.records() if r.get("status") == "done"]
        return records[-1] if records else None

    def folder(self, record: dict) -> Path:
        return self.cycles_dir / f"{record['number']:04d}"

    def save(self, record: dict) -> None:
        artifacts.write_text_atomic(self.folder(record) / "cycle.json",
                                    json.dumps(record, indent=2))

    # -- what is new ----------------------------------------------------------------------------
    def scan(self, patterns: str, settle_seconds: float,
             base: Path) -> tuple[list[dict], list[str]]:
        """(the new files as {path, sha256, bytes, mtime_ns, changed}, the paths left for later
        because they changed in the last `settle_seconds`); `base`: see `incoming_files`."""
        consumed = self.state()["consumed"]
        by_hash = {entry["sha256"]: path for path, entry in consumed.items()}
        new, settling, now = [], [], time.time()
        for path in incoming_files(patterns, base):
            stat = path.stat()
            old = consumed.get(str(path))
            if old and old["bytes"] == stat.st_size and old["mtime_ns"] == stat.st_mtime_ns:
                continue  # as it was when trained on
            if now - stat.st_mtime < settle_seconds:
                settling.append(str(path))
                continue
            digest = artifacts.sha256_file(path)
            if digest in by_hash:
                continue  # these contents were trained on (under this or another name)
            new.append({"path": str(path), "sha256": digest, "bytes": stat.st_size,
                        "mtime_ns": stat.st_mtime_ns, "changed": old is not None})
        return new, settling

    def open_new(self, files: list[dict]) -> dict:
        """Opens the next cycle on `files`: copies them into its folder (the copy is what it
        trains on, hashed as copied) and writes its record."""
        records = self.records()
        number = (max((r["number"] for r in records), default=0) + 1)
        base = self.last_done()
        record = {"number": number, "status": "open", "opened": _now(), "closed": "",
                  "base": base["number"] if base else None, "files": [], "mlflow_run_id": "",
                  "steps": {}, "tasks": {}}
        folder = self.folder(record)
        if folder.exists():  # an opening killed before its record: start it again
            shutil.rmtree(folder)
        with artifacts.atomic_dir(folder / "incoming") as tmp:
            for index, entry in enumerate(files):
                target = tmp / f"{index:04d}-{Path(entry['path']).name}"
                digest = hashlib.sha256()
                with open(entry["path"], "rb") as src, open(target, "wb") as dst:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        dst.write(block)
                record["files"].append({**entry, "sha256": digest.hexdigest(),
                                        "bytes": target.stat().st_size,
                                        "snapshot": f"incoming/{target.name}"})
        self.save(record)
        return record

    # -- closing --------------------------------------------------------------------------------
    def close(self, record: dict, keep: int) -> None:
        """Marks `record` done, adds its files to the state, removes the oldest cycle folders
        beyond `keep` (their MLflow runs and registered models stay)."""
        state = self.state()
        for entry in record["files"]:
            state["consumed"][entry["path"]] = {k: entry[k] for k in ("sha256", "bytes",
                                                                      "mtime_ns")}
            state["consumed"][entry["path"]]["cycle"] = record["number"]
        state["last_cycle"] = record["number"]
        # The state first: killed between the two, the cycle is still open and its re-run only
        # closes it again (were the record first, its files would be offered as new again).
        artifacts.write_text_atomic(self.state_file, json.dumps(state, indent=1))
        record.update(status="done", closed=_now())
        self.save(record)
        done = [r["number"] for r in self.records() if r.get("status") == "done"]
        for number in done[:-keep] if keep < len(done) else []:
            folder = self.cycles_dir / f"{number:04d}"
            shutil.rmtree(folder, ignore_errors=True)
            log.info(f"cycle: removed {folder} (cycle.keep_cycles = {keep}; its MLflow runs and "
                f"registered models stay)")
