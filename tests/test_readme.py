"""The README stays true: its algorithm table is the presets' own, its Quickstart
is two commands, the main job is the Dr. GRPO experiment, the demo and the Trainer example run, and
neither the README nor docs/ links anything outside the repository."""
import pathlib
import re
import sys

import pytest

from pgjax import demo
from pgjax.core import PRESETS, algorithm_table

README = (pathlib.Path(__file__).parent.parent / "README.md").read_text()


def _between(start: str, end: str) -> str:
    match = re.search(re.escape(start) + r"\n(.*?)\n" + re.escape(end), README, re.S)
    assert match, f"README has no {start} ... {end} section"
    return match.group(1).strip()


def test_readme_algorithm_table_is_generated_from_the_presets():
    assert _between("<!-- algorithm-table:start -->", "<!-- algorithm-table:end -->") == algorithm_table(), \
        "README's algorithm table is stale: paste the output of `python -m pgjax.demo --table`"


def test_quickstart_is_two_single_line_commands():
    commands = re.findall(r"<!-- quickstart:(\w+) -->\n```bash\n(.*?)```", README, re.S)
    assert [kind for kind, _ in commands] == ["run", "test"]
    for _, body in commands:
        assert len(body.strip().splitlines()) == 1
    assert "pytest" in commands[1][1]


def test_main_job_is_the_dr_grpo_experiment_file():
    from pgjax.train import experiment
    commands = dict(re.findall(r"<!-- quickstart:(\w+) -->\n```bash\n(.*?)```", README, re.S))
    match = re.search(r"python -m pgjax\.run (\S+)$", commands["run"].strip())
    assert match, commands["run"]
    exp = experiment.load(pathlib.Path(__file__).parent.parent / match.group(1))
    assert exp.algorithm == "dr_grpo" and exp.warm_start.steps > 0


def test_demo_prints_every_preset_and_the_16_setting_grid(capsys):
    demo.main(["--prompts", "2", "--length", "6"])
    out = capsys.readouterr().out
    for name in PRESETS:
        assert f"| {name} |" in out
    grid_rows = [line for line in out.splitlines() if re.match(r"\| [01] \| [01] \| [01] \| ", line)]
    assert len(grid_rows) == 16
    assert "nan" not in out.lower()


def test_table_flag_prints_the_table(capsys):
    demo.main(["--table"])
    assert capsys.readouterr().out.strip() == algorithm_table()


DOCS = [pathlib.Path(__file__).parent.parent / "README.md",
        *sorted((pathlib.Path(__file__).parent.parent / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)|<(https?://[^>]+)>|\]:\s*(\S+)")


def test_readme_and_docs_link_only_files_inside_the_repository():
    root = pathlib.Path(__file__).parent.parent.resolve()
    assert len(DOCS) >= 3, "docs/ holds the design notes"
    links = 0
    for doc in DOCS:
        for match in LINK.finditer(doc.read_text()):
            target = next(g for g in match.groups() if g)
            assert not re.match(r"[a-z]+:", target), f"{doc.name} links outside the repository: {target}"
            path = (doc.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(root), f"{doc.name} links outside the repository: {target}"
            assert path.exists(), f"{doc.name} links to {target}, which does not exist"
            links += 1
    assert links >= 5


def test_the_link_check_catches_broken_and_outside_links():
    found = [m.group(1) for m in LINK.finditer("see [seed](../shared/seed.md) and ![x](a/b.png) [y](https://x.org)")]
    assert found == ["../shared/seed.md", "a/b.png", "https://x.org"]


@pytest.mark.slow
def test_the_readme_trainer_example_runs_as_written(capsys, monkeypatch):
    """The notebook-sized example: build a Trainer from the main job's file, warm start, 3 steps by hand."""
    code = re.search(r"<!-- example:trainer -->\n```python\n(.*?)```", README, re.S).group(1)
    monkeypatch.chdir(pathlib.Path(__file__).parent.parent)
    exec(compile(code, "README example", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["1", "2", "3"]
    assert lines[3].startswith("greedy eval accuracy 0.")
    assert 0 < float(lines[0].split()[1]) < 1          # reward of step 1: the warm start gives a signal


def test_every_command_line_example_in_the_readme_and_docs_resolves(capsys):
    """Each ``python -m pgjax.run experiments/...`` example names an experiment file and keys that exist
    (checked with --print-config, which parses and applies every --set without running)."""
    from pgjax import run
    root = pathlib.Path(__file__).parent.parent
    examples = [line for doc in DOCS for line in doc.read_text().splitlines()
                if "python -m pgjax.run experiments/" in line and "<file>" not in line]
    assert len(examples) >= 8
    for line in examples:
        words = line.split("python -m pgjax.run ", 1)[1].split("#")[0].split("`")[0].replace("\\", "").split()
        argv = [w for w in words if w not in ("...", "--resume", "--print-config")]
        argv[0] = str(root / argv[0])
        assert run.main([*argv, "--print-config"]) == 0, line
        capsys.readouterr()


def _readme_tables():
    sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "benchmarks"))
    try:
        import readme_tables
    finally:
        sys.path.pop(0)
    return readme_tables


def test_the_readme_benchmark_tables_are_the_saved_results():
    """Every benchmarks/results/*.json table is in the README verbatim (``benchmarks/readme_tables.py``)."""
    tables = _readme_tables()
    saved = tables.saved_tables()
    assert len(saved) >= 3
    assert tables.stale(README, saved) == [], "run `python benchmarks/readme_tables.py` after a benchmark's --json"


def test_the_table_check_finds_stale_missing_and_orphan_blocks():
    tables = _readme_tables()
    readme = "a\n<!-- benchmark:x -->\n| old |\n<!-- /benchmark:x -->\n<!-- benchmark:gone -->\n|\n<!-- /benchmark:gone -->"
    saved = {"x": "| new |\n| --- |", "y": "| y |"}
    assert [p.split(":")[0] for p in tables.stale(readme, saved)] == ["x", "y", "gone"]
    fixed = tables.regenerate(readme, saved)
    assert "<!-- benchmark:x -->\n| new |\n| --- |\n<!-- /benchmark:x -->" in fixed
    assert [p.split(":")[0] for p in tables.stale(fixed, saved)] == ["y", "gone"]
