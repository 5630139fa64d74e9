"""The multi-seed studies (experiments/scripts/length_bias.py, experiments/scripts/difficulty_bias.py,
experiments/scripts/off_policy.py, experiments/scripts/switch_grid.py) run end to end in their smoke setting and write
metrics, tables and plots; the switch grid's committed report is regenerated from its committed records;
a study run again keeps the seeds it already has; the per-difficulty weights agree with a
hand-computed example; the real-model off-policy script (experiments/scripts/smollm2_off_policy.py) trains
and evaluates only what is missing and tables what the runs recorded."""
import json
import pathlib
import shutil

import numpy as np
import pytest
from helpers import assert_plotted, fake_commands, load_experiment_script

EXPERIMENTS = pathlib.Path(__file__).parent.parent / "experiments"


def test_bucket_measures_match_a_hand_computed_example():
    """K = 2, rows (difficulty, correct, token weights): group 1 (d=1): (1, 1, [.5, .5]), (1, 0, [-1, 0]);
    group 2 (d=2): (2, 0, [0, 0]), (2, 0, [0, 0]); group 3 (d=3): (3, 1, [2, 0]), (3, 1, [0, -1]).
    sum |c|: d1 = 2, d2 = 0, d3 = 3 of 5; accuracy .5, 0, 1; group 2 all wrong, group 3 all right;
    one group (group 1, weight 2) has k = 1 correct response of 2."""
    db = load_experiment_script("difficulty_bias")
    weights = np.array([[.5, .5], [-1, 0], [0, 0], [0, 0], [2, 0], [0, -1]])
    got = db.bucket_measures(weights, np.array([1, 0, 0, 0, 1, 1.0]), np.array([1, 1, 2, 2, 3, 3]), 2)
    want = {"weight_1": 2.0, "weight_2": 0.0, "weight_3": 3.0, "weight_share_1": 0.4, "weight_share_2": 0.0,
            "weight_share_3": 0.6, "accuracy_1": 0.5, "accuracy_2": 0.0, "accuracy_3": 1.0,
            "solved_groups_1": 0.0, "solved_groups_2": 0.0, "solved_groups_3": 1.0,
            "failed_groups_1": 0.0, "failed_groups_2": 1.0, "failed_groups_3": 0.0,
            "groups_k1": 1.0, "weight_k1": 2.0}
    assert got == pytest.approx(want)


def test_weight_per_group_prediction_is_k_times_k_minus_k_or_its_square_root():
    db = load_experiment_script("difficulty_bias")
    assert db.predicted_weight_per_group(1, 8, divide_by_std=False) == pytest.approx(7 / 16)
    assert db.predicted_weight_per_group(1, 8, divide_by_std=True) == pytest.approx((7 / 16) ** 0.5)
    assert db.predicted_weight_per_group(4, 8, divide_by_std=True) == pytest.approx(1.0)


