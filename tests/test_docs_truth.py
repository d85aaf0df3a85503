"""Docs a test keeps true (issue 51, point 5): what README.md and docs/*.md show in code (fenced
blocks and inline `code`) exists, and `make help` lists every target.

Checked, each against the code that defines it (no list here of its own):
- `make TARGET`: a target of the Makefile; no `--flag` given to make itself (make takes it:
  `make predict --text x` is make's own option, the command's flags go in `ARGS="..."`);
  the flags inside `ARGS="..."` are accepted by the command the target's recipe runs;
- `python -m pipeline CMD` / `bert-pipeline CMD`: CMD a stage (pipeline/stage_spec.py), `all`
  or a command of pipeline/cli.py's TOOLS; its `--flags` among the add_argument calls of the
  module that parses them (read with ast: importing the tools would load TensorFlow, MLflow;
  the subcommands of one module, fill-mask/nsp/attention/embed, share one set of flags), or
  cli.py's own --run-root and -v; more stages after a stage; a `config` subcommand;
- `section.key=` / `section.key:`: a declared key (pipeline.config.keys.declared(Config), what
  `make config-docs` writes docs/configuration.md from) or a name the code writes as a tag
  (`cycle.arm: direct`); also the keys of a ```yaml block whose top-level keys are config
  sections; and no key that `model.init_from` decides shown beside it;
- `from pipeline.x import y`, `import pipeline.x`, `python -m models.convert`, and an inline span
  that is a dotted name of the project (`pipeline.tracking.runs.promote_if_better`): the module
  file exists and defines the name (ast, nothing imported);
- a repository path (configs/..., pipeline/..., bench/..., tests/..., docs/..., beam_jobs/...,
  models/..., deploy/..., .ci/...): the file or folder exists;
- the comments of configs/*.yaml: the same, and a pointer `(docs/x.md, "Heading")` or
  `(README, Heading)` names a heading that file has.

Skipped on purpose: placeholders (`<run_dir>`, `$HOME/...`, `configs/finetune_*.yaml`, `...`,
`STAGE`, `finetune.key=value`), paths under data/ and runs/ and a block listing a folder made at
run time (`runs/nightly/` and what it holds), prose outside code, and flags where the
parser cannot be read from its source (a parser built with parse_known_args, which passes
unknown flags on, or with add_argument names computed at run time, e.g. the Beam jobs' settings
flags): there only the module is checked.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import functools
import re
import shlex
from pathlib import Path

import yaml

from pipeline import cli
from pipeline.config.keys import declared, sections
from pipeline.config.sections import Config
from tests.source_flags import literal, module_file, parser_of

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH_ROOTS = ("configs", "pipeline", "bench", "tests", "docs", "beam_jobs", "models", "deploy",
              ".ci")
PACKAGES = tuple(d.name for d in sorted(ROOT.iterdir()) if (d / "__init__.py").is_file())
KEYS = set(declared(Config))
SECTIONS = tuple(sections(Config))
# A `model.keras` or `data.py` is a file name, not the key `keras` of the section `model`.
FILE_SUFFIXES = {"keras", "py", "md", "json", "jsonl", "txt", "yaml", "yml", "log", "db", "png",
                 "npy", "parquet", "tsv", "csv", "gz", "tgz", "lock", "tfrecord", "bin", "html"}
PLACEHOLDER = re.compile(r"[<$*{]|\.\.\.|…")
PYTHON = re.compile(r"(^|/)python(3(\.\d+)?)?$")


# ---- what the docs show: code snippets with their line numbers ----

@dataclasses.dataclass
class Snippet:
    where: str  # file:line
    text: str
    block: bool  # a line of a fenced block (joined with its `\` continuations), else inline code
    listing: bool = False  # a line of a block that lists a run-time folder (runs/..., data/...)


def read_doc(path: Path) -> tuple[list[Snippet], list[tuple[str, str, list[str]]]]:
    """(every code snippet of a Markdown file, its fenced blocks as (file:line, language,
    lines))."""
    name = (path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path))
    lines = path.read_text(encoding="utf-8").splitlines()
    snippets, blocks, prose = [], [], []
    fence, i = None, 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence, block = stripped[:3], (f"{name}:{i + 1}", stripped[3:].strip(), [])
            blocks.append(block)
        elif fence is not None and stripped.startswith(fence):
            fence = None
        elif fence is not None:
            start, text = i, lines[i]
            block[2].append(lines[i])
            while text.endswith("\\") and i + 1 < len(lines) \
                    and not lines[i + 1].lstrip().startswith(fence):
                prose.append((i, ""))
                i += 1
                text = text[:-1] + " " + lines[i].strip()
                block[2].append(lines[i])
            listing = bool(re.match(r"^\s*(runs/|data/|<|\$)", block[2][0]))
            snippets.append(Snippet(f"{name}:{start + 1}", text, True, listing))
        prose.append((i, "" if fence is not None or stripped.startswith(("```", "~~~"))
                      else lines[i]))
        i += 1
    # inline code, paragraph by paragraph (a span may wrap onto the next line)
    paragraph: list[tuple[int, str]] = []
    for number, line in [*prose, (len(lines), "")]:
        if line.strip():
            paragraph.append((number, line))
            continue
        text = "\n".join(line for _, line in paragraph)
        for m in re.finditer(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, re.S):
            first = paragraph[text.count("\n", 0, m.start())][0]
            snippets.append(Snippet(f"{name}:{first + 1}", " ".join(m.group(2).split()), False))
        paragraph = []
    return snippets, blocks


@functools.cache
def defined_names(file: Path) -> dict[str, ast.AST]:
    """The top-level names a module defines (def, class, assignment, import; also inside
    top-level if/try), and for a package its submodules."""
    out: dict[str, ast.AST] = {}

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            out[name.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    out[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body + node.orelse + getattr(node, "finalbody", [])
                      + [n for h in getattr(node, "handlers", []) for n in h.body])

    visit(ast.parse(file.read_text(encoding="utf-8")).body)
    if file.name == "__init__.py":
        for sub in file.parent.iterdir():
            out.setdefault(sub.stem if sub.suffix == ".py" else sub.name, sub)
    return out


def resolve(dotted: str) -> str | None:
    """None if `dotted` (a module, or a module's name, or a class's attribute) exists, else what
    is missing."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        file = module_file(".".join(parts[:i]))
        if file is None:
            continue
        rest = parts[i:]
        if not rest:
            return None
        node = defined_names(file).get(rest[0])
        if node is None:
            return f"{'.'.join(parts[:i])} defines no {rest[0]!r} ({file.relative_to(ROOT)})"
        if len(rest) > 1 and isinstance(node, ast.ClassDef):
            members = {n.name for n in node.body if hasattr(n, "name")} | {
                t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in ast.walk(n) if isinstance(t, ast.Name)}
            if rest[1] not in members:
                return f"class {rest[0]} has no {rest[1]!r} ({file.relative_to(ROOT)})"
        return None
    return f"no module {parts[0]}"


