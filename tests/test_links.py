"""Every pointer in the course's text leads somewhere in a clone.

Checked in README.md, docs/*.md, docs/device-runs/**/README.md and summary.md, and every lab notebook's
markdown cells:
- a relative link `[text](path#anchor)` names a file or folder that exists (relative to the document), and
  its anchor is a heading of the target (GitHub's slugs; in a notebook also JupyterLab's);
- a repository path in backticks exists. A backticked token is a repository path when it has no space,
  is no URL, no absolute or home path, and no placeholder (`<id>`, `{x}`, `$VAR`, `...`, `NN`), is not
  ignored by git (runs/, .whl/ and other outputs), and either has a `/` and begins with an entry of the
  repository root or of the document's folder, or is a bare file name with a source extension (.py,
  .ipynb, .sh, .yaml, .toml), which must be a tracked file's name. Globs must match something. A path may
  also live at a revision the same document cites with `git show REV:path` (evidence kept in history);
- `git show REV:path` resolves (`git cat-file -e`), and a git tag named in the text exists.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import unicodedata
from functools import lru_cache
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_EXTENSIONS = (".py", ".ipynb", ".sh", ".yaml", ".yml", ".toml")
PLACEHOLDER = re.compile(r"[<>{}$~…]|\.\.\.|(^|[/_-])(N+|X+)([/_.-]|$)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|^\[[^\]]+\]:\s*(\S+)", re.M)
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
BACKTICK = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
GIT_SHOW = re.compile(r"git show ([\w.^~-]+):([^\s`'\"),]+)")
GIT_TAG = re.compile(r"\btag\s+\**`([^`\s]+)`")


def git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def documents(root: Path = ROOT) -> dict[str, str]:
    """{relative path: markdown text} of every document the test covers (a notebook: its markdown cells)."""
    paths = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    paths += sorted(p for p in (root / "docs" / "device-runs").rglob("*.md") if p.name in ("README.md", "summary.md"))
    docs = {str(p.relative_to(root)): p.read_text() for p in paths if p.exists()}
    for nb in sorted((root / "labs").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in nb.parts:
            continue
        cells = json.loads(nb.read_text())["cells"]
        docs[str(nb.relative_to(root))] = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return docs


def without_code_blocks(text: str) -> str:
    """The text with fenced code blocks blanked (a shell example is not a pointer), lines kept."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but - and _ removed, spaces -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return text.replace(" ", "-")


def anchors(text: str, notebook: bool = False) -> set[str]:
    """Every anchor a document's headings give (GitHub numbers repeats -1, -2; JupyterLab keeps case)."""
    found, seen = set(), {}
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", without_code_blocks(text), re.M):
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
        if notebook:
            found.add(m.group(1).strip().replace(" ", "-"))
    found |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    return found


@lru_cache(maxsize=None)
def tree_at(rev: str, root: Path = ROOT) -> frozenset[str]:
    """Every file and folder at a revision (empty if the clone lacks it)."""
    done = git("ls-tree", "-r", "--name-only", rev, cwd=root)
    files = done.stdout.split() if done.returncode == 0 else []
    dirs = {str(p) for f in files for p in PurePosixPath(f).parents if str(p) != "."}
    return frozenset(files) | frozenset(dirs)


@lru_cache(maxsize=None)
def tracked(root: Path = ROOT) -> frozenset[str]:
    return frozenset(git("ls-files", cwd=root).stdout.split())


def ignored(path: Path, root: Path = ROOT) -> bool:
    rel = os.path.relpath(path, root)
    return not rel.startswith("..") and git("check-ignore", "-q", "--no-index", rel, cwd=root).returncode == 0


def is_glob(token: str) -> bool:
    return any(ch in token for ch in "*?[")


def exists(path: Path, root: Path) -> bool:
    """A path (or a glob that matches something) in the working tree."""
    if is_glob(str(path)):
        base = root if path.is_relative_to(root) else path.anchor
        return any(Path(base).glob(str(path.relative_to(base))))
    return path.exists()


def at_revs(rel: str, revs: set[str], root: Path) -> bool:
    """The path (or glob) at one of the revisions."""
    rel = rel.rstrip("/")
    return any(any(p == rel or fnmatch.fnmatch(p, rel) for p in tree_at(r, root)) for r in revs)


def repo_path(token: str, doc: Path, root: Path = ROOT) -> list[Path] | None:
    """The places a backticked token may name (under the document's folder or the root), or None when the
    token is not a repository path by the rule in the module docstring."""
    if " " in token or "://" in token or token.startswith(("/", "-")) or PLACEHOLDER.search(token):
        return None
    if "/" not in token:
        return [doc.parent / token, root / token] if token.endswith(SOURCE_EXTENSIONS) else None
    first = token.split("/")[0]
    if first in ("..", "."):
        bases = [doc.parent]
    elif is_glob(first):
        bases = [doc.parent, root]
    else:
        bases = [b for b in dict.fromkeys((doc.parent, root)) if (b / first).exists()]
    places = [Path(os.path.normpath(b / token)) for b in bases]
    if not places or not is_glob(token) and all(ignored(p, root) for p in places):
        return None                                 # an output: runs/, .whl/, ...
    return places


