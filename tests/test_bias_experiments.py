"""The multi-seed studies (experiments/length_bias.py, experiments/difficulty_bias.py,
experiments/off_policy.py) run end to end in their smoke setting and write metrics, tables and plots;
a study run again keeps the seeds it already has; the per-difficulty weights agree with a
hand-computed example."""
import importlib.util
import json
import pathlib

import numpy as np
import pytest

EXPERIMENTS = pathlib.Path(__file__).parent.parent / "experiments"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bucket_measures_match_a_hand_computed_example():
    """K = 2, rows (difficulty, correct, token weights): group 1 (d=1): (1, 1, [.5, .5]), (1, 0, [-1, 0]);
    group 2 (d=2): (2, 0, [0, 0]), (2, 0, [0, 0]); group 3 (d=3): (3, 1, [2, 0]), (3, 1, [0, -1]).
    sum |c|: d1 = 2, d2 = 0, d3 = 3 of 5; accuracy .5, 0, 1; group 2 all wrong, group 3 all right;
    one group (group 1, weight 2) has k = 1 correct response of 2."""
    db = _load("difficulty_bias")
    weights = np.array([[.5, .5], [-1, 0], [0, 0], [0, 0], [2, 0], [0, -1]])
    got = db.bucket_measures(weights, np.array([1, 0, 0, 0, 1, 1.0]), np.array([1, 1, 2, 2, 3, 3]), 2)
    want = {"weight_1": 2.0, "weight_2": 0.0, "weight_3": 3.0, "weight_share_1": 0.4, "weight_share_2": 0.0,
            "weight_share_3": 0.6, "accuracy_1": 0.5, "accuracy_2": 0.0, "accuracy_3": 1.0,
            "solved_groups_1": 0.0, "solved_groups_2": 0.0, "solved_groups_3": 1.0,
            "failed_groups_1": 0.0, "failed_groups_2": 1.0, "failed_groups_3": 0.0,
            "groups_k1": 1.0, "weight_k1": 2.0}
    assert got == pytest.approx(want)


def test_weight_per_group_prediction_is_k_times_k_minus_k_or_its_square_root():
    db = _load("difficulty_bias")
    assert db.predicted_weight_per_group(1, 8, divide_by_std=False) == pytest.approx(7 / 16)
    assert db.predicted_weight_per_group(1, 8, divide_by_std=True) == pytest.approx((7 / 16) ** 0.5)
    assert db.predicted_weight_per_group(4, 8, divide_by_std=True) == pytest.approx(1.0)


@pytest.mark.slow
def test_length_bias_smoke_run_writes_its_metrics_table_and_plot(tmp_path):
    lb = _load("length_bias")
    summary = lb.main(["--smoke", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert set(summary) == {"grpo", "std_only", "length_only", "dr_grpo"}
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["curves"]["grpo"]["0"]["step"] == [1, 2]
    assert "| grpo |" in (tmp_path / "out" / "length_bias.md").read_text()
    assert (tmp_path / "out" / "length_bias.png").stat().st_size > 5000
    records = (tmp_path / "runs" / "length_only" / "seed0" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(records[-1])["step"] == 2
    experiment = json.loads((tmp_path / "runs" / "length_only" / "seed0" / "experiment.json").read_text())
    assert experiment["hparams"] == {"divide_by_std": 0.0, "divide_by_length": 1.0}


@pytest.mark.slow
def test_difficulty_bias_smoke_run_logs_per_difficulty_weights(tmp_path):
    db = _load("difficulty_bias")
    db.main(["--smoke", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    record = json.loads((tmp_path / "runs" / "std" / "seed0" / "metrics.jsonl").read_text().splitlines()[-1])
    for d in (1, 2, 3):
        assert {f"weight_{d}", f"weight_share_{d}", f"grad_norm_{d}", f"accuracy_{d}"} <= set(record)
    assert "| no_std | hard (3 digits) |" in (tmp_path / "out" / "difficulty_bias.md").read_text()
    assert (tmp_path / "out" / "difficulty_bias.png").stat().st_size > 5000


@pytest.mark.slow
def test_off_policy_smoke_run_logs_mismatch_and_a_second_run_keeps_the_finished_seed(tmp_path):
    op = _load("off_policy")
    op.VARIANTS = {name: op.VARIANTS[name] for name in ("s0", "s1_token_tis", "s2_clip_mu")}   # of the 12
    argv = ["--smoke", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    summary = op.main(argv)
    assert set(summary) == set(op.VARIANTS)
    record = json.loads((tmp_path / "runs" / "s1_token_tis" / "seed0" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["policy_lag"] == 1 and {"mismatch_abs", "mismatch_kl", "is_limited"} <= set(record)
    assert summary["s0"]["mismatch_abs"]["mean"] < 1e-5          # same weights, same precision: round-off
    assert "| s2_clip_mu |" in (tmp_path / "out" / "off_policy.md").read_text()
    saved = (tmp_path / "out" / "summary.json").read_text()
    import shutil
    shutil.rmtree(tmp_path / "runs")
    assert json.dumps(op.main(argv)) == json.dumps(summary)      # nothing trained again (NaN-safe compare)
    assert not (tmp_path / "runs").exists()
    assert (tmp_path / "out" / "summary.json").read_text() == saved


def test_a_study_keeps_only_seeds_every_variant_finished_under_the_same_settings(tmp_path):
    from pgjax.compare import finished_seeds
    settings = {"steps": 5, "seeds": 3, "tail": 2, "smoke": False, "overrides": ["optim.lr=0.1"]}
    curves = {"a": {"0": {"step": [1]}, "1": {"step": [1]}}, "b": {"0": {"step": [2]}}}
    path = tmp_path / "summary.json"
    assert finished_seeds(path, settings, ["a", "b"], 3) == {"a": {}, "b": {}}
    path.write_text(json.dumps({"settings": {**settings, "seeds": 2, "tail": 5}, "curves": curves}))
    assert finished_seeds(path, settings, ["a", "b"], 3) == {"a": {0: {"step": [1]}}, "b": {0: {"step": [2]}}}
    assert finished_seeds(path, settings, ["a", "b", "c"], 3) == {"a": {}, "b": {}, "c": {}}
    assert finished_seeds(path, {**settings, "overrides": []}, ["a"], 3) == {"a": {}}
    assert finished_seeds(path, {**settings, "steps": 6}, ["a"], 3) == {"a": {}}
    assert finished_seeds(path, settings, ["a"], 1) == {"a": {0: {"step": [1]}}}


def test_readme_tables_are_the_saved_results():
    readme = (EXPERIMENTS.parent / "README.md").read_text()
    for folder, name in (("length_bias", "length_bias"), ("difficulty_bias", "difficulty_bias"),
                         ("off_policy", "off_policy"), ("off_policy_warm400", "off_policy")):
        table = (EXPERIMENTS / "results" / folder / f"{name}.md").read_text().strip()
        assert table in readme, f"README's {folder} table is stale: paste experiments/results/{folder}/{name}.md"