@pytest.mark.slow
def test_length_bias_smoke_run_writes_its_metrics_table_and_plot(tmp_path):
    lb = load_experiment_script("length_bias")
    summary = lb.main(["--smoke", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert set(summary) == {"grpo", "std_only", "length_only", "dr_grpo"}
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["curves"]["grpo"]["0"]["step"] == [1, 2]
    assert "| grpo |" in (tmp_path / "out" / "length_bias.md").read_text()
    assert_plotted(tmp_path / "out" / "length_bias.png")
    records = (tmp_path / "runs" / "length_only" / "seed0" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(records[-1])["step"] == 2
    experiment = json.loads((tmp_path / "runs" / "length_only" / "seed0" / "experiment.json").read_text())
    assert experiment["algorithm"]["hparams"] == {"divide_by_std": 0.0, "divide_by_length": 1.0}


@pytest.mark.slow
def test_difficulty_bias_smoke_run_logs_per_difficulty_weights(tmp_path):
    db = load_experiment_script("difficulty_bias")
    db.main(["--smoke", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    record = json.loads((tmp_path / "runs" / "std" / "seed0" / "metrics.jsonl").read_text().splitlines()[-1])
    for d in (1, 2, 3):
        assert {f"weight_{d}", f"weight_share_{d}", f"grad_norm_{d}", f"accuracy_{d}"} <= set(record)
    assert "| no_std | hard (3 digits) |" in (tmp_path / "out" / "difficulty_bias.md").read_text()
    assert_plotted(tmp_path / "out" / "difficulty_bias.png")


@pytest.mark.slow
def test_off_policy_smoke_run_logs_mismatch_and_a_second_run_keeps_the_finished_seed(tmp_path):
    op = load_experiment_script("off_policy")
    op.VARIANTS = {name: op.VARIANTS[name] for name in ("s0", "s1_token_tis", "s2_clip_mu")}   # of the 12
    argv = ["--smoke", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    summary = op.main(argv)
    assert set(summary) == set(op.VARIANTS)
    record = json.loads((tmp_path / "runs" / "s1_token_tis" / "seed0" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["policy_lag"] == 1 and {"mismatch_abs", "mismatch_kl", "is_limited"} <= set(record)
    assert summary["s0"]["mismatch_abs"]["mean"] < 1e-5          # same weights, same precision: round-off
    assert "| s2_clip_mu |" in (tmp_path / "out" / "off_policy.md").read_text()
    saved = (tmp_path / "out" / "summary.json").read_text()
    shutil.rmtree(tmp_path / "runs")
    assert json.dumps(op.main(argv)) == json.dumps(summary)      # nothing trained again (NaN-safe compare)
    assert not (tmp_path / "runs").exists()
    assert (tmp_path / "out" / "summary.json").read_text() == saved


def _fake_smollm2_step(step: int) -> dict:
    return {"step": step, "policy_lag": step - 1, "accuracy": 0.25 * step, "mismatch_abs": 0.01 * step,
            "mismatch_abs_max": 0.1 * step, "mismatch_kl": 1e-4 * step, "mismatch_outside": 0.0,
            "is_limited": None, "time_step": 10.0 + 20.0 * (step - 1)}


def _fake_smollm2_subprocess(calls):
    """Stands in for ``pgjax.run`` (a two-step run: final/ and metrics.jsonl) and ``pgjax.eval`` (a JSON)."""
    def trained(directory, command):
        (directory / "final").mkdir(parents=True)
        records = [{"step": 0, "eval_accuracy": 0.3}, _fake_smollm2_step(1), _fake_smollm2_step(2),
                   {"step": 2, "eval_accuracy": 0.5}]
        (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    def evaluated(command):
        metric = {"value": 0.5, "ci95": [0.4, 0.6]}
        metrics = {key: metric for key in ("greedy_accuracy", "pass@1", "pass@8", "truncation_rate")}
        pathlib.Path(command[-1]).write_text(json.dumps(
            {"metrics": {**metrics, "mean_length": {"value": 20.0, "ci95": [18.0, 22.0]}}}))
    return fake_commands(calls, trained, evaluated)


def test_smollm2_off_policy_trains_and_evaluates_only_what_is_missing_and_tables_the_records(tmp_path, monkeypatch):
    from pgjax.study import jobs
    monkeypatch.syspath_prepend(str(EXPERIMENTS / "scripts"))       # its sibling import, as when run as a script
    sp = load_experiment_script("smollm2_off_policy")
    runs, out, calls = tmp_path / "runs", tmp_path / "out", []
    with pytest.raises(SystemExit, match="no variant has both a kept record"):
        sp.main(["--report", "--runs", str(runs), "--out", str(out)])
    monkeypatch.setattr(jobs.subprocess, "run", _fake_smollm2_subprocess(calls))
    (runs / "smollm2_math_s1" / "checkpoints" / "10").mkdir(parents=True)        # interrupted: resumed
    summary = sp.main(["--variants", "s1", "s2_token_tis", "--runs", str(runs), "--out", str(out)])
    trained = [c for c in calls if c[0] == "pgjax.run"]
    assert [c[-1] for c in trained] == ["--resume", "algorithm.correction=token"]
    assert "rollout.staleness=2" in trained[1] and f"run_dir={runs / 'smollm2_math_s2_token_tis'}" in trained[1]
    assert [c[1] for c in calls if c[0] == "pgjax.eval"] == [str(runs / "smollm2_math_s1"),
                                                               str(runs / "smollm2_math_s2_token_tis")]
    assert list(summary) == ["s1", "s2_token_tis"]              # the table follows VARIANTS' order
    row = summary["s1"]
    assert row["mismatch_abs"] == pytest.approx(0.015) and row["mismatch_abs_max"] == pytest.approx(0.2)
    assert row["step_seconds"] == pytest.approx(20.0) and row["wall_seconds"] == pytest.approx(40.0)
    assert np.isnan(row["is_limited"])
    assert ("| s1 | 0.500 [0.400, 0.600] | 0.500 [0.400, 0.600] | 0.500 [0.400, 0.600] | 20.0 [18.0, 22.0] "
            "| 50.0% [40.0, 60.0] | 1.50e-02 | 1.5e-04 | 0.0000 | - | 20.0 s | 0.7 min |"
            ) in (out / "smollm2_off_policy.md").read_text()
    assert_plotted(out / "smollm2_off_policy.png")
    calls.clear()
    again = sp.main(["--variants", "s1", "s2_token_tis", "--runs", str(runs), "--out", str(out)])
    assert calls == [] and json.dumps(again) == json.dumps(summary)   # trained and evaluated: left alone
    shutil.rmtree(runs)                      # RUNS gone (a new machine): the kept records and evaluations report
    assert json.dumps(sp.main(["--report", "--runs", str(runs), "--out", str(out)])) == json.dumps(summary)
    assert (out / "eval" / "smollm2_math_s1.json").exists() and calls == []


def test_a_study_keeps_only_seeds_every_variant_finished_under_the_same_settings(tmp_path):
    from pgjax.study.variants import finished_seeds
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


def test_smollm2_off_policy_reads_the_truncation_of_old_and_new_reports(monkeypatch):
    """Reports before the finish rate hold ``truncation_rate``; newer ones ``finish_rate``, its complement."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS / "scripts"))
    sp = load_experiment_script("smollm2_off_policy")
    new = sp.truncation({"finish_rate": {"value": 0.75, "ci95": [0.625, 0.875], "interval": "bootstrap"}})
    assert new == {"value": 0.25, "ci95": [0.125, 0.375]}
    old = {"value": 0.4, "ci95": [0.3, 0.5], "interval": "wilson"}
    assert sp.truncation({"truncation_rate": old}) is old


def test_the_switch_grid_report_is_regenerated_from_its_committed_records():
    """experiments/results/switch_grid/switch_grid.md is what ``--report`` computes from the records
    beside it: 32 members (2 x 2 switches x 8 seeds) that all trained to the end."""
    sg = load_experiment_script("switch_grid")
    out = EXPERIMENTS / "results" / "switch_grid"
    loaded = sg.load(out / "records")
    assert [len(seeds) for seeds in loaded["runs"].values()] == [8, 8, 8, 8]
    assert loaded["steps"] == 250 and all(records[-1]["step"] == 250 for seeds in loaded["runs"].values()
                                          for records in seeds.values())
    assert sg.report(loaded) == (out / "switch_grid.md").read_text().rstrip("\n")
    # the README's row: each switch's effect on the end greedy accuracy, and the range over the seeds
    readme = (EXPERIMENTS.parent / "README.md").read_text()
    end = {setting: np.array([sg.end_value(loaded["runs"][setting][seed], "eval_accuracy") for seed in range(8)])
           for setting in sg.SETTINGS}
    for on, off in ((((1.0, 0.0), (1.0, 1.0)), ((0.0, 0.0), (0.0, 1.0))),      # divide by std: on - off
                    (((0.0, 1.0), (1.0, 1.0)), ((0.0, 0.0), (1.0, 0.0)))):     # divide by length
        effect = sg.across_seeds(sum(end[x] for x in on) / 2, sum(end[x] for x in off) / 2)
        assert f"[{effect['mean']:+.3f} (95%: {effect['ci95'][0]:+.3f} to {effect['ci95'][1]:+.3f})]" in readme, effect
    every = np.concatenate(list(end.values()))
    assert f"[{every.min():.3f} to {every.max():.3f}]" in readme


@pytest.mark.slow
def test_switch_grid_smoke_run_trains_one_population_resumes_and_reports(tmp_path):
    sg = load_experiment_script("switch_grid")
    argv = ["--smoke", "--seeds", "2", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    text = sg.main(argv)
    saved = json.loads((tmp_path / "runs" / "population.json").read_text())
    assert len(saved["members"]) == 8 and saved["steps_done"] == 3
    assert [(m["seed"], m["hparams"]) for m in saved["members"][:3]] == [
        (0, {"divide_by_std": 0.0, "divide_by_length": 0.0}), (1, {"divide_by_std": 0.0, "divide_by_length": 0.0}),
        (0, {"divide_by_std": 0.0, "divide_by_length": 1.0})]
    assert (tmp_path / "out" / "switch_grid.png").is_file()
    assert (tmp_path / "out" / "switch_grid.md").read_text().rstrip("\n") == text
    for name in ("Dr. GRPO (neither)", "GRPO (both)", "divide by std", "divide by length", "GRPO - Dr. GRPO"):
        assert f"| {name} |" in text
    # the finished population resumed: nothing left to train, the same records and report
    assert sg.main([*argv, "--resume"]) == text

