"""The documentation holds together: every relative link and image in README.md and docs/*.md
points at a file of the repository (and a #anchor at a heading of that page), and the README
stays a front page whose Quick start is the two make commands. Reads files only."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 400

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link or heading inside one is only text)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def links(text: str) -> list[str]:
    """Every link and image target of a Markdown text: inline, reference-style and HTML."""
    found = []
    for line in prose_lines(text):
        prose = INLINE_CODE.sub("", line)
        found += LINK.findall(prose) + HTML.findall(prose)
        reference = REFERENCE.match(prose)
        if reference:
            found.append(reference.group(1))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, spaces as -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(text):
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """The relative links of `page` that do not resolve: no such file in the repository, or an
    anchor that no heading of the target page has."""
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue  # an absolute URL: not this repository's to check
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        inside = file == root or root in file.parents
        if not inside or not file.exists():
            broken.append(f"{target} (no such file in the repository)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text("utf-8")):
            broken.append(f"{target} (no heading '#{anchor}' in {file.name})")
    return broken


def section(text: str, title: str) -> str:
    """The body of the `## title` section of a Markdown text, up to the next heading of its
    level or higher outside a code block ("" when there is none)."""
    body, inside, fenced = [], False, False
    for line in text.splitlines():
        fenced = fenced != bool(FENCE.match(line))
        heading = None if fenced else HEADING.match(line)
        if heading and len(heading.group(1)) <= 2:
            if inside:
                break
            inside = heading.group(2) == title and len(heading.group(1)) == 2
            continue
        if inside:
            body.append(line)
    return "\n".join(body)


def fenced_commands(text: str) -> list[str]:
    """The first word pair of every line inside the fenced code blocks of a text."""
    commands, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif fenced and line.strip():
            commands.append(" ".join(line.split()[:2]))
    return commands


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_docs_pages_exist_and_each_links_back_to_the_readme():
    pages = [p for p in PAGES if p != README]
    assert len(pages) >= 10, [p.name for p in pages]
    for page in pages:
        assert "../README.md" in links(page.read_text(encoding="utf-8")), page.name


def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_the_quick_start_is_make_train_and_make_test():
    quick_start = section(README.read_text(encoding="utf-8"), "Quick start")
    commands = fenced_commands(quick_start)
    assert "make train" in commands and "make test" in commands, commands


def test_the_link_check_sees_a_broken_link_and_skips_code(tmp_path):
    """The checks are not vacuous: a missing file and a missing anchor are caught, a link in code
    or to the web is not a repository link, and a heading inside code is no anchor."""
    (tmp_path / "there.md").write_text("# Title\n\n## A section: with `code`, too\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-section-with-code-too) ![img](gone.png)\n"
        "[bad anchor](there.md#nowhere) [web](https://example.org/x) `[code](gone.md)`\n"
        "```\n[in a block](gone.md)\n# not a heading\n```\n[self](#not-a-heading)\n"
        "[ref]: missing.md\n"
    )
    assert broken_links(page, root=tmp_path) == [
        "gone.png (no such file in the repository)",
        "there.md#nowhere (no heading '#nowhere' in there.md)",
        "#not-a-heading (no heading '#not-a-heading' in page.md)",
        "missing.md (no such file in the repository)",
    ]


def test_the_quick_start_check_reads_only_that_section():
    text = "## Quick start\n\n```\nmake train\n```\n\n## Next\n\n```\nmake test\n```\n"
    assert fenced_commands(section(text, "Quick start")) == ["make train"]


def test_the_architecture_page_names_every_module():
    """docs/architecture.md mirrors the layout: each module of src/ is named there (a file added
    without a line there fails)."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    modules = sorted((ROOT / "src").rglob("*.py"))
    assert modules
    missing = [
        str(m.relative_to(ROOT))
        for m in modules
        if m.name != "__init__.py" and not re.search(rf"\b{re.escape(m.name)}\b", page)
    ]
    assert not missing, f"add these to docs/architecture.md: {missing}"


def test_the_readme_links_every_docs_page():
    """The README's table of docs pages is whole: a page added to docs/ without a row fails."""
    linked = {Path(target.split("#")[0]).name for target in links(README.read_text())}
    pages = {page.name for page in PAGES[1:]}
    assert pages and not pages - linked, f"link these from README.md: {sorted(pages - linked)}"


def test_the_groups_table_lists_every_option():
    """docs/configuration.md's groups table names each option `--help` lists (the files of
    conf/<group>/; ablation's many by its folder): an option added without a word there fails."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    rows = {}
    for line in section(page, "Config groups").splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) > 1:
            rows[cells[0].strip("| `")] = set(re.findall(r"`([\w-]+)`", cells[1]))
    groups = [g for g in sorted((ROOT / "conf").iterdir()) if g.is_dir() and g.name != "ablation"]
    assert len(groups) > 5 and "ablation" in rows
    missing = [
        f"{group.name}={option.stem}"
        for group in groups
        for option in sorted(group.glob("*.yaml"))
        if group.name in rows and option.stem not in rows[group.name]
    ]
    missing += [group.name for group in groups if group.name not in rows]
    assert not missing, f"add these to the groups table of docs/configuration.md: {missing}"
