"""The docs name no file that is not in the repository.

README.md, docs/*.md and helm/herald/README.md are scanned for repository paths: link targets
(`[text](path)`) and backticked paths (`scheduler/src/lease/`, `store/claim.rs`,
`proto/herald/v1/*.proto`). A path is taken for one when its first segment is a top-level entry
of the repository, it ends in `/` (a folder) or in a source-file extension (.rs .sql .proto
.py .sh .md). It
must exist: from the repository's root when it starts with a top-level entry (links: from the
doc's own folder), else as the end of some tracked path (`lease/sweeper.rs` is found as
scheduler/src/lease/sweeper.rs). `*`, `<name>` and `{a,b}` placeholders match anything within a
segment. Paths the services create at run time (.venv, target, .herald) are skipped.

When files move, this test lists every doc line that still names the old place.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import harness

REPO = harness.REPO
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "helm" / "herald" / "README.md"]
SOURCE_EXTENSIONS = (".rs", ".sql", ".proto", ".py", ".sh", ".md")
# Created at run time, not tracked.
RUNTIME = (".venv", "target", ".herald")

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
SEGMENT = re.compile(r"^[\w.*<>{},-]+$")


def tracked() -> list[str]:
    """The repository's files: tracked, plus new ones git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def as_regex(path: str) -> str:
    """A regex for `path` with its placeholders (`*`, `<name>`, `{a,b}`) matching one segment's
    worth of anything."""
    out = ""
    for part in re.split(r"(\*|<[^>/]*>|\{[^}/]*\})", path):
        out += "[^/]*" if part and part[0] in "*<{" else re.escape(part)
    return out


def looks_like_a_path(text: str, top: set[str]) -> bool:
    if " " in text or text.startswith(("/", "-", "http:", "https:", "$")) or "://" in text:
        return False
    if re.fullmatch(r"\.\w+", text):
        return False  # an extension (`.proto`), not a file
    segments = text.rstrip("/").split("/")
    if not all(SEGMENT.match(s) for s in segments):
        return False
    if segments[0] in RUNTIME:
        return False
    if segments[0] in top and (len(segments) > 1 or text.endswith("/")):
        return True
    if text.endswith("/"):
        return True  # a folder: `lease/`, `dashboard/`
    return "/" in text and text.rstrip("/").endswith(SOURCE_EXTENSIONS) or (
        "/" not in text and text.endswith(SOURCE_EXTENSIONS)
    )


def exists(path: str, doc: Path, files: list[str], dirs: set[str], top: set[str], link: bool) -> bool:
    clean = path.split("#", 1)[0].rstrip("/")
    if not clean:
        return True
    if link:
        target = (doc.parent / clean).resolve()
        try:
            rel = target.relative_to(REPO).as_posix()
        except ValueError:
            return False
        return rel in dirs or rel in files or target.exists() and rel.split("/")[0] not in RUNTIME
    pattern = as_regex(clean)
    anchored = clean.split("/")[0] in top
    regex = re.compile(("^" if anchored else r"(^|.*/)") + pattern + "$")
    return any(regex.match(p) for p in files) or any(regex.match(d) for d in dirs)


def test_docs_name_only_files_that_exist():
    files = tracked()
    dirs = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    top = {f.split("/")[0] for f in files}
    missing = []
    checked = 0
    for doc in DOCS:
        in_fence = False
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            candidates = [(m.group(1), True) for m in LINK.finditer(line)]
            candidates += [(m.group(1), False) for m in CODE.finditer(line)]
            for text, link in candidates:
                if link and (re.match(r"^[a-z]+:", text) or text.startswith("#")):
                    continue
                if not link and not looks_like_a_path(text, top):
                    continue
                checked += 1
                if not exists(text, doc, files, dirs, top, link):
                    missing.append(f"{doc.relative_to(REPO)}:{number}: {text}")
    assert checked > 50, f"only {checked} paths found: is the scan still finding them?"
    assert not missing, "docs name paths that are not in the repository:\n" + "\n".join(missing)
