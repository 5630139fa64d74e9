"""The vmapped toy lab: one compiled call equals a loop of single runs, learns, and the
experiment file writes its CSV and plot."""
import csv

import jax
import numpy as np
import pytest

from pgjax.theory import lab
from pgjax.theory import mdp as mdp_lib


@pytest.fixture(scope="module")
def setup():
    mdp = mdp_lib.make_mdp(vocab=3, horizon=3, prompts=3, reward="outcome", seed=0)
    return mdp, mdp_lib.shared_policy(mdp), lab.default_algorithms()


@pytest.mark.slow
def test_vmapped_grid_equals_a_loop_of_single_runs(setup):
    mdp, policy, algorithms = setup
    lrs, seeds, steps = (0.5, 2.0), 2, 6
    curves = lab.run_grid(mdp, policy, algorithms, lrs, seeds, k=4, steps=steps, init_scale=0.3)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    for a in (0, 3, 5, 6):
        train = jax.jit(lab.make_train(mdp, policy, algorithms[a], k=4, steps=steps))
        for li, lr in enumerate(lrs):
            for s in range(seeds):
                theta0 = 0.3 * jax.random.normal(keys[s], policy[1])
                single = train(keys[s], lr, theta0)
                np.testing.assert_allclose(curves[a, li, s], np.asarray(single), rtol=1e-5, atol=1e-6)
    # the curve starts at the exact J of theta0, and algorithms really differ
    theta0 = 0.3 * jax.random.normal(keys[0], policy[1])
    np.testing.assert_allclose(curves[:, :, 0, 0], float(mdp_lib.objective(mdp, policy[0](theta0))), rtol=1e-6)
    assert np.ptp(curves[:, 1, 0, -1]) > 1e-3


def test_zero_learning_rate_keeps_j_constant(setup):
    mdp, policy, algorithms = setup
    curves = lab.run_grid(mdp, policy, algorithms, (0.0,), 1, k=2, steps=4)
    np.testing.assert_allclose(curves, curves[..., :1].repeat(5, axis=-1), rtol=1e-6)


@pytest.mark.slow
def test_every_algorithm_learns(setup):
    mdp, policy, algorithms = setup
    curves = lab.run_grid(mdp, policy, algorithms, (3.0,), 4, k=4, steps=30)
    j0 = curves[0, 0, 0, 0]
    final = curves[:, 0, :, -1].mean(axis=1)
    assert np.all(final > j0 + 0.2), (j0, final)


@pytest.mark.slow
def test_toy_ablation_experiment_writes_csv_table_and_plot(tmp_path):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).parent.parent / "experiments" / "scripts" / "toy_ablation.py"
    spec = importlib.util.spec_from_file_location("toy_ablation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--out", str(tmp_path), "--steps", "3", "--seeds", "2", "--prompts", "2", "--horizon", "3"])
    with open(tmp_path / "curves.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(lab.default_algorithms()) * len(module.LEARNING_RATES) * 2 * 4
    assert {r["algorithm"] for r in rows} == {a.label for a in lab.default_algorithms()}
    labels, curves = module.read_csv(tmp_path / "curves.csv")
    assert labels == [a.label for a in lab.default_algorithms()] and curves.shape == (len(labels), 4, 2, 4)
    assert (tmp_path / "toy_ablation.md").read_text() == module.table(labels, curves) + "\n"
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
