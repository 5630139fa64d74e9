"""The numbers the docs state in prose, recomputed from the committed records they come from.

A generated table (a benchmark block, a report excerpt: ``readme_tables.py``) carries its numbers from
their record. A sentence that quotes a number from a table the page does not show, or a number derived
from several (a ratio, a per-seed difference), is a ``Claim``: the page and section it is in, the
fragment of prose as written, and the function that recomputes the fragment's numbers, in the order
the fragment states them, from the committed records (``experiments/results/``, ``benchmarks/results/``).
A number agrees when the recomputed value rounds to it at the precision it is written with; a sign
written before a number (``+0.32``, ``[-0.020``) is part of it.

    python benchmarks/claims.py        # every claim, its numbers and the recomputed values; exit 1 if one differs

A number that is no measurement (a kernel version, a goal, a definition's constant) is ``Stated``: the
fragment and what its numbers are, with nothing to recompute.

``tests/test_readme.py`` fails when a claim's fragment is not in its section or a number differs;
requires every number the README links to be in a generated or checked table of the section it links,
or in one of that section's claims; and counts, per page, the measured-looking numbers of the prose
that neither shows (the count may only fall).
"""
import dataclasses
import functools
import json
import pathlib
import re
import statistics
import sys
from collections.abc import Callable, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import readme_tables

from pgjax.evaluation.statistics import median_ratio, wilson_interval

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"(?<![\w.@])([-+]?)(\d+(?:\.\d+)?(?:e[-+]?\d+)?)(?![a-wyzA-Z_\d])")


@dataclasses.dataclass(frozen=True)
class Claim:
    """``text``, verbatim (line breaks as spaces) in section ``section`` (a heading's anchor) of ``page``,
    states the numbers ``values()`` returns, in order."""
    page: str
    section: str
    text: str
    values: Callable[[], Sequence[float]]


@dataclasses.dataclass(frozen=True)
class Stated:
    """``text``, verbatim in section ``section`` of ``page``, holds numbers that are no measurement and
    have no record to come from (a kernel version, a property of the paper's setting); ``why`` says what
    they are. The check only finds the fragment in its section."""
    page: str
    section: str
    text: str
    why: str


def numbers(text: str) -> list[str]:
    """The numbers written in ``text``, each with the sign written before it: ``+0.32``, ``-0.020``;
    a hyphen between two numbers (``0.81-0.90``) is a range, not a sign; a number that runs into a
    letter other than ``x`` is part of a name (``SmolLM2-135M``), not a number."""
    found = []
    for match in NUMBER.finditer(text):
        sign = match.group(1)
        start = match.start()
        signed = sign and (start == 0 or text[start - 1] in " ([,\n")
        found.append((sign if signed else "") + match.group(2))
    return found


def agrees(written: str, value: float) -> bool:
    """Whether ``value`` rounds to ``written`` at the precision it is written with (``0.81`` for 0.8149,
    ``1.01`` for 1.008; ``3e-15`` for 3.11e-15: one significant digit)."""
    if "e" in written:
        mantissa, exponent = written.split("e")
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        return abs(value - float(written)) <= 0.5 * 10 ** (int(exponent) - decimals) * (1 + 1e-9)
    decimals = len(written.split(".")[1]) if "." in written else 0
    return abs(value - float(written)) <= 0.5 * 10 ** -decimals * (1 + 1e-9) + 1e-12


# --- where the values come from


def report_cells(report: str, spec: str) -> list[list[str]]:
    """The data rows of the table that an excerpt of ``report`` with options ``spec`` shows."""
    lines = readme_tables.excerpt(report, spec, ROOT).splitlines()
    return [readme_tables.table_cells(line) for line in lines[2:]]


def report_numbers(report: str, spec: str) -> list[float]:
    """The numbers, in reading order, of the one cell the excerpt ``spec`` of ``report`` selects (a cell
    ``0.375 ± 0.014 (0.364-0.391)`` gives 0.375, 0.014, 0.364, 0.391); ValueError if it selects more."""
    cells = report_cells(report, spec)
    if len(cells) != 1 or len(cells[0]) != 1:
        raise ValueError(f"{report} {spec}: selects {sum(map(len, cells))} cells, not one")
    return [float(n) for n in numbers(cells[0][0])]


def result(name: str) -> dict:
    """The committed record ``benchmarks/results/NAME.json``."""
    return json_file(f"benchmarks/results/{name}.json")


@functools.cache
def records(path: str) -> list[dict]:
    """The per-step records of a committed ``metrics.jsonl`` (read once; callers do not change them)."""
    return [json.loads(line) for line in (ROOT / path).read_text().splitlines() if line.strip()]


@functools.cache
def json_file(path: str) -> dict:
    """A committed JSON file (an evaluation, a summary; read once, callers do not change it)."""
    return json.loads((ROOT / path).read_text())


def stated_in(path: str, pattern: str) -> list[float]:
    """The numbers that ``pattern``'s groups capture in a committed file (a log line, a constant in code,
    a test's threshold); ValueError when it is not there."""
    match = re.search(pattern, (ROOT / path).read_text(), re.M)
    if not match:
        raise ValueError(f"{path}: nothing matches {pattern!r}")
    return [float(group) for group in match.groups()]


def generated_tables(page: str, name: str) -> list[list[list[str]]]:
    """Each table's data rows in a page's ``<!-- NAME:start -->`` block: a command's output, which a test of
    ``tests/test_readme.py`` checks against the command."""
    block = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", (ROOT / page).read_text(), re.S)
    if not block:
        raise ValueError(f"{page}: no <!-- {name}:start --> block")
    return [table[2:] for tables in readme_tables.report_sections(block.group(1)).values() for table in tables]


def pooled_step_seconds(name: str, row: str) -> list[float]:
    """Every timed step of one row of a ``compare_trl.py`` record, its rounds pooled: the step's seconds
    are its sampling, scoring and update."""
    return [s["sampling"] + s["scoring"] + s["update"] for run in result(name)["runs"][row] for s in run["steps"]]


# --- the claims, page by page

SMOLLM2_SEEDS = "experiments/results/smollm2_seeds/smollm2_seeds.md"
TOOLS_SEEDS = "experiments/results/smollm2_tools_seeds/smollm2_tools_seeds.md"
REWARD_SEEDS = "experiments/results/smollm2_reward_model_seeds/smollm2_reward_model_seeds.md"
TRAINING = 'sections="training phrasings"'


STEP_COSTS = "experiments/results/smollm2_step_costs/records"
AFTER_COMPILING = range(2, 5)       # the step-cost runs' steps after the first, which compiles


def _step_seconds(method: str) -> list[float]:
    """The least and the most ``time_step`` of the step-cost study's ``method`` run after compiling."""
    return _step_field(method, "time_step", AFTER_COMPILING)


def _peak_gb(method: str) -> float:
    """The step-cost study's ``method`` run's peak resident memory after its last step (GB)."""
    return records(f"{STEP_COSTS}/{method}_s0/metrics.jsonl")[-1]["peak_rss_gb"]


def _step_field(method: str, field: str, steps: range = range(1, 5)) -> list[float]:
    """The least and the most of ``field`` over ``steps`` of the step-cost study's ``method`` run."""
    values = [r[field] for r in records(f"{STEP_COSTS}/{method}_s0/metrics.jsonl") if r["step"] in steps]
    return [min(values), max(values)]


