"""``pgjax.study``: jobs run once each and resume across sessions, a run's evaluations wait for its
training, a study whose RUNS is gone keeps what it kept, reports pair every model on the same prompts;
the study files (experiments/studies/smollm2_seeds.py, experiments/studies/gemma3_seeds.py) build the commands they
document. ``subprocess.run`` is replaced: nothing trains or evaluates here."""
import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest
from helpers import assert_plotted, fake_commands, load_experiment_script

from pgjax import study as studies
from pgjax.study import jobs

EXPERIMENTS = pathlib.Path(__file__).parent.parent / "experiments"


def _fake_report(greedy, sampled_correct, samples: int, budget: int) -> dict:
    """A ``pgjax.eval --json`` report of one budget on four fixed prompts (what ``paired`` reads)."""
    from pgjax.evaluation.held_out import outcome_metrics
    correct = np.array([[i < c for i in range(samples)] for c in sampled_correct])
    sampled = {"correct": correct, "format": correct, "finished": np.ones_like(correct),
               "length": np.full(correct.shape, 10)}
    return {"prompts": 4, "samples": samples, "decoding": {"max_new_tokens": budget, "temperature": 0.7},
            "bootstrap": {"resamples": 10_000, "seed": 0}, "strata": {},
            "metrics": outcome_metrics(np.array(greedy, bool), sampled, (1,), 10_000, 0),
            "per_prompt": {"prompt": ["p0", "p1", "p2", "p3"], "greedy_correct": list(greedy),
                           "sampled_correct": list(sampled_correct), "sampled_finished": [samples] * 4}}


def job_of(study, name: str):
    """The study's job named ``name`` (a TrainJob or an EvalJob)."""
    return {str(job): job for job in study.jobs()}[name]


def lines_of(plan: str) -> dict:
    """``{job: status}`` of ``Study.plan``'s lines."""
    return {line.split()[0]: line.split(None, 1)[1] for line in plan.splitlines() if not line.startswith("left")}


def fake_subprocess(monkeypatch, base_model: str) -> list:
    """Replace ``pgjax.study``'s ``subprocess.run``: training makes ``final/`` and a two-point record,
    evaluation writes a report (the base model's worse than a trained run's); returns the calls."""
    calls = []

    def trained(directory, command):
        (directory / "final").mkdir(parents=True)
        (directory / "metrics.jsonl").write_text('{"step": 0, "eval_accuracy": 0.3}\n'
                                                 '{"step": 40, "eval_accuracy": 0.5}\n')

    def evaluated(command):
        better = command[3] != base_model
        report = _fake_report([1, 1, 1, 0] if better else [0, 1, 0, 0], [4, 3, 2, 1] if better else [1, 1, 0, 0], 4, 64)
        pathlib.Path(command[-1]).write_text(json.dumps(report))

    monkeypatch.setattr(jobs.subprocess, "run", fake_commands(calls, trained, evaluated))
    return calls


