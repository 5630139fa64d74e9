"""benchmarks/cost_growth.py: which points it runs, the harness arguments of a point, what it reads out
of a harness results file (the committed tiny record, as ``compare_trl.py`` writes it), its table and
its plot."""
import json
import pathlib

import matplotlib.image
import pytest
from helpers import load_benchmark

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.fixture(scope="module")
def cost_growth():
    return load_benchmark("cost_growth")


def test_the_points_are_the_length_sweep_then_the_group_sweep_each_once(cost_growth):
    assert cost_growth.points([64, 128, 256], 8, [4, 8, 16], 256) == [(64, 8), (128, 8), (256, 8), (256, 4), (256, 16)]
    assert cost_growth.points([64], 8, [], 256) == [(64, 8)]


def test_a_points_harness_arguments_force_its_length_and_pass_the_rest_through(cost_growth, tmp_path):
    args, passed = cost_growth.parse(["--steps", "6", "--warmup", "2", "--rounds", "3", "--layers", "4"])
    argv = cost_growth.point_argv(512, 16, args, passed, tmp_path / "p.json")
    options = dict(zip(argv[::2], argv[1::2], strict=True))
    assert options == {"--lengths": "forced", "--new-tokens": "512", "--samples": "16", "--steps": "6",
                       "--warmup": "2", "--rounds": "3", "--layers": "4", "--json": str(tmp_path / "p.json")}


def test_a_point_reads_each_sides_median_step_memory_and_the_ratio_from_a_harness_record(cost_growth):
    record = json.loads((RESULTS / "compare_trl_tiny.json").read_text())
    row = cost_growth.point_row(16, 8, record)
    rows = record["rows"]
    assert row["seconds"] == {"pgjax": rows["pgjax"]["step"], "TRL GRPOTrainer": rows["TRL GRPOTrainer"]["step"]}
    assert row["peak_rss_gib"]["TRL GRPOTrainer"] == rows["TRL GRPOTrainer"]["peak_rss_gib"]
    ratio = row["ratio"]
    assert ratio["low"] <= ratio["ratio"] <= ratio["high"]
    assert ratio["ratio"] == pytest.approx(rows["TRL GRPOTrainer"]["step"] / rows["pgjax"]["step"], rel=1e-9)


def synthetic_rows(cost_growth):
    """Points whose seconds grow as length x group (pgjax) and twice that (TRL)."""
    return [{"new_tokens": n, "samples": g, "seconds": {"pgjax": n * g / 512, "TRL GRPOTrainer": n * g / 256},
             "peak_rss_gib": {"pgjax": 1.0 + n / 1024, "TRL GRPOTrainer": 0.5 + n / 512},
             "ratio": {"ratio": 2.0, "low": 1.9, "high": 2.1, "n": [5, 5]}}
            for n, g in cost_growth.points([64, 1024], 8, [4], 64)]


def test_the_table_has_a_row_per_point_with_both_sides_and_the_interval(cost_growth):
    lines = cost_growth.table(synthetic_rows(cost_growth))
    assert len(lines) == 2 + 3
    assert lines[2] == "| 64 | 8 | 1.00 | 2.00 | 2.00x [1.90, 2.10] | 1.1 GiB | 0.6 GiB |"
    assert lines[3] == "| 1024 | 8 | 16.00 | 32.00 | 2.00x [1.90, 2.10] | 2.0 GiB | 2.5 GiB |"
    assert lines[4].startswith("| 64 | 4 | 0.500 | 1.00 |")


def test_the_plot_is_a_two_by_two_figure_of_the_sweeps(cost_growth, tmp_path):
    path = tmp_path / "growth.png"
    cost_growth.plot(synthetic_rows(cost_growth), 8, 64, path)
    height, width, _ = matplotlib.image.imread(path).shape
    assert (width, height) == (900, 630)         # figsize (10, 7) at 90 dpi