def _episode_token_excess() -> list[float]:
    """How many more tokens (%) the re-prefilled side of ``episodes_smollm2`` generates than the carried
    side: over all rounds, and in the round where it is most."""
    generated = result("episodes_smollm2")["generated"]
    pairs = list(zip(generated["re-prefilled"], generated["carried"], strict=True))
    return [100 * (sum(r for r, _ in pairs) / sum(c for _, c in pairs) - 1), 100 * max(r / c - 1 for r, c in pairs)]


HOST_MEMORY_DEFAULTS = "glibc defaults (`PGJAX_KEEP_FREED_MEMORY=0`)"


def _lever_speedup(shape: str, lever: str) -> float:
    """The median step of steps 2-6 at glibc's defaults over that of ``lever`` at ``shape``, in
    ``host_memory_smollm2`` (step 1 compiles)."""
    runs = result("host_memory_smollm2")["results"][shape]
    median = lambda name: statistics.median(s["seconds"] for s in runs[name]["steps"][1:])   # noqa: E731
    return median(HOST_MEMORY_DEFAULTS) / median(lever)


def _difficulty_run_mean(variant: str, field: str) -> float:
    """The mean over seeds of each seed's mean of ``field`` over the difficulty study's steps."""
    curves = json_file("experiments/results/difficulty_bias/summary.json")["curves"][variant]
    return statistics.fmean(statistics.fmean(v for v in seed[field] if v is not None and v == v)
                            for seed in curves.values())


def _difficulty_gradient_ratios() -> list[float]:
    """Each bucket's run-mean gradient norm with the std over without it: easy and medium stated as one
    number (a third value, which fails the claim, where they round apart), then hard."""
    easy, medium, hard = (_difficulty_run_mean("std", name) / _difficulty_run_mean("no_std", name)
                          for name in ("grad_norm_1", "grad_norm_2", "grad_norm_3"))
    return [easy, hard] if round(easy, 1) == round(medium, 1) else [easy, medium, hard]


def _seed_means_pass1() -> list[float]:
    """Dr. GRPO's and GRPO's pass@1 over their three seeds on the training phrasings: mean and sd each."""
    cells = [report_numbers(SMOLLM2_SEEDS, f'{TRAINING} rows="{m}" columns="pass@1"') for m in ("dr_grpo", "grpo")]
    return [*cells[0][:2], *cells[1][:2]]


def _tools_gain_per_seed() -> list[float]:
    """warm_rl's pass@1 minus warm's, seed by seed (the report's per-seed table)."""
    def per_seed(model):
        return [float(c[1]) for c in report_cells(TOOLS_SEEDS, f'table=2 rows="{model}" columns="run,pass@1"')]
    return [b - a for a, b in zip(per_seed("warm"), per_seed("warm_rl"), strict=True)]


def _paired(report: str, pair: str, metric: str, table: int = 3, section: str = "") -> list[float]:
    """A report's pooled paired difference B - A of ``metric`` and its paired-bootstrap interval (in
    ``section``, a heading's start; default: the report's first section with a table)."""
    where = f'sections="{section}" ' if section else ""
    rows = f'{where}table={table} rows="{pair}" where="metric={re.escape(metric)}"'
    return (report_numbers(report, f'{rows} columns="mean difference"')
            + report_numbers(report, f'{rows} columns="95% CI (paired bootstrap)"'))


def _sampler_stacked_ratios() -> list[float]:
    """The stacked-layer sampler's tokens per second over transformers', ragged then forced."""
    return [r["pgjax_stacked_layers"] / r["transformers"] for r in result("sampler_smollm2")["results"]]


def _bfloat16_weights_over_transformers() -> list[float]:
    """The sampler with bfloat16 weights over transformers' tokens per second, ragged then forced."""
    return [r["pgjax_weights"] / r["transformers"] for r in result("sampler_smollm2_bf16_weights")["results"]]


def _trl_fastest_against_fastest() -> list[float]:
    """TRL with huge pages over pgjax at its defaults: the ratio of pooled median step seconds and its
    bootstrap interval (each side at its fastest setting of the tuned run)."""
    name = "compare_trl_smollm2_tuned"
    ratio = median_ratio(pooled_step_seconds(name, "TRL GRPOTrainer, huge pages"), pooled_step_seconds(name, "pgjax"))
    return [ratio["ratio"], ratio["low"], ratio["high"]]


def _remat_over_chunked_torch() -> list[float]:
    """pgjax's stacked layers with remat over torch eager with a chunked log-softmax, seconds per
    update, at each shape of the model-options record."""
    return _update_over("train_step_options_smollm2", "torch eager, chunked")


def _long_run_start_greedy() -> list[float]:
    """The 60-step reward-model run's greedy evaluation at step 0 (its 64 prompts)."""
    path = "experiments/results/smollm2_reward_model_seeds/records/reward_model_long_s0/metrics.jsonl"
    return [next(r["eval_accuracy"] for r in records(path) if r["step"] == 0)]


def _seed_length_and_finish(seed: int) -> list[float]:
    """One Dr. GRPO seed's mean length and finish rate (percent) on the training phrasings."""
    spec = f'{TRAINING} table=2 rows="dr_grpo" where="run=seed {seed}"'
    return [report_numbers(SMOLLM2_SEEDS, f'{spec} columns="mean_length"')[0],
            100 * report_numbers(SMOLLM2_SEEDS, f'{spec} columns="finish_rate"')[0]]


def _across_seeds_p(report: str, pair: str, metric: str, section: str) -> list[float]:
    """The across-seed test's p-values of B - A: the unpaired one (Welch's or one-sample t), then paired by seed."""
    spec = f'sections="{section}" table=4 rows="{pair}" where="metric={re.escape(metric)}"'
    return [report_numbers(report, f'{spec} columns="p (t across seeds)"')[0],
            report_numbers(report, f'{spec} columns="p (t paired by seed)"')[0]]


def _budget_cell(model: str, budget: int, stratum: str, column: str) -> float:
    """One cell of the SmolLM2 study's response-budget table of ``model``."""
    return report_numbers(SMOLLM2_SEEDS, f'sections="response budgets: {model}" rows="{budget}" '
                                         f'where="stratum={stratum}" columns="{column}"')[0]


def _base_finished(budget: int) -> float:
    return _budget_cell("base", budget, "all", "finished")


def _budget_pass1(model: str, budget: int, stratum: str) -> float:
    return _budget_cell(model, budget, stratum, "pass@1")


def _passk_finished(model: str) -> float:
    """The finish rate of ``model``'s pass@k evaluation (64 samples of 64 prompts, 256 new tokens)."""
    return report_numbers(SMOLLM2_SEEDS, f'sections="pass@k (256 new tokens): {model}" where="stratum=all" '
                                         'columns="finished"')[0]


def _state_baseline_variance_cut() -> list[float]:
    """REINFORCE's total variance without and with the V(s_t) baseline on the audit's mixed MDP (its
    second table), and the share the baseline cuts, in percent."""
    _, mixed = generated_tables("docs/theory.md", "audit-table")     # the one-prompt MDP, then the mixed one
    plain, baseline = (float(next(r for r in mixed if r[0].startswith(name))[4])
                       for name in ("REINFORCE (eq. 10)", "REINFORCE + V(s_t)"))
    return [plain, baseline, 100 * (1 - baseline / plain)]