def test_smollm2_seeds_runs_each_missing_job_once_and_reports_the_paired_tables(tmp_path, monkeypatch):
    study = load_experiment_script("smollm2_seeds").STUDY
    runs, out = tmp_path / "runs", tmp_path / "out"
    arguments = ["--runs", str(runs), "--out", str(out)]
    main = lambda argv: studies.main(study, argv)      # noqa: E731
    calls = fake_subprocess(monkeypatch, "models/smollm2-135m-instruct")
    assert len(study.jobs()) == 9 + 10 * 3 + 2 + 3 and "missing" in study.plan(study.jobs(), runs, out)
    with pytest.raises(SystemExit, match="no final policy: run train:dr_grpo:0 first"):
        main(["--jobs", "eval:dr_grpo_s0:none", *arguments])
    with pytest.raises(SystemExit, match="unknown jobs"):
        main(["--jobs", "eval:dr_grpo_s7:none", *arguments])
    (runs / "dr_grpo_s0" / "checkpoints" / "10").mkdir(parents=True)            # interrupted: resumed
    main(["--jobs", "train:dr_grpo:0", "eval:base:none", "eval:dr_grpo_s0:none", *arguments])
    text = (out / "smollm2_seeds.md").read_text()
    train, base, trained = calls
    assert train[-1] == "--resume" and "seed=0" in train and f"run_dir={runs / 'dr_grpo_s0'}" in train
    assert "model.path=models/smollm2-135m-instruct" in train          # --base-model, from any directory
    for evaluation in (base, trained):
        assert evaluation[evaluation.index("--seed") + 1] == "1000" and "task.options.held_out=none" in evaluation
        assert evaluation[evaluation.index("--prompts") + 1] == "256"
    assert base[1:4] == ["models/smollm2-135m-instruct", "--task", "word_math"]
    assert trained[1] == str(runs / "dr_grpo_s0")
    assert "| dr_grpo - base | greedy_accuracy | +0.500 |" in text and "training phrasings" in text
    assert_plotted(out / "smollm2_seeds.png")
    calls.clear()
    main(["--jobs", "train:dr_grpo:0", "eval:base:none", "eval:dr_grpo_s0:none", *arguments])
    assert calls == []                                  # every output exists: nothing runs again
    lines = lines_of(study.plan(study.jobs(), runs, out))
    assert lines["eval:base:none"] == "done" and lines["eval:grpo_s1:templates"] == "missing (~6 min)"
    (runs / "grpo_s0").mkdir()                          # still training: not in the curves yet
    (runs / "grpo_s0" / "metrics.jsonl").write_text('{"step": 0, "eval_accuracy": 0.3}\n')
    main(["--report", *arguments])
    assert study.curves(out) == {"dr_grpo": {0: [(0, 0.3), (40, 0.5)]}}
    # RUNS is gone (a new machine) and OUT is kept: the run counts as trained while nothing needs its
    # policy, its curve still plots, and a job that needs the policy says to train it again
    shutil.rmtree(runs)
    assert lines_of(study.plan(study.jobs(), runs, out))["train:dr_grpo:0"] == "missing (~30 min)"   # 2 evals left
    for job in ("eval:dr_grpo_s0:templates", "eval:dr_grpo_s0:numbers", "budgets:dr_grpo_s0"):
        study.output(job_of(study, job), runs, out).parent.mkdir(exist_ok=True)
        shutil.copy(out / "eval" / "dr_grpo_s0_none.json", study.output(job_of(study, job), runs, out))
    assert lines_of(study.plan(study.jobs(), runs, out))["train:dr_grpo:0"] == "done"
    study.run_job(job_of(study, "train:dr_grpo:0"), runs, out, "models/smollm2-135m-instruct")
    assert calls == [] and study.curves(out) == {"dr_grpo": {0: [(0, 0.3), (40, 0.5)]}}
    with pytest.raises(SystemExit, match="no final policy: run train:grpo:1 first"):
        main(["--jobs", "passk:grpo_s1", *arguments])
    # a run evaluated everywhere whose record was never kept is done, and the plan says it has no curve
    (kept := studies.kept_record("dr_grpo_s0", out)).unlink()
    assert lines_of(study.plan(study.jobs(), runs, out))["train:dr_grpo:0"] == (
        "done (its record is not kept: the curves leave it out)")
    assert not kept.exists() and study.curves(out) == {}


def test_gemma3_seeds_evaluates_the_base_model_through_the_experiments_prompt_template(tmp_path, monkeypatch, capsys):
    """The base model has no experiment.json: its evaluation carries the experiment's task options, so
    its prompts, template and stop are the trained runs' (escapes as ``--set`` gives them)."""
    from pgjax.config import load as load_experiment
    study = load_experiment_script("gemma3_seeds").STUDY
    calls = fake_subprocess(monkeypatch, "models/gemma3-270m")
    runs, out = tmp_path / "runs", tmp_path / "out"
    studies.main(study, ["--jobs", "eval:base:numbers", "--runs", str(runs), "--out", str(out)])
    (base,) = calls
    sets = dict(base[i + 1].split("=", 1) for i, a in enumerate(base) if a == "--set")
    task = load_experiment(EXPERIMENTS / "gemma3_math.py").task
    assert sets["task.prompt.template"] == task.prompt.template.replace("\n", "\\n")
    assert sets["task.prompt.stop_text"] == task.prompt.stop_text and sets["task.options.held_out"] == "numbers"
    assert (sets["task.options.digits"], sets["task.options.ops"], sets["task.prompt.chat_template"]) == (
        str(task.options["digits"]), task.options["ops"], task.prompt.chat_template)
    assert list(map(str, study.jobs()))[:6] == [f"train:{m}:{s}" for m in ("dr_grpo", "grpo") for s in (0, 1, 2)]
    assert len(study.jobs()) == 6 + 7 * 3
    # one model evaluated: nothing to pair yet, so no report; asked for one, the study says so
    assert "nothing to report yet" in capsys.readouterr().out and not (out / "gemma3_seeds.md").exists()
    with pytest.raises(SystemExit, match="nothing to report yet"):
        studies.main(study, ["--report", "--runs", str(runs), "--out", str(out)])


