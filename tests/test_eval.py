"""Evaluation: its metrics and intervals, ``evaluate`` against the Trainer's greedy accuracy, and
the command line on a trained run."""
import dataclasses
import json

import jax
import numpy as np
import pytest
from helpers import EMIT_X, EmitX, hand_percentile, slow_bootstrap_means, tiny_experiment

from pgjax import eval as eval_cli
from pgjax.config import TaskSection
from pgjax.evaluation import held_out as evaluation
from pgjax.evaluation import paired, statistics
from pgjax.rollout.collect import pad_id, sample_and_score
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.sinks import read_records
from pgjax.train.trainer import Trainer, train

METRICS = {"greedy_accuracy", "pass@1", "pass@2", "pass@4", "finish_rate", "accuracy_finished", "mean_length",
           "length_correct", "length_incorrect", "format_rate"}


def test_outcome_metrics_by_hand():
    """Three prompts, four samples each: every value by hand, the intervals from the same resamples."""
    sampled = {"correct": np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]], bool),
               "finished": np.array([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool),
               "format": np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]], bool),
               "length": np.array([[3, 5, 2, 2], [8, 8, 8, 8], [1, 2, 3, 4]])}
    metrics = evaluation.outcome_metrics(np.array([1, 0, 1], bool), sampled, ks=(1, 2), resamples=500, seed=4)
    assert list(metrics) == ["greedy_accuracy", "pass@1", "pass@2", "finish_rate", "accuracy_finished",
                             "mean_length", "length_correct", "length_incorrect", "format_rate"]
    # correct responses: lengths 3, 5 (prompt 0) and 1, 3, 4 (prompt 2); the other seven 2, 2, 8 x 4, 2
    want = {"greedy_accuracy": 2 / 3, "pass@1": 5 / 12, "pass@2": (1 - 1 / 6 + 0 + 1) / 3, "finish_rate": 7 / 12,
            "accuracy_finished": 4 / 7, "mean_length": 54 / 12, "length_correct": 16 / 5,
            "length_incorrect": 38 / 7, "format_rate": 3 / 12}
    assert {name: m["value"] for name, m in metrics.items()} == pytest.approx(want, abs=1e-15)
    assert metrics["greedy_accuracy"]["interval"] == "wilson"
    assert metrics["greedy_accuracy"]["ci95"] == list(statistics.wilson_interval(2, 3))
    # the ratio's interval: per resample, correct-and-finished over finished, resamples with none left out
    finished = np.array(slow_bootstrap_means(np.array([3, 0, 4]) / 4, 500, 4))
    both = np.array(slow_bootstrap_means(np.array([1, 0, 3]) / 4, 500, 4))
    ratio = [b / f for b, f in zip(both, finished, strict=True) if f > 0]
    assert len(ratio) < 500                         # some resamples drew only the prompt that never finishes
    np.testing.assert_allclose(metrics["accuracy_finished"]["ci95"],
                               [hand_percentile(ratio, 2.5), hand_percentile(ratio, 97.5)], atol=1e-13)
    right = np.array(slow_bootstrap_means(np.array([2, 0, 3]) / 4, 500, 4))
    right_tokens = np.array(slow_bootstrap_means(np.array([8, 0, 8]) / 4, 500, 4))
    ratio = [t / r for t, r in zip(right_tokens, right, strict=True) if r > 0]
    np.testing.assert_allclose(metrics["length_correct"]["ci95"],
                               [hand_percentile(ratio, 2.5), hand_percentile(ratio, 97.5)], atol=1e-13)
    lengths = slow_bootstrap_means(np.array([3.0, 8.0, 2.5]), 500, 4)
    np.testing.assert_allclose(metrics["mean_length"]["ci95"],
                               [hand_percentile(lengths, 2.5), hand_percentile(lengths, 97.5)], atol=1e-13)
    # nothing finished: no accuracy among finished answers; one prompt: nothing to resample
    unfinished = {**sampled, "finished": np.zeros((3, 4), bool)}
    none = evaluation.outcome_metrics(np.array([1, 0, 1], bool), unfinished, ks=(1,))["accuracy_finished"]
    assert none == {"value": None, "ci95": None, "interval": "bootstrap"}
    all_right = evaluation.outcome_metrics(np.array([1, 0, 1], bool), {**sampled, "correct": np.ones((3, 4), bool)})
    assert all_right["length_incorrect"] == {"value": None, "ci95": None, "interval": "bootstrap"}
    assert all_right["length_correct"]["value"] == 54 / 12
    one = evaluation.outcome_metrics(np.array([1], bool), {k: v[:1] for k, v in sampled.items()}, ks=(1,))
    assert one["pass@1"] == {"value": 0.5, "ci95": None, "interval": "bootstrap"}


