"""The docs' generated tables: benchmark results and excerpts of study reports.

Every ``benchmarks/results/NAME.json`` written by a benchmark's ``--json`` holds the markdown table
the benchmark printed (``"table"``: a list of lines). One page of the documentation (``README.md`` or
a page of ``docs/``; today ``docs/benchmarks.md`` and ``docs/scaling.md``) shows it verbatim between

    <!-- benchmark:NAME -->
    ...
    <!-- /benchmark:NAME -->

A page quotes a committed study report (``experiments/results/STUDY/STUDY.md``, which
``tests/test_study.py`` regenerates from the study's evaluation files) between

    <!-- excerpt:REPORT sections="HEADING;HEADING" table=N rows="REGEX" columns="NAME,NAME" -->
    ...
    <!-- /excerpt -->

``REPORT`` is the report's path from the repository root; ``sections``: the report's ``###`` headings
to quote, each named by the start of its text (default: the first with a table; several: a first
column, ``split``, names each section's rows); ``table``: which table of each section, from 1
(default 1); ``rows``: the rows whose first cell the regular expression matches in full (default
all); ``where``: ``COLUMN=REGEX`` conditions, separated by ``;``, on other cells, each matched in
full; ``columns``: the header names to keep, in their order (default all). The options are optional,
quoted as in a shell.

``tests/test_readme.py`` fails when a block differs from what its source gives, a results file has no
block, a block has no results file, or a benchmark block is on two pages. A table may move between
pages freely. After re-running a benchmark with ``--json`` or a study with ``--report``:

    python benchmarks/readme_tables.py          # rewrite every block from its source, on whichever page it is
    python benchmarks/readme_tables.py --check  # only list the stale, missing or orphan blocks
"""
import argparse
import json
import pathlib
import re
import shlex
import sys
from collections.abc import Iterator

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from provenance import machine_line, record

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def doc_pages(root=ROOT) -> list[pathlib.Path]:
    """The pages that may hold a benchmark block: the README and every ``docs/*.md``."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def saved_tables(results=RESULTS) -> dict:
    """{NAME: the markdown table saved in ``results/NAME.json``}."""
    tables = {}
    for path in sorted(results.glob("*.json")):
        saved = json.loads(path.read_text())
        if "table" not in saved:
            raise ValueError(f"{path} holds no table: re-run the benchmark its argv names ({saved.get('argv')})")
        tables[path.stem] = "\n".join(saved["table"])
    return tables


def block(name: str) -> re.Pattern:
    """The block of results file ``name``: its markers and what lies between them."""
    return re.compile(rf"(<!-- benchmark:{re.escape(name)} -->)\n(.*?)\n?(<!-- /benchmark:{re.escape(name)} -->)", re.S)


def save_table(path, argv, table: list[str], provenance: dict | None = None, **fields) -> None:
    """Print ``table``, closed by a line naming the machine, the date and the commit, and with a
    ``path`` save it as a results file this module reads: ``argv`` (the benchmark's arguments), the
    table, ``provenance`` (default: ``provenance.record()`` of this process) and ``fields`` (the raw
    numbers, per step where the benchmark has steps)."""
    provenance = provenance or record()
    changes = " (with uncommitted changes)" if provenance["uncommitted_changes"] else ""
    table = [*table, "", f"Measured on {machine_line(provenance)}, {provenance['date'][:10]}, commit "
                         f"{provenance['commit'][:10]}{changes}."]
    print("\n".join(table))
    if path:
        pathlib.Path(path).write_text(json.dumps({"argv": argv, "table": table, "provenance": provenance, **fields},
                                                 indent=1) + "\n")


def stale(pages, tables: dict) -> list[str]:
    """What is wrong with the blocks of ``pages`` ({page name: text}, or one text): a results file
    with no block, or with blocks on two pages; a block that differs from its file; a block whose
    file does not exist."""
    if isinstance(pages, str):
        pages = {"the page": pages}
    problems = []
    for name, table in tables.items():
        found = [(page, match) for page, text in pages.items() for match in block(name).finditer(text)]
        if not found:
            problems.append(f"{name}: no <!-- benchmark:{name} --> block in {', '.join(pages)}")
        elif len(found) > 1:
            problems.append(f"{name}: {len(found)} blocks ({', '.join(page for page, _ in found)}): keep one")
        elif found[0][1].group(2) != table:
            problems.append(f"{name}: the table in {found[0][0]} differs from benchmarks/results/{name}.json")
    problems += [f"{name}: no benchmarks/results/{name}.json (block in {page})"
                 for page, text in pages.items()
                 for name in re.findall(r"<!-- benchmark:(\S+) -->", text) if name not in tables]
    return problems


def regenerate(text: str, tables: dict) -> str:
    """``text`` with every existing block replaced by its saved table."""
    for name, table in tables.items():
        text = block(name).sub(lambda m, table=table: f"{m.group(1)}\n{table}\n{m.group(3)}", text)
    return text


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def heading_walk(text: str) -> Iterator[tuple[list[tuple[int, str]], bool, str]]:
    """Each line of a markdown text with the headings open at it, as (level, anchor) outermost first, and
    whether the line is one of them; a ``#`` line in fenced code opens none."""
    open_headings: list[tuple[int, str]] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#{1,6}) (.+)", line)
        if heading:
            level = len(heading.group(1))
            open_headings = [(lv, a) for lv, a in open_headings if lv < level] + [(level, slug(heading.group(2)))]
        yield open_headings, bool(heading), line


def sections(text: str) -> dict[str, str]:
    """Each heading's anchor (``slug``; the first of repeats) and the text under it, its subsections
    included, outside fenced code as inside."""
    found: dict[str, list[str]] = {}
    for open_headings, is_heading, line in heading_walk(text):
        if is_heading:
            found.setdefault(open_headings[-1][1], [])
        for _, anchor in open_headings:
            found[anchor].append(line)
    return {anchor: "\n".join(lines) for anchor, lines in found.items()}


def leaf_sections(text: str) -> list[tuple[list[str], str]]:
    """(anchors, text) of each heading's own text up to the next heading: ``anchors`` are its own and those
    of the sections of level 2 or deeper that enclose it, innermost first."""
    found: list[tuple[list[str], list[str]]] = []
    for open_headings, is_heading, line in heading_walk(text):
        if is_heading:
            own = open_headings[-1][0]
            found.append(([a for lv, a in reversed(open_headings) if lv >= 2 or lv == own], []))
        if found:
            found[-1][1].append(line)
    return [(anchors, "\n".join(lines)) for anchors, lines in found]


EXCERPT = re.compile(r"(<!-- excerpt:(\S+)([^\n]*?) -->)\n((?:(?!<!-- excerpt:).)*?)\n?(<!-- /excerpt -->)", re.S)
EXCERPT_OPENER = "<!-- excerpt:"
EXCERPT_OPTIONS = {"sections", "table", "rows", "where", "columns"}


def table_cells(line: str) -> list[str]:
    """The cells of one markdown table row, unescaped (``\\|`` is a ``|`` inside its cell)."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def report_sections(text: str) -> dict[str, list[list[list[str]]]]:
    """{heading text: [each table of its section as rows of cells, the separator row second]} of a
    markdown report; tables before the first heading are under ``""``."""
    sections: dict[str, list[list[list[str]]]] = {"": []}
    tables, rows = sections[""], None
    for line in text.splitlines():
        if line.startswith("#"):
            tables, rows = sections.setdefault(line.lstrip("#").strip(), []), None
        elif line.startswith("|"):
            if rows is None:
                rows = []
                tables.append(rows)
            rows.append(table_cells(line))
        else:
            rows = None
    return sections


def excerpt_options(spec: str) -> dict[str, str]:
    """The ``name=value`` options of an excerpt marker; ValueError naming an unknown or malformed one."""
    options = {}
    for word in shlex.split(spec):
        name, equals, value = word.partition("=")
        if not equals or name not in EXCERPT_OPTIONS:
            raise ValueError(f"excerpt option {word!r}: expected one of {sorted(EXCERPT_OPTIONS)} as name=value")
        options[name] = value
    return options


def _section(sections: dict, start: str, report: str) -> tuple[str, list]:
    """The section whose heading is ``start``, else the one heading that starts with it."""
    if start in sections:
        return start, sections[start]
    found = [heading for heading in sections if heading and heading.startswith(start)]
    if len(found) != 1:
        raise ValueError(f"{report}: {len(found)} sections start with {start!r} (headings: "
                         f"{[h for h in sections if h]})")
    return found[0], sections[found[0]]


def _conditions(where: str | None, header: list[str], report: str) -> list[tuple[int, re.Pattern]]:
    """[(column index, pattern)] of a ``where`` option; ValueError naming a malformed one or a missing column."""
    conditions = []
    for condition in where.split(";") if where else []:
        name, equals, pattern = condition.partition("=")
        if not equals or name not in header:
            raise ValueError(f"{report}: where {condition!r} is not COLUMN=REGEX of a column of {header}")
        conditions.append((header.index(name), re.compile(pattern)))
    return conditions


def excerpt(report: str, spec: str = "", root: pathlib.Path = ROOT) -> str:
    """The table that the excerpt block of ``report`` with options ``spec`` shows (module docstring);
    ValueError naming what is missing: the report, a section, a table, a column, or every row."""
    from pgjax.markdown import table
    path = root / report
    if not path.is_file():
        raise ValueError(f"no report {report}")
    options, sections = excerpt_options(spec), report_sections(path.read_text())
    first = next((heading for heading, tables in sections.items() if tables), "")
    starts = options["sections"].split(";") if "sections" in options else [first]
    number, pattern = int(options.get("table", "1")), re.compile(options.get("rows", ".*"))
    header: list[str] | None = None
    kept, rows = [], []
    for start in starts:
        heading, tables = _section(sections, start, report)
        if not 1 <= number <= len(tables):
            raise ValueError(f"{report}: section {heading!r} has {len(tables)} tables, not a table {number}")
        found = tables[number - 1]
        names = options["columns"].split(",") if "columns" in options else found[0]
        missing = [name for name in names if name not in found[0]]
        if missing:
            raise ValueError(f"{report}: section {heading!r} table {number} has no column {missing} "
                             f"(columns: {found[0]})")
        if header is not None and names != header:
            raise ValueError(f"{report}: the sections' tables have different columns ({header} and {names})")
        header, kept = names, [found[0].index(name) for name in names]
        conditions = _conditions(options.get("where"), found[0], report)
        matched = [[row[i] for i in kept] for row in found[2:]
                   if pattern.fullmatch(row[0]) and all(test.fullmatch(row[i]) for i, test in conditions)]
        label = heading.split(" (`")[0]
        rows += [[label if i == 0 else "", *row] if len(starts) > 1 else row for i, row in enumerate(matched)]
    if not rows:
        raise ValueError(f"{report}: no row's first cell matches {pattern.pattern!r}")
    align = "".join("r" if found[1][i].endswith(":") else "l" for i in kept)
    return table(["split", *header] if len(starts) > 1 else header,
                 rows,
                 align=("l" + align) if len(starts) > 1 else align)


def stale_excerpts(pages, root: pathlib.Path = ROOT) -> list[str]:
    """What is wrong with the excerpt blocks of ``pages`` ({page name: text}): a block that differs from
    its report, or whose report, section, table, column or rows do not exist."""
    problems = []
    for page, text in pages.items():
        unmatched = text.count(EXCERPT_OPENER) - len(EXCERPT.findall(text))
        if unmatched:
            problems.append(f"{page}: {unmatched} excerpt marker(s) without their closing <!-- /excerpt --> or "
                            "with options over more than one line")
        for match in EXCERPT.finditer(text):
            try:
                if match.group(4) != excerpt(match.group(2), match.group(3), root):
                    problems.append(f"{match.group(2)}: an excerpt in {page} differs from the report")
            except ValueError as error:
                problems.append(f"{match.group(2)}: an excerpt in {page}: {error}")
    return problems


def regenerate_excerpts(text: str, root: pathlib.Path = ROOT) -> str:
    """``text`` with every excerpt block replaced by what its report gives (a broken one left as it is)."""
    def replaced(match: re.Match) -> str:
        try:
            return f"{match.group(1)}\n{excerpt(match.group(2), match.group(3), root)}\n{match.group(5)}"
        except ValueError:
            return match.group(0)
    return EXCERPT.sub(replaced, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale or missing")
    args = parser.parse_args(argv)
    tables = saved_tables()
    for path in doc_pages():
        if not args.check:
            text = path.read_text()
            new = regenerate_excerpts(regenerate(text, tables))
            if new != text:
                path.write_text(new)
    pages = {str(path.relative_to(ROOT)): path.read_text() for path in doc_pages()}
    problems = stale(pages, tables) + stale_excerpts(pages)
    excerpts = sum(len(EXCERPT.findall(text)) for text in pages.values())
    print("\n".join(problems) or f"{len(tables)} tables and {excerpts} excerpts up to date",
          file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
