"""Evaluation: pass@k, the confidence intervals, ``evaluate`` against the Trainer's greedy accuracy, and
the command line on a trained run."""
import dataclasses
import itertools
import json
import math
from fractions import Fraction

import jax
import numpy as np
import pytest
from helpers import EMIT_X, EmitX, tiny_experiment

from pgjax import eval as eval_cli
from pgjax.train import evaluation, paired
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.experiment import TaskSection
from pgjax.train.rollout import pad_id, sample_and_score
from pgjax.train.sinks import read_records
from pgjax.train.trainer import Trainer, train

METRICS = {"greedy_accuracy", "pass@1", "pass@2", "pass@4", "finish_rate", "accuracy_finished", "mean_length",
           "length_correct", "length_incorrect", "format_rate"}


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of the k-subsets of n samples (the first c correct) holding a correct one, in float64."""
    subsets = list(itertools.combinations(range(n), k))
    return float(np.mean([any(i < c for i in subset) for subset in subsets], dtype=np.float64))


@pytest.mark.parametrize("n,k", [(1, 1), (4, 1), (4, 2), (5, 3), (6, 6), (8, 3), (10, 4)])
def test_pass_at_k_equals_enumeration_over_all_k_subsets(n, k):
    got = evaluation.pass_at_k(n, np.arange(n + 1), k)       # every c at once: vectorised over problems
    want = [brute_force_pass_at_k(n, c, k) for c in range(n + 1)]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)
    assert got.dtype == np.float64


@pytest.mark.parametrize("n,k", [(5, 1), (8, 3), (16, 8), (20, 20)])
@pytest.mark.parametrize("p", [0.0, 0.05, 0.5, 0.9, 1.0])
def test_pass_at_k_is_unbiased_for_a_bernoulli_problem(n, k, p):
    """E_c[pass_at_k(n, c, k)] over c ~ Binomial(n, p), summed exactly, is the true 1 - (1 - p)^k."""
    c = np.arange(n + 1)
    weights = np.array([math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in c])
    assert float(weights @ evaluation.pass_at_k(n, c, k)) == pytest.approx(1 - (1 - p) ** k, abs=1e-12)


def test_pass_at_k_edge_cases_and_large_n():
    assert evaluation.pass_at_k(7, 0, 3) == 0.0                           # c = 0
    assert evaluation.pass_at_k(7, 7, 3) == 1.0                           # c = n
    np.testing.assert_array_equal(evaluation.pass_at_k(5, [0, 1, 5], 5), [0.0, 1.0, 1.0])   # k = n
    assert evaluation.pass_at_k(9, 3, 1) == pytest.approx(3 / 9)          # pass@1 is the fraction correct
    # per-problem n, broadcast with c
    np.testing.assert_allclose(evaluation.pass_at_k([4, 10], [1, 3], 2),
                               [brute_force_pass_at_k(4, 1, 2), brute_force_pass_at_k(10, 3, 2)], atol=1e-14)
    # large n: binomial coefficients far beyond float range, the product form stays accurate
    n, c, k = 10_000, 37, 500
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert evaluation.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("n,c,k,match", [(3, 1, 4, "k=4 must be in"), (3, 1, 0, "k=0 must be in"),
                                         (3, 4, 1, "c .* must be in"), (3, -1, 1, "c .* must be in"),
                                         (3.0, 1, 1, "n must be integers"), (3, 0.5, 1, "c must be integers")])
def test_pass_at_k_rejects_bad_input(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        evaluation.pass_at_k(n, c, k)


def test_wilson_interval_matches_hand_computed_values():
    # z = 1.95996, z^2 = 3.84146: 0/10 -> [0, z^2 / (10 + z^2)] = [0, 0.27753]; 10/10 is its mirror image;
    # 5/10 -> 0.5 -+ (z / 1.38415) sqrt(0.025 + z^2 / 400) = [0.23659, 0.76341];
    # 1/4 -> (0.25 + 0.48018 -+ 1.95996 sqrt(0.046875 + 0.060025)) / 1.96036 = [0.04559, 0.69936]
    for (successes, trials), want in {(0, 10): (0.0, 0.27753), (10, 10): (0.72247, 1.0), (5, 10): (0.23659, 0.76341),
                                      (1, 4): (0.04559, 0.69936)}.items():
        np.testing.assert_allclose(evaluation.wilson_interval(successes, trials), want, atol=1e-5)
    for trials in range(1, 60):                   # inside [0, 1], around the observed rate, exact ends
        for successes in range(trials + 1):
            low, high = evaluation.wilson_interval(successes, trials)
            assert 0 <= low <= successes / trials <= high <= 1
            assert (low == 0) == (successes == 0) and (high == 1) == (successes == trials)
    for successes, trials in ((1, 0), (3, 2), (-1, 2)):
        with pytest.raises(ValueError, match="successes <= trials"):
            evaluation.wilson_interval(successes, trials)


def slow_bootstrap_means(column, resamples: int, seed: int) -> list[float]:
    """Each resample's mean by a Python loop, from the same draws as ``bootstrap_means`` documents."""
    idx = np.random.default_rng(seed).integers(0, len(column), size=(resamples, len(column)))
    return [math.fsum(float(column[i]) for i in row) / len(column) for row in idx]