DECODE = result("decode_profile_smollm2")
WEIGHT_MATMULS = ("MLP matmuls", "q, k, v projections", "unembedding (logits)", "attention output projection")

FORCED = result("compare_trl_smollm2_forced")["rows"]["pgjax"]
REMAT = "pgjax, chunked, scan + remat"


def _range(values) -> list[float]:
    return [min(values), max(values)]


def _faults(name: str, *rows: str) -> list[float]:
    """Per row of a ``compare_trl.py`` record: its step's page faults in millions and kernel seconds."""
    return [v for row in rows for v in (result(name)["rows"][row]["minor_faults"] / 1e6,
                                        result(name)["rows"][row]["system_s"])]


def _fault_microseconds(name: str) -> float:
    """TRL's kernel seconds per page fault, in microseconds."""
    row = result(name)["rows"]["TRL GRPOTrainer"]
    return 1e6 * row["system_s"] / row["minor_faults"]


def _update_over(name: str, baseline: str) -> list[float]:
    """pgjax's stacked-layer remat update time over ``baseline``'s, at each shape of a train_step record."""
    return [r["seconds"][REMAT] / r["seconds"][baseline] for r in result(name)["results"]]


def _decode_goal_cell() -> list[float]:
    """The decode profile's weight matmuls: share of the op time, ms a step, their FLOP/s range and share
    of their roofline bound; attention's share and the bytes it reads per second."""
    parts = {p["part"]: p for p in DECODE["parts"]}
    matmuls = [parts[name] for name in WEIGHT_MATMULS if name != "unembedding (logits)"]
    rates = [p["work_per_step"][0] / p["ms_per_step"] / 1e6 for p in matmuls]
    bound = [p["roofline_ms"] / p["ms_per_step"] for p in matmuls]
    attention = parts["attention over the KV cache"]
    return [100 * sum(p["share"] for p in DECODE["parts"] if p["part"] in WEIGHT_MATMULS),
            _decode_step()[0], *_range(rates), *(100 * b for b in _range(bound)), 100 * attention["share"],
            attention["work_per_step"][1] / attention["ms_per_step"] / 1e6]


def _growth_point(new_tokens: int) -> dict:
    """The cost-growth record's harness run at ``new_tokens`` and its default number of samples."""
    return next(run for run in result("cost_growth_tiny")["runs"]
                if run["argv"][run["argv"].index("--new-tokens") + 1] == str(new_tokens)
                and run["argv"][run["argv"].index("--samples") + 1] == "8")


def _growth_phases(new_tokens: int, row: str) -> list[float]:
    """Scoring and update seconds of one side at one point of the length sweep."""
    phases = _growth_point(new_tokens)["rows"][row]
    return [phases["scoring"], phases["update"]]


def _growth_rss(side: str) -> list[float]:
    """One side's peak RSS (GiB) at the shortest and the longest point of the length sweep."""
    points = [p for p in result("cost_growth_tiny")["points"] if p["samples"] == 8]
    return [min(points, key=lambda p: p["new_tokens"])["peak_rss_gib"][side],
            max(points, key=lambda p: p["new_tokens"])["peak_rss_gib"][side]]


def _step(row: str, batch: int, length: int, field: str) -> float:
    """One row's ``field`` (``seconds``, ``system_s``) at one shape of the training-step record."""
    return next(r[field][row] for r in result("train_step_smollm2")["results"]
                if (r["batch"], r["length"]) == (batch, length))


def _growth(row: str, small: tuple[int, int], large: tuple[int, int]) -> list[float]:
    """How one row's step grows from one shape to another: the ratio, then both seconds."""
    a, b = _step(row, *small, "seconds"), _step(row, *large, "seconds")
    return [b / a, a, b]


def _tuned_step(row: str) -> float:
    """One row's median step seconds in the tuned TRL comparison."""
    return result("compare_trl_smollm2_tuned")["rows"][row]["step"]


def _async_step(label: str) -> float:
    """One row's median step seconds in the asynchronous-rollout record."""
    return next(r["time_step"] for r in result("async_overlap_tiny")["rows"] if r["label"] == label)


def _std_gain() -> list[float]:
    """How much more the std division weighs a group with 1 or 7 right of 8 (each relative to 4 of 8), measured
    and predicted: the mean over k = 1 and k = 7 of the std row over the no-std row of the difficulty study."""
    table = report_cells("experiments/results/difficulty_bias/difficulty_bias.md", "table=2")
    rows = {r[0]: [float(x) for x in r[1:]] for r in table}

    def gain(kind):
        return statistics.mean(rows[f"std: {kind}"][i] / rows[f"no_std: {kind}"][i] for i in (0, -1))
    return [gain("measured"), gain("predicted")]


def _evaluations(path: str, best: bool = False) -> list[float]:
    """A kept record's first and last greedy evaluation (and with ``best`` the highest)."""
    evaluations = [r["eval_accuracy"] for r in records(path) if r.get("eval_accuracy") is not None]
    return [evaluations[0], evaluations[-1], *([max(evaluations)] if best else [])]


def _main_job_ends(machine: str) -> list[float]:
    """A kept main-job record's first and last greedy evaluation."""
    return _evaluations(f"experiments/results/main_job_machines/{machine}/metrics.jsonl")


def _decode_step() -> list[float]:
    """The profiled decode: ms per token step and tokens per second of the untraced calls' median, the
    number of calls and their range in seconds."""
    shape = re.search(r"(\d+) rows x (\d+) new tokens", DECODE["setup"])
    assert shape, DECODE["setup"]
    rows, steps = int(shape.group(1)), int(shape.group(2))
    median = statistics.median(DECODE["seconds"])
    return [1000 * median / steps, rows * steps / median, len(DECODE["seconds"]), min(DECODE["seconds"]),
            max(DECODE["seconds"])]


def _mismatch_band() -> list[float]:
    """The ratio band outside which a token counts in ``mismatch_outside`` (``pgjax.core.off_policy``)."""
    return stated_in("pgjax/core/off_policy.py", r"^MISMATCH_BAND = \(([\d.]+), ([\d.]+)\)")


def _bfloat16_gradient_tolerance() -> float:
    """The relative gradient-norm tolerance the bfloat16-compute test holds the first step to."""
    return stated_in("tests/test_model_options.py", r"abs\(norm16 - norm32\) < ([\d.e-]+) \* norm32")[0]


def _gemma_gaps(method: str) -> list[float]:
    """Each Gemma 3 seed's mean length of wrong answers minus right ones, on the training phrasings."""
    gaps = []
    for seed in range(3):
        m = json_file(f"experiments/results/gemma3_seeds/eval/{method}_s{seed}_none.json")["metrics"]
        gaps.append(m["length_incorrect"]["value"] - m["length_correct"]["value"])
    return gaps


def _gemma_window(method: str, steps: str, metric: str) -> float:
    """The Gemma 3 study's training ``metric`` over a window of steps, the mean over seeds."""
    return report_numbers("experiments/results/gemma3_seeds/gemma3_seeds.md",
                          f'sections="training, per 10 steps" rows="{method}" where="steps={steps}" '
                          f'columns="{metric}"')[0]


GEMMA_ONE_SEED = "experiments/results/gemma3/dr_grpo_metrics.jsonl"
TOOLS = "experiments/results/smollm2_tools/comparison.md"
PAIRS = json_file("experiments/results/smollm2_reward_model/pairs_summary.json")


