"""The README stays true: its algorithm table is the presets' own, its Quickstart
is two commands, the main job is the Dr. GRPO experiment, and the demo runs."""
import pathlib
import re

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