def hand_percentile(values, q: float) -> float:
    """The q-th percentile by sorting and interpolating linearly between the order statistics."""
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def test_bootstrap_means_and_interval_equal_a_slow_loop_with_the_same_draws():
    rng = np.random.default_rng(5)
    columns = rng.normal(size=(37, 3))
    got = evaluation.bootstrap_means(columns, 2000, seed=11)
    assert got.shape == (2000, 3) and got.dtype == np.float64
    for j in range(3):
        np.testing.assert_allclose(got[:, j], slow_bootstrap_means(columns[:, j], 2000, 11), rtol=0, atol=1e-13)
    slow = slow_bootstrap_means(columns[:, 0], 2000, 11)
    np.testing.assert_allclose(evaluation.percentile_interval(got[:, 0]),
                               (hand_percentile(slow, 2.5), hand_percentile(slow, 97.5)), rtol=0, atol=1e-13)
    wide = rng.normal(size=(300, 50))                          # 3 blocks of resamples: the same draws
    np.testing.assert_allclose(evaluation.bootstrap_means(wide, 600, seed=3)[:, 7],
                               slow_bootstrap_means(wide[:, 7], 600, 3), rtol=0, atol=1e-13)
    assert not np.array_equal(evaluation.bootstrap_means(columns, 50, seed=1), evaluation.bootstrap_means(columns, 50))


def test_percentile_interval_leaves_out_undefined_resamples_and_bad_input_is_refused():
    assert evaluation.percentile_interval([np.nan, 1.0, 3.0, np.nan]) == (1.05, 2.95)
    assert evaluation.percentile_interval([np.nan, np.nan]) is None
    for bad, message in ((np.ones(3), "finite"), ([[1.0], [np.inf]], "finite"), (np.ones((0, 2)), "prompts >= 1")):
        with pytest.raises(ValueError, match=message):
            evaluation.bootstrap_means(bad)
    with pytest.raises(ValueError, match="resamples"):
        evaluation.bootstrap_means(np.ones((3, 1)), 0)


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
    assert metrics["greedy_accuracy"]["ci95"] == list(evaluation.wilson_interval(2, 3))
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


def enumerated_sign_flip_p(differences) -> Fraction:
    """P(|sum s_i d_i| >= |sum d_i|) counted over every one of the 2^P sign vectors."""
    observed = abs(sum(differences))
    signs = list(itertools.product((1, -1), repeat=len(differences)))
    hits = sum(abs(sum(s * d for s, d in zip(flip, differences, strict=True))) >= observed for flip in signs)
    return Fraction(hits, len(signs))


@pytest.mark.parametrize("differences", [[3, -1, 0, 2, 5, -4, 1, 1, -2, 6, 0, 3], [1, 1, 1, 1, 1, -1, -1],
                                         [4, 6, -2, 8, 10], [2, -2], [7], [0, 0], [1, 2, 3, -6]])
def test_sign_flip_test_equals_full_enumeration(differences):
    assert paired.sign_flip_test(differences) == pytest.approx(float(enumerated_sign_flip_p(differences)),
                                                               rel=0, abs=1e-14)


@pytest.mark.parametrize("b,c", [(0, 0), (5, 0), (7, 2), (10, 10), (12, 30), (1, 2), (40, 3)])
def test_sign_flip_test_on_greedy_outcomes_is_mcnemars_exact_test(b, c):
    """b prompts only B answers, c only A, 5 both and 4 neither: p = min(1, 2 P(X <= min(b, c))),
    X ~ Binomial(b + c, 1/2), summed exactly."""
    a = [0] * b + [1] * c + [1] * 5 + [0] * 4
    bb = [1] * b + [0] * c + [1] * 5 + [0] * 4
    tail = Fraction(sum(math.comb(b + c, j) for j in range(min(b, c) + 1)), 2 ** (b + c))
    result = paired.paired_difference(a, 1, bb, 1)
    assert result["p_value"] == pytest.approx(float(min(1, 2 * tail)), rel=1e-12, abs=0)
    assert result["difference"] == pytest.approx((b - c) / len(a))