def test_pass_at_k_differences_by_hand():
    """Three prompts, two samples each: B - A of per-prompt pass@k, its bootstrap interval (NumPy's
    percentiles of the same resampled prompts) and the exact sign-flip test where the differences lie on
    a lattice (k = 1: c_B n_A - c_A n_B = 4, 2, -2, so p = 6/8; k = n = 2: solved or not, 1, 0, 0, p = 1)."""
    def evaluation(correct, source):
        return {"samples": 2, "source": source, "decoding": {"max_new_tokens": 8},
                "metrics": {"pass@1": {}, "pass@2": {}},
                "per_prompt": {"prompt": ["p", "q", "r"], "sampled_correct": correct}}
    a, b = evaluation([0, 1, 2], "a.json"), evaluation([2, 2, 1], "b.json")
    for k, d, p_value in [(1, [1.0, 0.5, -0.5], 0.75), (2, [1.0, 0.0, 0.0], 1.0)]:
        stats = paired.pass_at_k_difference(a, b, k)
        draws = np.asarray(d)[np.random.default_rng(0).integers(0, 3, size=(statistics.RESAMPLES, 3))].mean(1)
        assert stats["difference"] == pytest.approx(np.mean(d))
        assert stats["ci95"] == pytest.approx(tuple(np.percentile(draws, [2.5, 97.5])))
        assert stats["p_value"] == pytest.approx(p_value)
    more = {**b, "samples": 3, "metrics": {"pass@2": {}},
            "per_prompt": {**b["per_prompt"], "sampled_correct": [3, 0, 1]}}
    assert paired.pass_at_k_difference(a, more, 2)["p_value"] is None        # 2 of 3 samples: no lattice
    table = paired.pass_at_k_pairs(("base", [a]), {"tuned": [b]})
    assert "| tuned - base | 8 | 1 | +0.333 |" in table and "| tuned - base | 8 | 2 | +0.333 |" in table
    assert paired.pass_at_k_pairs(("base", [a]), {"tuned": [{**b, "decoding": {"max_new_tokens": 9}}]}) is None
    with pytest.raises(ValueError, match="different prompts"):
        paired.pass_at_k_difference(a, {**b, "per_prompt": {**b["per_prompt"], "prompt": ["p", "q", "s"]}}, 1)


def test_across_runs_summary_by_hand():
    runs = [{"metrics": {"pass@1": {"value": v}, "accuracy_finished": {"value": f}}}
            for v, f in ((0.5, 0.9), (0.25, None), (0.75, 0.7))]
    summary = paired.across_runs(runs)
    assert list(summary) == ["pass@1"]                       # a metric some run lacks a value of is left out
    # mean 0.5; std: sqrt((0 + 0.0625 + 0.0625) / 2) = 0.25
    assert summary["pass@1"].pop("values") == [0.5, 0.25, 0.75]
    assert summary["pass@1"] == pytest.approx({"mean": 0.5, "std": 0.25, "min": 0.25, "max": 0.75, "runs": 3})
    assert paired.across_runs(runs[:1])["pass@1"]["std"] is None