def _greedy_by_digits(name: str) -> list[float]:
    """A calculator evaluation's greedy accuracy on 1-, 2- and 3-digit problems."""
    strata = json_file(f"experiments/results/smollm2_tools/{name}.json")["strata"]["difficulty"]
    return [strata[d]["metrics"]["greedy_accuracy"]["value"] for d in ("1", "2", "3")]


def _tools_window(metric: str) -> list[float]:
    """The tool study's training ``metric`` in its first and last 5-step windows (mean over seeds)."""
    cells = report_cells(TOOLS_SEEDS, f'sections="training, per 5 steps" columns="{metric}"')
    return [float(numbers(cells[0][0])[0]), float(numbers(cells[-1][0])[0])]


def _tools_seed_cell(model: str, seed: int, metric: str) -> float:
    """One seed's ``metric`` in the tool study's per-seed table."""
    return report_numbers(TOOLS_SEEDS, f'table=2 rows="{model}" where="run=seed {seed}" columns="{metric}"')[0]


def _tools_format(seed: int) -> list[float]:
    """One seed's format rate before and after RL."""
    return [_tools_seed_cell("warm", seed, "format_rate"), _tools_seed_cell("warm_rl", seed, "format_rate")]


def wilson_95(successes: float, n: int) -> list[float]:
    """The Wilson score 95% interval of ``successes`` of ``n`` (``pgjax.evaluation.statistics``)."""
    return list(wilson_interval(successes, n))