def test_an_unpaired_evaluation_tables_each_model_and_a_variantless_job_has_no_suffix(tmp_path, monkeypatch):
    study = studies.Study(
        name="s", experiment="e.py", base_model="ckpt", methods={"m": ()}, seeds=(0,),
        references={"base": ("--task", "t")},
        evaluations=(studies.Evaluation("budgets", ("--prompts", 4), minutes=1, paired=False,
                                        titles={"": "response budgets"}),),
        train_minutes=2, machine="here")
    assert list(map(str, study.jobs())) == ["train:m:0", "budgets:base", "budgets:m_s0"]
    calls = fake_subprocess(monkeypatch, "ckpt")
    studies.main(study, ["--jobs", "budgets:base", "--runs", str(tmp_path / "r"), "--out", str(tmp_path / "o")])
    assert calls[0] == ["pgjax.eval", "ckpt", "--task", "t", "--prompts", "4",
                        "--json", str(tmp_path / "o/budgets/base.json")]
    assert "### response budgets: base" in (tmp_path / "o" / "s.md").read_text()
    assert study.plan(study.jobs(), tmp_path / "r", tmp_path / "o").splitlines()[-1] == "left: ~0.1 h on here"


@pytest.mark.parametrize("change, message", [
    ({"references": {"m_s0": ()}}, "no reference named like a trained run"),
    ({"references": {}}, "needs a reference"),
    ({"evaluations": (studies.Evaluation("eval", (), 1),) * 2}, "distinct evaluation kinds"),
])
def test_a_study_that_would_clash_is_refused(change, message):
    settings = dict(name="s", experiment="e.py", base_model="ckpt", methods={"m": ()}, seeds=(0,),
                    references={"base": ()}, evaluations=(studies.Evaluation("eval", (), 1),), train_minutes=1,
                    machine="x")
    with pytest.raises(ValueError, match=message):
        studies.Study(**{**settings, **change})


@pytest.mark.parametrize("kind, variants", [("train", {"": ()}), ("a:b", {"": ()}), ("eval", {"held_out": ()}),
                                            ("eval", {})])
def test_an_evaluation_whose_names_would_break_job_names_is_refused(kind, variants):
    with pytest.raises(ValueError, match="evaluation"):
        studies.Evaluation(kind, (), 1, variants=variants)


def test_the_training_table_averages_each_window_then_the_seeds(tmp_path):
    """Two seeds, windows of 2 steps: seed 0's accuracy 0.2, 0.4 | 0.6 and seed 1's 0.4, null | 0.8
    give 0.3 and 0.4 (mean 0.35 [0.3, 0.4]) for steps 1-2, and 0.6, 0.8 for step 3; the greedy
    evaluation is the one at the window's last step."""
    study = studies.Study(
        name="s", experiment="e.py", base_model="ckpt", methods={"m": ()}, seeds=(0, 1), references={"base": ()},
        evaluations=(studies.Evaluation("eval", (), 1),), train_minutes=1, machine="x",
        record_metrics=("accuracy", "length"), record_window=2)
    out = tmp_path / "out"
    rows = {0: [(0, None, None, 0.1), (1, 0.2, 10, None), (2, 0.4, 12, 0.5), (3, 0.6, 14, 0.7)],
            1: [(0, None, None, 0.1), (1, 0.4, 20, None), (2, None, 20, 0.3), (3, 0.8, 30, 0.9)]}
    for seed, steps in rows.items():
        path = studies.kept_record(f"m_s{seed}", out)
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps({"step": step, "accuracy": accuracy, "length": length,
                                            "eval_accuracy": evaluation}) + "\n"
                                for step, accuracy, length, evaluation in steps))
    table = study.training_table(out).splitlines()
    assert table[0] == "| method | seeds | steps | accuracy | length | greedy eval at the window's end |"
    assert table[1] == "| --- | ---: | --- | ---: | ---: | ---: |"

    def cell(a: float, b: float, digits: int) -> str:   # two seeds: the mean -+ t_{0.975, 1} sd / sqrt(2), where
        # Student t with 1 degree of freedom is the Cauchy distribution: t_{0.975, 1} = tan(0.475 pi)
        mean, half = (a + b) / 2, np.tan(0.475 * np.pi) * np.std([a, b], ddof=1) / np.sqrt(2)
        return f"{mean:.{digits}f} [{mean - half:.{digits}f}, {mean + half:.{digits}f}]"
    assert table[2] == f"| m | 2 | 1-2 | {cell(0.3, 0.4, 3)} | {cell(11.0, 20.0, 1)} | {cell(0.5, 0.3, 3)} |"
    assert table[3] == f"| m | 2 | 3-3 | {cell(0.6, 0.8, 3)} | {cell(14.0, 30.0, 1)} | {cell(0.7, 0.9, 3)} |"
    assert "95% t interval across seeds" in table[-1]
    assert dataclasses.replace(study, record_metrics=()).training_table(out) is None