@dataclasses.dataclass
class Makefile:
    targets: set[str]
    phony: set[str]
    help_text: str
    runs: dict[str, tuple[str, str]]  # target -> ("pipeline", command) or ("file", script)


@functools.cache
def read_makefile(path: Path) -> Makefile:
    targets, phony, runs, recipes = set(), set(), {}, {}
    current: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("\t"):
            for target in current:
                recipes.setdefault(target, []).append(line.strip())
            continue
        current = []
        if line.startswith(".PHONY:"):
            phony.update(line.split(":", 1)[1].split())
        elif (m := re.match(r"^([^\s#$=:][^=:]*?)\s*:(?![=])", line)) and "$" not in m.group(1):
            current = m.group(1).split()
            targets.update(current)
    for target, recipe in recipes.items():
        for line in recipe:
            if m := re.search(r"-m pipeline (\S+)", line):
                runs[target] = ("pipeline", target if m.group(1) == "$@" else m.group(1))
                break
            if m := re.search(r"\$\(PY\) (bench/\S+\.py)", line):
                runs[target] = ("file", m.group(1))
                break
    help_text = "\n".join(" ".join(re.findall(r'"((?:[^"\\]|\\.)*)"', line))
                          for line in recipes.get("help", []))
    return Makefile(targets, phony, help_text, runs)


