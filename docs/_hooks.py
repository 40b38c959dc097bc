"""mkdocs hooks: the repository's Markdown outside docs/ joins the site, and every page's links
keep the form that works on GitHub.

Pages link by their repository paths (``../FORMAT.md`` from docs/, ``docs/guide/attach.md``
from README.md), so they read on GitHub as they are. The site holds docs/ plus the root files
in ``ROOT_PAGES``; each link is resolved against the linking file's place in the repository
and rewritten to the target's place in the site. A link to a repository file the site does
not hold (a source file, a test) becomes its text; a link to nothing is left as written, so
``mkdocs build --strict`` fails on it.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
DOCS = "docs"
#: repository path -> its path in the site (README.md, the front page, is the site's home)
ROOT_PAGES = {"README.md": "index.md", "FORMAT.md": "FORMAT.md", "CHANGELOG.md": "CHANGELOG.md",
              "bench/README.md": "bench/README.md"}
#: docs/README.md, docs/' index on GitHub, lists what the site's navigation shows: links to it go home
ALIASES = {"docs/README.md": "index.md"}
LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)(\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def on_files(files: Files, config) -> Files:
    """Add the root pages as generated files whose source is the repository's file."""
    for repo_path, src_uri in ROOT_PAGES.items():
        path = REPO / repo_path
        if path.exists():
            files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    return files


def _repo_path(src_uri: str) -> str:
    """Where a site page lives in the repository."""
    for repo_path, uri in ROOT_PAGES.items():
        if uri == src_uri:
            return repo_path
    return f"{DOCS}/{src_uri}"


def _site_uri(repo_path: str) -> str | None:
    """The site path of a repository file, or None where the site does not hold it."""
    if repo_path in ROOT_PAGES:
        return ROOT_PAGES[repo_path]
    if repo_path in ALIASES:
        return ALIASES[repo_path]
    if repo_path.startswith(f"{DOCS}/"):
        return repo_path[len(DOCS) + 1:]
    return None


def _rewrite(target: str, page_repo: str, page_uri: str) -> str | None:
    """The link's target in the site; '' to drop the link (keep its text); None to leave it."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path, _, anchor = target.partition("#")
    repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo), path))
    if (REPO / repo_path).is_dir() and (REPO / repo_path / "README.md").exists():
        repo_path = posixpath.join(repo_path, "README.md")
    uri = _site_uri(repo_path)
    if uri is None:
        return "" if (REPO / repo_path).exists() else None
    rel = posixpath.relpath(uri, posixpath.dirname(page_uri) or ".")
    return rel + (f"#{anchor}" if anchor else "")


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    """Rewrite the page's relative links from repository paths to site paths (not in code blocks)."""
    page_uri = page.file.src_uri
    page_repo = _repo_path(page_uri)
    out, in_code = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            in_code = not in_code
        if not in_code:
            line = LINK.sub(lambda m: _link(m, page_repo, page_uri), line)
        out.append(line)
    return "\n".join(out)


def _link(m: re.Match, page_repo: str, page_uri: str) -> str:
    """One link, rewritten by ``_rewrite``; a dropped link keeps its text (an image stays as written)."""
    label, target, title = m.group(1), m.group(2), m.group(3) or ""
    new = _rewrite(target, page_repo, page_uri)
    if new is None:
        return m.group(0)
    if new == "":
        return label[1:-1] if not label.startswith("!") else m.group(0)
    return f"{label}({new}{title})"