@dataclasses.dataclass(frozen=True)
class VariedX(EmitX):
    """EmitX's reward (a response starting with ``x``) on prompts of 1..3 of a, b, x, tagged with their length
    as ``difficulty``."""
    name: str = "varied_x"

    def examples(self, n, seed=0):
        rng = np.random.default_rng(seed)
        prompts = ["".join(rng.choice(list("abx"), rng.integers(1, 4))) for _ in range(n)]
        return [{"prompt": p, "answer": "x", "difficulty": len(p)} for p in prompts]


@pytest.fixture(scope="module")
def varied(tmp_path_factory):
    """An untrained tiny policy's Trainer on 32 different VariedX prompts."""
    exp = tiny_experiment(tmp_path_factory.mktemp("varied"), task=TaskSection(name="test_eval:VariedX"),
                          eval_prompts=32)
    return exp, Trainer(exp)


def evaluate_varied(varied, **options) -> dict:
    exp, trainer = varied
    context = trainer.context
    return evaluation.evaluate(trainer.policy, context.tokenizer, context.task, context.eval_examples,
                               decoding=exp.rollout, max_prompt_tokens=exp.rollout.max_prompt_tokens,
                               eos_ids=context.eos_ids, mesh=trainer.mesh, prompt_format=context.prompt_format,
                               **options)


def test_greedy_accuracy_is_the_trainers_on_varied_prompts(varied):
    """An untrained policy answers some of 32 different prompts right: the two agree on a fraction."""
    results = evaluate_varied(varied, samples=0, key=jax.random.PRNGKey(3))
    accuracy = varied[1].evaluate()
    assert 0 < accuracy < 1 and results["metrics"]["greedy_accuracy"]["value"] == accuracy
    assert list(results["metrics"]) == ["greedy_accuracy"] and results["samples"] == 0


@pytest.fixture(scope="module")
def varied_results(varied):
    """``evaluate`` of the untrained policy on the 32 VariedX prompts, 4 samples each, in one sampler call."""
    return evaluate_varied(varied, samples=4, key=jax.random.PRNGKey(7))


def test_each_stratum_has_the_metrics_of_its_prompts(varied, varied_results):
    whole = varied_results
    per_prompt = {name: np.array(values) for name, values in whole["per_prompt"].items() if name != "tags"}
    difficulty = np.array(whole["per_prompt"]["tags"]["difficulty"])
    assert list(whole["strata"]) == ["difficulty"] and list(whole["strata"]["difficulty"]) == ["1", "2", "3"]
    for value, part in whole["strata"]["difficulty"].items():
        rows = difficulty == int(value)
        assert part["prompts"] == rows.sum()
        metrics = part["metrics"]
        assert metrics["greedy_accuracy"]["value"] == per_prompt["greedy_correct"][rows].mean()
        assert metrics["pass@1"]["value"] == pytest.approx(per_prompt["sampled_correct"][rows].mean() / 4)
        assert metrics["finish_rate"]["value"] == pytest.approx(per_prompt["sampled_finished"][rows].mean() / 4)
        assert metrics["mean_length"]["value"] == pytest.approx(per_prompt["mean_length"][rows].mean())
    assert evaluate_varied(varied, samples=0, key=jax.random.PRNGKey(7), by=())["strata"] == {}
    other_budget = {**whole, "decoding": {**whole["decoding"], "max_new_tokens": 9}}
    lines = evaluation.to_markdown([whole, other_budget]).splitlines()
    assert lines[0].startswith("| budget | prompts | stratum | greedy | pass@1 | finished |")
    assert [line.split(" | ")[:3] for line in lines[2:10]] == [
        [f"| {budget}", str(count), label] for budget in (3, 9) for count, label in
        [(32, "all")] + [(part["prompts"], f"difficulty={v}") for v, part in whole["strata"]["difficulty"].items()]]
    assert "percentile bootstrap over prompts (10000 resamples, seed 0" in lines[-1]


