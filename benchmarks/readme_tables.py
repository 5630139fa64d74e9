"""The docs' benchmark tables, regenerated from the saved results.

Every ``benchmarks/results/NAME.json`` written by a benchmark's ``--json`` holds the markdown table
the benchmark printed (``"table"``: a list of lines). One page of the documentation (``README.md`` or
a page of ``docs/``; today ``docs/benchmarks.md`` and ``docs/scaling.md``) shows it verbatim between

    <!-- benchmark:NAME -->
    ...
    <!-- /benchmark:NAME -->

and ``tests/test_readme.py`` fails when a block differs from its file, a results file has no block,
a block has no results file, or a block is on two pages. A table may move between pages freely.
After re-running a benchmark with ``--json``:

    python benchmarks/readme_tables.py          # rewrite every block from its JSON, on whichever page it is
    python benchmarks/readme_tables.py --check  # only list the stale, missing or orphan blocks
"""
import argparse
import json
import pathlib
import re
import sys

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale or missing")
    args = parser.parse_args(argv)
    tables = saved_tables()
    for path in doc_pages():
        if not args.check:
            text = path.read_text()
            new = regenerate(text, tables)
            if new != text:
                path.write_text(new)
    problems = stale({str(path.relative_to(ROOT)): path.read_text() for path in doc_pages()}, tables)
    print("\n".join(problems) or f"{len(tables)} tables up to date", file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
