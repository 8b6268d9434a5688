"""Every relative link of README.md and docs/*.md reaches a file, and its #anchor a heading.

Anchors follow GitHub's rule for headings: lower case, punctuation other than `-` and `_`
dropped, each space a hyphen.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$")


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := HEADING.match(line)):
            found.add(slug(heading[1]))
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    return broken


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = [problem for page in PAGES for problem in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_the_slug_rule() -> None:
    assert slug("`[gateway]`") == "gateway"
    assert slug('Replicas that act as one (`[state] backend = "redis"`)') == (
        "replicas-that-act-as-one-state-backend--redis"
    )
    assert slug("The leader's `/health` off the serving loop") == (
        "the-leaders-health-off-the-serving-loop"
    )


def test_the_docs_index_lists_every_page_once() -> None:
    """One index (docs/README.md): every page of docs/ in its table, exactly once."""
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| \[([\w-]+\.md)\]\(\1\) \|", index, flags=re.MULTILINE)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert sorted(listed) == pages