@pytest.mark.slow
def test_sampling_in_batches(varied, varied_results):
    exp, trainer = varied
    context, key, whole = trainer.context, jax.random.PRNGKey(7), varied_results
    batched = evaluate_varied(varied, samples=4, key=key, batch_rows=44)   # 11 prompts a call: 3, the last padded
    assert batched["per_prompt"]["greedy_correct"] == whole["per_prompt"]["greedy_correct"]
    assert all(len(batched["per_prompt"][name]) == 32 for name in ("sampled_correct", "sampled_finished", "prompt"))
    assert batched["per_prompt"]["sampled_correct"] != whole["per_prompt"]["sampled_correct"]   # other draws
    # in one call the sampled pass is sample_and_score's with the key's second half
    scored = sample_and_score(trainer.policy, context.tokenizer, context.eval_examples, exp.rollout.max_prompt_tokens,
                              jax.random.split(key)[1], exp.rollout.sampling(context.eos_ids, pad_id(context.tokenizer),
                                                                             n=4),
                              {"correct": context.task.reward_fn}, trainer.mesh, "error", context.prompt_format)
    assert whole["per_prompt"]["sampled_correct"] == (scored.scores["correct"] == 1).reshape(32, 4).sum(1).tolist()
    assert whole["per_prompt"]["sampled_finished"] == (~scored.truncated).reshape(32, 4).sum(1).tolist()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny trained run on the EMIT_X task (8 evaluation prompts, 3 new tokens)."""
    exp = tiny_experiment(tmp_path_factory.mktemp("eval"), task=EMIT_X)
    return exp, train(exp, progress=False)


def test_greedy_accuracy_is_the_trainers_evaluation(run):
    exp, directory = run
    trainer = Trainer(exp)
    trainer.restore(Checkpoints(directory / "checkpoints"))
    results = evaluation.evaluate(trainer.policy, trainer.tokenizer, trainer.task, trainer.context.eval_examples,
                                  samples=4, ks=(1, 4), decoding=exp.rollout,
                                  max_prompt_tokens=exp.rollout.max_prompt_tokens, eos_ids=trainer.context.eos_ids,
                                  key=jax.random.PRNGKey(1), mesh=trainer.mesh,
                                  prompt_format=trainer.context.prompt_format)
    greedy = results["metrics"]["greedy_accuracy"]
    assert greedy["value"] == trainer.evaluate() == read_records(directory)[-1]["eval_accuracy"]
    assert greedy["interval"] == "wilson" and greedy["ci95"][0] <= greedy["value"] <= greedy["ci95"][1]
    assert results["prompts"] == exp.eval_prompts and results["samples"] == 4
    assert set(results["metrics"]) == METRICS - {"pass@2"}
    assert results["metrics"]["pass@1"]["value"] <= results["metrics"]["pass@4"]["value"]
    with pytest.raises(ValueError, match="k=8"):
        evaluation.evaluate(trainer.policy, trainer.tokenizer, trainer.task, trainer.context.eval_examples, samples=4,
                            ks=(8,), decoding=exp.rollout, max_prompt_tokens=4, eos_ids=trainer.context.eos_ids,
                            key=jax.random.PRNGKey(1))


def test_command_line_on_a_run_prints_the_table_and_writes_json(run, tmp_path, capsys):
    exp, directory = run
    out = tmp_path / "eval.json"
    assert eval_cli.main([str(directory), "--samples", "4", "--k", "1,2,4", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| budget | prompts | stratum | greedy | pass@1 | pass@2 | pass@4 | finished |")
    assert f"| {exp.rollout.max_new_tokens} | {exp.eval_prompts} | all |" in table
    report = json.loads(out.read_text())
    assert report["task"] == EMIT_X.name and report["prompts"] == exp.eval_prompts and report["samples"] == 4
    assert set(report["metrics"]) == METRICS and report["strata"] == {}      # EmitX's examples carry no tags
    for name, metric in report["metrics"].items():
        if metric["value"] is not None:
            low, high = metric["ci95"]
            assert low <= metric["value"] <= high, name
    assert report["metrics"]["greedy_accuracy"]["value"] == read_records(directory)[-1]["eval_accuracy"]
    assert report["decoding"]["max_new_tokens"] == exp.rollout.max_new_tokens       # the run's budget
    assert report["task_options"] == exp.task.resolved_options()                      # what the prompts were
    assert report["prompt_format"] == {"chat_template": exp.task.prompt.chat_template, "system_prompt": "",
                                       "template": "{prompt}", "stop_text": ""}
    per_prompt = report["per_prompt"]                                                  # each prompt's outcomes
    assert per_prompt["prompt"] == ["ab"] * exp.eval_prompts
    assert len(per_prompt["greedy_correct"]) == len(per_prompt["sampled_correct"]) == exp.eval_prompts
    assert np.mean(per_prompt["greedy_correct"]) == report["metrics"]["greedy_accuracy"]["value"]
    assert np.mean(per_prompt["sampled_correct"]) / 4 == pytest.approx(report["metrics"]["pass@1"]["value"])
    assert np.mean(per_prompt["sampled_finished"]) / 4 == pytest.approx(report["metrics"]["finish_rate"]["value"])


@pytest.fixture(scope="module")
def reports(run, tmp_path_factory):
    """Reports of the run at budgets 2 and 3 (one file) and at 3 with another temperature."""
    directory, out = run[1], tmp_path_factory.mktemp("reports")
    common = [str(directory), "--samples", "4", "--json"]
    assert eval_cli.main([*common, str(out / "budgets.json"), "--max-new-tokens", "2,3,2"]) == 0
    assert eval_cli.main([*common, str(out / "hot.json"), "--temperature", "3"]) == 0
    return out


@pytest.mark.slow
def test_several_budgets_in_one_call(run, reports, capsys):
    report = json.loads((reports / "budgets.json").read_text())
    assert [ev["decoding"]["max_new_tokens"] for ev in report["budgets"]] == [2, 3]    # distinct, in order
    two, three = report["budgets"]
    assert two["per_prompt"]["prompt"] == three["per_prompt"]["prompt"]
    # the same key: at 3 tokens a response starts as it did at 2, so it is no shorter
    assert np.all(np.array(three["per_prompt"]["mean_length"]) >= np.array(two["per_prompt"]["mean_length"]))
    assert three["metrics"]["finish_rate"]["value"] >= two["metrics"]["finish_rate"]["value"]
    capsys.readouterr()
    assert eval_cli.main([str(run[1]), "--samples", "0", "--max-new-tokens", "2,3"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in table[2:4]] == ["| 2", "| 3"] and table[4] == ""


@pytest.mark.slow
def test_compare_command_pairs_the_reports(reports, tmp_path, capsys):
    out = tmp_path / "comparison.json"
    budgets, hot = reports / "budgets.json", reports / "hot.json"
    assert eval_cli.main(["compare", f"cold={budgets}@3", f"hot={hot},{hot}", f"short={budgets}@2",
                          "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| hot - cold | pass@1 |" in printed and "| short - hot | greedy_accuracy |" in printed
    comparison = json.loads(out.read_text())
    assert [(p["a"], p["b"]) for p in comparison["pairs"]] == [("cold", "hot"), ("cold", "short"), ("hot", "short")]
    cold, two_runs = (json.loads(budgets.read_text())["budgets"][1], json.loads(hot.read_text()))
    assert comparison["models"]["hot"]["metrics"]["pass@1"] == {
        "mean": two_runs["metrics"]["pass@1"]["value"], "std": 0.0, "min": two_runs["metrics"]["pass@1"]["value"],
        "max": two_runs["metrics"]["pass@1"]["value"], "runs": 2,
        "values": [two_runs["metrics"]["pass@1"]["value"]] * 2}
    difference = comparison["pairs"][0]["metrics"]["pass@1"]       # pooled runs: the same rate per prompt
    want = (np.array(two_runs["per_prompt"]["sampled_correct"]) - np.array(cold["per_prompt"]["sampled_correct"])) / 4
    assert difference["difference"] == pytest.approx(want.mean())
    assert difference["p_value"] == pytest.approx(statistics.sign_flip_test((want * 4).astype(int)))
    assert comparison["pairs"][0]["metrics"]["greedy_accuracy"]["p_value"] == 1.0     # greedy: the same responses


def synthetic_evaluation(prompts: list[str], budget: int, seed: int) -> dict:
    """An evaluation as ``evaluate`` returns it, of random outcomes of 4 samples per prompt (no model)."""
    rng = np.random.default_rng(seed)
    shape = (len(prompts), 4)
    greedy, correct, finished = rng.random(len(prompts)) < 0.5, rng.random(shape) < 0.4, rng.random(shape) < 0.8
    sampled = {"correct": correct, "finished": finished, "format": np.zeros(shape, bool),
               "length": rng.integers(1, budget + 1, shape)}
    return {"prompts": len(prompts), "samples": 4, "decoding": {"max_new_tokens": budget, "temperature": 1.0},
            "metrics": evaluation.outcome_metrics(greedy, sampled), "strata": {},
            "per_prompt": {"prompt": prompts, "tags": {}, "greedy_correct": greedy.astype(int).tolist(),
                           "sampled_correct": correct.sum(1).tolist(), "sampled_finished": finished.sum(1).tolist()}}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Reports without a model: budgets 2 and 3 in one file, another at 3, and one on other prompts."""
    out, prompts = tmp_path_factory.mktemp("synthetic"), [f"prompt {i}" for i in range(8)]
    reports = {"budgets": {"model": "m", "budgets": [synthetic_evaluation(prompts, 2, 0),
                                                    synthetic_evaluation(prompts, 3, 1)]},
               "hot": {"model": "h", **synthetic_evaluation(prompts, 3, 2)},
               "other": {"model": "o", **synthetic_evaluation(prompts[:4], 3, 3)}}
    for name, report in reports.items():
        (out / f"{name}.json").write_text(json.dumps(report))
    return out