@functools.cache
def global_flags() -> dict[str, bool]:
    """What pipeline/cli.py's main takes for every command before dispatching: --run-root DIR
    (_take_run_root) and -v/--verbose."""
    tree = ast.parse((ROOT / "pipeline" / "cli.py").read_text(encoding="utf-8"))
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_take_run_root":
            out.update({c.value.rstrip("="): True for c in ast.walk(node)
                        if literal(c) and c.value.startswith("--")})
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "verbose"
                                                for t in node.targets):
            out.update({c.value: False for c in ast.walk(node)
                        if literal(c) and c.value.startswith("-")})
    assert "--run-root" in out and "-v" in out, "pipeline/cli.py's global flags not found"
    return out


@functools.cache
def code_names() -> set[str]:
    """The `section.name` strings of pipeline/'s code: MLflow tags and params it writes
    (`cycle.arm: direct` is a tag of a model version, not a config key)."""
    pattern = rf"[\"']((?:{'|'.join(SECTIONS)})\.\w+)[\"']"
    return {m.group(1) for file in (ROOT / "pipeline").rglob("*.py")
            for m in re.finditer(pattern, file.read_text(encoding="utf-8"))}


@functools.cache
def checkpoint_decides() -> set[str]:
    """The keys model.init_from fills from the checkpoint (pipeline/config/checkpoint.py:
    MODEL_KEYS, and the model./vocab. names its code writes, model.preset among them)."""
    tree = ast.parse((ROOT / "pipeline" / "config" / "checkpoint.py").read_text(encoding="utf-8"))
    out = {c.value for c in ast.walk(tree) if literal(c)
           and re.fullmatch(r"(model|vocab)\.\w+", c.value)} - {"model.init_from"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODEL_KEYS":
            out |= {f"model.{k.value}" for k in node.value.keys}
    assert {"model.num_layers", "model.preset", "vocab.from_file"} <= out, out
    return out


@functools.cache
def pipeline_commands() -> dict[str, Path]:
    """{command of `python -m pipeline`: the file whose parser reads its flags}."""
    out = {name: ROOT / "pipeline" / "cli.py" for name in (*cli.STAGES, *cli.EXTRA_STAGES, "all")}
    for name, target in cli.TOOLS.items():
        out[name] = module_file(target.split(":")[0])
    return out


# ---- the checks ----

def check_flags(where: str, tokens: list[str], parsed: tuple | None, what: str,
                extra: dict[str, bool] | None = None) -> list[str]:
    """`tokens` (a command's arguments) against a parser_of result; flags only."""
    if parsed is None:
        return []
    flags = {**parsed[0], **(extra or {})}
    out, skip = [], False
    for token in tokens:
        if skip or PLACEHOLDER.search(token):
            skip = False
            continue
        if re.match(r"^--?[A-Za-z]", token):
            name = token.split("=", 1)[0]
            if name not in flags:
                out.append(f"{where}: {what} has no option {name!r}"
                           + (f" (shown: {token!r})" if token != name else ""))
            skip = flags.get(name, False) and "=" not in token
    return out


def check_pipeline(where: str, args: list[str], shown: str) -> list[str]:
    """`python -m pipeline ARGS`: the command exists, its flags are its parser's."""
    commands = pipeline_commands()
    glob = global_flags()
    i = 0
    while i < len(args) and args[i] in glob:
        i += 2 if glob[args[i]] else 1
    if i >= len(args):
        return []
    command = args[i]
    if PLACEHOLDER.search(command) or command.isupper() or not re.match(r"^[a-z][\w-]*$",
                                                                           command):
        return []  # `python -m pipeline STAGE`, `<name>`, `...`
    if command not in commands:
        return [f"{where}: `python -m pipeline {command}`: no such command (stages, all, or "
                f"pipeline/cli.py TOOLS) in {shown!r}"]
    rest = args[i + 1:]
    parsed = parser_of(commands[command])
    out = check_flags(where, rest, parsed, f"`python -m pipeline {command}`", glob)
    flags = {**(parsed[0] if parsed else {}), **glob}
    positional, skip = [], False
    for token in rest:
        if skip:
            skip = False
        elif token.startswith("-"):
            skip = flags.get(token.split("=")[0], False) and "=" not in token
        elif "=" not in token and not PLACEHOLDER.search(token) and token not in ("", "\\"):
            positional.append(token)
    if commands[command].name == "cli.py":  # more stages
        out += [f"{where}: `python -m pipeline {command} ... {p}`: {p!r} is no stage"
                for p in positional if p not in commands or commands[p].name != "cli.py"]
    elif parsed and parsed[1] and command not in parsed[1] and positional \
            and positional[0] not in parsed[1]:
        out.append(f"{where}: `python -m pipeline {command} {positional[0]}`: no such "
                   f"subcommand (has: {', '.join(sorted(parsed[1]))})")
    return out


def check_make(where: str, args: list[str], makefile: Makefile) -> list[str]:
    out = []
    targets = [t for t in args if not t.startswith("-") and "=" not in t
               and not re.search(r"[<\\]|\.\.\.|…|^\[|\]$", t)]
    for token in args:
        if token.startswith("-"):
            out.append(f"{where}: `make {' '.join(targets)} {token}`: make takes "
                       f"{token.split('=')[0]!r} itself; pass the command's options in "
                       f"ARGS=\"...\"")
        elif token in targets:
            if not fnmatch.filter(makefile.targets, token):
                out.append(f"{where}: `make {token}`: no such target {token!r} in the Makefile")
    for token in args:
        if not token.startswith("ARGS=") or not targets:
            continue
        try:
            inner = shlex.split(token[5:])
        except ValueError:
            continue
        for target in targets:
            kind, what = makefile.runs.get(target, ("", ""))
            if kind == "pipeline":
                out += check_pipeline(where, [what, *inner], f"make {target} {token}")
            elif kind == "file":
                out += check_flags(where, inner, parser_of(ROOT / what), f"`make {target}` "
                                   f"({what})")
    return out


def check_import(where: str, text: str) -> list[str]:
    out = []
    for m in re.finditer(r"(?:^|[;`]|\s)from\s+([\w.]+)\s+import\s+\(?([\w\s,]+)", text):
        module, names = m.group(1), m.group(2)
        if module.split(".")[0] not in PACKAGES:
            continue
        if module_file(module) is None:
            out.append(f"{where}: `from {module} import ...`: no module {module}")
            continue
        for name in re.split(r"\s*,\s*", names.strip()):
            name = name.split(" as ")[0].strip()
            if name and (problem := resolve(f"{module}.{name}")):
                out.append(f"{where}: `from {module} import {name}`: {problem}")
    for m in re.finditer(r"(?:^|[;`])\s*import\s+([\w.]+)", text):
        if m.group(1).split(".")[0] in PACKAGES and module_file(m.group(1)) is None:
            out.append(f"{where}: `import {m.group(1)}`: no such module")
    return out


def check_snippet(snippet: Snippet, makefile: Makefile) -> list[str]:
    where, text, out = snippet.where, snippet.text, []
    code = re.sub(r"(^|\s)#\s.*$", "", text)  # a shell comment
    code = re.sub(r"<[^<>`]*>", "<placeholder>", code)  # `<the task's config>`: one word
    # commands: make ..., python -m ..., bert-pipeline ...
    segments = re.split(r"\s*(?:&&|\|\||;)\s*", code)
    for segment in segments:
        parts = [p.strip() for p in segment.split("|")]
        try:
            tokens = shlex.split(parts[0])
        except ValueError:
            tokens = parts[0].split()
        while tokens and (tokens[0] == "$" or re.match(r"^[A-Z_]+=", tokens[0])):
            tokens = tokens[1:]
        # an optional part: `[--json]`, `[ARGS=...]`
        tokens = [t[1:].removesuffix("]") if t.startswith("[") else t for t in tokens]
        if not tokens:
            continue
        if tokens[0] == "make":
            # `make corpus | vocab | data | train`: targets, one of which
            more = [p for p in parts[1:] if re.fullmatch(r"[\w-]+", p)]
            out += check_make(where, tokens[1:] + more, makefile)
        elif tokens[0] == "bert-pipeline":
            out += check_pipeline(where, tokens[1:], segment)
        elif PYTHON.search(tokens[0]) and tokens[1:2] == ["-m"] and len(tokens) > 2:
            module = tokens[2]
            if module == "pipeline":
                out += check_pipeline(where, tokens[3:], segment)
            elif module.split(".")[0] in PACKAGES:
                file = module_file(module, main=True)
                if file is None:
                    out.append(f"{where}: `python -m {module}`: no module {module} (or no "
                               f"__main__.py)")
                else:
                    out += check_flags(where, tokens[3:], parser_of(file),
                                       f"`python -m {module}`")
    out += check_import(where, code)
    # config keys: section.key= / section.key: (`finetune.key=value`: a placeholder)
    pattern = rf"(?<![\w.$/@:-])((?:{'|'.join(SECTIONS)})\.[A-Za-z_]\w*)(?=\s*(?:=|:(?!/)))"
    for key in (m.group(1) for m in re.finditer(pattern, code)):
        if key not in KEYS | code_names() and not key.endswith(".key"):
            out.append(f"{where}: config key {key!r} is not declared (pipeline/config/"
                       f"sections.py; every key: docs/configuration.md)")
    # `model.init_from` alone is enough: the checkpoint decides its sizes and vocab
    if re.search(r"(?<![\w.])model\.init_from=", code):
        for key in sorted(checkpoint_decides()):
            if re.search(rf"(?<![\w.]){re.escape(key)}=", code):
                out.append(f"{where}: {key} shown with model.init_from, which decides it "
                           f"(pipeline/config/checkpoint.py): model.init_from alone is enough")
    # a dotted name of the project, alone in an inline span
    if not snippet.block and (m := re.fullmatch(rf"((?:{'|'.join(PACKAGES)})(?:\.\w+)+)"
                                                r"(\(.*\))?", text)):
        if m.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES and (problem := resolve(m.group(1))):
            out.append(f"{where}: `{text}`: {problem}")
    # repository paths
    roots = "|".join(re.escape(r) for r in PATH_ROOTS)
    for m in re.finditer(rf"(?<![\w./~:@$-])((?:{roots})/[^\s`'\"()\[\],;|]*)",
                         "" if snippet.listing else text):
        path = m.group(1).split(":")[0].rstrip(".")
        if not PLACEHOLDER.search(path) and not (ROOT / path).exists():
            out.append(f"{where}: {path}: no such file or folder in the repository")
    return out


def check_yaml_block(where: str, lang: str, lines: list[str]) -> list[str]:
    """A ```yaml block that is (part of) a config: its section.key names are declared."""
    if lang not in ("yaml", "yml"):
        return []
    try:
        data = yaml.safe_load("\n".join(lines))
    except yaml.YAMLError:
        return []
    if not isinstance(data, dict) or not set(data) <= set(SECTIONS) | KEYS:
        return []
    file, line = where.rsplit(":", 1)
    out = []
    for section, body in data.items():
        for key in body if isinstance(body, dict) else ():
            if f"{section}.{key}" not in KEYS:
                number = int(line) + 1 + next((i for i, text in enumerate(lines)
                                               if re.match(rf"^\s+{re.escape(str(key))}:", text)),
                                              0)
                out.append(f"{file}:{number}: config key '{section}.{key}' is not declared")
    return out


def doc_problems(path: Path, makefile: Path = ROOT / "Makefile") -> list[str]:
    snippets, blocks = read_doc(path)
    make = read_makefile(makefile)
    out = [p for s in snippets for p in check_snippet(s, make)]
    out += [p for block in blocks for p in check_yaml_block(*block)]
    return list(dict.fromkeys(out))


@functools.cache
def headings(path: Path) -> set[str]:
    """A Markdown file's headings (outside fenced blocks), lower case, without backticks."""
    out, fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6} (.+)$", line)):
            out.add(m.group(1).replace("`", "").strip().lower())
    return out


