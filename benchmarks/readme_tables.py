"""The README's benchmark tables, regenerated from the saved results.

Every ``benchmarks/results/NAME.json`` written by a benchmark's ``--json`` holds the markdown table
the benchmark printed (``"table"``: a list of lines). The README shows it verbatim between

    <!-- benchmark:NAME -->
    ...
    <!-- /benchmark:NAME -->

and ``tests/test_readme.py`` fails when a block differs from its file or a results file has no
block. After re-running a benchmark with ``--json``:

    python benchmarks/readme_tables.py          # rewrite every block from its JSON
    python benchmarks/readme_tables.py --check  # only list the stale or missing blocks
"""
import argparse
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


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
    """The README block of results file ``name``: its markers and what lies between them."""
    return re.compile(rf"(<!-- benchmark:{re.escape(name)} -->)\n(.*?)\n?(<!-- /benchmark:{re.escape(name)} -->)", re.S)


def save_table(path, argv, table: list[str], **fields) -> None:
    """Print ``table`` and, with a ``path``, save it as a results file this module reads (``argv``: the
    benchmark's arguments; ``fields``: its raw numbers)."""
    print("\n".join(table))
    if path:
        pathlib.Path(path).write_text(json.dumps({"argv": argv, "table": table, **fields}, indent=1) + "\n")


def stale(readme: str, tables: dict) -> list[str]:
    """What is wrong with ``readme``'s blocks: a results file with no block, a block that differs
    from its file, a block whose file does not exist."""
    problems = []
    for name, table in tables.items():
        found = block(name).search(readme)
        if not found:
            problems.append(f"{name}: no <!-- benchmark:{name} --> block in the README")
        elif found.group(2) != table:
            problems.append(f"{name}: the README's table differs from benchmarks/results/{name}.json")
    problems += [f"{name}: no benchmarks/results/{name}.json"
                 for name in re.findall(r"<!-- benchmark:(\S+) -->", readme) if name not in tables]
    return problems


def regenerate(readme: str, tables: dict) -> str:
    """``readme`` with every existing block replaced by its saved table."""
    for name, table in tables.items():
        readme = block(name).sub(lambda m: f"{m.group(1)}\n{table}\n{m.group(3)}", readme)
    return readme


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale or missing")
    args = parser.parse_args(argv)
    path, tables = ROOT / "README.md", saved_tables()
    if not args.check:
        path.write_text(regenerate(path.read_text(), tables))
    problems = stale(path.read_text(), tables)
    print("\n".join(problems) or f"{len(tables)} tables up to date", file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