def test_compare_pools_runs_per_prompt_and_summarises_them_across_runs(synthetic):
    load = paired.load_evaluation
    runs = [load(synthetic / "budgets.json", 3), load(synthetic / "hot.json")]
    base = load(synthetic / "budgets.json", 2)
    comparison = paired.compare({"base": [base], "trained": runs})
    assert comparison["models"]["trained"]["runs"] == [f"{synthetic / 'budgets.json'}@3", f"{synthetic / 'hot.json'}@3"]
    assert comparison["models"]["trained"]["budgets"] == [3] and comparison["models"]["base"]["budgets"] == [2]
    assert comparison["models"]["trained"]["metrics"]["pass@1"] == paired.across_runs(runs)["pass@1"]
    (pair,) = comparison["pairs"]
    assert (pair["a"], pair["b"]) == ("base", "trained") and list(pair["metrics"]) == ["greedy_accuracy", "pass@1",
                                                                                       "finish_rate"]
    for metric, (field, trials) in {"greedy_accuracy": ("greedy_correct", 1), "pass@1": ("sampled_correct", 4),
                                    "finish_rate": ("sampled_finished", 4)}.items():
        pooled = np.sum([r["per_prompt"][field] for r in runs], axis=0)        # successes of 2 x trials
        want = statistics.paired_difference(base["per_prompt"][field], trials, pooled, 2 * trials)
        assert pair["metrics"][metric] == want
    table = paired.to_markdown(comparison)
    assert "| trained | 2 | 3 |" in table and "| trained - base | greedy_accuracy |" in table
    # each run of a model with several: its own value, named by its place (no seeds given) or its seed
    for i, run in enumerate(runs):
        assert f"| trained | run {i + 1} | {run['metrics']['greedy_accuracy']['value']:.3f} |" in table
    assert "| base | run 1 |" not in table
    seeded = paired.to_markdown(paired.compare({"base": [base], "trained": runs}, run_seeds={"trained": [4, 7]}))
    assert "| trained | seed 4 |" in seeded and "| trained | seed 7 |" in seeded
    greedy_only = {**base, "per_prompt": {k: v for k, v in base["per_prompt"].items() if not k.startswith("sampled")}}
    assert list(paired.compare({"a": [greedy_only], "b": runs})["pairs"][0]["metrics"]) == ["greedy_accuracy"]