def test_paired_difference_against_the_slow_bootstrap_and_enumeration():
    xa, xb = np.array([3, 5, 0, 8, 2, 7, 1, 4, 4, 6]), np.array([2, 1, 0, 4, 3, 4, 4, 2, 1, 4])
    d = xb / 4 - xa / 8                                          # A: 8 samples per prompt, B: 4
    result = paired.paired_difference(xa, 8, xb, 4, resamples=10_000, seed=3)
    assert result["difference"] == pytest.approx(math.fsum(d) / len(d), abs=1e-15)
    slow = slow_bootstrap_means(d, 10_000, 3)
    np.testing.assert_allclose(result["ci95"], [hand_percentile(slow, 2.5), hand_percentile(slow, 97.5)], atol=1e-13)
    assert result["p_value"] == pytest.approx(float(enumerated_sign_flip_p(list(xb * 8 - xa * 4))), abs=1e-14)
    assert paired.paired_difference(xa, 8, xa, 8)["p_value"] == 1.0
    for bad in ((xa, 8, xb, 2), (xa, 8, xb[:3], 4), (xa, 0, xb, 4)):
        with pytest.raises(ValueError, match="0 <= successes <= trials"):
            paired.paired_difference(*bad)
    with pytest.raises(ValueError, match="integers"):
        paired.sign_flip_test([0.5, 1.0])


def test_across_seeds_is_students_t_by_hand():
    """d = b - a = [0.1, 0.3, -0.1, 0.2]: mean 0.125, sd (ddof 1) sqrt(0.0291666...) = 0.170783;
    t_{0.975, 3} = 3.182446 (the table's value), half-width 3.182446 x 0.170783 / 2 = 0.271753;
    t = 0.125 / 0.0853913 = 1.463850 on 3 degrees of freedom, two-sided p = 0.239443."""
    b, a = np.array([0.6, 0.8, 0.4, 0.7]), np.array([0.5, 0.5, 0.5, 0.5])
    got = paired.across_seeds(b, a)
    assert got["mean"] == pytest.approx(0.125, abs=1e-12)
    assert got["ci95"] == pytest.approx([0.125 - 0.271753, 0.125 + 0.271753], abs=2e-6)
    assert got["p_value"] == pytest.approx(0.239443, abs=2e-6)
    assert (got["positive"], got["seeds"]) == (3, 4)
    # one setting's own mean and interval: against zeros; equal differences: no spread, the point
    assert paired.across_seeds(b, np.zeros(4))["mean"] == pytest.approx(0.625)
    same = paired.across_seeds(b, b - 0.2)
    assert same["ci95"] == pytest.approx([0.2, 0.2]) and same["p_value"] == 1.0
    for bad in (([1.0], [0.0]), ([1.0, 2.0], [0.0]), ([1.0, float("nan")], [0.0, 0.0])):
        with pytest.raises(ValueError, match="finite per-seed values, n >= 2"):
            paired.across_seeds(*bad)


def test_across_runs_summary_by_hand():
    runs = [{"metrics": {"pass@1": {"value": v}, "accuracy_finished": {"value": f}}}
            for v, f in ((0.5, 0.9), (0.25, None), (0.75, 0.7))]
    summary = paired.across_runs(runs)
    assert list(summary) == ["pass@1"]                       # a metric some run lacks a value of is left out
    # mean 0.5; std: sqrt((0 + 0.0625 + 0.0625) / 2) = 0.25
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
    assert report["task_options"] == exp.task.factory_fields()                        # what the prompts were
    assert report["prompt_format"] == {"chat_template": exp.task.chat_template, "system_prompt": "",
                                       "prompt_template": "{prompt}", "stop_text": ""}
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
        "max": two_runs["metrics"]["pass@1"]["value"], "runs": 2}
    difference = comparison["pairs"][0]["metrics"]["pass@1"]       # pooled runs: the same rate per prompt
    want = (np.array(two_runs["per_prompt"]["sampled_correct"]) - np.array(cold["per_prompt"]["sampled_correct"])) / 4
    assert difference["difference"] == pytest.approx(want.mean())
    assert difference["p_value"] == pytest.approx(paired.sign_flip_test((want * 4).astype(int)))
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
    assert (pair["a"], pair["b"]) == ("base", "trained") and list(pair["metrics"]) == list(paired.PAIRED)
    for metric, (field, trials) in {"greedy_accuracy": ("greedy_correct", 1), "pass@1": ("sampled_correct", 4),
                                    "finish_rate": ("sampled_finished", 4)}.items():
        pooled = np.sum([r["per_prompt"][field] for r in runs], axis=0)        # successes of 2 x trials
        want = paired.paired_difference(base["per_prompt"][field], trials, pooled, 2 * trials)
        assert pair["metrics"][metric] == want
    table = paired.to_markdown(comparison)
    assert "| trained | 2 | 3 |" in table and "| trained - base | greedy_accuracy |" in table
    greedy_only = {**base, "per_prompt": {k: v for k, v in base["per_prompt"].items() if not k.startswith("sampled")}}
    assert list(paired.compare({"a": [greedy_only], "b": runs})["pairs"][0]["metrics"]) == ["greedy_accuracy"]


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