def config_problems(path: Path) -> list[str]:
    """A config file's comments: what they show (as in the docs), and their pointers to the
    docs: the file exists, and `(docs/x.md, "Heading")` / `(README, Heading)` is a heading of
    it (a README pointer must name one: the README is short, its sections move)."""
    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    make, out = read_makefile(ROOT / "Makefile"), []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not (m := re.search(r"(?:^|\s)#\s?(.*)$", line)):
            continue
        where, comment = f"{name}:{number}", m.group(1)
        out += check_snippet(Snippet(where, comment, True), make)
        for span in re.findall(r"`([^`]+)`", comment):
            out += check_snippet(Snippet(where, span, False), make)
        pointers = r'\b(README(?:\.md)?|CHANGELOG\.md|docs/[\w-]+\.md)(?:,\s*("[^"]+"|[^);:\n]+))?'
        for ref in re.finditer(pointers, comment):
            file = ROOT / ("README.md" if ref.group(1).startswith("README") else ref.group(1))
            heading = (ref.group(2) or "").strip().rstrip(".")
            if not file.is_file():
                continue  # a docs/ path: reported above
            if heading.startswith('"') or file.name == "README.md":
                if heading.strip('"').lower() not in headings(file):
                    out.append(f"{where}: {ref.group(0)!r}: {file.relative_to(ROOT)} has no "
                               f"such section (its sections move: point to the page)")
    return list(dict.fromkeys(out))