def test_compare_adds_the_statistics_across_seeds_where_a_model_has_several_runs(synthetic):
    """Two runs against one: the two-way bootstrap of the per-run, per-prompt rates and the one-sample t of
    the runs' rates against the single run's; two runs against two: Welch's t; the third table says so."""
    load = paired.load_evaluation
    runs = [load(synthetic / "budgets.json", 3), load(synthetic / "hot.json")]
    base = load(synthetic / "budgets.json", 2)
    comparison = paired.compare({"base": [base], "trained": runs, "again": list(reversed(runs))})
    by_pair = {(p["a"], p["b"]): p for p in comparison["pairs"]}
    for metric, (field, trials) in {"greedy_accuracy": ("greedy_correct", 1), "pass@1": ("sampled_correct", 4)}.items():
        rates = np.array([np.asarray(r["per_prompt"][field]) / trials for r in runs])
        reference = np.asarray(base["per_prompt"][field])[None] / trials
        seeds = by_pair[("base", "trained")]["across_seeds"][metric]
        assert seeds["seeds_and_prompts"] == statistics.seeds_and_prompts_bootstrap(rates, reference)
        one_sample = statistics.across_seeds(rates.mean(1), np.full(2, reference.mean()))
        assert seeds["seeds_t"]["ci95"] == one_sample["ci95"] and seeds["seeds_t"]["test"] == "one-sample t"
        flipped = by_pair[("trained", "again")]["across_seeds"][metric]["seeds_t"]
        assert flipped == statistics.welch_across_seeds(rates[::-1].mean(1), rates.mean(1))
        assert flipped["mean"] == pytest.approx(0.0, abs=1e-15)
        reverse = paired.compare({"trained": runs, "base": [base]})["pairs"][0]["across_seeds"][metric]["seeds_t"]
        assert reverse["ci95"] == pytest.approx([-one_sample["ci95"][1], -one_sample["ci95"][0]], abs=1e-15)
        assert reverse["p_value"] == pytest.approx(one_sample["p_value"], abs=1e-15)
    table = paired.to_markdown(comparison)
    assert "| trained - base | greedy_accuracy | 2, 1 |" in table and "(one-sample t) |" in table
    assert "| again - trained | pass@1 | 2, 2 |" in table and "(Welch t) |" in table
    assert "Across seeds, the runs taken as a sample" in table
    assert "across_seeds" not in paired.compare({"a": [base], "b": runs[:1]})["pairs"][0]
    # runs named by their training seeds: the same seeds pair by seed, other seeds stay Welch's
    models = {"trained": runs, "again": list(reversed(runs))}
    rates = np.array([np.asarray(r["per_prompt"]["sampled_correct"]) / 4 for r in runs])
    same = paired.compare(models, run_seeds={"trained": [0, 1], "again": [0, 1]})["pairs"][0]
    got = same["across_seeds"]["pass@1"]
    assert got["seeds_paired_t"] == {**statistics.across_seeds(rates[::-1].mean(1), rates.mean(1)),
                                     "test": "paired t by seed"}
    assert got["seeds_t"]["test"] == "Welch t"
    p = got["seeds_paired_t"]["p_value"]
    assert f"(Welch t) | {p:.3g} |" in paired.to_markdown({**comparison, "pairs": [same]})
    other = paired.compare(models, run_seeds={"trained": [0, 1], "again": [2, 3]})["pairs"][0]
    assert "seeds_paired_t" not in other["across_seeds"]["pass@1"]
    assert "(one-sample t) | - |" in table


