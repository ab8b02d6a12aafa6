"""The operator's documentation holds together: the README stays an operator's page (at most README_MAX_LINES lines,
a link to every page of docs/), and every relative link of README.md and docs/*.md, `[text](path)` or
`[text](path#anchor)`, reaches a file of the checkout and, for a Markdown file, one of its headings (GitHub's
anchors). External links (http, https, mailto) are not followed."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
# [text](target) and ![alt](target), with an optional "title"; the text may hold a code span, not a bracket.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.I)


def prose(text):
    """The text with its fenced code blocks emptied and its code spans blanked out, lines kept in place."""
    fenced, lines = False, []
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else CODE_SPAN.sub("``", line))
    return "\n".join(lines)


def links(text):
    """(line number, target) of every Markdown link of the text, code excluded; a link's text may span lines."""
    text = prose(text)
    return [(text.count("\n", 0, match.start(1)) + 1, match.group(1)) for match in LINK.finditer(text)]


def slug(heading):
    """GitHub's anchor of a heading: its rendered text lower-cased, spaces to '-', every other character but
    letters, digits, '-' and '_' removed."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text):
    """The anchors of a Markdown file's headings; a repeated one gets -1, -2, … as on GitHub."""
    seen, result = {}, set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(page, root=ROOT):
    """'page:line: target (why)' for every relative link of the page that does not resolve, paths from root."""
    problems = []
    for number, target in links(page.read_text()):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where} (no file {path})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            problems.append(f"{where} (no heading of {resolved.relative_to(root)} has the anchor #{anchor})")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    problems = broken_links(page)
    assert not problems, "broken links (fix the path, or the anchor: the heading's text, GitHub-style):\n" + \
        "\n".join(problems)


def test_the_readme_is_an_operators_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines, over {README_MAX_LINES}: move the details to a "
                                       "page of docs/ and link it")


def test_the_readme_links_every_page_of_docs():
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in links((ROOT / "README.md").read_text())}
    missing = [str(p.relative_to(ROOT)) for p in PAGES[1:] if p.resolve() not in linked]
    assert PAGES[1:], "docs/ has no page"
    assert not missing, f"README.md links no page {missing}: add it to its Documentation list"


def test_no_page_names_a_file_the_checkout_lacks():
    """LLAMACPP.md, for one, is not in this repository: a page may not send the reader to it."""
    for page in PAGES:
        for name in set(re.findall(r"\b[A-Z][A-Z0-9_]+\.md\b", page.read_text())):
            assert (ROOT / name).exists() or (page.parent / name).exists(), \
                f"{page.relative_to(ROOT)} names {name}, which is not in the checkout"


def test_the_check_finds_a_broken_path_and_a_broken_anchor(tmp_path):
    """The check itself, on a page with a good link, a missing file, a missing anchor and links it must skip."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Rolling back by hand\n\n## The `speed` strategy\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#rolling-back-by-hand) [ok](docs/a.md#the-speed-strategy) [self](#top)\n"
        "# Top\n"
        "[gone](docs/b.md) [no anchor](docs/a.md#rolling-back) [web](https://example.com/x.md)\n"
        "`[in code](docs/c.md)`\n"
        "```\n[in a block](docs/d.md)\n```\n"
        "a [link over\ntwo lines](docs/e.md)\n")
    assert broken_links(page, root=tmp_path) == [
        "README.md:3: docs/b.md (no file docs/b.md)",
        "README.md:3: docs/a.md#rolling-back (no heading of docs/a.md has the anchor #rolling-back)",
        "README.md:9: docs/e.md (no file docs/e.md)",
    ]


def test_anchors_are_githubs():
    assert slug("Vulkan: a worker's second master session (lavapipe, Mesa 22.3)") == \
        "vulkan-a-workers-second-master-session-lavapipe-mesa-223"
    assert slug("The bench report (`make bench`)") == "the-bench-report-make-bench"
    assert slug("How `upgrade.yml` runs") == "how-upgradeyml-runs"
    assert anchors("# Status\n## Status\n```\n# not a heading\n```\n") == {"status", "status-1"}