def test_a_kept_record_keeps_its_machines_and_the_report_names_the_cpu_of_each_sitting(tmp_path):
    """keep_record copies machines.jsonl beside metrics.jsonl; the machines table gives each sitting's
    steps (from the step after its start to the next sitting's start, or the run's last step) and CPU,
    and a run kept without machines.jsonl says it is not recorded."""
    study = studies.Study(
        name="s", experiment="e.py", base_model="ckpt", methods={"m": ()}, seeds=(0, 1), references={},
        evaluations=(), train_minutes=1, machine="x")
    runs, out = tmp_path / "runs", tmp_path / "out"
    xeon = {"model": "Xeon", "instruction_sets": ["avx2", "avx512f"], "cores": 2, "usable_cores": 2}
    epyc = {"model": "EPYC", "instruction_sets": [], "cores": 4, "usable_cores": 3}
    for seed, sittings in ((0, [(0, xeon), (20, epyc)]), (1, None)):
        run = runs / f"m_s{seed}"
        (run / "final").mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(31)))
        if sittings:
            (run / "machines.jsonl").write_text("".join(json.dumps({"step": step, "cpu": c}) + "\n"
                                                        for step, c in sittings))
        studies.keep_record(f"m_s{seed}", runs, out)
    kept = studies.kept_record("m_s0", out).parent
    assert (kept / "machines.jsonl").read_bytes() == (runs / "m_s0" / "machines.jsonl").read_bytes()
    assert not (studies.kept_record("m_s1", out).parent / "machines.jsonl").exists()
    assert study.machines_table(out).splitlines()[2:] == [
        "| m_s0 | 1-20 | Xeon (avx2, avx512f; 2 cores) |",
        "| m_s0 | 21-30 | EPYC (no AVX; 3 cores) |",
        "| m_s1 | 1-30 | not recorded |"]
    assert "### the machines that trained each run" in study.report(runs, out)
    assert dataclasses.replace(study, seeds=(2,)).machines_table(out) is None
    assert dataclasses.replace(study, seeds=(1,)).machines_table(out) is None      # no run recorded its machine
    # a study without evaluations reads the records alone: a kept record is a finished job, RUNS or not
    shutil.rmtree(runs)
    assert [line.split()[1] for line in study.plan(study.jobs(), runs, out).splitlines()[:2]] == ["done", "done"]
    studies.kept_record("m_s1", out).unlink()
    assert study.plan(study.jobs(), runs, out).splitlines()[1].split()[1] == "missing"


def test_the_contrast_table_tests_each_methods_change_and_the_last_window_across_seeds(tmp_path):
    """Windows of 2 steps over 4 steps, three seeds each: each method's last window minus its first is
    Student's t paired by seed and B - A in the last window Welch's t (scipy's) and, with the same seeds,
    the t paired by seed (scipy's ttest_rel)."""
    from scipy import stats as scipy_stats
    study = studies.Study(
        name="s", experiment="e.py", base_model="ckpt", methods={"a": (), "b": ()}, seeds=(0, 1, 2),
        references={"base": ()}, evaluations=(studies.Evaluation("eval", (), 1),), train_minutes=1, machine="x",
        record_metrics=("length_incorrect",), record_window=2, record_contrasts=(("b", "a"),))
    out = tmp_path / "out"
    lengths = {"a": [[10, 12, 11, 13], [9, 9, 10, 12], [14, 12, 13, 13]],
               "b": [[10, 14, 20, 26], [11, 9, 15, 17], [12, 12, 22, 30]]}
    for method, seeds in lengths.items():
        for seed, values in enumerate(seeds):
            path = studies.kept_record(f"{method}_s{seed}", out)
            path.parent.mkdir(parents=True)
            path.write_text("".join(json.dumps({"step": step + 1, "length_incorrect": v}) + "\n"
                                    for step, v in enumerate(values)))
    first = {m: np.mean(np.asarray(v)[:, :2], 1) for m, v in lengths.items()}
    last = {m: np.mean(np.asarray(v)[:, 2:], 1) for m, v in lengths.items()}
    table = study.contrast_table(out).splitlines()
    assert table[0] == ("| contrast | metric | steps | seeds | mean difference | 95% CI (t across seeds) "
                        "| p (t across seeds) | p (t paired by seed) |")
    for row, method in zip(table[2:4], ("b", "a"), strict=True):
        change = last[method] - first[method]
        t = scipy_stats.ttest_1samp(change, 0.0)
        low, high = t.confidence_interval(0.95)
        assert row == (f"| {method} | length_incorrect | 1-2 -> 3-4 | 3 | {change.mean():+.1f} "
                       f"| [{low:+.1f}, {high:+.1f}] | {t.pvalue:.3g} (paired t) | - |")
    welch = scipy_stats.ttest_ind(last["b"], last["a"], equal_var=False)
    low, high = welch.confidence_interval(0.95)
    paired_p = scipy_stats.ttest_rel(last["b"], last["a"]).pvalue
    assert table[4] == (f"| b - a | length_incorrect | 3-4 | 3, 3 | {last['b'].mean() - last['a'].mean():+.1f} "
                        f"| [{low:+.1f}, {high:+.1f}] | {welch.pvalue:.3g} (Welch t) | {paired_p:.3g} |")
    studies.kept_record("a_s2", out).unlink()             # a with two seeds: Welch's t only, no pairing
    welch = scipy_stats.ttest_ind(last["b"], last["a"][:2], equal_var=False)
    low, high = welch.confidence_interval(0.95)
    assert study.contrast_table(out).splitlines()[4] == (
        f"| b - a | length_incorrect | 3-4 | 3, 2 | {last['b'].mean() - last['a'][:2].mean():+.1f} "
        f"| [{low:+.1f}, {high:+.1f}] | {welch.pvalue:.3g} (Welch t) | - |")
    assert dataclasses.replace(study, record_contrasts=()).contrast_table(out) is None
    with pytest.raises(ValueError, match="record_contrasts are \\(B, A\\) pairs of its methods"):
        dataclasses.replace(study, record_contrasts=(("b", "c"),))