def help_problems(makefile: Path = ROOT / "Makefile") -> list[str]:
    """Every .PHONY target but help itself is named in `make help` (as `make X` or in a list
    `make a | b | c`)."""
    make = read_makefile(makefile)
    listed = {name for m in re.finditer(r"\bmake\s+([\w-]+(?:\s*\|\s*[\w-]+)*)", make.help_text)
              for name in re.split(r"\s*\|\s*", m.group(1))}
    return [f"{makefile.name}: `make help` does not list the target {target!r} (.PHONY)"
            for target in sorted(make.phony - listed - {"help"})]


# ---- the tests ----

def test_every_reference_in_the_docs_exists():
    problems = [p for doc in DOCS for p in doc_problems(doc)]
    assert not problems, "the docs show what does not exist:\n" + "\n".join(problems)


def test_config_comments_point_to_what_exists():
    problems = [p for file in sorted((ROOT / "configs").glob("*.yaml"))
                for p in config_problems(file)]
    assert not problems, "the configs' comments show what does not exist:\n" + "\n".join(problems)


def test_make_help_lists_every_phony_target():
    problems = help_problems()
    assert not problems, "\n".join(problems)


def test_the_checks_find_what_is_broken(tmp_path):
    """The checker itself, on a page that shows only what exists and on one that shows one
    wrong thing of each kind, each reported with its file:line; and on a Makefile whose help
    leaves a target out."""
    good = tmp_path / "good.md"
    good.write_text(
        "Run `make pretrain ARGS=\"train.steps=300 --force\"` or `make bench-*`, then\n"
        "`make predict ARGS=\"--model runs/default/finetune/brown_genre --text 'A text.'\"`.\n"
        "`make corpus | vocab | data | train`, `make <name>`\n\n"
        "```bash\n"
        "python -m pipeline all --config configs/pretrain_tiny.yaml train.max_seconds=600 \\\n"
        "    --force\n"
        "python -m pipeline -v finetune --config configs/finetune_*.yaml run_dir=runs/x\n"
        "bert-pipeline cycle --config configs/nightly.yaml --step finetune   # a comment\n"
        "python -m models.convert import-hf <dir> --out ckpt/model.keras\n"
        "python -m pipeline config show --defaults\n"
        "python -m pipeline params --preset base [--json]\n"
        "```\n\n"
        "`from pipeline.tracking.runs import promote_if_better`, `pipeline.tracking.runs`,\n"
        "`models.preprocessor.TokenizerLayer`, `finetune.init_from`, `model.keras`,\n"
        "`data/downloads/x.tgz`, `runs/<run_dir>/logs`, `pipeline/stages/<name>.py`,\n"
        "`$HOME/bert`, `tests/test_docs.py`, `docs/img/`\n\n"
        "```yaml\ncycle:\n  incoming: data/incoming/*.txt\n```\n", encoding="utf-8")
    assert doc_problems(good) == []

    bad = tmp_path / "bad.md"
    bad.write_text(
        "`make no-such-target`\n\n"                                      # 1
        "`make predict --question ... --context ...`\n\n"               # 3
        "`make predict ARGS=\"--model m --no-such-flag x\"`\n\n"         # 5
        "```\n"                                                           # 7
        "python -m pipeline no-such-command --config x\n"                # 8
        "python -m pipeline finetune --config x --no-such-option\n"      # 9
        "python -m pipeline all vocab nonstage\n"                        # 10
        "make pretrain ARGS=\"train.no_such_key=1\"\n"                   # 11
        "from pipeline.tracking import promote_if_better\n"              # 12
        "python -m models.no_such_module\n"                               # 13
        "```\n\n"
        "Then `pipeline.tracking.promote_if_better` moves the alias; see\n"  # 16
        "`configs/no_such_config.yaml` and\n"                             # 17
        "`finetune.no_such_key=1`; `make pretrain ARGS=\"model.init_from=c model.preset=base\"`"
        ".\n\n"                                                            # 18
        "```yaml\ntrain:\n  steps: 10\n  no_such_key: 1\n```\n\n"         # 20-24
        "`python -m pipeline config shw`\n",                               # 26
        encoding="utf-8")
    problems = doc_problems(bad)
    expected = [
        (1, "'no-such-target'"), (3, "make takes '--question' itself"),
        (3, "make takes '--context' itself"), (5, "predict` has no option '--no-such-flag'"),
        (8, "no-such-command"), (9, "'--no-such-option'"), (10, "'nonstage' is no stage"),
        (11, "'train.no_such_key'"), (12, "pipeline.tracking defines no 'promote_if_better'"),
        (13, "models.no_such_module"), (16, "pipeline.tracking defines no 'promote_if_better'"),
        (17, "configs/no_such_config.yaml"), (18, "'finetune.no_such_key'"),
        (18, "model.preset shown with model.init_from"),
        (23, "'train.no_such_key'"), (26, "config shw`: no such subcommand")]
    for line, words in expected:
        assert any(p.startswith(f"{bad}:{line}: ") and words in p for p in problems), (
            line, words, problems)
    assert len(problems) == len(expected), problems

    config = tmp_path / "bad.yaml"
    config.write_text(
        '# The recipe (README, How good is the model?); yours (docs/stages.md, "Your own corpus")\n'
        "train:\n  steps: 10   # see docs/no-such-page.md and configs/no_such.yaml\n"
        '# good: (docs/configuration.md, "Your own corpus"), README, Layout; docs/quality.md\n',
        encoding="utf-8")
    problems = config_problems(config)
    for line, words in [(1, "'README, How good is the model?'"), (1, '"Your own corpus"'),
                        (3, "docs/no-such-page.md: no such file"), (3, "configs/no_such.yaml")]:
        assert any(p.startswith(f"{config}:{line}: ") and words in p for p in problems), (
            line, words, problems)
    assert len(problems) == 4, problems

    makefile = tmp_path / "Makefile"
    makefile.write_text(".PHONY: help shown hidden\nhelp:\n\t@echo \"make shown   does it\"\n"
                        "shown:\n\ttrue\nhidden:\n\ttrue\n", encoding="utf-8")
    assert help_problems(makefile) == [
        "Makefile: `make help` does not list the target 'hidden' (.PHONY)"]