def problems(root: Path = ROOT) -> list[str]:
    """Every dead pointer in the covered documents, as 'document: what'."""
    found = []
    names = {PurePosixPath(p).name for p in tracked(root)}
    for rel, text in documents(root).items():
        doc = root / rel
        prose = without_code_blocks(text)
        revs = {m.group(1) for m in GIT_SHOW.finditer(text)}
        for m in GIT_SHOW.finditer(text):
            if git("cat-file", "-e", f"{m.group(1)}:{m.group(2)}", cwd=root).returncode != 0:
                found.append(f"{rel}: `git show {m.group(1)}:{m.group(2)}` does not resolve in this clone")
        for m in GIT_TAG.finditer(prose):
            if git("rev-parse", "-q", "--verify", f"refs/tags/{m.group(1)}", cwd=root).returncode != 0:
                found.append(f"{rel}: the git tag {m.group(1)!r} does not exist in this clone")
        for m in list(LINK.finditer(prose)) + list(IMAGE.finditer(prose)):
            target = next(g for g in m.groups() if g)
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
                continue                                  # http:, mailto:, ...
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if path and not dest.exists():
                found.append(f"{rel}: link to {target} leads nowhere")
                continue
            if anchor and dest.is_file() and dest.suffix in (".md", ".ipynb"):
                dest_text = text if dest == doc else documents(root).get(str(dest.relative_to(root))) \
                    or dest.read_text()
                if anchor not in anchors(dest_text, notebook=dest.suffix == ".ipynb"):
                    found.append(f"{rel}: link to {target}: no heading gives the anchor #{anchor}")
        for m in BACKTICK.finditer(prose):
            token = m.group(1).strip()
            places = repo_path(token, doc, root)
            if places is None:
                continue
            if "/" not in token:
                ok = token in names or any(PurePosixPath(p).name == token for r in revs for p in tree_at(r, root))
            else:
                ok = any(exists(p, root) for p in places) or any(
                    at_revs(os.path.relpath(p, root), revs, root) for p in places if p.is_relative_to(root))
            if not ok:
                found.append(f"{rel}: `{token}` is not in the repository"
                             + (f" (nor at {', '.join(sorted(revs))})" if revs else ""))
    return found


def test_every_link_anchor_path_and_git_reference_resolves():
    found = problems()
    assert not found, "dead pointers:\n" + "\n".join(found)


# The checker itself, on a throw-away repository.

@pytest.fixture
def repo(tmp_path):
    def run(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    run("init", "-q")
    run("config", "user.email", "t@t")
    run("config", "user.name", "t")
    (tmp_path / "docs").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "old_probe.py").write_text("")
    (tmp_path / ".gitignore").write_text("runs/\n.whl/\n")
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## The 7B rehearsal\n\ntext\n")
    run("add", "-A")
    run("commit", "-qm", "one")
    rev = git("rev-parse", "--short", "HEAD", cwd=tmp_path).stdout.strip()
    (tmp_path / "scripts" / "old_probe.py").unlink()
    (tmp_path / "scripts" / "bench.py").write_text("")
    run("add", "-A")
    run("commit", "-qm", "two")
    tree_at.cache_clear()
    tracked.cache_clear()

    def check(readme: str) -> list[str]:
        (tmp_path / "README.md").write_text(readme)
        return [p.split(": ", 1)[1] for p in problems(tmp_path)]
    check.rev = rev
    yield check
    tree_at.cache_clear()
    tracked.cache_clear()


def test_good_pointers_pass(repo):
    assert repo(f"[g](docs/guide.md#the-7b-rehearsal) and [top](#top-section)\n\n# Top section\n\n"
                f"`scripts/bench.py`, `bench.py`, `scripts/*.py`, `docs/`, `runs/<id>/report.md`, `.whl/`, "
                f"`labs/NN/x.ipynb`, `fp16/bf16`, `lm_eval/tasks/x.yaml`, `report.md`, `python -m ci.run`, "
                f"`git show {repo.rev}:scripts/old_probe.py` and `scripts/old_probe.py` at that commit\n") == []


def test_a_deleted_script_named_in_backticks_is_found(repo):
    assert repo("built with `scripts/nb_from_py.py`\n") == ["`scripts/nb_from_py.py` is not in the repository"]


def test_a_tag_the_clone_lacks_is_found(repo):
    found = repo("at the git tag **`kernels-probes`**, e.g. `git show kernels-probes:docs/x.md`\n")
    assert found == ["`git show kernels-probes:docs/x.md` does not resolve in this clone",
                     "the git tag 'kernels-probes' does not exist in this clone"]


def test_a_path_missing_at_the_cited_commit_is_found(repo):
    found = repo(f"`git show {repo.rev}:scripts/old_probe.py`; evidence `scripts/gone_probe.py`\n")
    assert found == [f"`scripts/gone_probe.py` is not in the repository (nor at {repo.rev})"]


def test_dead_links_and_anchors_are_found(repo):
    assert repo("[a](docs/missing.md), [b](docs/guide.md#the-8b-rehearsal), [c](#nowhere), ![i](img.png)\n") == [
        "link to docs/missing.md leads nowhere", "link to docs/guide.md#the-8b-rehearsal: no heading gives the "
        "anchor #the-8b-rehearsal", "link to #nowhere: no heading gives the anchor #nowhere",
        "link to img.png leads nowhere"]


def test_a_bare_source_file_name_must_be_tracked(repo):
    assert repo("see `nb_from_py.py` and `bench.py`\n") == ["`nb_from_py.py` is not in the repository"]


def test_github_slugs():
    assert github_slug("The 7B rehearsal") == "the-7b-rehearsal"
    assert github_slug("GEMM (`gemm.py`)") == "gemm-gemmpy"
    assert github_slug("Lab 05: kernels & roofline") == "lab-05-kernels--roofline"
    assert anchors("# A\n## A\n") == {"a", "a-1"}
