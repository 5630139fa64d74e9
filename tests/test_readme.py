"""The README and docs/ stay true: the README is a short front door whose Quickstart is two commands
and whose main job is the Dr. GRPO experiment; its examples run as written; every generated table
(the algorithm table, the exact audits, the benchmarks, the training studies) is its command's or
its saved result's current output, on whichever page it lives; every link resolves, anchors
included, and none leaves the repository; every command-line example parses."""
import functools
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import FAST_COMPILE, load_experiment_script

from pgjax import demo
from pgjax.core import PRESETS
from pgjax.demo import algorithm_table

ROOT = pathlib.Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES = DOCS[1:]


def _readme_block(marker: str, lang: str) -> str:
    """The fenced ``lang`` block right after ``<!-- marker -->`` in the README."""
    match = re.search(rf"<!-- {re.escape(marker)} -->\n```{lang}\n(.*?)```", README, re.S)
    assert match, f"README has no <!-- {marker} --> block"
    return match.group(1)


def _benchmark_module(name: str):
    """A module of benchmarks/ (the docs' tables and claims live there, beside the records they read)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def _readme_tables():
    return _benchmark_module("readme_tables")


_TABLES = _readme_tables()
slug, sections, leaf_sections = _TABLES.slug, _TABLES.sections, _TABLES.leaf_sections

# pages for who works on pgjax, not for its users: linked from the docs page named, not from the README
INTERNAL = {"collective_hang.md": "contributing.md"}


def test_readme_is_a_front_door():
    """At most 300 lines; everything else lives in docs/, which the README maps page by page (an internal
    page from the docs page that ``INTERNAL`` names instead), and every notebook is named."""
    assert len(README.splitlines()) <= 300, "README.md is over 300 lines: move the details to a page of docs/"
    for page in PAGES:
        if page.name in INTERNAL:
            assert f"(docs/{page.name})" not in README, f"{page.name} is internal: link it from docs/, not the README"
            assert f"({page.name})" in (ROOT / "docs" / INTERNAL[page.name]).read_text(), page.name
        else:
            assert f"(docs/{page.name})" in README, f"the README's map of docs/ lacks {page.name}"
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert notebook.name in README, f"the README's list of notebooks lacks {notebook.name}"


def test_every_docs_page_opens_with_what_it_covers():
    for page in PAGES:
        text = re.sub(r"\A# [^\n]*\n+", "", page.read_text())
        assert text.startswith("This page covers"), f"{page.name} must open with a paragraph 'This page covers ...'"


def test_every_result_at_a_glance_links_to_the_page_that_backs_it():
    section = re.search(r"^## Results at a glance\n(.*?)^## ", README, re.S | re.M).group(1)
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| what", "| ---"))]
    assert len(rows) >= 5
    for row in rows:
        result = row.split(" | ", 1)[1]
        numbers = re.sub(r"\[[^\]]*\]\([^)]*\)", "", result)        # what is left outside the links
        assert re.search(r"\]\(docs/\w+\.md#[\w-]+\)", result), f"no link to a docs section: {row}"
        assert not re.search(r"\d\.\d|\d+(\.\d+)?x\b|\d%", numbers), f"a number without its link: {row}"


# Generated blocks: <!-- NAME:start --> ... <!-- NAME:end --> on exactly one page of the README or docs/,
# equal to what the command prints now.
GENERATED = {"algorithm-table": "python -m pgjax.demo --table",
             "audit-table": "python -m pgjax.theory.audit",
             "off-policy-table": "python -m pgjax.theory.off_policy",
             "masking-table": "python -m pgjax.theory.multiturn",
             "learned-reward-table": "python -m pgjax.theory.learned_reward"}


def _generated(name: str) -> str:
    pattern = re.compile(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", re.S)
    found = [(doc.name, match.group(1).strip()) for doc in DOCS for match in pattern.finditer(doc.read_text())]
    assert len(found) == 1, (f"<!-- {name}:start --> ... <!-- {name}:end --> must be on exactly one page, "
                             f"found {found!r:.200}")
    return found[0][1]


def test_every_generated_block_is_known():
    for doc in DOCS:
        for name in re.findall(r"<!-- ([\w-]+):start -->", doc.read_text()):
            assert name in GENERATED, f"{doc.name}: <!-- {name}:start --> has no command that regenerates it"


def test_algorithm_table_is_generated_from_the_presets():
    assert _generated("algorithm-table") == algorithm_table(), \
        "the algorithm table is stale: paste the output of `python -m pgjax.demo --table`"


@pytest.mark.slow
def test_audit_table_is_the_audit_commands_output(x64):    # x64: as the command computes it
    from pgjax.theory.audit import report
    assert _generated("audit-table") == report().strip(), \
        "the audit table is stale: paste `python -m pgjax.theory.audit`"


@pytest.mark.slow
def test_off_policy_table_is_the_commands_output(x64):
    from pgjax.theory import off_policy
    assert _generated("off-policy-table") == off_policy.report().strip(), \
        "the off-policy table is stale: paste `python -m pgjax.theory.off_policy`"


@pytest.mark.slow
def test_masking_table_is_the_commands_output(x64):
    from pgjax.theory import multiturn
    assert _generated("masking-table") == multiturn.report().strip(), \
        "the masking table is stale: paste `python -m pgjax.theory.multiturn`"


@pytest.mark.slow
def test_learned_reward_table_is_the_commands_output():
    """Run as the command, at XLA's default optimisation level (the tests' -O0 moves its fourth digit)."""
    flags = os.environ.get("XLA_FLAGS", "").replace(FAST_COMPILE, "").strip()
    done = subprocess.run([sys.executable, "-m", "pgjax.theory.learned_reward"], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, "XLA_FLAGS": flags})
    assert done.returncode == 0, done.stderr
    assert _generated("learned-reward-table") == done.stdout.strip(), \
        "the learned-reward table is stale: paste `python -m pgjax.theory.learned_reward`"


RESULTS = ROOT / "experiments" / "results"
STUDY_TABLES = (RESULTS / "length_bias" / "length_bias.md", RESULTS / "difficulty_bias" / "difficulty_bias.md",
                RESULTS / "off_policy" / "off_policy.md", RESULTS / "off_policy_warm400" / "off_policy.md",
                RESULTS / "smollm2_off_policy" / "smollm2_off_policy.md", RESULTS / "switch_grid" / "switch_grid.md",
                RESULTS / "toy_ablation" / "toy_ablation.md")


def test_the_toy_ablation_table_is_its_committed_curves():
    """experiments/results/toy_ablation/toy_ablation.md is what its committed curves.csv gives (each
    algorithm's best learning rate, mean J and final J over seeds)."""
    script = load_experiment_script("toy_ablation")
    folder = RESULTS / "toy_ablation"
    assert (folder / "toy_ablation.md").read_text() == script.table(*script.read_csv(folder / "curves.csv")) + "\n"


def test_training_study_tables_are_the_saved_results():
    """Each study's saved table (``experiments/results/<folder>/<name>.md``) is in the docs verbatim."""
    docs = "\n".join(doc.read_text() for doc in DOCS)
    for path in STUDY_TABLES:
        assert path.read_text().strip() in docs, f"the docs' copy of {path.relative_to(ROOT)} is stale: paste it"


def main_job_table_lines() -> list[str]:
    """docs/experiments.md's per-step table of the main job, each row checked against seed 0's committed
    record (three decimals, halves rounded up: 0.5625 reads 0.563)."""
    page = (ROOT / "docs" / "experiments.md").read_text()
    table = page.split("## The main job", 1)[1].split("| step | sampled accuracy |", 1)[1].split("\n\n", 1)[0]
    records = {r["step"]: r for r in map(json.loads, (ROOT / "experiments" / "results" / "main_job_seeds" / "records"
                                                     / "dr_grpo_s0" / "metrics.jsonl").read_text().splitlines())}
    lines = table.splitlines()[2:]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert len(rows) == 6
    for step, sampled, greedy in rows:
        record = records[int(step.split()[0])]
        assert abs(float(greedy) - record["eval_accuracy"]) <= 5e-4 + 1e-12, step
        if step.startswith("0 "):
            assert sampled == "", step
        else:
            assert abs(float(sampled) - record["accuracy"]) <= 5e-4 + 1e-12, step
    return lines


def test_the_main_job_table_is_seed_0s_kept_record():
    main_job_table_lines()


MISMATCH = ("mismatch_abs", "mismatch_abs_max", "mismatch_kl")


def _metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_main_job_keeps_its_record_on_a_second_xeon():
    """The main job at a run's defaults (seed 0) on the Xeon without AMX or AVX-512 BF16
    (experiments/results/main_job_machines/xeon_avx512) equals seed 0's record from the AMX Xeon in every
    metric but the timings and the sampler-learner mismatch (each machine's own rounding between the
    sampler's and the learner's log-probs, below 1e-4 on both)."""
    here = _metrics(RESULTS / "main_job_machines" / "xeon_avx512" / "metrics.jsonl")
    there = _metrics(RESULTS / "main_job_seeds" / "records" / "dr_grpo_s0" / "metrics.jsonl")
    assert len(here) == len(there) == 251
    for a, b in zip(here, there, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key in MISMATCH:
                assert max(a[key], b[key]) < 1e-4, (a["step"], key)
            elif not (key.startswith("time_") or key == "tokens_per_second"):
                assert a[key] == b[key], (a["step"], key, a[key], b[key])


def test_quickstart_is_two_single_line_commands():
    commands = re.findall(r"<!-- quickstart:(\w+) -->\n```bash\n(.*?)```", README, re.S)
    assert [kind for kind, _ in commands] == ["run", "test"]
    for _, body in commands:
        assert len(body.strip().splitlines()) == 1
    assert "pytest" in commands[1][1]


def test_main_job_is_the_dr_grpo_experiment_file():
    from pgjax import config
    match = re.search(r"pgjax run (\S+)$", _readme_block("quickstart:run", "bash").strip())
    assert match, _readme_block("quickstart:run", "bash")
    exp = config.load(ROOT / match.group(1))
    assert exp.algorithm.preset == "dr_grpo" and exp.warm_start.steps > 0


# The quickstart install has no torch: hide it from transformers (its only check is find_spec) and run the main
# job for a step; stderr holds pgjax's own lines only.
_WITHOUT_TORCH = """
import importlib.util, sys
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] == "torch" else find_spec(name, *a)
from pgjax import run
sys.exit(run.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_the_main_job_prints_no_third_party_warning_without_torch(tmp_path):
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, str(ROOT / "experiments" / "arithmetic_dr_grpo.py"),
                           "--no-progress", "--set", "steps=1", "--set", "warm_start.steps=1",
                           "--set", "eval_prompts=32", "--set", f"run_dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["warm start 1/1: loss " + done.stderr.split("loss ")[1].split()[0]]
    assert "greedy eval accuracy" in done.stdout


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


def test_the_readme_core_example_runs_as_written():
    """The ten-line ``pgjax.core`` example: a GRPO loss's gradient for 4 settings in one vmapped call."""
    code = _readme_block("example:core", "python")
    scope = {}
    exec(compile(code, "README core example", "exec"), scope)
    grads, settings = np.asarray(scope["grads"]), scope["settings"]
    assert grads.shape == (len(settings), 8, 6, 16) == (4, 8, 6, 16)
    assert np.all(np.isfinite(grads))
    assert len({grads[i].tobytes() for i in range(4)}) == 4        # each setting its own gradient


@pytest.mark.slow
def test_the_readme_trainer_example_runs_as_written(capsys, monkeypatch):
    """The notebook-sized example: build a Trainer from the main job's file, warm start, 3 steps by hand."""
    code = _readme_block("example:trainer", "python")
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README example", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["1", "2", "3"]
    assert lines[3].startswith("greedy eval accuracy 0.")
    assert 0 < float(lines[0].split()[1]) < 1          # reward of step 1: the warm start gives a signal


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)|<(https?://[^>]+)>|\]:\s*(\S+)")


def anchors(text: str) -> set[str]:
    """The anchors of every heading of a markdown text outside fenced code (repeats get -1, -2, ...)."""
    found, seen = set(), {}
    for open_headings, is_heading, _ in _TABLES.heading_walk(text):
        if is_heading:
            base = open_headings[-1][1]
            found.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return found


def shown_in(number: str, text: str) -> bool:
    """Whether ``text`` holds a number that ``number`` (as the README writes it, e.g. ``0.300`` or ``6.8``)
    shows at its precision: one that rounds to it (``3.00e-01`` for ``0.300``, ``0.8161`` for ``0.82``); a
    number in scientific notation (``1e-12``) as written."""
    if "e" in number:
        return number in text
    decimals = len(number.split(".")[1]) if "." in number else 0
    value = float(number)
    return any(abs(abs(float(found)) - value) <= 0.5 * 10 ** -decimals + 1e-12
               for found in re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", text.replace(",", "")))


@functools.cache
def _checked_lines() -> frozenset[str]:
    """The rows of the hand-laid tables, each checked against its record."""
    return frozenset(main_job_table_lines() + smollm2_64_lines() + gemma3_one_seed_lines()
                     + reward_model_held_out_lines() + smollm2_tools_lines())


@functools.cache
def checked_text(section: str) -> str:
    """What a section shows that a test regenerates from its record: benchmark blocks, report excerpts,
    command tables, pasted study tables, and the rows of hand-laid tables checked against their records."""
    tables, checked = _readme_tables(), _checked_lines()
    parts = [m.group(0) for m in tables.EXCERPT.finditer(section)]
    parts += [m.group(0) for m in re.finditer(r"<!-- benchmark:(\S+) -->.*?<!-- /benchmark:\1 -->", section, re.S)]
    parts += [m.group(0) for m in re.finditer(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", section, re.S)]
    parts += [text for text in (path.read_text().strip() for path in STUDY_TABLES) if text in section]
    parts += [line for line in section.splitlines() if line in checked]
    return "\n".join(parts)


def test_every_number_the_readme_links_is_in_the_section_it_links():
    """Each README link whose text holds numbers (``[0.170 -> 0.455](docs/real_models.md#...)``) links a
    docs section (its subsections included) whose regenerated parts (``checked_text``) or claims
    (``benchmarks/claims.py``) show every one of them at the README's precision: no README figure rests
    on prose alone."""
    claims = _benchmark_module("claims")
    pages: dict[str, dict[str, str]] = {}
    checked = 0
    for text, page, anchor in re.findall(r"\[([^\]]*\d[^\]]*)\]\((docs/[^)#]+)#([^)]+)\)", README):
        section = pages.setdefault(page, sections((ROOT / page).read_text())).get(anchor)
        assert section is not None, f"README links {page}#{anchor}, which is no heading of that page"
        shown = checked_text(section) + "\n" + " ".join(claims.claimed_numbers(page, anchor))
        numbers = re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", text.replace("95%", ""))
        missing = [n for n in numbers if not shown_in(n, shown)]
        assert not missing, (f"README's [{text}]({page}#{anchor}): {missing} are in no regenerated table or claim "
                             "of that section")
        checked += 1
    assert checked > 50


def test_every_claim_of_the_docs_prose_agrees_with_its_record():
    """benchmarks/claims.py: each claim's fragment is in its section and states what its record gives."""
    claims = _benchmark_module("claims")
    pages: dict[str, dict[str, str]] = {}
    assert claims.problems(lambda page: pages.setdefault(page, sections((ROOT / page).read_text()))) == []
    assert len(claims.CLAIMS) >= 14


MEASURED = re.compile(r"(?<![\w.@/-])(?:\d+\.\d+|\d+(?=x\b|%))(?!\.?\d)(?![a-wyzA-Z_])")


def prose_numbers_without_a_record(page: str) -> list[tuple[str, str]]:
    """(anchor, number) of each measured-looking number (a decimal, or a count before ``x`` or ``%``; not
    an interval's ``95%``) in the prose of a docs page, outside code, that no regenerated table
    (``checked_text``) of its section, subsections included, and no claim (``benchmarks/claims.py``) of
    its section shows, nor those of a section of level 2 or deeper that encloses it."""
    claims = _benchmark_module("claims")
    text = (ROOT / page).read_text()
    whole = sections(text)
    found = []
    for anchors, section in leaf_sections(text):
        checked = checked_text(section)
        prose = re.sub(r"<!-- excerpt:.*?<!-- /excerpt -->|<!-- benchmark:(\S+) -->.*?<!-- /benchmark:\1 -->"
                       r"|<!-- ([\w-]+):start -->.*?<!-- \2:end -->|```.*?```|`[^`\n]*`|\b95%", "", section,
                       flags=re.S)
        prose = "\n".join(line for line in prose.splitlines() if line not in checked)
        shown = "\n".join([checked, *(checked_text(whole[a]) for a in anchors),
                           *(" ".join(claims.claimed_numbers(page, a)) for a in anchors)])
        found += [(anchors[0], n) for n in MEASURED.findall(prose) if not shown_in(n, shown)]
    return found


def test_the_docs_prose_states_no_number_without_a_record():
    """Every measured-looking number in the docs' prose is a claim or in a regenerated table of its section."""
    found = {page.name: prose_numbers_without_a_record(f"docs/{page.name}") for page in PAGES}
    found = {page: numbers for page, numbers in found.items() if numbers}
    assert not found, f"prose numbers with no claim (benchmarks/claims.py) or regenerated table: {found}"


def test_the_prose_number_check_finds_a_number_only_prose_states(tmp_path, monkeypatch):
    page = ("# P\n\n## A section\n\n<!-- benchmark:x -->\n| a |\n| --- |\n| 0.52 |\n<!-- /benchmark:x -->\n\n"
            "The gain is 0.52 here, 1.7x there and 12% elsewhere; `0.99` is code, step 40 a count.\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "p.md").write_text(page)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert prose_numbers_without_a_record("docs/p.md") == [("a-section", "1.7"), ("a-section", "12")]


def test_a_claim_that_drifts_from_its_record_is_found():
    """The check names a changed number, a missing fragment and a miscounted one; a sign is part of a number,
    a hyphen between two numbers a range."""
    claims = _benchmark_module("claims")
    page = {"s": "The gain is +0.32 [-0.020, +0.035] over 0.81-0.90 of pass@1, 1.5x on SmolLM2-135M."}
    assert claims.numbers(page["s"]) == ["+0.32", "-0.020", "+0.035", "0.81", "0.90", "1.5"]

    def claim(text, values):
        return claims.Claim("p.md", "s", text, lambda: values)
    assert claims.problems(lambda _: page, [claim("+0.32 [-0.020, +0.035]", [0.3249, -0.0204, 0.0346])], []) == []
    found = claims.problems(lambda _: page, [claim("+0.32 [-0.020, +0.035]", [0.3251, -0.020, 0.035]),
                                             claim("+0.32 [-0.020, +0.035]", [0.32, 0.020, 0.035]),
                                             claim("gain is 0.40", [0.40]),
                                             claim("0.81-0.90", [0.81])],
                            [claims.Stated("p.md", "s", "over 0.81", "a threshold"),
                             claims.Stated("p.md", "s", "under 0.81", "a threshold")])
    assert len(found) == 5 and "'under 0.81' is not in the section" in found[4]
    assert "differs" in found[0] and "differs" in found[1] and "not in the section" in found[2]
    assert "states 2 numbers, its record gives 1" in found[3]
    assert claims.agrees("3e-15", 3.11e-15) and not claims.agrees("3e-15", 3.6e-15)


def test_readme_and_docs_link_only_files_inside_the_repository():
    root = ROOT.resolve()
    assert len(DOCS) >= 3, "docs/ holds the design notes"
    links = 0
    for doc in DOCS:
        for match in LINK.finditer(doc.read_text()):
            target = next(g for g in match.groups() if g)
            assert not re.match(r"[a-z]+:", target), f"{doc.name} links outside the repository: {target}"
            assert not re.search(r"(^|/)\.\.(/|$)", target), f"{doc.name} links with ../: {target}"
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc.resolve()
            assert path.is_relative_to(root), f"{doc.name} links outside the repository: {target}"
            assert path.exists(), f"{doc.name} links to {target}, which does not exist"
            if anchor:
                assert path.suffix == ".md" and anchor in anchors(path.read_text()), \
                    f"{doc.name} links to {target}: {path.name} has no heading with that anchor"
            links += 1
    assert links >= 20


def test_the_link_check_catches_broken_and_outside_links():
    found = [m.group(1) for m in LINK.finditer("see [paper](../shared/paper.md) and ![x](a/b.png) [y](https://x.org)")]
    assert found == ["../shared/paper.md", "a/b.png", "https://x.org"]
    assert slug("Sampler vs transformers' `generate`") == "sampler-vs-transformers-generate"
    assert slug("`pgjax.core` from your own code") == "pgjaxcore-from-your-own-code"
    assert slug("Will it fit? The memory planner") == "will-it-fit-the-memory-planner"
    assert anchors("# A\n## B: c\n```\n# not a heading\n```\n## B: c\n") == {"a", "b-c", "b-c-1"}


# "the seed" once meant the paper in these docs; "seed" now only ever means a random seed.
PAPER_AS_SEED = re.compile(r"\*the seed\*|\bthe seed(?:'s)? (?:claims|says|derivation|identities|switches|section|"
                           r"argument|allows|does not|per-time-step|eq\.|equation|Dr\. GRPO|length-bias|on/off|`1/K`)",
                           re.I)


def test_the_paper_is_called_the_paper():
    for doc in DOCS:
        found = PAPER_AS_SEED.findall(doc.read_text())
        assert not found, f"{doc.name} calls the paper 'the seed': {found}"
    assert PAPER_AS_SEED.search("What the seed claims") and not PAPER_AS_SEED.search("the seed and the step number")


def test_every_command_line_example_in_the_readme_and_docs_resolves(capsys):
    """Each ``python -m pgjax.run experiments/...`` or ``pgjax run experiments/...`` example names an
    experiment file and keys that exist (checked with --print-config, which parses and applies every --set
    without running)."""
    from pgjax import run
    command = re.compile(r"(?:python -m pgjax\.run|pgjax run) (?=experiments/)")
    examples = [line for doc in DOCS for line in doc.read_text().splitlines()
                if command.search(line) and "<file>" not in line]
    assert len(examples) >= 8
    for line in examples:
        words = command.split(line, 1)[1].split("#")[0].split("`")[0].replace("\\", "").split()
        argv = [w for w in words if w not in ("...", "--resume", "--print-config")]
        argv[0] = str(ROOT / argv[0])
        assert run.main([*argv, "--print-config"]) == 0, line
        capsys.readouterr()


def test_the_benchmark_tables_are_the_saved_results():
    """Every benchmarks/results/*.json table is verbatim on one page of the docs (``benchmarks/readme_tables.py``)."""
    tables = _readme_tables()
    saved = tables.saved_tables()
    assert len(saved) >= 3
    assert tables.doc_pages() == DOCS
    pages = {doc.name: doc.read_text() for doc in DOCS}
    assert tables.stale(pages, saved) == [], "run `python benchmarks/readme_tables.py` after a benchmark's --json"


SMOLLM2_64 = {"SmolLM2-135M-Instruct": "base", "after 40 Dr. GRPO steps": "trained",
              "after 40 GRPO steps (`--set algorithm.preset=grpo`)": "grpo",
              "after 40 Dr. GRPO steps with LoRA r16 (below)": "lora"}


def smollm2_64_row(label: str, metrics: dict) -> str:
    """One row of real_models.md's 64-prompt SmolLM2 table from its evaluation file's metrics: rates to
    0.001 with their interval to 0.01, the format and cut-off rates in percent, the length to 0.1."""
    def rate(name):
        m = metrics[name]
        return "{:.3f} [{:.2f}, {:.2f}]".format(m["value"], *m["ci95"])

    def percent(name):
        m = metrics[name]
        return "{:.1f}% [{:.1f}, {:.1f}]".format(100 * m["value"], *(100 * x for x in m["ci95"]))
    length = metrics["mean_length"]
    return (f"| {label} | {rate('greedy_accuracy')} | {rate('pass@1')} | {rate('pass@8')} | {percent('format_rate')} "
            "| {:.1f} [{:.1f}, {:.1f}] | {} |".format(length["value"], *length["ci95"], percent("truncation_rate")))

def smollm2_64_lines() -> list[str]:
    """docs/real_models.md's one-seed SmolLM2 rows, each what experiments/results/smollm2_*.json holds."""
    lines = (ROOT / "docs" / "real_models.md").read_text().splitlines()
    rows = []
    for label, name in SMOLLM2_64.items():
        metrics = json.loads((ROOT / "experiments" / "results" / f"smollm2_{name}.json").read_text())["metrics"]
        rows.append(smollm2_64_row(label, metrics))
        assert rows[-1] in lines, f"the {label!r} row differs from smollm2_{name}.json"
    return rows


def test_the_64_prompt_smollm2_table_is_its_evaluation_files():
    smollm2_64_lines()


def gemma3_window_rows(records: list[dict], width: int = 10) -> list[str]:
    """real_models.md's per-10-step rows of a one-seed Gemma 3 run from its record: each window's mean of
    the steps' training accuracy, lengths (where defined) and cut-off share, and the greedy evaluation at
    its last step; the first row the starting model's evaluation."""
    evals = {r["step"]: r["eval_accuracy"] for r in records if r.get("eval_accuracy") is not None}
    rows = [f"| 0 (base) | - | - | - | - | - | {evals[0]:.3f} |"]
    last = max(r["step"] for r in records)
    for start in range(1, last + 1, width):
        steps = [r for r in records if start <= r["step"] < start + width and "accuracy" in r]

        def mean(name, steps=steps):
            return np.mean([r[name] for r in steps if r.get(name) is not None])
        rows.append(f"| {start}-{start + width - 1} | {mean('accuracy'):.3f} | {mean('length'):.1f} "
                    f"| {mean('length_correct'):.1f} | {mean('length_incorrect'):.1f} | {mean('truncated'):.2f} "
                    f"| {evals[start + width - 1]:.3f} |")
    return rows


def gemma3_one_seed_lines() -> list[str]:
    """docs/real_models.md's Gemma 3 base-model evaluation and its two one-seed zero-RL runs' per-step tables,
    each row what experiments/results/gemma3/ holds."""
    lines = (ROOT / "docs" / "real_models.md").read_text().splitlines()
    results = ROOT / "experiments" / "results" / "gemma3"
    checked = []
    for name in ("dr_grpo_metrics.jsonl", "dr_grpo_lr2e-6_metrics.jsonl"):
        records = [json.loads(line) for line in (results / name).read_text().splitlines()]
        rows = gemma3_window_rows(records)
        assert len(rows) == 5 and all(row in lines for row in rows), (name, rows)
        checked += rows
    base = json.loads((results / "base.json").read_text())

    def cell(metric):
        return "{:.3f} [{:.3f}, {:.3f}]".format(metric["value"], *metric["ci95"])
    for label, part in [("all 128", base), *((f"{d}-digit operands (64)", base["strata"]["difficulty"][d])
                                               for d in ("1", "2"))]:
        m = part["metrics"]
        row = (f"| {label} | {cell(m['greedy_accuracy'])} | {cell(m['pass@1'])} | {cell(m['pass@8'])} "
               f"| {m['finish_rate']['value']:.3f} | {m['mean_length']['value']:.1f} |")
        assert row in lines, row
        checked.append(row)
    return checked


def test_the_gemma3_one_seed_tables_are_their_records():
    gemma3_one_seed_lines()


def reward_model_held_out_lines() -> list[str]:
    """docs/reward_models.md's held-out pairwise accuracy, Wilson interval and loss per evaluation step,
    each row experiments/results/smollm2_reward_model/metrics.jsonl's."""
    lines = (ROOT / "docs" / "reward_models.md").read_text().splitlines()
    path = ROOT / "experiments" / "results" / "smollm2_reward_model" / "metrics.jsonl"
    evaluations = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("eval_accuracy") is not None]
    assert [r["step"] for r in evaluations] == [0, 25, 50]
    rows = []
    for r in evaluations:
        accuracy = f"{r['eval_accuracy']:.3f}" + (" (every pair a tie)" if r["step"] == 0 else "")
        rows.append(f"| {r['step']} | {accuracy} | [{r['eval_accuracy_low']:.3f}, {r['eval_accuracy_high']:.3f}] "
                    f"| {r['eval_loss']:.3f} |")
        assert rows[-1] in lines, rows[-1]
    return rows


def test_the_reward_models_held_out_table_is_its_record():
    reward_model_held_out_lines()


TOOLS_ROWS = {"base_no_tools": ("SmolLM2-135M-Instruct", "none"),
              "base_tools": ("SmolLM2-135M-Instruct", "the tool prompt"),
              "warm_start_40": ("after the warm start (40 steps of 16 worked episodes)", "the tool prompt")}


def smollm2_tools_lines() -> list[str]:
    """docs/agents.md's SmolLM2-with-the-calculator rows, each what experiments/results/smollm2_tools/NAME.json
    holds: greedy and pass@1 with their intervals, the call and valid-call rates, turns and tokens per episode
    (``-`` where a model makes no call; without tools: one turn, and the response's tokens)."""
    lines = (ROOT / "docs" / "agents.md").read_text().splitlines()
    rows = []
    for name, (model, tools) in TOOLS_ROWS.items():
        m = json.loads((ROOT / "experiments" / "results" / "smollm2_tools" / f"{name}.json").read_text())["metrics"]

        def rate(metric, m=m):
            return "{:.3f} [{:.3f}, {:.3f}]".format(m[metric]["value"], *m[metric]["ci95"])

        def plain(metric, spec, m=m):
            value = m.get(metric, {}).get("value")
            return "-" if value is None else format(value, spec)
        turns = plain("mean_turns", ".2f").replace("-", "1")
        tokens = (m.get("mean_episode_tokens") or {}).get("value") or m["mean_length"]["value"]
        cells = [model, tools, rate("greedy_accuracy"), rate("pass@1"), plain("call_rate", ".3f"),
                 plain("valid_call_rate", ".3f"), turns, f"{tokens:.1f}"]
        rows.append("| " + " | ".join(cells) + " |")
        assert rows[-1] in lines, f"agents.md's {name} row differs from its evaluation file: {rows[-1]}"
    return rows


def test_the_smollm2_tools_table_is_its_evaluation_files():
    smollm2_tools_lines()


def test_the_study_excerpts_are_the_committed_reports():
    """Every excerpt block of the docs is what its committed study report gives (each report regenerates from
    its study's evaluation files: tests/test_study.py), and every study that has a report is quoted."""
    tables = _readme_tables()
    pages = {doc.name: doc.read_text() for doc in DOCS}
    assert tables.stale_excerpts(pages) == [], "run `python benchmarks/readme_tables.py` after a study's --report"
    quoted = {match.group(2) for text in pages.values() for match in tables.EXCERPT.finditer(text)}
    studies = {f"experiments/results/{path.stem}/{path.stem}.md"
               for path in (ROOT / "experiments" / "studies").glob("*.py")}
    run = {report for report in studies if (ROOT / report).exists()}       # a study not yet run: test_study
    assert run and run <= quoted, f"studies with a report that no page quotes: {sorted(run - quoted)}"


REPORT = """# a report

### first split (`held_out=none`)

| model | runs | score |
| --- | ---: | ---: |
| base | 1 | 0.100 |
| tuned | 2 | 0.500 ± 0.100 (0.400-0.600) |

| B - A | metric | mean difference |
| --- | --- | ---: |
| tuned - base | score | +0.400 |
| tuned - base | a\\|b | +0.300 |

### second split (`held_out=numbers`)

| model | runs | score |
| --- | ---: | ---: |
| base | 1 | 0.050 |
| tuned | 2 | 0.150 ± 0.050 (0.100-0.200) |

### second

| model | runs | score |
| --- | ---: | ---: |
| other | 1 | 0.900 |
"""


def test_an_excerpt_selects_sections_tables_rows_and_columns_and_names_what_is_missing(tmp_path):
    tables = _readme_tables()
    (tmp_path / "r.md").write_text(REPORT)
    assert tables.excerpt("r.md", "", tmp_path) == "\n".join([
        "| model | runs | score |", "| --- | ---: | ---: |", "| base | 1 | 0.100 |",
        "| tuned | 2 | 0.500 ± 0.100 (0.400-0.600) |"])
    spec = 'sections="first;second split" rows="tuned" columns="model,score"'
    assert tables.excerpt("r.md", spec, tmp_path) == "\n".join([
        "| split | model | score |", "| --- | --- | ---: |", "| first split | tuned | 0.500 ± 0.100 (0.400-0.600) |",
        "| second split | tuned | 0.150 ± 0.050 (0.100-0.200) |"])
    # a heading that is the start of another is picked by its whole text; a unique start picks the other
    assert tables.excerpt("r.md", 'sections="second"', tmp_path).splitlines()[2] == "| other | 1 | 0.900 |"
    assert tables.excerpt("r.md", 'sections="second split" rows="base"', tmp_path).splitlines()[2] == \
        "| base | 1 | 0.050 |"
    assert tables.excerpt("r.md", 'table=2 where="metric=a\\|b"', tmp_path).splitlines()[2] == \
        "| tuned - base | a\\|b | +0.300 |"
    for spec, error in [('sections="third"', "0 sections start with 'third'"), ("table=3", "has 2 tables"),
                        ('columns="model,loss"', "no column ['loss']"), ('rows="nobody"', "no row"),
                        ('where="loss=1"', "is not COLUMN=REGEX"), ("colour=red", "excerpt option 'colour=red'"),
                        ('sections="first;second split" table=2', "has 1 tables")]:
        with pytest.raises(ValueError, match=re.escape(error)):
            tables.excerpt("r.md", spec, tmp_path)
    with pytest.raises(ValueError, match="no report gone.md"):
        tables.excerpt("gone.md", "", tmp_path)
    page = ('<!-- excerpt:r.md rows="base" -->\n| stale |\n<!-- /excerpt -->\n'
            '<!-- excerpt:r.md table=9 -->\n<!-- /excerpt -->')
    assert [p.split(" in ")[1] for p in tables.stale_excerpts({"p.md": page}, tmp_path)] == [
        "p.md differs from the report",
        "p.md: r.md: section 'first split (`held_out=none`)' has 2 tables, not a table 9"]
    fixed = tables.regenerate_excerpts(page, tmp_path)
    assert ('<!-- excerpt:r.md rows="base" -->\n| model | runs | score |\n| --- | ---: | ---: |\n'
            '| base | 1 | 0.100 |\n<!-- /excerpt -->') in fixed
    assert "<!-- excerpt:r.md table=9 -->\n<!-- /excerpt -->" in fixed
    assert len(tables.stale_excerpts({"p.md": fixed}, tmp_path)) == 1
    # a marker whose options run over two lines, or with no closing marker, is a problem, and a block after
    # an unclosed one keeps its own markers when the page is regenerated
    broken = '<!-- excerpt:r.md\n rows="base" -->\n<!-- /excerpt -->\n<!-- excerpt:r.md -->\n| x |\n'
    after = '<!-- excerpt:r.md rows="base" -->\n| stale |\n<!-- /excerpt -->'
    assert any("2 excerpt marker(s) without" in p for p in tables.stale_excerpts({"p.md": broken + after}, tmp_path))
    assert tables.regenerate_excerpts(broken + after, tmp_path).startswith(broken)


def test_the_table_check_finds_stale_missing_orphan_and_duplicate_blocks():
    tables = _readme_tables()
    page = ("a\n<!-- benchmark:x -->\n| old |\n<!-- /benchmark:x -->\n<!-- benchmark:gone -->\n|\n"
            "<!-- /benchmark:gone -->")
    saved = {"x": "| new |\n| --- |", "y": "| y |"}
    assert [p.split(":")[0] for p in tables.stale(page, saved)] == ["x", "y", "gone"]
    fixed = tables.regenerate(page, saved)
    assert "<!-- benchmark:x -->\n| new |\n| --- |\n<!-- /benchmark:x -->" in fixed
    assert [p.split(":")[0] for p in tables.stale(fixed, saved)] == ["y", "gone"]
    other = "<!-- benchmark:y -->\n| y |\n<!-- /benchmark:y -->"
    assert [p.split(":")[0] for p in tables.stale({"a.md": fixed, "b.md": other}, saved)] == ["gone"]
    assert [p.split(":")[0] for p in tables.stale({"a.md": other, "b.md": other}, {"y": "| y |"})] == ["y"]
