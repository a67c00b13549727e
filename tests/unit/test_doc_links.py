"""The Markdown that `mkdocs build --strict` does not see: the README and the folders' READMEs.

`make docs` (run by `make test`) fails on any broken link, anchor or unlisted page inside
`docs/`. The README and the per-folder READMEs live outside it, so their links are checked
here: every relative link names a file that exists, and an anchor into a Markdown file names
one of its headings (slugged as MkDocs' `toc` extension slugs them, which GitHub agrees with
for these headings). The README stays an index: at most 200 lines, linking every page of the
site's nav, and its demo tables are the ones docs/results.md reports.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _readmes() -> list[Path]:
    skip = {"node_modules", "build", "runs", "models"}
    found = [
        p
        for p in ROOT.rglob("README.md")
        if not any(
            part in skip or part.startswith(".") or part.endswith(".egg-info")
            for part in p.relative_to(ROOT).parts
        )
        and p.relative_to(ROOT).parts[0] != "docs"
    ]
    return sorted(found)


def slug(heading: str) -> str:
    """Python-Markdown's `toc` slugify on a heading's text (code spans and link syntax removed)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(md: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", md.read_text()))}


def links(md: Path) -> list[str]:
    text = FENCE.sub("", md.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # a code span is not a link
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("readme", _readmes(), ids=lambda p: str(p.relative_to(ROOT)))
def test_readme_links_resolve(readme: Path) -> None:
    problems = []
    for target in links(readme):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (readme.parent / path).resolve() if path else readme
        if not dest.exists():
            shown = dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest
            problems.append(f"{target}: {shown} missing")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(ROOT)}")
    assert not problems, f"{readme.relative_to(ROOT)}: " + "; ".join(problems)


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_readme_is_an_index_of_the_docs_site() -> None:
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail into docs/"
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    linked = {t.partition("#")[0] for t in links(readme)}
    missing = [p for p in _nav_pages(config["nav"]) if p != "index.md" and f"docs/{p}" not in linked]
    assert not missing, f"README.md's docs index does not link {missing}"


def test_readme_demo_tables_are_the_results_pages() -> None:
    rows = [
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if re.match(r"^\| (math|code|if) \| \d", line)
    ]
    assert len(rows) == 6, rows
    results = (ROOT / "docs" / "results.md").read_text().splitlines()
    assert [r for r in rows if r not in results] == []