@pytest.mark.parametrize("arguments,message", [
    (["a={budgets}@3", "b={other}"], "were evaluated on different prompts (8 against 4 prompts)"),
    (["a={budgets}", "b={hot}"], "holds budgets 2, 3: choose one"),
    (["a={hot}@5", "b={hot}"], "has no evaluation at budget 5"),
    (["a={budgets}", "b={hot}", "--budget", "4"], "has no evaluation at budget 4"),
    (["a={hot}@x", "b={hot}"], "@BUDGET with a whole number"),
    (["{hot}", "b={hot}"], "expected LABEL=REPORT.json"),
    (["a={hot}", "a={hot}"], "a label of its own"),
    (["a={hot}"], "two or more models"),
    (["a={hot}", "b={hot}", "--resamples", "999"], "resamples must be >= 10,000"),
    (["a={hot}", "b={missing}"], "not a readable pgjax.eval report"),
])
def test_compare_command_refuses_in_one_line(synthetic, capsys, arguments, message):
    names = {name: synthetic / f"{name}.json" for name in ("budgets", "hot", "other", "missing")}
    assert eval_cli.main(["compare", *(a.format(**names) for a in arguments)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("pgjax.eval compare: error:") and message in error and error.count("\n") == 1


def test_compare_refuses_prompts_that_differ_in_text(synthetic, tmp_path):
    report = json.loads((synthetic / "hot.json").read_text())
    report["per_prompt"]["prompt"][5] = "another prompt"
    (tmp_path / "changed.json").write_text(json.dumps(report))
    with pytest.raises(ValueError, match="prompt 5 differs: 'prompt 5' against 'another prompt'"):
        paired.compare({"a": [paired.load_evaluation(synthetic / "hot.json")],
                        "b": [paired.load_evaluation(tmp_path / "changed.json")]})


def test_compare_refuses_an_old_report_without_per_prompt_outcomes(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"decoding": {"max_new_tokens": 64}, "metrics": {},
                               "per_prompt": {"greedy_correct": [1]}}))
    with pytest.raises(ValueError, match="records no per-prompt prompts"):
        paired.load_evaluation(old)


@pytest.mark.parametrize("arguments,message", [
    (["--samples", "2", "--k", "1,4"], "k=4"),
    (["--task", "no_such_task"], "task.name='no_such_task' is unknown"),
    (["--set", "rollout.temperature=2"], "--set takes task options"),
    (["--k", "1,x"], "comma-separated integers"),
    (["--max-new-tokens", "64,0"], "--max-new-tokens must be >= 1"),
    (["--max-new-tokens", "64;256"], "--max-new-tokens='64;256': expected comma-separated integers"),
    (["--by", "difficulty"], "--by difficulty: the examples carry no such tag"),
    (["--batch-rows", "0"], "--batch-rows must be >= 1"),
])
def test_command_line_reports_bad_input_in_one_line(run, capsys, arguments, message):
    assert eval_cli.main([str(run[1]), *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_command_line_needs_a_model_directory_and_a_task_for_a_checkpoint(run, tmp_path, capsys):
    assert eval_cli.main([str(tmp_path / "missing"), "--task", "arithmetic"]) == 2
    assert "neither a Hugging Face checkpoint directory" in capsys.readouterr().err
    assert eval_cli.main([str(run[1] / "final")]) == 2
    assert "--task is required" in capsys.readouterr().err
