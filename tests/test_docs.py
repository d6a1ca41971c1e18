"""The README and the pages under docs/: every relative link resolves, and the README stays a guide."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 350
# Pages another change adds; a link to one of them may go ahead of it.
COMING = {ROOT / "docs" / "resume.md"}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def links(page: Path) -> list[str]:
    """The targets of a page's Markdown links, leaving out code blocks."""
    return LINK.findall(FENCE.sub("", page.read_text()))


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as '-'."""
    headings = re.findall(r"^#+\s+(.*)$", FENCE.sub("", page.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if file in COMING:
            continue
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
            broken.append(f"{target} (no heading with that anchor)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_and_heading_that_exist(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#a-heading) [gone](missing.md) ![gone](missing.png) "
                    "[bad anchor](there.md#nowhere) [web](https://example.com/x)\n```\n[in code](ignored.md)\n```\n")
    assert broken_links(page) == ["missing.md (no such file)", "missing.png (no such file)",
                                  "there.md#nowhere (no heading with that anchor)"]


def test_the_readme_is_at_most_350_lines() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move depth into a page under docs/"
