"""The documentation: the README stays a short front door, and docs/ builds as a MkDocs site with
`mkdocs build --strict`, so that a broken link, a missing anchor or a page left out of the nav
(mkdocs.yml's `validation` makes each a warning) fails the tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 250
README_MAX_CHARS = 120


def mkdocs_build(config: Path, site_dir: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config` into `site_dir`, with this interpreter's mkdocs."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(config), "--site-dir", str(site_dir)],
        check=False, cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


def test_mkdocs_is_installed():
    """The site needs mkdocs and the material theme (requirements-test.txt pins them)."""
    for module in ("mkdocs", "material"):
        found = subprocess.run([sys.executable, "-c", f"import {module}"], check=False,
                               capture_output=True)
        assert found.returncode == 0, (f"{module} is not installed: `make test-setup` installs "
                                       f"requirements-test.txt")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The project's site, built once for this module: (the build's result, its site folder)."""
    site = tmp_path_factory.mktemp("docs") / "site"
    return mkdocs_build(ROOT / "mkdocs.yml", site), site


def test_site_builds_strict(built):
    result, site = built
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    pages = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    for page in sorted((ROOT / "docs").glob("*.md")):
        expected = "index.html" if page.stem == "index" else f"{page.stem}/index.html"
        assert expected in pages, f"docs/{page.name} was not built"
    assert (site / "img" / "training_curves.png").is_file()


def test_strict_build_fails_on_a_page_left_out_of_the_nav_and_a_broken_link(tmp_path):
    """The guard itself: a copy of the site with one page missing from the nav and one link to
    a page that does not exist must not build."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n\nNot in the nav.\n")
    with open(tmp_path / "docs" / "stages.md", "a", encoding="utf-8") as page:
        page.write("\nSee [a page that is not there](no-such-page.md).\n")
    result = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "orphan.md" in output, output
    assert "no-such-page.md" in output, output


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move reference material "
        f"to a page of docs/ and history to CHANGELOG.md")
    long = [i for i, line in enumerate(lines, 1) if len(line) > README_MAX_CHARS]
    assert not long, f"README.md lines over {README_MAX_CHARS} characters: {long}"


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading (its default slugify)."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text)


def _anchors(markdown: Path) -> set[str]:
    anchors, fence = set(), False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6} (.+)$", line)):
            anchors.add(_slug(m.group(1)))
    return anchors


def test_slug_matches_the_built_site(built):
    """_slug is checked against the anchors mkdocs writes, so the README check below means what
    it says."""
    result, site = built
    assert result.returncode == 0, result.stdout + result.stderr
    html = (site / "quality" / "index.html").read_text(encoding="utf-8")
    built = set(re.findall(r'<h[1-6] id="([^"]+)"', html))
    assert built and built == _anchors(ROOT / "docs" / "quality.md")


@pytest.mark.parametrize("source", ["README.md", "CHANGELOG.md"])
def test_links_outside_the_site_resolve(source):
    """README.md and CHANGELOG.md are not pages of the site: their relative links (files and
    anchors) are checked here."""
    text = (ROOT / source).read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / source
        if not file.exists() or (anchor and file.suffix == ".md"
                                 and anchor not in _anchors(file)):
            broken.append(target)
    assert not broken, f"{source}: links to nothing: {broken}"