CLAIMS: tuple[Claim, ...] = (
    Claim("docs/real_models.md", "smollm2-135m-instruct-on-word-problems",
          "a step takes 19.4-25.0 s, and the process peaks at 5.29 GB resident",
          lambda: [*_step_seconds("dr_grpo"), _peak_gb("dr_grpo")]),
    Claim("docs/real_models.md", "lora-instead-of-full-fine-tuning",
          "it peaks at 3.95 GB resident against 5.29 GB", lambda: [_peak_gb("lora"), _peak_gb("dr_grpo")]),
    Claim("docs/real_models.md", "lora-instead-of-full-fine-tuning",
          "take 19.1-22.6 s against 19.4-25.0 s", lambda: [*_step_seconds("lora"), *_step_seconds("dr_grpo")]),
    Claim("docs/real_models.md", "grpo-for-comparison",
          "after the first take 23.1-25.1 s against Dr. GRPO's 19.4-25.0 s",
          lambda: [*_step_seconds("grpo"), *_step_seconds("dr_grpo")]),
    Claim("docs/real_models.md", "grpo-for-comparison",
          "it peaks at 6.03 GB resident against 5.29 GB", lambda: [_peak_gb("grpo"), _peak_gb("dr_grpo")]),
    Claim("docs/experiments.md", "the-real-model",
          "peaks at 6.87 GB resident against 5.29 GB on-policy",
          lambda: [_peak_gb("s1_token_tis"), _peak_gb("dr_grpo")]),
    Claim("docs/experiments.md", "the-real-model",
          "a mean |delta log p| of 0.027-0.053 per step, KL 1.3e-03 to 6.3e-03 per token and up to 0.2% of the tokens",
          lambda: [*_step_field("bf16_compute", "mismatch_abs"), *_step_field("bf16_compute", "mismatch_kl"),
                   100 * _step_field("bf16_compute", "mismatch_outside")[1]]),
    Claim("docs/experiments.md", "the-real-model",
          "it is 0.008-0.010 over the first two steps but 0.060-0.062 over the last two (KL up to 1.0e-02, 1.1% of",
          lambda: [*_step_field("bf16_weights", "mismatch_abs", range(1, 3)),
                   *_step_field("bf16_weights", "mismatch_abs", range(3, 5)),
                   _step_field("bf16_weights", "mismatch_kl")[1],
                   100 * _step_field("bf16_weights", "mismatch_outside")[1]]),
    Claim("docs/experiments.md", "the-real-model",
          "its sampling took 3.3-3.9 s a step against the float32 sampler's 4.4-5.6 s",
          lambda: [*_step_field("bf16_weights", "time_sample", AFTER_COMPILING),
                   *_step_field("dr_grpo", "time_sample", AFTER_COMPILING)]),
    Claim("docs/experiments.md", "difficulty",
          "they are 2.3x those without it for the easy and medium buckets and 2.6x for the hard one",
          _difficulty_gradient_ratios),
    Claim("docs/experiments.md", "difficulty",
          "easy 0.36 vs 0.38 of the update, medium 0.55 vs 0.54, hard 0.09 vs 0.08",
          lambda: [_difficulty_run_mean(variant, f"weight_share_{b}") for b in (1, 2, 3)
                   for variant in ("std", "no_std")]),
    Claim("docs/experiments.md", "difficulty",
          "easy prompts are solved 91% of the time and medium ones 9%",
          lambda: [100 * _difficulty_run_mean("std", f"accuracy_{b}") for b in (1, 2)]),
    Claim("docs/real_models.md", "checking-a-gain-budgets-held-out-phrasings-seeds",
          "The seed means are 0.421 ± 0.035 and 0.375 ± 0.014", _seed_means_pass1),
    Claim("docs/agents.md", "what-rl-adds-after-a-short-warm-start-three-seeds",
          "pass@1 rises by +0.32, +0.32 and +0.36", _tools_gain_per_seed),
    Claim("docs/reward_models.md", "grpo-against-the-reward-model-vs-against-the-verifier",
          "pass@1 +0.122 [+0.083, +0.162] with the verifier",
          lambda: _paired(REWARD_SEEDS, "verifier - base", "pass@1")),
    Claim("docs/reward_models.md", "grpo-against-the-reward-model-vs-against-the-verifier",
          "+0.130 [+0.086, +0.174] with the reward model",
          lambda: _paired(REWARD_SEEDS, "reward_model - base", "pass@1")),
    Claim("docs/reward_models.md", "grpo-against-the-reward-model-vs-against-the-verifier",
          "pass@1 +0.007 [-0.020, +0.035]", lambda: _paired(REWARD_SEEDS, "reward_model - verifier", "pass@1")),
    Claim("docs/reward_models.md", "grpo-against-the-reward-model-vs-against-the-verifier",
          "greedy -0.010 [-0.055, +0.034]",
          lambda: _paired(REWARD_SEEDS, "reward_model - verifier", "greedy_accuracy")),
    Claim("docs/reward_models.md", "grpo-against-the-reward-model-vs-against-the-verifier",
          "(+0.139 [+0.112, +0.167] finished)",
          lambda: _paired(REWARD_SEEDS, "reward_model - verifier", "finish_rate")),
    Claim("docs/reward_models.md", "where-optimising-the-reward-model-starts-to-hurt",
          "the start's greedy accuracy on those prompts is 0.312", _long_run_start_greedy),
    Claim("docs/reward_models.md", "where-optimising-the-reward-model-starts-to-hurt",
          "greedy 0.211 and pass@1 0.205",
          lambda: [report_numbers(REWARD_SEEDS, f'rows="reward_model_long" columns="{metric}"')[0]
                   for metric in ("greedy_accuracy", "pass@1")]),
    Claim("docs/reward_models.md", "where-optimising-the-reward-model-starts-to-hurt",
          "-0.201 [-0.263, -0.143] greedy and -0.118 [-0.160, -0.078] pass@1",
          lambda: [*_paired(REWARD_SEEDS, "reward_model_long - reward_model", "greedy_accuracy"),
                   *_paired(REWARD_SEEDS, "reward_model_long - reward_model", "pass@1")]),
    Claim("docs/reward_models.md", "where-optimising-the-reward-model-starts-to-hurt",
          "greedy -0.102 [-0.188, -0.016]",
          lambda: _paired(REWARD_SEEDS, "reward_model_long - base", "greedy_accuracy")),
    Claim("docs/benchmarks.md", "sampler-vs-transformers-generate",
          "1.43x and 1.31x transformers' tokens/s", _sampler_stacked_ratios),
    Claim("docs/benchmarks.md", "sampler-vs-transformers-generate", "3.96x and 3.06x transformers'",
          _bfloat16_weights_over_transformers),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer",
          "the sampler with bfloat16 weights (`rollout.weight_dtype`, not the default) reads 3.96x and 3.06x",
          _bfloat16_weights_over_transformers),
    Claim("docs/benchmarks.md", "tuned-settings-on-both-sides",
          "gives **1.71x [1.53, 1.84]**", _trl_fastest_against_fastest),
    Claim("docs/benchmarks.md", "the-model-options",
          "1.01x and 0.81x the chunked torch row's", _remat_over_chunked_torch),
    # real_models.md
    Claim("docs/real_models.md", "checking-a-gain-budgets-held-out-phrasings-seeds",
          "Seed 2 answers in 12 tokens on average and finishes 99.9%; seed 1 in 22 tokens, finishing 92%",
          lambda: [2, *_seed_length_and_finish(2), 1, *_seed_length_and_finish(1)]),
    Claim("docs/real_models.md", "checking-a-gain-budgets-held-out-phrasings-seeds",
          "GRPO +0.201 [+0.148, +0.254] on the training phrasings, +0.277 on the held-out templates; Dr. GRPO "
          "+0.191 and +0.255",
          lambda: [*_paired(SMOLLM2_SEEDS, "grpo - base", "greedy_accuracy", section="training phrasings"),
                   _paired(SMOLLM2_SEEDS, "grpo - base", "greedy_accuracy", section="held-out templates")[0],
                   _paired(SMOLLM2_SEEDS, "dr_grpo - base", "greedy_accuracy", section="training phrasings")[0],
                   _paired(SMOLLM2_SEEDS, "dr_grpo - base", "greedy_accuracy", section="held-out templates")[0]]),
    Claim("docs/real_models.md", "checking-a-gain-budgets-held-out-phrasings-seeds",
          "Against GRPO's seeds (0.364-0.391) Welch's p = 0.067, p = 0.12 paired by seed",
          lambda: [*report_numbers(SMOLLM2_SEEDS, f'{TRAINING} rows="grpo" columns="pass@1"')[2:],
                   *_across_seeds_p(SMOLLM2_SEEDS, "dr_grpo_lora - grpo", "pass@1", "training phrasings")]),
    Claim("docs/real_models.md", "checking-a-gain-budgets-held-out-phrasings-seeds",
          "it finishes 96-99% of its answers instead of 54%",
          lambda: [100 * min(_base_finished(256), _base_finished(512)),
                   100 * max(_base_finished(256), _base_finished(512)), 100 * _base_finished(64)]),
    Claim("docs/real_models.md", "checking-a-gain-budgets-held-out-phrasings-seeds",
          "On 2-digit operands it goes from 0.041 at best to 0.143, on 1-digit ones from 0.303 at best to 0.562",
          lambda: [2, max(_budget_pass1("base", b, "difficulty=2") for b in (64, 256, 512)),
                   _budget_pass1("dr_grpo_s0", 512, "difficulty=2"), 1,
                   max(_budget_pass1("base", b, "difficulty=1") for b in (64, 256, 512)),
                   _budget_pass1("dr_grpo_s0", 512, "difficulty=1")]),
    Claim("docs/real_models.md", "checking-a-gain-budgets-held-out-phrasings-seeds",
          "where the base model finishes 96% of its answers", lambda: [100 * _passk_finished("base")]),
    Claim("docs/real_models.md", "checking-a-gain-budgets-held-out-phrasings-seeds",
          "finish 99.4% and 99.9% of them",
          lambda: [100 * _passk_finished("grpo_s1"), 100 * _passk_finished("dr_grpo_lora_s0")]),
    Claim("docs/benchmarks.md", "where-a-decode-step-goes",
          "A token step took 289 ms (221 tokens/s untraced, the median of 5 calls that ranged over 35.4-41.5 s",
          _decode_step),
    Claim("docs/benchmarks.md", "where-a-decode-step-goes",
          "302 ms of the traced call had an XLA operation running; the operations add up to 373 ms",
          lambda: [DECODE["covered_ms_per_step"], DECODE["op_ms_per_step"]]),
    Claim("docs/benchmarks.md", "where-a-decode-step-goes", "at 241 GFLOP/s, and 22.6 GB/s read",
          lambda: [DECODE["matmul_peak_flops"] / 1e9, DECODE["memory_bandwidth"] / 1e9]),
    Claim("docs/benchmarks.md", "where-a-decode-step-goes", "take 324 ms a step against a bound of 97 ms (30%)",
          lambda: [DECODE["bounded_ms_per_step"], DECODE["roofline_ms_per_step"],
                   100 * DECODE["roofline_ms_per_step"] / DECODE["bounded_ms_per_step"]]),
    Claim("docs/benchmarks.md", "where-a-decode-step-goes", "The weight matmuls take 66% of the op time",
          lambda: [100 * sum(p["share"] for p in DECODE["parts"] if p["part"] in WEIGHT_MATMULS)]),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer", "of TRL 1.16's `GRPOTrainer`",
          lambda: stated_in("benchmarks/results/compare_trl_smollm2_forced.json", r"trl (\d+\.\d+)\.\d+")),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer", "(GRPO with beta = 0.04",
          lambda: stated_in("benchmarks/results/compare_trl_smollm2_forced.json", r"GRPO, beta ([\d.]+)")),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer",
          "pgjax's step faults 1.1 million pages and spends 2.5 kernel-seconds doing so; TRL's faults 3.9 million "
          "and spends 53 kernel-seconds", lambda: _faults("compare_trl_smollm2_forced", "pgjax", "TRL GRPOTrainer")),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer",
          "TRL's step spent 45.7 kernel-seconds on 4.1 million page faults (about 11 microseconds each), pgjax's "
          "2.2 on 1.1 million",
          lambda: [*_faults("compare_trl_smollm2", "TRL GRPOTrainer")[::-1], _fault_microseconds("compare_trl_smollm2"),
                   *_faults("compare_trl_smollm2", "pgjax")[::-1]]),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer",
          "1.71x [1.53, 1.84] (each at its fastest)", _trl_fastest_against_fastest),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer",
          "the update, 60% of the step at 44% of the matmul peak; sampling 25%",
          lambda: [100 * FORCED["update"] / FORCED["step"], 100 * FORCED["mfu"]["update"],
                   100 * FORCED["sampling"] / FORCED["step"]]),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer",
          "the weight matmuls 66% of a 289 ms step at 56-63 GFLOP/s (23-26% of their roofline bound), attention 21% "
          "reading every cache slot at 7.4 GB/s", _decode_goal_cell),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer",
          "0.79-0.93x torch eager's time at 32 x 128 and 16 x 256",
          lambda: [*_range(_update_over("train_step_options_smollm2", "torch eager")),
                   *(n for r in result("train_step_options_smollm2")["results"] for n in (r["batch"], r["length"]))]),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer", "0.76-1.65x over",
          lambda: _range(_update_over("train_step_smollm2", "torch eager"))),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-trls-grpotrainer", "33-48% of the peak: missed",
          lambda: [100 * v for v in _range([r["mfu"][REMAT] for r in result("train_step_smollm2")["results"]])]),
    Claim("docs/benchmarks.md", "tuned-settings-on-both-sides", "(0.58 against 1.12 million a step)",
          lambda: [result("compare_trl_smollm2_tuned")["rows"][row]["minor_faults"] / 1e6
                   for row in ("pgjax, PGJAX_KEEP_FREED_MEMORY=1", "pgjax")]),
    Claim("docs/benchmarks.md", "one-grpo-step-vs-tunix", "GRPO with beta 0.04",
          lambda: stated_in("benchmarks/results/compare_tunix_smollm2.json", r"GRPO, beta ([\d.]+)")),
    Claim("docs/benchmarks.md", "cost-growth-response-length-and-group-size",
          "at 1024 tokens they take 4.3 and 14.2 s against TRL's 1.5 and 4.1 s",
          lambda: [1024, *_growth_phases(1024, "pgjax"), *_growth_phases(1024, "TRL GRPOTrainer")]),
    Claim("docs/benchmarks.md", "cost-growth-response-length-and-group-size",
          "peak RSS grows from 1.4 to 7.7 GiB over the length sweep, TRL's from 0.8 to 2.4 GiB",
          lambda: [*_growth_rss("pgjax"), *_growth_rss("TRL GRPOTrainer")]),
    Claim("docs/benchmarks.md", "training-step-vs-pytorch",
          "Torch eager's 16 x 256 step took 14.7 s with 2.1 kernel-seconds",
          lambda: [16, 256, _step("torch eager", 16, 256, "seconds"), _step("torch eager", 16, 256, "system_s")]),
    Claim("docs/benchmarks.md", "training-step-vs-pytorch",
          "from 16 x 64 to 16 x 512 (8x the tokens) pgjax's step grows 12.2x (4.7 to 57.1 s), torch eager's 16.4x "
          "(3.7 to 60.9 s) and the chunked torch row's 12.1x (4.1 to 49.9 s)",
          lambda: [16, 64, 16, 512, 8, *(v for row in (REMAT, "torch eager", "torch eager, chunked")
                                       for v in _growth(row, (16, 64), (16, 512)))]),
    Claim("docs/benchmarks.md", "training-step-vs-pytorch",
          "from 16 to 128 rows (8x), pgjax grows 8.2x (4.7 to 38.1 s), torch eager 13.6x (3.7 to 50.5 s) and the "
          "chunked row 10.3x",
          lambda: [16, 128, 8, *_growth(REMAT, (16, 64), (128, 64)), *_growth("torch eager", (16, 64), (128, 64)),
                   _growth("torch eager, chunked", (16, 64), (128, 64))[0]]),
    Claim("docs/benchmarks.md", "multi-turn-episodes-the-kv-cache-carried-across-turns",
          "generates 5.9% more tokens in all (up to 11% more in a round)", _episode_token_excess),
    Claim("docs/benchmarks.md", "page-faults-and-the-allocator", "1.25x faster at",
          lambda: [_lever_speedup("16x256", "glibc, transparent huge pages")]),
    Claim("docs/benchmarks.md", "page-faults-and-the-allocator", "and 1.07x at",
          lambda: [_lever_speedup("32x64", "glibc, transparent huge pages")]),
    Claim("docs/benchmarks.md", "page-faults-and-the-allocator", "1.35x)",
          lambda: [_lever_speedup("32x64", "pgjax's opt-in: one arena, no mmap'd blocks, no trimming")]),
    Claim("docs/benchmarks.md", "page-faults-and-the-allocator", "1.09x (",
          lambda: [_lever_speedup("32x64", "glibc, scan_layers + remat save_nothing")]),
    Claim("docs/benchmarks.md", "page-faults-and-the-allocator", "1.21x (",
          lambda: [_lever_speedup("16x256", "glibc, scan_layers + remat save_nothing")]),
    Claim("docs/benchmarks.md", "huge-pages-at-the-default-layout", "for the 1.07-1.25x above",
          lambda: [_lever_speedup("32x64", "glibc, transparent huge pages"),
                   _lever_speedup("16x256", "glibc, transparent huge pages")]),
    Claim("docs/benchmarks.md", "page-faults-and-the-allocator",
          "the GRPO step took 33.5 s with it against 33.9 s without",
          lambda: [_tuned_step("pgjax, PGJAX_KEEP_FREED_MEMORY=1"), _tuned_step("pgjax")]),
    Claim("docs/benchmarks.md", "huge-pages-at-the-default-layout",
          "pgjax's step took 41.3 s with huge pages against 33.9 s without",
          lambda: [_tuned_step("pgjax, huge pages"), _tuned_step("pgjax")]),
    Claim("docs/benchmarks.md", "the-model-options", "steps in 0.95x the unrolled row's time here",
          lambda: [statistics.median(r["seconds"]["pgjax, chunked, LoRA r16"] / r["seconds"]["pgjax, chunked"]
                                     for r in result("train_step_options_smollm2")["results"])]),
    Claim("docs/benchmarks.md", "asynchronous-rollouts-what-staleness-hides",
          "the step takes 0.140 s against 0.186 s on-policy on all 8 (0.75x)",
          lambda: [_async_step("8 devices, staleness 1, sampler on 4 of them"), _async_step("8 devices, on-policy"), 8,
                   _async_step("8 devices, staleness 1, sampler on 4 of them") / _async_step("8 devices, on-policy")]),
    Claim("docs/benchmarks.md", "the-machines-behind-the-numbers",
          "with unrolled layers without remat it reads 0.418 -> 0.875", lambda: _main_job_ends("xeon_avx512_unrolled")),
    Claim("docs/experiments.md", "the-main-job", "without remat that Xeon reads 0.418 -> 0.875",
          lambda: _main_job_ends("xeon_avx512_unrolled")),
    Claim("docs/experiments.md", "the-main-job", "(0.637 against 0.418)",
          lambda: [_main_job_ends("xeon_avx512")[0], _main_job_ends("xeon_avx512_unrolled")[0]]),
    Claim("docs/experiments.md", "countdown-and-a-math-checkpoint", "from 0.336 to 0.457 (best 0.473)",
          lambda: _evaluations("experiments/results/countdown_machines/xeon_avx512/metrics.jsonl", best=True)),
    Claim("docs/experiments.md", "difficulty", "a 1.6x relative gain against a predicted 1.5x", _std_gain),
    # theory.md
    Claim("docs/theory.md", "off-policy-what-each-correction-costs-exactly",
          "35-45% of pi's mass as `tests/test_theory_off_policy.py`",
          lambda: [100 * v for v in stated_in("tests/test_theory_off_policy.py",
                                                r"assert (0\.\d+) < np\.sum\(mdp\.prompt_probs\[:, None\] \* pi "
                                                r"\* \(w > 2\)\) < (0\.\d+)")]),
    Claim("docs/theory.md", "what-the-paper-claims-checked-exactly",
          "REINFORCE's total variance from 0.187 to 0.073 (61%) on the mixed MDP", _state_baseline_variance_cut),
    # design.md
    Claim("docs/design.md", "the-training-loop", "pays 1.2x in the update",
          lambda: [result("packing_smollm2_trained")["ratios"]["packed x2"]["ratio"]]),
    Claim("docs/design.md", "fitting-bigger-models-the-models-memory-options",
          "within 2% of float32's, and a six-step GRPO run moving p(rewarded token) as the float32 run does, "
          "within 0.02",
          lambda: [100 * _bfloat16_gradient_tolerance(),
                   *stated_in("tests/test_model_options.py", r"abs\(p16 - p32\) < ([\d.]+)")]),
    Claim("docs/real_models.md", "dr-grpo-against-grpo-from-the-gemma-3-base-model-three-seeds-each",
          "GRPO's wrong answers are 1.1 tokens longer than its right ones on average (training phrasings; "
          "Dr. GRPO's 0.3), but the gap is 0.3, 0.3 and 2.7 tokens over its three seeds (Dr. GRPO's 1.4, -0.4 "
          "and -0.1)",
          lambda: [statistics.mean(_gemma_gaps("grpo")), statistics.mean(_gemma_gaps("dr_grpo")),
                   *_gemma_gaps("grpo"), *_gemma_gaps("dr_grpo")]),
    Claim("docs/real_models.md", "dr-grpo-against-grpo-from-the-gemma-3-base-model-three-seeds-each",
          "training accuracy climbs from 0.18 to 0.58 (Dr. GRPO) and 0.53 (GRPO) by steps 31-40",
          lambda: [_gemma_window("dr_grpo", "1-10", "accuracy"), _gemma_window("dr_grpo", "31-40", "accuracy"),
                   _gemma_window("grpo", "31-40", "accuracy"), 31, 40]),
    Claim("docs/real_models.md", "dr-grpo-against-grpo-from-the-gemma-3-base-model-three-seeds-each",
          "(9.8 vs 10.0 in steps 31-40) while GRPO keeps about one token (11.4 vs 10.3)",
          lambda: [_gemma_window("dr_grpo", "31-40", "length_incorrect"),
                   _gemma_window("dr_grpo", "31-40", "length_correct"), 31, 40,
                   _gemma_window("grpo", "31-40", "length_incorrect"),
                   _gemma_window("grpo", "31-40", "length_correct")]),
    Claim("docs/real_models.md", "zero-rl-from-the-gemma-3-base-model-what-is-measured-so-far",
          "within 15 steps, and about 45% of them ran to the budget",
          lambda: [15, 100 * statistics.mean(r["truncated"] for r in records(GEMMA_ONE_SEED)
                                             if "truncated" in r and r["step"] > 15)]),
    # design.md, experiments.md: the mismatch band
    Claim("docs/design.md", "off-policy-rollouts-the-samplers-policy-is-not-the-learners",
          "tokens whose ratio leaves [0.5, 2]", lambda: _mismatch_band()),
    Claim("docs/experiments.md", "off-policy-rollouts-in-training", "masked outside [0.5, 2]",
          lambda: [stated_in("pgjax/core/algorithms.py", rf"{name}: Scalar = ([\d.]+)")[0]
                   for name in ("is_floor", "is_cap")]),
    # reliability.md
    Claim("docs/reliability.md", "the-rules", "about 0.37 s for SmolLM2-135M and 0.7 s for a 1 GiB dataset",
          lambda: [*(statistics.median(result("fingerprints")["raw"][name]["new_run_s"])
                     for name in ("SmolLM2-135M-Instruct checkpoint (float32)", "1 GiB JSONL dataset")),
                   result("fingerprints")["raw"]["1 GiB JSONL dataset"]["bytes"] / 2 ** 30]),
    # scaling.md
    Claim("docs/scaling.md", "fitting-bigger-models-scan-over-layers-remat-bfloat16-compute-lora",
          "(bfloat16: a gradient norm within 2%",
          lambda: [100 * _bfloat16_gradient_tolerance()]),
    Claim("docs/scaling.md", "will-it-fit-the-memory-planner",
          "GiB above the process's resident memory after its imports (0.20 GiB)",
          lambda: [result("plan_smollm2")["results"][0]["measured"]["baseline_kib"] / 2 ** 20]),
    # agents.md
    Claim("docs/agents.md", "episodes", "1.53x faster", lambda: [result("episodes_smollm2")["ratio"]["ratio"]]),
    Claim("docs/agents.md", "episodes", "0.69x with", lambda: [result("episodes_smollm2_obs256")["ratio"]["ratio"]]),
    Claim("docs/agents.md", "smollm2-with-the-calculator",
          "+0.828 [+0.719, +0.922] greedy (p = 3e-15) and +0.898 [+0.836, +0.953]",
          lambda: [*_paired(TOOLS, "warm_start_40 - base_no_tools", "greedy_accuracy", table=2),
                   *report_numbers(TOOLS, 'table=2 rows="warm_start_40 - base_no_tools" '
                                          'where="metric=greedy_accuracy" columns="p (exact sign-flip)"'),
                   *_paired(TOOLS, "warm_start_40 - base_no_tools", "pass@1", table=2)]),
    Claim("docs/agents.md", "smollm2-with-the-calculator",
          "solves 0.318 / 0.143 / 0.000 of the 1-, 2- and 3-digit problems greedily; the warm-started one "
          "1.000 / 0.952 / 1.000",
          lambda: [*_greedy_by_digits("base_no_tools"), 1, 2, 3, *_greedy_by_digits("warm_start_40")]),
    Claim("docs/agents.md", "smollm2-with-the-calculator", "loss fell from 1.12 to 0.000 in 40",
          lambda: stated_in("experiments/results/smollm2_tools/warm_start_40.log",
                            r"warm start 1/40: loss (\S+)\n(?:.*\n)*?warm start 40/40: loss (\S+)") + [40]),
    Claim("docs/agents.md", "what-rl-adds-after-a-short-warm-start-three-seeds",
          "accuracy goes 0.68 -> 0.95 from the first 5 steps to the last 5, and its call rate 0.87 -> 1.00",
          lambda: [*_tools_window("accuracy"), 5, 5, *_tools_window("call_rate")]),
    Claim("docs/agents.md", "what-rl-adds-after-a-short-warm-start-three-seeds",
          "its format rate fell 0.74 -> 0.42 and its replies shortened to 45 tokens",
          lambda: [*_tools_format(0), _tools_seed_cell("warm_rl", 0, "mean_episode_tokens")]),
    Claim("docs/agents.md", "what-rl-adds-after-a-short-warm-start-three-seeds",
          "Seeds 1 and 2 box more often (0.68 -> 0.93 and 0.88)",
          lambda: [1, 2, _tools_seed_cell("warm", 1, "format_rate"), _tools_seed_cell("warm_rl", 1, "format_rate"),
                   _tools_seed_cell("warm_rl", 2, "format_rate")]),
    Claim("docs/agents.md", "masking-exactly-what-training-on-observation-tokens-does",
          "per-turn rewards add 0.5 for a first turn",
          lambda: stated_in("pgjax/theory/multiturn.py", r"^TURN_REWARD = (\S+)$")),
    # reward_models.md
    Claim("docs/reward_models.md", "preference-pairs-from-a-verifiable-task",
          "the sampled accuracy was 0.155, 309 of the 640 prompts gave a pair, 510 pairs in all",
          lambda: [PAIRS["sampled_accuracy"], PAIRS["prompts_with_a_pair"], PAIRS["prompts"],
                   PAIRS["pairs"]["correct_over_incorrect"]]),
    Claim("docs/reward_models.md", "training-a-reward-model", "spans [0.28, 0.72] for 16 pairs around a certain 0.5",
          lambda: [*wilson_95(8, 16), 16, 0.5]),
    Claim("docs/reward_models.md", "training-a-process-reward-model",
          "the held-out step accuracy is above 0.9 after 16 steps",
          lambda: stated_in("tests/test_reward_trainer.py", r'stage="process_reward_model", steps=(\d+)[\s\S]*?'
                                                             r'records\[-1\]\["eval_accuracy"\] > (\S+)')[::-1]),
    Claim("docs/reward_models.md", "reward-hacking-logged-every-step", "agreement above 0.85",
          lambda: stated_in("tests/test_learned_reward.py", r"np\.mean\(agreements\) > (\S+)")),
    Claim("docs/reward_models.md", "reward-hacking-logged-every-step", "agreement stays below 0.15",
          lambda: stated_in("tests/test_learned_reward.py", r"np\.mean\(agreements\) < (\S+)")),
)

