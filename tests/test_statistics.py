"""The statistics of every report (pgjax.evaluation.statistics) against brute-force enumeration,
hand-computed values, slow loops with the same draws, SciPy's t tests and closed-form moments: pass@k,
Wilson intervals, the percentile bootstrap, the exact sign-flip test, paired differences, Student's and
Welch's t across seeds and the two-way bootstrap over runs and prompts."""
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from helpers import enumerated_sign_flip_p, hand_percentile, slow_bootstrap_means
from scipy import stats as scipy_stats

from pgjax.evaluation import statistics


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of the k-subsets of n samples (the first c correct) holding a correct one, in float64."""
    subsets = list(itertools.combinations(range(n), k))
    return float(np.mean([any(i < c for i in subset) for subset in subsets], dtype=np.float64))


@pytest.mark.parametrize("n,k", [(1, 1), (4, 1), (4, 2), (5, 3), (6, 6), (8, 3), (10, 4)])
def test_pass_at_k_equals_enumeration_over_all_k_subsets(n, k):
    got = statistics.pass_at_k(n, np.arange(n + 1), k)       # every c at once: vectorised over problems
    want = [brute_force_pass_at_k(n, c, k) for c in range(n + 1)]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)
    assert got.dtype == np.float64


@pytest.mark.parametrize("n,k", [(5, 1), (8, 3), (16, 8), (20, 20)])
@pytest.mark.parametrize("p", [0.0, 0.05, 0.5, 0.9, 1.0])
def test_pass_at_k_is_unbiased_for_a_bernoulli_problem(n, k, p):
    """E_c[pass_at_k(n, c, k)] over c ~ Binomial(n, p), summed exactly, is the true 1 - (1 - p)^k."""
    c = np.arange(n + 1)
    weights = np.array([math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in c])
    assert float(weights @ statistics.pass_at_k(n, c, k)) == pytest.approx(1 - (1 - p) ** k, abs=1e-12)


def test_pass_at_k_edge_cases_and_large_n():
    assert statistics.pass_at_k(7, 0, 3) == 0.0                           # c = 0
    assert statistics.pass_at_k(7, 7, 3) == 1.0                           # c = n
    np.testing.assert_array_equal(statistics.pass_at_k(5, [0, 1, 5], 5), [0.0, 1.0, 1.0])   # k = n
    assert statistics.pass_at_k(9, 3, 1) == pytest.approx(3 / 9)          # pass@1 is the fraction correct
    # per-problem n, broadcast with c
    np.testing.assert_allclose(statistics.pass_at_k([4, 10], [1, 3], 2),
                               [brute_force_pass_at_k(4, 1, 2), brute_force_pass_at_k(10, 3, 2)], atol=1e-14)
    # large n: binomial coefficients far beyond float range, the product form stays accurate
    n, c, k = 10_000, 37, 500
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert statistics.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("n,c,k,match", [(3, 1, 4, "k=4 must be in"), (3, 1, 0, "k=0 must be in"),
                                         (3, 4, 1, "c .* must be in"), (3, -1, 1, "c .* must be in"),
                                         (3.0, 1, 1, "n must be integers"), (3, 0.5, 1, "c must be integers")])
def test_pass_at_k_rejects_bad_input(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        statistics.pass_at_k(n, c, k)


def test_wilson_interval_matches_hand_computed_values():
    # z = 1.95996, z^2 = 3.84146: 0/10 -> [0, z^2 / (10 + z^2)] = [0, 0.27753]; 10/10 is its mirror image;
    # 5/10 -> 0.5 -+ (z / 1.38415) sqrt(0.025 + z^2 / 400) = [0.23659, 0.76341];
    # 1/4 -> (0.25 + 0.48018 -+ 1.95996 sqrt(0.046875 + 0.060025)) / 1.96036 = [0.04559, 0.69936]
    for (successes, trials), want in {(0, 10): (0.0, 0.27753), (10, 10): (0.72247, 1.0), (5, 10): (0.23659, 0.76341),
                                      (1, 4): (0.04559, 0.69936)}.items():
        np.testing.assert_allclose(statistics.wilson_interval(successes, trials), want, atol=1e-5)
    for trials in range(1, 60):                   # inside [0, 1], around the observed rate, exact ends
        for successes in range(trials + 1):
            low, high = statistics.wilson_interval(successes, trials)
            assert 0 <= low <= successes / trials <= high <= 1
            assert (low == 0) == (successes == 0) and (high == 1) == (successes == trials)
    for successes, trials in ((1, 0), (3, 2), (-1, 2)):
        with pytest.raises(ValueError, match="successes <= trials"):
            statistics.wilson_interval(successes, trials)


def test_bootstrap_means_and_interval_equal_a_slow_loop_with_the_same_draws():
    rng = np.random.default_rng(5)
    columns = rng.normal(size=(37, 3))
    got = statistics.bootstrap_means(columns, 2000, seed=11)
    assert got.shape == (2000, 3) and got.dtype == np.float64
    for j in range(3):
        np.testing.assert_allclose(got[:, j], slow_bootstrap_means(columns[:, j], 2000, 11), rtol=0, atol=1e-13)
    slow = slow_bootstrap_means(columns[:, 0], 2000, 11)
    np.testing.assert_allclose(statistics.percentile_interval(got[:, 0]),
                               (hand_percentile(slow, 2.5), hand_percentile(slow, 97.5)), rtol=0, atol=1e-13)
    wide = rng.normal(size=(300, 50))                          # 3 blocks of resamples: the same draws
    np.testing.assert_allclose(statistics.bootstrap_means(wide, 600, seed=3)[:, 7],
                               slow_bootstrap_means(wide[:, 7], 600, 3), rtol=0, atol=1e-13)
    assert not np.array_equal(statistics.bootstrap_means(columns, 50, seed=1), statistics.bootstrap_means(columns, 50))


def test_percentile_interval_leaves_out_undefined_resamples_and_bad_input_is_refused():
    assert statistics.percentile_interval([np.nan, 1.0, 3.0, np.nan]) == (1.05, 2.95)
    assert statistics.percentile_interval([np.nan, np.nan]) is None
    for bad, message in ((np.ones(3), "finite"), ([[1.0], [np.inf]], "finite"), (np.ones((0, 2)), "prompts >= 1")):
        with pytest.raises(ValueError, match=message):
            statistics.bootstrap_means(bad)
    with pytest.raises(ValueError, match="resamples"):
        statistics.bootstrap_means(np.ones((3, 1)), 0)


@pytest.mark.parametrize("differences", [[3, -1, 0, 2, 5, -4, 1, 1, -2, 6, 0, 3], [1, 1, 1, 1, 1, -1, -1],
                                         [4, 6, -2, 8, 10], [2, -2], [7], [0, 0], [1, 2, 3, -6]])
def test_sign_flip_test_equals_full_enumeration(differences):
    assert statistics.sign_flip_test(differences) == pytest.approx(float(enumerated_sign_flip_p(differences)),
                                                               rel=0, abs=1e-14)


@pytest.mark.parametrize("b,c", [(0, 0), (5, 0), (7, 2), (10, 10), (12, 30), (1, 2), (40, 3)])
def test_sign_flip_test_on_greedy_outcomes_is_mcnemars_exact_test(b, c):
    """b prompts only B answers, c only A, 5 both and 4 neither: p = min(1, 2 P(X <= min(b, c))),
    X ~ Binomial(b + c, 1/2), summed exactly."""
    a = [0] * b + [1] * c + [1] * 5 + [0] * 4
    bb = [1] * b + [0] * c + [1] * 5 + [0] * 4
    tail = Fraction(sum(math.comb(b + c, j) for j in range(min(b, c) + 1)), 2 ** (b + c))
    result = statistics.paired_difference(a, 1, bb, 1)
    assert result["p_value"] == pytest.approx(float(min(1, 2 * tail)), rel=1e-12, abs=0)
    assert result["difference"] == pytest.approx((b - c) / len(a))


def test_paired_difference_against_the_slow_bootstrap_and_enumeration():
    xa, xb = np.array([3, 5, 0, 8, 2, 7, 1, 4, 4, 6]), np.array([2, 1, 0, 4, 3, 4, 4, 2, 1, 4])
    d = xb / 4 - xa / 8                                          # A: 8 samples per prompt, B: 4
    result = statistics.paired_difference(xa, 8, xb, 4, resamples=10_000, seed=3)
    assert result["difference"] == pytest.approx(math.fsum(d) / len(d), abs=1e-15)
    slow = slow_bootstrap_means(d, 10_000, 3)
    np.testing.assert_allclose(result["ci95"], [hand_percentile(slow, 2.5), hand_percentile(slow, 97.5)], atol=1e-13)
    assert result["p_value"] == pytest.approx(float(enumerated_sign_flip_p(list(xb * 8 - xa * 4))), abs=1e-14)
    assert statistics.paired_difference(xa, 8, xa, 8)["p_value"] == 1.0
    for bad in ((xa, 8, xb, 2), (xa, 8, xb[:3], 4), (xa, 0, xb, 4)):
        with pytest.raises(ValueError, match="0 <= successes <= trials"):
            statistics.paired_difference(*bad)
    with pytest.raises(ValueError, match="integers"):
        statistics.sign_flip_test([0.5, 1.0])


def test_across_seeds_is_students_t_by_hand():
    """d = b - a = [0.1, 0.3, -0.1, 0.2]: mean 0.125, sd (ddof 1) sqrt(0.0291666...) = 0.170783;
    t_{0.975, 3} = 3.182446 (the table's value), half-width 3.182446 x 0.170783 / 2 = 0.271753;
    t = 0.125 / 0.0853913 = 1.463850 on 3 degrees of freedom, two-sided p = 0.239443."""
    b, a = np.array([0.6, 0.8, 0.4, 0.7]), np.array([0.5, 0.5, 0.5, 0.5])
    got = statistics.across_seeds(b, a)
    assert got["mean"] == pytest.approx(0.125, abs=1e-12)
    assert got["ci95"] == pytest.approx([0.125 - 0.271753, 0.125 + 0.271753], abs=2e-6)
    assert got["p_value"] == pytest.approx(0.239443, abs=2e-6)
    assert (got["positive"], got["seeds"]) == (3, 4)
    # one setting's own mean and interval: against zeros; equal differences: no spread, the point
    assert statistics.across_seeds(b, np.zeros(4))["mean"] == pytest.approx(0.625)
    same = statistics.across_seeds(b, b - 0.2)
    assert same["ci95"] == pytest.approx([0.2, 0.2]) and same["p_value"] == 1.0
    for bad in (([1.0], [0.0]), ([1.0, 2.0], [0.0]), ([1.0, float("nan")], [0.0, 0.0])):
        with pytest.raises(ValueError, match="finite per-seed values, n >= 2"):
            statistics.across_seeds(*bad)


def test_welch_across_seeds_by_hand_and_as_scipys_unequal_variance_t_test():
    """b = [0.6, 0.8, 0.7], a = [0.5, 0.55]: means 0.7 and 0.525, variances (ddof 1) 0.01 and 0.00125,
    se^2 = 0.01 / 3 + 0.00125 / 2 = 0.00395833, dof = se^4 / ((0.01/3)^2 / 2 + (0.000625)^2 / 1)
    = 0.0000156684 / 0.0000059462 = 2.63504, t = 0.175 / 0.0629153 = 2.78152."""
    b, a = np.array([0.6, 0.8, 0.7]), np.array([0.5, 0.55])
    got = statistics.welch_across_seeds(b, a)
    se2 = 0.01 / 3 + 0.00125 / 2
    dof = se2 ** 2 / ((0.01 / 3) ** 2 / 2 + (0.00125 / 2) ** 2 / 1)
    assert got["mean"] == pytest.approx(0.175, abs=1e-12) and got["dof"] == pytest.approx(dof, rel=1e-12)
    assert dof == pytest.approx(2.63504, abs=1e-5)
    reference = scipy_stats.ttest_ind(b, a, equal_var=False)
    assert reference.statistic == pytest.approx(0.175 / np.sqrt(se2), rel=1e-12) == pytest.approx(2.78152, abs=1e-5)
    assert got["p_value"] == pytest.approx(reference.pvalue, rel=1e-10)
    assert got["ci95"] == pytest.approx(list(reference.confidence_interval(0.95)), rel=1e-10)
    rng = np.random.default_rng(3)
    for sizes in ((2, 2), (5, 3), (4, 7)):
        b, a = rng.normal(0.6, 0.1, sizes[0]), rng.normal(0.5, 0.02, sizes[1])
        got, reference = statistics.welch_across_seeds(b, a), scipy_stats.ttest_ind(b, a, equal_var=False)
        assert (got["p_value"], got["dof"]) == pytest.approx((reference.pvalue, reference.df), rel=1e-10)
        assert got["ci95"] == pytest.approx(list(reference.confidence_interval(0.95)), rel=1e-10)
        assert got["runs"] == list(sizes)
    # no spread in either: the point, and nothing to test against
    flat = statistics.welch_across_seeds([0.7, 0.7], [0.5, 0.5, 0.5])
    assert flat["ci95"] == pytest.approx([0.2, 0.2]) and flat["p_value"] == 1.0 and flat["dof"] is None
    for bad in (([1.0], [0.0, 1.0]), ([1.0, 2.0], [[0.0, 1.0]]), ([1.0, float("inf")], [0.0, 0.0])):
        with pytest.raises(ValueError, match="two runs or more each"):
            statistics.welch_across_seeds(*bad)


def crossed_bootstrap_moments(b: np.ndarray, a: np.ndarray) -> tuple[float, float]:
    """The exact mean and variance of the two-way bootstrap's draw v' C u, with C = [B; A], u the prompts'
    drawn weights and v = [w_B; -w_A] the runs' (independent multinomial counts / n). For counts of n
    draws over n items, E w = 1/n and E w w' = 11'/n^2 + (I - 11'/n)/n^2; u and v are independent, so
    E[(v' C u)^2] = tr(E[v v'] C E[u u'] C')."""
    def second_moment(n):
        ones = np.ones((n, n))
        return ones / n ** 2 + (np.eye(n) - ones / n) / n ** 2
    rb, ra, p = len(b), len(a), b.shape[1]
    runs = np.block([[second_moment(rb), -np.ones((rb, ra)) / (rb * ra)],
                     [-np.ones((ra, rb)) / (rb * ra), second_moment(ra)]])
    c = np.vstack([b, a])
    mean = b.mean() - a.mean()
    return mean, float(np.trace(runs @ c @ second_moment(p) @ c.T)) - mean ** 2


def test_the_seeds_and_prompts_bootstrap_has_the_exact_two_way_resampling_moments():
    """The draws' mean and variance against the closed form over 200,000 resamples (the variance's own
    sampling error is about 0.3%); the interval is the draws' 2.5th and 97.5th percentiles."""
    rng = np.random.default_rng(0)
    prompts = rng.random(30)
    b = np.clip(prompts + rng.normal(0.15, 0.1, (3, 1)) + rng.normal(0, 0.05, (3, 30)), 0, 1)   # run effects
    a = np.clip(prompts + rng.normal(0, 0.05, (4, 30)), 0, 1)
    draws = statistics.seeds_and_prompts_draws(b, a, resamples=200_000, seed=1)
    mean, variance = crossed_bootstrap_moments(b, a)
    assert draws.mean() == pytest.approx(mean, abs=4 * np.sqrt(variance / 200_000))
    assert draws.var() == pytest.approx(variance, rel=0.02)
    got = statistics.seeds_and_prompts_bootstrap(b, a, resamples=200_000, seed=1)
    assert got["difference"] == pytest.approx(mean, abs=1e-15) and got["runs"] == [3, 4]
    assert got["ci95"] == pytest.approx(list(np.percentile(draws, [2.5, 97.5])), abs=1e-15)
    # one run each: prompts alone are resampled, the variance that of the paired per-prompt differences
    one_b, one_a = b[:1], a[:1]
    _, prompts_only = crossed_bootstrap_moments(one_b, one_a)
    assert prompts_only == pytest.approx(np.var(one_b[0] - one_a[0]) / 30, rel=1e-12)
    assert statistics.seeds_and_prompts_draws(one_b, one_a, 100_000).var() == pytest.approx(prompts_only, rel=0.02)


def test_the_seeds_and_prompts_interval_is_wider_than_the_fixed_runs_one_when_seeds_disagree():
    """Three runs of B whose accuracies spread by seed (0.55-0.75) against one reference run on 64 prompts:
    the runs-fixed paired bootstrap of the pooled rates leaves the seed spread out; the two-way one does not."""
    rng = np.random.default_rng(5)
    reference = (rng.random(64) < 0.5).astype(np.int64)
    runs = np.stack([(rng.random(64) < rate).astype(np.int64) for rate in (0.55, 0.65, 0.75)])
    fixed = statistics.paired_difference(reference, 1, runs.sum(0), 3)
    both = statistics.seeds_and_prompts_bootstrap(runs, reference[None])
    assert both["difference"] == pytest.approx(fixed["difference"], abs=1e-12)
    assert np.diff(both["ci95"])[0] > np.diff(fixed["ci95"])[0]


def test_the_seeds_and_prompts_bootstrap_refuses_bad_input():
    good = np.full((2, 5), 0.5)
    for bad, match in (((np.full(5, 0.5), good), "rates_b must be a finite"),
                       ((good, np.full((2, 4), 0.5)), "same prompts, got 5 and 4"),
                       ((good, np.full((0, 5), 0.5)), "rates_a must be a finite"),
                       ((np.where(np.eye(2, 5) > 0, np.nan, 0.5), good), "rates_b must be a finite")):
        with pytest.raises(ValueError, match=match):
            statistics.seeds_and_prompts_bootstrap(*bad)
    with pytest.raises(ValueError, match="resamples must be >= 1"):
        statistics.seeds_and_prompts_bootstrap(good, good, resamples=0)
