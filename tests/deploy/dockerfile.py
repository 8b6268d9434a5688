"""deploy/Dockerfile read as BuildKit reads it: one instruction per logical line (backslash
continuations joined, comments and parser directives dropped), exec-form arguments as JSON.

Enough for what tests/deploy checks without a daemon: what it copies, the user it ends as,
and the command lines it runs (ENTRYPOINT + CMD, the HEALTHCHECK).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from tests.deploy.manifests import ROOT

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    rest: str  # the arguments as written, continuations joined with spaces

    def exec_form(self) -> list[str]:
        """A JSON-array argument (ENTRYPOINT ["unitgate"]); shell form is an error here."""
        value = json.loads(self.rest)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self
        return value


def instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    found: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        text = (pending + line).strip()
        pending = ""
        keyword, _, rest = text.partition(" ")
        found.append(Instruction(keyword.upper(), rest.strip()))
    assert not pending, "the last instruction ends in a continuation"
    return found


def all_of(keyword: str, path: Path = DOCKERFILE) -> list[Instruction]:
    return [i for i in instructions(path) if i.keyword == keyword]


def last(keyword: str, path: Path = DOCKERFILE) -> Instruction:
    """The one that counts (a later ENTRYPOINT, CMD, USER or HEALTHCHECK replaces earlier)."""
    found = all_of(keyword, path)
    assert found, f"no {keyword}"
    return found[-1]


def copy_sources(path: Path = DOCKERFILE) -> list[str]:
    """What every COPY takes from the build context (flags such as --chown skipped)."""
    sources: list[str] = []
    for copy in all_of("COPY", path):
        words = [w for w in copy.rest.split() if not w.startswith("--")]
        sources.extend(words[:-1])
    return sources


def context_allowlist(path: Path = DOCKERIGNORE) -> set[str]:
    """The `!` entries of an ignore-everything-else dockerignore (`*` first)."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*", "the dockerignore starts by leaving everything out"
    return {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}


def in_context(path: str, ignore: Path = DOCKERIGNORE) -> bool:
    """Whether the build context holds `path` (relative, with /): as Docker reads the file,
    the last rule that matches the path or one of its parent folders decides."""
    lines = [line.strip() for line in ignore.read_text().splitlines()]
    sent = True
    for rule in (line for line in lines if line and not line.startswith("#")):
        pattern = rule.removeprefix("!").strip("/")
        if _matches(pattern, path):
            sent = rule.startswith("!")
    return sent


def _matches(pattern: str, path: str) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    if pattern.startswith("**/"):  # at any depth
        tails = ["/".join(parts[k:n]) for n in range(1, len(parts) + 1) for k in range(n)]
        return any(fnmatchcase(tail, pattern[3:]) for tail in tails)
    depth = pattern.count("/") + 1  # a `*` does not cross a `/`
    return any(fnmatchcase(p, pattern) for p in prefixes if p.count("/") + 1 == depth)