SAMPLER_GOAL = "the sampler's speed goal"
FAILED_ROW = "the score `per_example` gives a row whose rule fails"

STATED: tuple[Stated, ...] = (
    Stated("docs/benchmarks.md", "the-machines-behind-the-numbers", "torch 2.13 (2 threads)",
           "the version of PyTorch the benchmarks install"),
    Stated("docs/agents.md", "what-is-tested", "Linux 6.18, Landlock ABI 7", "the kernel the sandbox tests ran on"),
    Stated("docs/agents.md", "what-it-does-not-guarantee",
           "a kernel before 5.13 without Landlock, before 6.7 without its TCP rules, before 5.12 without "
           "`mount_setattr`", "the kernel versions that brought each sandbox layer"),
    Stated("docs/benchmarks.md", "sampler-vs-transformers-generate", "**short of the 2.5x goal**",
           SAMPLER_GOAL),
    Stated("docs/benchmarks.md", "sampler-vs-transformers-generate", "they show the sampler at the 2.5x goal",
           SAMPLER_GOAL),
    Stated("docs/benchmarks.md", "sampler-vs-transformers-generate", "weights while it runs, 0.4 GB here",
           "SmolLM2-135M's 30 layers in float32: about 106M parameters of 4 bytes (the rest is the embedding)"),
    Stated("docs/benchmarks.md", "where-a-decode-step-goes", "The 2.5x goal against transformers",
           SAMPLER_GOAL),
    Stated("docs/benchmarks.md", "memory-efficient-log-probs", "at no more than 1.5x its time",
           "the log-prob memory goal"),
    Stated("docs/experiments.md", "difficulty", "a mix with a bucket near 50% success", "a proposed experiment"),
    Stated("docs/real_models.md", "gemma-3-270m-a-base-model-from-a-chunked-package", "1.07 GB in float32",
           "Gemma 3 270M's 268M parameters of 4 bytes"),
    Stated("docs/real_models.md", "zero-rl-from-the-gemma-3-base-model-what-is-measured-so-far",
           "a token's logits cost 1.7 times the 18 layers below them",
           "the tied embedding's 168M parameters against the 18 layers' 100M"),
    Stated("docs/real_models.md", "zero-rl-from-the-gemma-3-base-model-what-is-measured-so-far",
           "At a 5x smaller learning rate", "2e-6 against 1e-5"),
    Stated("docs/scaling.md", "will-it-fit-the-memory-planner", "Leave 20% of headroom",
           "advice: the measured step peaks are 17-20% above the predicted totals"),
    Stated("docs/training.md", "logging", "(defaults: 4 x 2 x 2,000 = 16,000, 1.6 M per 1,000 steps)",
           "the defaults' arithmetic (a step logged every 10)"),
    Stated("docs/training.md", "tasks-and-rewards", "(the verifier: 1.0 correct, 0.0 otherwise)",
           "the verifier's two rewards"),
    Stated("docs/training.md", "tasks-and-rewards", "raises or returns a non-finite value 0.0",
           FAILED_ROW),
    Stated("docs/reliability.md", "the-rules", "an exception or NaN in one row is 0.0",
           FAILED_ROW),
    Stated("docs/training.md", "evaluation", "the task's verifier scores 1.0",
           "the verifier's reward for a right answer"),
    Stated("docs/population.md", "building-and-running-one", 'hparams={"kl_coef": 0.01})])', "an example's setting"),
    Stated("docs/design.md", "configuration-dataclasses-and-why-not-a-library",
           "pydantic 2.14.3, draccus 0.11.6 and tyro 1.0.16 on Python 3.11", "the versions compared"),
    Stated("docs/design.md", "configuration-dataclasses-and-why-not-a-library",
           "| mistake | pgjax | pydantic 2.14 | draccus 0.11 | tyro 1.0 |", "the versions compared"),
    Stated("docs/design.md", "array-conventions", "1.0 on response tokens that count (EOS included), 0.0 on padding",
           "the mask's two values"),
)


