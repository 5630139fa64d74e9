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
from pgjax.train import evaluation
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.experiment import TaskSection
from pgjax.train.sinks import read_records
from pgjax.train.trainer import Trainer, train

METRICS = {"greedy_accuracy", "pass@1", "pass@2", "pass@4", "format_rate", "mean_length", "truncation_rate"}


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


def test_mean_interval_is_the_normal_approximation_with_the_sample_deviation():
    # 1..5: mean 3, s = sqrt(2.5), 1.95996 * s / sqrt(5) = 1.38590
    np.testing.assert_allclose(evaluation.mean_interval([1, 2, 3, 4, 5]), (1.61410, 4.38590), atol=1e-5)
    assert evaluation.mean_interval([0, 1, 1, 0], support=(0, 1)) == (0.0, 1.0)     # clipped
    assert evaluation.mean_interval([0.5]) is None                                   # no s from one value
    with pytest.raises(ValueError, match="finite 1-D"):
        evaluation.mean_interval([1.0, np.nan])


@dataclasses.dataclass(frozen=True)
class VariedX(EmitX):
    """EmitX's reward (a response starting with ``x``) on prompts of 1..3 of a, b, x."""
    name: str = "varied_x"

    def examples(self, n, seed=0):
        rng = np.random.default_rng(seed)
        return [{"prompt": "".join(rng.choice(list("abx"), rng.integers(1, 4))), "answer": "x"} for _ in range(n)]


def test_greedy_accuracy_is_the_trainers_on_varied_prompts(tmp_path):
    """An untrained policy answers some of 32 different prompts right: the two agree on a fraction."""
    exp = tiny_experiment(tmp_path, task=TaskSection(name="test_eval:VariedX"), eval_prompts=32)
    trainer = Trainer(exp)
    results = evaluation.evaluate(trainer.policy, trainer.tokenizer, trainer.task, trainer.context.eval_examples,
                                  samples=0, decoding=exp.rollout, max_prompt_tokens=exp.rollout.max_prompt_tokens,
                                  eos_ids=trainer.context.eos_ids, key=jax.random.PRNGKey(3), mesh=trainer.mesh,
                                  prompt_format=trainer.context.prompt_format)
    accuracy = trainer.evaluate()
    assert 0 < accuracy < 1 and results["metrics"]["greedy_accuracy"]["value"] == accuracy
    assert list(results["metrics"]) == ["greedy_accuracy"] and results["samples"] == 0


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
                                  key=jax.random.PRNGKey(1), mesh=trainer.mesh, prompt_format=trainer.context.prompt_format)
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
    assert table.startswith("| metric | value | 95% CI |")
    assert all(f"| {name} |" in table for name in METRICS)
    report = json.loads(out.read_text())
    assert report["task"] == EMIT_X.name and report["prompts"] == exp.eval_prompts and report["samples"] == 4
    assert set(report["metrics"]) == METRICS
    for name, metric in report["metrics"].items():
        low, high = metric["ci95"]
        assert low <= metric["value"] <= high, name
    assert report["metrics"]["greedy_accuracy"]["value"] == read_records(directory)[-1]["eval_accuracy"]
    assert report["decoding"]["max_new_tokens"] == exp.rollout.max_new_tokens       # the run's budget
    assert report["task_options"] == exp.task.options()                               # what the prompts were
    per_prompt = report["per_prompt"]                                                  # each prompt's counts
    assert len(per_prompt["greedy_correct"]) == len(per_prompt["sampled_correct"]) == exp.eval_prompts
    assert np.mean(per_prompt["greedy_correct"]) == report["metrics"]["greedy_accuracy"]["value"]
    assert np.mean(per_prompt["sampled_correct"]) / 4 == pytest.approx(report["metrics"]["pass@1"]["value"])


@pytest.mark.parametrize("arguments,message", [
    (["--samples", "2", "--k", "1,4"], "k=4"),
    (["--task", "no_such_task"], "task.name='no_such_task' is unknown"),
    (["--set", "rollout.temperature=2"], "--set takes task options"),
    (["--k", "1,x"], "comma-separated integers"),
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
