"""What every benchmark result must carry (``benchmarks/provenance.py``, ``pgjax.evaluation.statistics``):
each results JSON records where its numbers come from (date, commit, command, CPU model and
instruction sets, cores and threads, library versions, environment) and its docs table names the
machine; a ratio of two sides is of pooled medians, with a bootstrap interval, from at least 5 steps a side."""
import json
import pathlib
import re
import sys

import numpy as np
import pytest

from pgjax.evaluation import statistics

ROOT = pathlib.Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results"



@pytest.fixture(scope="module")
def bench():
    """The benchmarks' provenance module (benchmarks/ is a folder of scripts, not a package) and the
    statistics they report with."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import provenance
    finally:
        sys.path.pop(0)
    return provenance, statistics


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.stem)
def test_every_results_file_records_where_its_numbers_come_from(bench, path):
    provenance = bench[0]
    saved = json.loads(path.read_text())
    record = saved.get("provenance")
    assert isinstance(record, dict), f"{path.name} has no provenance: re-run it (its argv: {saved.get('argv')})"
    assert [field for field in provenance.REQUIRED if field not in record] == []
    assert re.fullmatch(r"[0-9a-f]{40}", record["commit"]) and record["command"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", record["date"])
    cpu = record["cpu"]
    assert cpu["model"] and cpu["cores"] >= 1 and cpu["usable_cores"] >= 1 and isinstance(cpu["instruction_sets"], list)
    assert record["versions"]["jax"] and record["threads"]["usable_cores"] >= 1
    assert isinstance(record["environment"], dict)
    assert provenance.machine_line(record) in saved["table"][-1], "the table does not name its machine"


def test_a_ratio_is_of_pooled_medians_with_a_bootstrap_interval(bench):
    stats = bench[1]
    trl, ours = [4.0, 4.2, 3.9, 4.1, 8.0, 4.0], [2.0, 2.1, 1.9, 2.0, 2.05]
    result = stats.median_ratio(trl, ours)
    assert result["ratio"] == pytest.approx(np.median(trl) / np.median(ours)) and result["n"] == [6, 5]
    assert result["low"] <= result["ratio"] <= result["high"]
    # every resample's median lies within each side's range: the interval cannot leave min/max ratios
    assert min(trl) / max(ours) <= result["low"] and result["high"] <= max(trl) / min(ours)
    constant = stats.median_ratio([3.0] * 5, [1.5] * 5)
    assert (constant["ratio"], constant["low"], constant["high"]) == (2.0, 2.0, 2.0)
    assert stats.describe_ratio(constant) == "2.00x [2.00, 2.00]"
    interval = stats.median_interval(ours)
    assert interval["median"] == 2.0 and interval["low"] <= 2.0 <= interval["high"]


def test_the_interval_covers_the_true_ratio_about_95_percent_of_the_time(bench):
    """Coverage on lognormal step times whose true median ratio is 2: close to the nominal 95% with 10
    steps a side (a percentile bootstrap of medians is a little liberal at small n)."""
    stats = bench[1]
    rng = np.random.default_rng(0)
    covered = [(lambda r: r["low"] <= 2.0 <= r["high"])(stats.median_ratio(
        2.0 * np.exp(rng.normal(0, 0.1, 10)), np.exp(rng.normal(0, 0.1, 10)), seed=i)) for i in range(200)]
    assert 0.85 <= np.mean(covered) <= 1.0


@pytest.mark.parametrize("bad", [[1.0] * 4, [1.0, 2.0, 3.0, 4.0, float("nan")], [1.0, 2.0, 0.0, 4.0, 5.0]])
def test_too_few_or_bad_times_are_refused(bench, bad):
    with pytest.raises(ValueError, match="numerator"):
        bench[1].median_ratio(bad, [1.0] * 5)