def test_a_method_that_continues_another_starts_from_its_run_of_the_same_seed(tmp_path, monkeypatch):
    """experiments/studies/smollm2_tools_seeds.py: ``warm_rl`` of seed s starts from ``warm`` of seed s, waits for
    it, and keeps it needed while ``warm_rl`` is to train; the tool-prompt reference sets the tools."""
    study = load_experiment_script("smollm2_tools_seeds").STUDY
    runs, out, base = tmp_path / "runs", tmp_path / "out", "models/smollm2-135m-instruct"
    calls = fake_subprocess(monkeypatch, base)
    with pytest.raises(SystemExit, match="train:warm_rl:1: .*warm_s1 has no final policy: run train:warm:1 first"):
        study.run_job(job_of(study, "train:warm_rl:1"), runs, out, base)
    for job in ("train:warm:1", "train:warm_rl:1", "eval:base_tool_prompt"):
        study.run_job(job_of(study, job), runs, out, base)
    warm, rl, reference = calls
    assert f"model.path={base}" in warm and "steps=0" in warm and "warm_start.steps=10" in warm
    assert f"model.path={runs / 'warm_s1' / 'final'}" in rl and "seed=1" in rl and "warm_start.steps=0" in rl
    assert rl.index(f"model.path={runs / 'warm_s1' / 'final'}") < rl.index("warm_start.steps=0")
    assert reference[1] == base and "task.tools.names=calculator" in reference and "rollout.max_turns=3" in reference
    assert str(study.policy_users("warm_s1")[0]) == "train:warm_rl:1"
    # warm_s1's policy is gone with RUNS: it is not done until warm_rl_s1 and every evaluation of both are
    shutil.rmtree(runs / "warm_s1")
    assert not study.done(job_of(study, "train:warm:1"), runs, out)
    for model in ("warm_s1", "warm_rl_s1"):
        path = study.output(studies.EvalJob("eval", model), runs, out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    assert study.done(job_of(study, "train:warm:1"), runs, out)


@pytest.mark.parametrize("change, message", [
    ({"experiment": ""}, "no experiment for the methods"),
    ({"experiment": "", "experiments": {"m": "m.py"}, "methods": {"m": (), "n": ()}}, r"no experiment .*\['n'\]"),
    ({"experiment": object()}, "needs the InProcess runner"),
])
def test_a_study_refuses_a_method_without_an_experiment_its_runner_can_train(change, message):
    settings = dict(name="s", experiment="e.py", base_model="", methods={"m": ()}, seeds=(0,))
    with pytest.raises(ValueError, match=message):
        studies.Study(**{**settings, **change})


def test_method_seeds_must_name_a_method_of_the_study():
    with pytest.raises(ValueError, match="method_seeds names methods not in the study"):
        studies.Study(name="s", experiment="e.py", base_model="ckpt", methods={"m": ()}, seeds=(0,),
                      references={"base": ()}, evaluations=(studies.Evaluation("eval", (), 1),), train_minutes=1,
                      machine="x", method_seeds={"gone": (0,)})


@pytest.mark.parametrize("continues", [{"m": "m"}, {"m": "later"}, {"gone": "m"}])
def test_a_method_may_continue_only_an_earlier_method(continues):
    with pytest.raises(ValueError, match="continues an earlier method"):
        studies.Study(name="s", experiment="e.py", base_model="ckpt", methods={"m": (), "later": ()}, seeds=(0,),
                      references={"base": ()}, evaluations=(studies.Evaluation("eval", (), 1),), train_minutes=1,
                      machine="x", continues=continues)


def test_the_reward_model_study_trains_each_arm_on_its_reward_and_plots_its_training_curves(tmp_path, monkeypatch):
    """experiments/studies/smollm2_reward_model_seeds.py: both arms run GRPO with the reward model loaded, the
    verifier arm giving it weight 0 and the reward-model arm giving the verifier weight 0 (each a valid
    experiment); the plot's per-step curves are window means: seed 0's learned_reward 1, 3 | 5 and seed
    1's 2, 4 | 7 in windows of 2 steps give (2, 2.0), (3, 5.0) and (2, 3.0), (3, 7.0)."""
    from pgjax.config import load as load_experiment
    from pgjax.config import override
    module = load_experiment_script("smollm2_reward_model_seeds")
    study, runs, out = module.STUDY, tmp_path / "runs", tmp_path / "out"
    assert [str(job) for job in study.jobs() if isinstance(job, studies.TrainJob)] == [
        *(f"train:{m}:{s}" for m in ("verifier", "reward_model") for s in (0, 1, 2)), "train:reward_model_long:0"]
    names = list(map(str, study.jobs()))
    assert "eval:reward_model_long_s0" in names and "eval:reward_model_long_s1" not in names
    calls = fake_subprocess(monkeypatch, study.base_model)
    for seed in (0, 1):
        study.run_job(job_of(study, f"train:verifier:{seed}"), runs, out, study.base_model)
    study.run_job(job_of(study, "train:reward_model:0"), runs, out, study.base_model)
    sets = [[c[i + 1] for i, a in enumerate(c) if a == "--set"] for c in calls]
    base = load_experiment(EXPERIMENTS / "smollm2_math.py")
    verifier, learned = override(base, sets[0]), override(base, sets[2])
    assert (verifier.task.reward.model, verifier.task.reward.model_weight, verifier.task.reward.verifier_weight) == (
        module.REWARD_MODEL, 0.0, 1.0)
    assert (learned.task.reward.model, learned.task.reward.model_weight, learned.task.reward.verifier_weight) == (
        module.REWARD_MODEL, 1.0, 0.0)
    assert verifier.steps == learned.steps == module.RL_STEPS and verifier.algorithm == learned.algorithm
    study.run_job(job_of(study, "train:reward_model_long:0"), runs, out, study.base_model)
    long = override(base, [calls[3][i + 1] for i, a in enumerate(calls[3]) if a == "--set"])
    assert long.steps == module.LONG_STEPS and long.task == learned.task
    assert verifier.seed == 0 and override(base, sets[1]).seed == 1
    for seed, values in {0: (1.0, 3.0, 5.0), 1: (2.0, 4.0, 7.0)}.items():
        studies.kept_record(f"verifier_s{seed}", out).write_text("".join(
            json.dumps({"step": step, "learned_reward": value, "accuracy": 0.5, "eval_accuracy": 0.4 if step else None})
            + "\n" for step, value in enumerate(values, start=1)))
    windowed = dataclasses.replace(study, record_window=2)
    assert windowed.curves(out, "learned_reward")["verifier"] == {0: [(2, 2.0), (3, 5.0)], 1: [(2, 3.0), (3, 7.0)]}
    assert windowed.curves(out)["verifier"][0] == [(1, 0.4), (2, 0.4), (3, 0.4)]
    windowed.report(runs, out)
    assert_plotted(out / "smollm2_reward_model_seeds.png")


def test_seed_statistics_are_the_mean_and_students_t_interval_across_seeds():
    """Three seeds: the mean -+ t_{0.975, 2} sd / sqrt(3), where Student's t with 2 degrees of freedom has
    the closed-form quantile t_p = (2p - 1) / sqrt(2 p (1 - p)); one seed is its value, every seed equal
    a point (the mean alone), a NaN seed ``n/a``."""
    from pgjax.study.curves import seed_cell, seed_statistics
    values = np.array([0.61, 0.74, 0.70], np.float64)
    t = (2 * 0.975 - 1) / np.sqrt(2 * 0.975 * 0.025)
    half = t * values.std(ddof=1) / np.sqrt(3)
    got = seed_statistics(values)
    assert got["seeds"] == 3 and got["mean"] == pytest.approx(values.mean(), abs=1e-15)
    assert got["ci95"] == pytest.approx([values.mean() - half, values.mean() + half], rel=1e-12)
    assert seed_cell(values, ".4f") == f"{values.mean():.4f} [{values.mean() - half:.4f}, {values.mean() + half:.4f}]"
    assert seed_statistics([0.5]) == {"mean": 0.5, "ci95": None, "seeds": 1} and seed_cell([0.5]) == "0.500"
    assert seed_cell([0.25, 0.25, 0.25]) == "0.250" and seed_cell([0.5, float("nan")]) == "n/a"


def test_a_variant_study_reports_its_saved_curves_again_with_the_across_seed_interval(tmp_path):
    """``--report`` trains nothing: experiments/scripts/length_bias.py's table from a summary.json's curves
    (three seeds, tail 2), each end cell the mean over seeds of the last two steps and its t interval."""
    lb = load_experiment_script("length_bias")
    ends = {0: [4.0, 6.0], 1: [7.0, 9.0], 2: [5.0, 5.0]}          # length_correct's last two steps per seed
    curves = {seed: {"step": [1, 2, 3, 4], "length_correct": [3.0, 3.0, *last], "length_incorrect": [3.0] * 4,
                     "accuracy": [0.5] * 4} for seed, last in ends.items()}
    settings = {"steps": 4, "seeds": 3, "tail": 2, "smoke": False, "overrides": []}
    (tmp_path / "summary.json").write_text(json.dumps({"settings": settings, "summary": {},
                                                       "curves": dict.fromkeys(lb.VARIANTS, curves)}))
    summary = lb.main(["--report", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")])
    end = np.array([np.mean(last) for last in ends.values()])
    t = (2 * 0.975 - 1) / np.sqrt(2 * 0.975 * 0.025)           # Student's t quantile, 2 degrees of freedom
    half = t * end.std(ddof=1) / np.sqrt(3)
    assert summary["grpo"]["length_correct"]["end_per_seed"] == end.tolist()
    rows = (tmp_path / "length_bias.md").read_text().splitlines()
    assert rows[1] == "| --- | ---: | ---: | ---: |"
    assert rows[2] == (f"| grpo | 3.00 -> {end.mean():.2f} [{end.mean() - half:.2f}, {end.mean() + half:.2f}] "
                       "| 3.00 -> 3.00 | 0.50 -> 0.50 |")
    assert "95% t interval across seeds" in rows[-1] and not (tmp_path / "runs").exists()
    assert_plotted(tmp_path / "length_bias.png")


def test_a_variant_study_trains_each_variant_from_its_seeds_warm_start_as_the_old_overrides_did():
    """``variants.variants_study``'s in-process jobs: the warm start a ``steps=0`` run of the base, and
    each variant the base with its switches (plain names: hparams), its dotted keys, the seed's warm
    policy, no warm start of its own and the run named after it, under RUNS/<method>/seed<k>."""
    import dataclasses as dc

    from pgjax.config import Experiment, override
    from pgjax.study import variants
    base = Experiment(name="study", algorithm="dr_grpo", steps=5)
    study = variants.variants_study("s", base, {"tis": {"divide_by_std": 1.0, "rollout.staleness": 1}}, (0, 3))
    runs = pathlib.Path("/r")
    assert [str(job) for job in study.jobs()] == ["train:warm:0", "train:warm:3", "train:tis:0", "train:tis:3"]
    assert override(base, study.train_sets(studies.TrainJob("warm", 3), runs, "")) == dc.replace(
        base, seed=3, steps=0, run_dir="/r/warm/seed3")
    want = dc.replace(override(base, ["rollout.staleness=1"]), name="study_tis", seed=3, run_dir="/r/tis/seed3",
                      algorithm=dc.replace(base.algorithm, hparams={**base.algorithm.hparams, "divide_by_std": 1.0}),
                      model=dc.replace(base.model, path="/r/warm/seed3/final"),
                      warm_start=dc.replace(base.warm_start, steps=0))
    assert override(base, study.train_sets(studies.TrainJob("tis", 3), runs, "")) == want
    # nothing reads a variant's policy: without its final policy it is not done
    assert not study.done(studies.TrainJob("tis", 0), runs, runs)
    with pytest.raises(ValueError, match="warm start's method"):
        variants.variants_study("s", base, {"warm": {}}, (0,))


def test_the_comparison_is_a_study_of_the_seven_experiment_files_and_tables_its_seeds(tmp_path):
    """``pgjax.compare``: one method per algorithm, each from its own experiment file; one seed writes
    RUNS/<algorithm>, several RUNS/<algorithm>/seed<k>, and the table gives the mean over seeds and its
    interval across seeds (two seeds: t_{0.975, 1} = tan(0.475 pi))."""
    from pgjax import compare
    one = compare.comparison_study(["steps=3"], "experiments", compare.ALGORITHMS, 1)
    assert list(one.methods) == list(compare.ALGORITHMS)
    assert one.experiment_of("ppo") == "experiments/arithmetic_ppo.py"
    assert isinstance(one.runner, studies.InProcess) and one.run_name("ppo", 0) == "ppo"
    assert one.train_sets(studies.TrainJob("ppo", 0), tmp_path, "") == [f"run_dir={tmp_path / 'ppo'}", "seed=0",
                                                                         "steps=3"]
    assert compare.comparison_study([], "experiments", ("grpo",), 2).run_name("grpo", 1) == "grpo/seed1"
    run = {"start": 0.5, "best": 0.9, "curve": [(0, 0.5), (10, 0.9)]}
    results = {"grpo": {0: {**run, "final": 0.8, "steps_to_target": 10, "seconds": 10.0},
                        1: {**run, "final": 0.6, "steps_to_target": None, "seconds": 14.0}}}
    rows = compare.table(results, 0.8).splitlines()
    t = np.tan(0.475 * np.pi)
    final, wall = t * np.std([0.8, 0.6], ddof=1) / np.sqrt(2), t * np.std([10.0, 14.0], ddof=1) / np.sqrt(2)
    assert rows[2] == (f"| grpo | 0.500 | 0.700 [{0.7 - final:.3f}, {0.7 + final:.3f}] | 0.900 | 10 / - "
                       f"| 12 [{12 - wall:.0f}, {12 + wall:.0f}] |")
    assert "2 seeds" in rows[-1]
    compare.plot(results, tmp_path / "comparison.png")
    assert_plotted(tmp_path / "comparison.png")


def test_a_band_of_points_is_the_mean_and_range_of_the_seeds_that_have_each_step():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    studies.plot_points_band(ax, [[(0, 0.2), (5, 0.4)], [(0, 0.6), (3, 0.1), (5, 0.8)]], "method")
    line, = ax.get_lines()
    np.testing.assert_array_equal(line.get_xdata(), [0, 3, 5])
    np.testing.assert_allclose(line.get_ydata(), [0.4, 0.1, 0.6])       # step 3: the one seed that has it
    band = ax.collections[0].get_paths()[0].vertices
    for step, low, high in [(0, 0.2, 0.6), (3, 0.1, 0.1), (5, 0.4, 0.8)]:
        at = band[np.isclose(band[:, 0], step), 1]
        assert np.isclose(at.min(), low) and np.isclose(at.max(), high), (step, at)
    assert line.get_label() == "method"
    plt.close(fig)


EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"
STUDY_FILES = sorted(p.stem for p in (EXPERIMENTS / "studies").glob("*.py"))


def _reported(name: str) -> bool:
    """Whether study ``name`` has its report (``experiments/results/NAME/NAME.md``): a study under way
    may already keep the records of its finished runs beside it."""
    return (EXPERIMENTS / "results" / name / f"{name}.md").exists()


@pytest.mark.parametrize("name", [name for name in STUDY_FILES if not _reported(name)])
def test_a_study_not_yet_run_plans_every_job_and_the_docs_name_it_planned(name, tmp_path):
    """A study file whose results are not committed yet: its plan lists every job as missing with the
    hours it needs, and a page of docs/ names it with its --plan command and as not yet run or under way."""
    study = load_experiment_script(name).STUDY
    plan = study.plan(study.jobs(), tmp_path / "runs", tmp_path / "out").splitlines()
    assert len(plan) == len(study.jobs()) + 1 and all("missing (~" in line for line in plan[:-1])
    assert float(plan[-1].split("~")[1].split(" h")[0]) > 0
    pages = [doc.read_text() for doc in (EXPERIMENTS.parent / "docs").glob("*.md")]
    assert any(f"python experiments/studies/{name}.py --plan" in page
               and ("not yet run" in page or "under way" in page) for page in pages), \
        f"no page of docs/ names experiments/studies/{name}.py as not yet run or under way"


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in STUDY_FILES if _reported(name)])
def test_each_committed_study_report_regenerates_from_its_committed_evaluations(name, tmp_path):
    """``python experiments/studies/NAME.py --report`` on a copy of ``experiments/results/NAME`` (its
    evaluation files and kept records, no runs) writes the committed ``NAME.md`` byte for byte, and a plot
    with data drawn of the committed one's size (its bytes depend on matplotlib's version): every table
    a study reports comes from the records beside it."""
    committed = EXPERIMENTS / "results" / name
    out = tmp_path / name
    shutil.copytree(committed, out)
    for made in (out / f"{name}.md", out / f"{name}.png"):
        made.unlink()
    import matplotlib.image
    load_experiment_script(name).STUDY.report(tmp_path / "no_runs", out)
    assert (out / f"{name}.md").read_text() == (committed / f"{name}.md").read_text(), \
        f"experiments/results/{name}/{name}.md is stale: run python experiments/studies/{name}.py --report"
    assert_plotted(out / f"{name}.png")
    size = [matplotlib.image.imread(path).shape for path in (out / f"{name}.png", committed / f"{name}.png")]
    assert size[0] == size[1], f"{name}.png is stale: run python experiments/studies/{name}.py --report"


def test_the_committed_seven_algorithm_comparison_regenerates_from_its_kept_records(tmp_path):
    """``python -m pgjax.compare --report --out experiments/results/comparison`` on a copy (the kept records
    and comparison.json, no runs) writes the committed comparison.md byte for byte, one row per algorithm."""
    from pgjax import compare
    committed = EXPERIMENTS / "results" / "comparison"
    out = tmp_path / "comparison"
    shutil.copytree(committed, out)
    (out / "comparison.md").unlink()
    results = compare.report(out)
    assert list(results) == list(compare.ALGORITHMS)
    assert (out / "comparison.md").read_text() == (committed / "comparison.md").read_text(), \
        "experiments/results/comparison/comparison.md is stale: run python -m pgjax.compare --report " \
        "--out experiments/results/comparison"
    assert_plotted(out / "comparison.png")