# --- the check


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space: a fragment may wrap anywhere."""
    return " ".join(text.split())


def problems(sections_of: Callable[[str], dict[str, str]], claims: Sequence[Claim] = CLAIMS,
             stated: Sequence[Stated] = STATED) -> list[str]:
    """What is wrong with ``claims`` and ``stated``: a fragment missing from its section, or a claimed
    number its values do not round to. ``sections_of(page)``: {anchor: the section's text} of a page."""
    found = []
    for claim in (*claims, *stated):
        section = sections_of(claim.page).get(claim.section)
        where = f"{claim.page}#{claim.section}"
        if section is None:
            found.append(f"{where}: no such section")
            continue
        if flat(claim.text) not in flat(section):
            found.append(f"{where}: {claim.text!r} is not in the section")
            continue
        if isinstance(claim, Stated):
            continue
        written, values = numbers(claim.text), list(claim.values())
        if len(written) != len(values):
            found.append(f"{where}: {claim.text!r} states {len(written)} numbers, its record gives {len(values)}")
        elif not all(agrees(w, v) for w, v in zip(written, values, strict=True)):
            shown = ", ".join(f"{v:.6g}" for v in values)
            found.append(f"{where}: {claim.text!r} differs from its record: {shown}")
    return found


def claimed_numbers(page: str, section: str) -> list[str]:
    """The numbers the claims and statements of one section hold."""
    return [n for c in (*CLAIMS, *STATED) if c.page == page and c.section == section for n in numbers(c.text)]


def main() -> int:
    cache: dict[str, dict[str, str]] = {}

    def sections_of(page):
        return cache.setdefault(page, readme_tables.sections((ROOT / page).read_text()))
    for claim in CLAIMS:
        values = ", ".join(f"{v:.6g}" for v in claim.values())
        print(f"{claim.page}#{claim.section}: {claim.text!r} <- {values}")
    found = problems(sections_of)
    summary = f"{len(CLAIMS)} claims agree with their records, {len(STATED)} statements found"
    print("\n".join(found) or summary, file=sys.stderr if found else sys.stdout)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
