"""Population training (``pgjax.train.population``): every member of a vmapped population equals its own
single ``Trainer`` run (``Population.member_experiment(i)``): the same warm start, sampled tokens and
evaluation, and records to float rounding; a member whose update is non-finite, or whose reward is
NaN, stops alone while the others train on as their single runs do; per-member learning rates are
the single runs of those rates; what populations do not support is a one-line ConfigError."""
import dataclasses
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import EMIT_X, TINY_MODEL, load_benchmark, read_events, simulated_devices, starts_with_x, tiny_experiment

from pgjax.config import (
    ConfigError,
    LoRASection,
    OptimConfig,
    RewardSection,
    TaskSection,
    UpdateConfig,
    WarmStartSection,
    stream_seed,
)
from pgjax.errors import RunStopped
from pgjax.models import hf
from pgjax.rollout.collect import RolloutConfig
from pgjax.train import interrupts
from pgjax.train.interrupts import RunInterrupted
from pgjax.train.optim import make_optimizer
from pgjax.train.population import Member, Population, member_scale, over_members
from pgjax.train.records import COST_KEYS
from pgjax.train.sinks import read_records
from pgjax.train.trainer import Trainer

ROOT = pathlib.Path(__file__).resolve().parents[1]
captured = load_benchmark("population").captured     # the benchmark's own capture of each call's result
STEPS = 3
# records differ by float rounding only: vmap batches every matmul, so XLA sums in another order, and
# training carries the rounding on. Measured on a 2-core Xeon: up to 1e-4 relative (grad_norm) after a
# 40-step warm start, 2e-6 without one; the mismatch metrics are themselves float rounding (~1e-7) and
# are compared by the absolute tolerance
RTOL, RTOL_COLD, ATOL = 1e-3, 1e-5, 1e-5
NOT_COMPARED = (*COST_KEYS, "padding")     # wall-clock; padding counts the population's common width


def arithmetic(tmp_path, **changes):
    """1-digit addition with a 40-step warm start (greedy accuracy 0.125 and 0 for seeds 0 and 1) and a
    format reward (the rewards vary from the first step): prompts, evaluation prompts and
    demonstrations all depend on the seed."""
    base = dict(
        task=TaskSection(options={"digits": 1}, reward=RewardSection(format_weight=0.5)),
        eval_prompts=16,
        optim=OptimConfig(lr=2e-3),
        warm_start=WarmStartSection(steps=40, batch_size=16, optim=OptimConfig(lr=3e-3, warmup_steps=10)),
        rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=4),
    )
    return tiny_experiment(tmp_path, **{**base, **changes})


def single_run(exp, steps=STEPS):
    """A single Trainer run of ``exp``: (its records, each step's sampled responses [B, N], its
    evaluation after the warm start and at the end, its parameters after the warm start)."""
    trainer = Trainer(exp)
    tokens = []
    trainer.pipeline.dispatch = captured(trainer.pipeline.dispatch, tokens, lambda r: r[1].response)
    trainer.warm_start()
    warm = jax.device_get(trainer.state.params)
    first = trainer.evaluate()
    records = [trainer.step() for _ in range(steps)]
    return records, tokens, (first, trainer.evaluate()), warm


def population_run(exp, members, steps=STEPS, vmap_width=None):
    """The same for a population: (records [steps][members], sampled responses [steps] of [N, B, N],
    evaluations, the parameters [N, ...] after the warm start), and the population."""
    population = Population(exp, members, vmap_width=vmap_width)
    tokens = []
    population._sample = captured(population._sample, tokens, lambda s: s.response)
    population.warm_start()
    warm = jax.device_get(population.state.params)
    first = population.evaluate()
    records = [population.step() for _ in range(steps)]
    return records, tokens, (first, population.evaluate()), warm, population


def largest_difference(stacked, i: int, single) -> float:
    """The largest difference between member ``i``'s parameters and a single run's, relative to each
    array's largest entry."""
    return max(float(np.max(np.abs(a[i] - b)) / np.max(np.abs(b)))
               for a, b in zip(jax.tree.leaves(stacked), jax.tree.leaves(single), strict=True))


def assert_same_record(single: dict, member: dict, where: str, rtol=RTOL):
    assert set(single) == set(member), where
    for key, value in single.items():
        if key in NOT_COMPARED:
            continue
        other = member[key]
        if isinstance(value, float) and isinstance(other, float):
            assert math.isclose(value, other, rel_tol=rtol, abs_tol=ATOL), f"{where}: {key} {value} != {other}"
        else:
            assert value == other, f"{where}: {key} {value!r} != {other!r}"


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """2 seeds x divide_by_std in {0, 1} of GRPO (a KL term: the reference policy too) on 1-digit
    addition, as a population with every member vmapped and as four single runs."""
    exp = arithmetic(tmp_path_factory.mktemp("grid"), algorithm="grpo")
    members = [Member(seed=s, hparams={"divide_by_std": d}) for d in (0.0, 1.0) for s in (0, 1)]
    population = population_run(exp, members, vmap_width=len(members))
    singles = [single_run(population[-1].member_experiment(i)) for i in range(len(members))]
    return exp, members, population, singles


@pytest.mark.slow
def test_each_member_samples_the_tokens_of_its_single_run(grid):
    _, members, (_, tokens, _, warm, population), singles = grid
    assert population.vmap_width == len(members)
    for i in range(len(members)):
        assert largest_difference(warm, i, singles[i][3]) < 1e-4       # measured: 3e-6
        for step in range(STEPS):
            assert np.array_equal(tokens[step][i], singles[i][1][step]), f"member {i}, step {step + 1}"


@pytest.mark.slow
def test_each_members_records_equal_its_single_runs(grid):
    _, members, (records, _, _, _, population), singles = grid
    for i in range(len(members)):
        for step in range(STEPS):
            assert_same_record(singles[i][0][step], records[step][i], f"member {i}, step {step + 1}")
    assert population.stopped == [None] * len(members)
    # the settings differ where they should: divide_by_std changes the update, the seed the prompts
    assert records[0][1]["grad_norm"] != records[0][3]["grad_norm"]
    assert records[0][0]["reward"] != records[0][1]["reward"]


@pytest.mark.slow
def test_each_members_warm_start_and_evaluation_equal_its_single_runs(grid):
    _, members, (_, _, (first, last), _, _), singles = grid
    assert first == [s[2][0] for s in singles]
    assert last == [s[2][1] for s in singles]


@pytest.mark.slow
def test_one_member_at_a_time_computes_as_its_single_run(grid):
    """vmap_width=1 (the default on CPU): lax.map over the members, each computed with a single run's
    shapes: the warm start bit for bit, the same tokens and evaluations, records within 1e-5."""
    exp, members, _, singles = grid
    records, tokens, evaluations, warm, population = population_run(exp, [members[0], members[3]], vmap_width=1)
    for i, single in enumerate((singles[0], singles[3])):
        assert largest_difference(warm, i, single[3]) == 0.0
        assert [evaluations[0][i], evaluations[1][i]] == list(single[2])
        for step in range(STEPS):
            assert np.array_equal(tokens[step][i], single[1][step]), f"member {i}, step {step + 1}"
            assert_same_record(single[0][step], records[step][i], f"member {i}, step {step + 1}", RTOL_COLD)


@pytest.mark.slow
def test_per_member_learning_rates_equal_single_runs_with_those_rates(tmp_path):
    exp = tiny_experiment(tmp_path, algorithm="dr_grpo", task=EMIT_X, optim=OptimConfig(lr=1e-2, warmup_steps=2,
                                                                                       weight_decay=0.1))
    members = [Member(seed=0), Member(seed=0, lr=3e-2), Member(seed=0, lr=1e-3)]
    records, tokens, _, _, population = population_run(exp, members, vmap_width=len(members))
    for i in (1, 2):
        single_records, single_tokens, _, _ = single_run(population.member_experiment(i))
        assert population.member_experiment(i).optim.lr == members[i].lr
        for step in range(STEPS):
            assert np.array_equal(tokens[step][i], single_tokens[step])
            assert_same_record(single_records[step], records[step][i], f"member {i}, step {step + 1}", RTOL_COLD)
    assert records[-1][1]["grad_norm"] != records[-1][2]["grad_norm"]


def opo():
    from pgjax.config import load
    return load(str(ROOT / "experiments" / "arithmetic_opo.py")).algorithm.estimator


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, hparams", [
    ("ppo", {"clip_eps_low": 0.1}),             # a critic: its parameters and optimizer state stacked too
    (opo, {"length_power": 0.0}),               # a user's estimator (docs/estimators.md) and its own hparams
], ids=["ppo", "user_estimator"])
def test_a_critic_and_a_users_estimator_train_as_their_single_runs(tmp_path, algorithm, hparams):
    estimator = algorithm() if callable(algorithm) else None
    exp = tiny_experiment(tmp_path, task=EMIT_X, **({} if estimator else {"algorithm": algorithm}))
    population = Population(exp, [Member(seed=0), Member(seed=1, hparams=hparams)], algorithm=estimator)
    records = [population.step() for _ in range(2)]
    for i in range(2):
        trainer = Trainer(population.member_experiment(i))
        for step in range(2):
            assert_same_record(trainer.step(), records[step][i], f"member {i}, step {step + 1}", RTOL_COLD)


@pytest.mark.slow
def test_a_member_whose_update_is_not_finite_stops_and_the_others_train_on(grid):
    """An entropy coefficient of 3e38 makes that member's loss infinite: its every update is skipped
    (its state kept), after update.max_skipped_steps steps it stops; member 0 is the grid's member 0."""
    exp, members, _, singles = grid
    bad = Member(seed=0, hparams={"entropy_coef": 3e38})
    records, _, _, _, population = population_run(exp, [members[0], bad], vmap_width=2)
    for step in range(STEPS):
        assert_same_record(singles[0][0][step], records[step][0], f"member 0, step {step + 1}")
        assert records[step][1]["skipped_updates"] == 1 and records[step][1]["policy_loss"] is None
    assert population.stopped[0] is None and "max_skipped_steps=3" in population.stopped[1]
    warm = Population(exp, [members[0], bad], vmap_width=2)
    warm.warm_start()       # the state it never left: the warm-started one
    same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a[1], b[1])), population.state.params, warm.state.params)
    assert all(jax.tree.leaves(same))
    assert population.step()[1] is None         # stopped: no more records


def nan_for_seed_one(prompts, completions, **fields):
    """EmitX's reward, NaN on the rows whose example is ``poisoned``."""
    return np.where(fields["poisoned"], np.nan, starts_with_x(prompts, completions, **fields))


POISONED = {stream_seed(1, "train", step) for step in range(8)}


class EmitXPoisoned:
    """EmitX whose rewards are NaN on the prompts the seed-1 stream draws."""
    name = "emit_x_poisoned"
    format_pattern = "[abx]*"
    reward_fn = staticmethod(nan_for_seed_one)

    def tokenizer(self):
        from pgjax.tasks import char_tokenizer
        return char_tokenizer("abx")

    def examples(self, n, seed=0):
        return [{"prompt": "ab", "answer": "x", "poisoned": seed in POISONED} for _ in range(n)]


@pytest.mark.slow
def test_a_member_fed_nan_rewards_stops_and_the_others_train_on(tmp_path):
    """rollout.nonfinite_rewards="error": the seed-1 member's single run stops at step 1 (RunStopped);
    in the population that member stops there, and the seed-0 members train on as their single runs."""
    exp = tiny_experiment(tmp_path, algorithm="dr_grpo", task=TaskSection(name="test_population:EmitXPoisoned"))
    members = [Member(seed=0), Member(seed=1), Member(seed=0, hparams={"divide_by_length": 1.0})]
    records, _, _, _, population = population_run(exp, members, vmap_width=len(members))
    with pytest.raises(RunStopped, match="step 1: .*non-finite"):
        Trainer(population.member_experiment(1)).step()
    assert [r[1] for r in records] == [None] * STEPS
    assert population.stopped[1].startswith("step 1: ") and population.stopped[0] is None
    for i in (0, 2):
        single_records, _, _, _ = single_run(population.member_experiment(i))
        for step in range(STEPS):
            assert_same_record(single_records[step], records[step][i], f"member {i}, step {step + 1}", RTOL_COLD)


@pytest.mark.slow
def test_fit_writes_a_run_directory_per_member_and_export_writes_a_checkpoint(tmp_path):
    exp = tiny_experiment(tmp_path, algorithm="dr_grpo", task=EMIT_X, steps=2, eval_every=1)
    population = Population.grid(exp, seeds=[0, 1], divide_by_length=[0.0, 1.0])
    assert [(m.seed, m.hparams["divide_by_length"]) for m in population.members] == [(0, 0.0), (1, 0.0), (0, 1.0),
                                                                                     (1, 1.0)]
    directory = population.fit(tmp_path / "population", progress=False)
    saved = json.loads((directory / "population.json").read_text())
    assert [(m["seed"], m["hparams"], m["stopped"]) for m in saved["members"]] == [
        (m.seed, m.hparams, None) for m in population.members]
    assert saved["members"][3]["hparams_resolved"]["divide_by_length"] == 1.0 and saved["steps_done"] == 2
    for i in range(4):
        records = read_records(directory / f"member-{i}")
        assert [r["step"] for r in records] == [0, 1, 2] and all("eval_accuracy" in r for r in records)
        assert read_events(directory / f"member-{i}")["reward"].keys() == {1, 2}
        assert (directory / f"member-{i}" / "curves.png").is_file()
    with pytest.raises(ConfigError, match="holds a population or a run already"):
        Population(exp, [Member()]).fit(directory)
    exported = population.export(3, tmp_path / "member-3")
    loaded = hf.load(exported)
    assert np.array_equal(np.asarray(loaded.embed[...]), np.asarray(population.policy(3).embed[...]))
    # a checkpoint at model.path is every member's start, whatever its seed
    started = Population(dataclasses.replace(exp, model=dataclasses.replace(exp.model, path=str(exported))),
                         [Member(seed=5), Member(seed=6)])
    for i in range(2):
        assert np.array_equal(np.asarray(started.policy(i).embed[...]), np.asarray(loaded.embed[...]))


def _fitted(exp, directory, resume=False):
    """A 2 x 2 population (seeds 0, 1 x divide_by_std) fitted into ``directory``: (each member's records
    without timings, the stacked parameters)."""
    population = Population.grid(exp, seeds=[0, 1], divide_by_std=[0.0, 1.0])
    population.fit(directory, progress=False, resume=resume)
    records = [[{k: v for k, v in r.items() if k not in COST_KEYS} for r in read_records(directory / f"member-{i}")]
               for i in range(population.size)]
    return records, jax.device_get(population.state.params), population


@pytest.mark.slow
def test_a_population_resumes_exactly_from_its_checkpoint(tmp_path):
    """4 steps straight equal 2 steps, then a resume to 4 (``steps`` is operational); and a kill after
    step 3's records but before its checkpoint is resumed from step 2, the step-3 records redone
    once: records and every parameter equal, bit for bit (one member at a time, the same programs)."""
    exp = arithmetic(tmp_path, algorithm="dr_grpo", steps=4, eval_every=2, checkpoint_every=2,
                     warm_start=WarmStartSection(steps=5, batch_size=16))
    straight, params, _ = _fitted(exp, tmp_path / "straight")
    _fitted(dataclasses.replace(exp, steps=2), tmp_path / "resumed")
    assert sorted(int(p.name) for p in (tmp_path / "resumed" / "checkpoints").iterdir() if p.name.isdigit()) == [0, 2]
    resumed, resumed_params, population = _fitted(exp, tmp_path / "resumed", resume=True)
    assert resumed == straight and [r["step"] for r in resumed[0]] == [0, 1, 2, 3, 4]
    assert all(np.array_equal(a, b)
               for a, b in zip(jax.tree.leaves(resumed_params), jax.tree.leaves(params), strict=True))
    assert json.loads((tmp_path / "resumed" / "population.json").read_text())["steps_done"] == 4
    # killed after step 3 was logged, before its checkpoint: the resume drops step 3's records and redoes them
    _fitted(dataclasses.replace(exp, steps=3, checkpoint_every=4), tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "3")
    assert [r["step"] for r in read_records(tmp_path / "killed" / "member-0")] == [0, 1, 2, 3]
    killed, killed_params, _ = _fitted(exp, tmp_path / "killed", resume=True)
    assert killed == straight
    assert all(np.array_equal(a, b)
               for a, b in zip(jax.tree.leaves(killed_params), jax.tree.leaves(params), strict=True))
    # what a resume refuses, in one line each, before anything is written
    with pytest.raises(ConfigError, match="another population's members"):
        Population(exp, [Member(seed=0)]).fit(tmp_path / "straight", resume=True)
    with pytest.raises(ConfigError, match=r"differs from the population's .*optim.lr: 0.002 -> 0.001"):
        _fitted(dataclasses.replace(exp, optim=OptimConfig(lr=1e-3)), tmp_path / "straight", resume=True)
    with pytest.raises(ConfigError, match="holds no population"):
        population.fit(tmp_path / "empty", resume=True)
    with pytest.raises(ConfigError, match="holds a population or a run already"):
        population.fit(tmp_path / "straight")


@pytest.mark.slow
def test_a_stop_signal_ends_a_population_after_its_step_with_a_checkpoint(tmp_path, monkeypatch):
    """SIGTERM during step 1 (``interrupts.requested``): ``fit`` writes step 1's checkpoint and raises
    RunInterrupted; ``resume=True`` then trains on as if nothing had happened."""
    exp = tiny_experiment(tmp_path, algorithm="dr_grpo", task=EMIT_X, steps=3, eval_every=3, checkpoint_every=3)
    straight, params, _ = _fitted(exp, tmp_path / "straight")
    monkeypatch.setattr(interrupts, "requested", lambda: signal.SIGTERM)
    with pytest.raises(RunInterrupted, match="SIGTERM after step 1 of the population, its checkpoint written"):
        _fitted(exp, tmp_path / "stopped")
    monkeypatch.undo()
    assert (tmp_path / "stopped" / "checkpoints" / "1").is_dir()
    resumed, resumed_params, _ = _fitted(exp, tmp_path / "stopped", resume=True)
    assert resumed == straight
    assert all(np.array_equal(a, b)
               for a, b in zip(jax.tree.leaves(resumed_params), jax.tree.leaves(params), strict=True))


DEVICES_WARM_START = WarmStartSection(steps=3, batch_size=8)


def members_over_devices(tmp: str) -> dict:
    """(Run with 8 simulated devices.) The 2 seeds x 2 x 2 switch grid over the devices: 8 groups of one
    member on one device each, and 4 groups of two members on a data-parallel mesh of 2 devices each;
    each member's state on its group's devices alone. Its sampled tokens, records and parameters after
    2 steps, per layout."""
    from pgjax.parallel.mesh import MeshConfig
    assert jax.device_count() == 8
    out = {}
    for name, groups, data in (("8 groups x 1 device", 8, 1), ("4 groups x 2 devices", 4, 2)):
        exp = tiny_experiment(pathlib.Path(tmp), algorithm="dr_grpo", task=EMIT_X, mesh=MeshConfig(data=data),
                              warm_start=DEVICES_WARM_START)
        population = Population.grid(exp, seeds=[0, 1], member_groups=groups, divide_by_std=[0.0, 1.0],
                                     divide_by_length=[0.0, 1.0])
        leaf = jax.tree.leaves(population.state.params)[0]
        assert population.mesh.shape == {"members": groups, "data": data, "fsdp": 1, "tensor": 1}
        assert leaf.sharding.spec[0] == "members", leaf.sharding
        assert {shard.data.shape[0] for shard in leaf.addressable_shards} == {8 // groups}   # its group's members
        tokens = []
        population._sample = captured(population._sample, tokens, lambda s: s.response)
        population.warm_start()
        records = [population.step() for _ in range(2)]
        out[name] = {"records": records, "tokens": [np.asarray(t).tolist() for t in tokens],
                     "evaluation": population.evaluate(),
                     "params": [np.asarray(x).tolist()
                                for x in jax.tree.leaves(jax.device_get(population.state.params))]}
    return out


@pytest.mark.slow
def test_members_over_8_devices_train_as_on_one(tmp_path):
    """The members split over 8 simulated devices (one member per device; two per data-parallel pair)
    sample the tokens of the one-device population, evaluate alike, and their records and parameters
    agree to float rounding (another program: XLA sums in another order)."""
    env = {**os.environ, "XLA_FLAGS": simulated_devices(8), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    result = subprocess.run([sys.executable, __file__, str(tmp_path)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    layouts = json.loads((tmp_path / "members_over_devices.json").read_text())
    exp = tiny_experiment(tmp_path, algorithm="dr_grpo", task=EMIT_X, warm_start=DEVICES_WARM_START)
    population = Population.grid(exp, seeds=[0, 1], divide_by_std=[0.0, 1.0], divide_by_length=[0.0, 1.0])
    assert population.member_groups == 1
    population.warm_start()
    tokens = []
    population._sample = captured(population._sample, tokens, lambda s: s.response)
    records = [population.step() for _ in range(2)]
    evaluation = population.evaluate()
    params = jax.tree.leaves(jax.device_get(population.state.params))
    assert records[1][0]["grad_norm"] != records[1][2]["grad_norm"]      # the settings differ
    for name, got in layouts.items():
        assert got["tokens"] == [np.asarray(t).tolist() for t in tokens], name
        assert got["evaluation"] == evaluation, name
        for step in range(2):
            for i in range(8):
                assert_same_record(records[step][i], got["records"][step][i], f"{name}: member {i}, step {step + 1}",
                                   rtol=RTOL_COLD)
        # relative to each array's largest entry: Adam's step of an entry whose gradient is about 0 is +-lr
        # whatever its size, so rounding that flips the sign of such a gradient moves the entry by up to 2 lr
        # (measured: 4e-3 of the largest entry after 3 warm-start and 2 RL steps at lr 1e-2)
        for a, b in zip(got["params"], params, strict=True):
            assert np.max(np.abs(np.asarray(a, np.float32) - b)) / np.max(np.abs(b)) < 2e-2, name


@pytest.mark.parametrize("width", [1, 2, 4])
def test_the_member_loop_equals_a_map_over_the_members(width):
    """``over_members(..., carried=2)`` (the state carried through a loop over chunks of ``width`` members
    and written in place) gives what mapping ``fn`` over the members one by one gives, state and outputs."""
    def fn(a, b, x):
        return a + x.sum(), b * 2.0, {"y": jnp.tanh(a) * x, "n": jnp.sum(b)}
    keys = jax.random.split(jax.random.key(0), 3)
    a, b, x = (jax.random.normal(k, shape) for k, shape in zip(keys, [(4, 3), (4, 2, 2), (4, 3)], strict=True))
    got = jax.jit(over_members(fn, width, 4, carried=2), donate_argnums=(0, 1))(a + 0.0, b + 0.0, x)
    want = [fn(a[i], b[i], x[i]) for i in range(4)]
    for k, part in enumerate(got):
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[w[k] for w in want])
        assert jax.tree.all(jax.tree.map(lambda u, v: bool(jnp.allclose(u, v, rtol=1e-6, atol=1e-6)), part, stacked))


def test_the_member_scale_makes_the_update_of_that_learning_rate():
    """AdamW's update is linear in its learning rate (warm-up times lr, weight decay inside): scaling a
    run's update by lr_i / lr is the run of lr_i up to float rounding."""
    params = {"w": jax.random.normal(jax.random.key(0), (8, 4)), "b": jnp.ones(4)}
    base = OptimConfig(lr=1e-2, warmup_steps=3, weight_decay=0.1)
    scaled = optax.chain(make_optimizer(base), member_scale())
    reference = make_optimizer(dataclasses.replace(base, lr=3e-2))
    p, q = params, params
    s = scaled.init(p)
    s = (s[0], s[1]._replace(scale=jnp.asarray(3.0, jnp.float32)))
    r = reference.init(q)
    for step in range(6):
        grads = jax.tree.map(lambda x, step=step: jax.random.normal(jax.random.key(step), x.shape), params)
        u, s = scaled.update(grads, s, p)
        v, r = reference.update(grads, r, q)
        p, q = optax.apply_updates(p, u), optax.apply_updates(q, v)
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # at scale 1 it changes nothing, bit for bit
    one = optax.chain(make_optimizer(base), member_scale())
    u, _ = one.update(grads, one.init(params), params)
    v, _ = make_optimizer(base).update(grads, make_optimizer(base).init(params), params)
    assert all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(v), strict=True))


@pytest.mark.parametrize("changes, message", [
    (dict(task=TaskSection(name="helpers:SumWithCalculator", tools="calculator")), "task.tools.names='calculator'"),
    (dict(rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=4, max_new_tokens=3, staleness=1)),
     "rollout.staleness=1"),
    (dict(update=UpdateConfig(pack_width=2)), "update.pack_width=2"),
    (dict(algorithm="remax"), "greedy baseline"),
    (dict(model=dataclasses.replace(TINY_MODEL, lora=LoRASection(rank=2))), "model.lora.rank=2"),
    (dict(stage="reward_model"), "stage='reward_model'"),
    (dict(rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=4, max_new_tokens=3, sampler_devices=1)),
     "sampler_devices"),
])
def test_what_populations_do_not_support_is_a_config_error(tmp_path, changes, message):
    exp = tiny_experiment(tmp_path, **{**dict(algorithm="dr_grpo", task=EMIT_X), **changes})
    with pytest.raises(ConfigError, match=message) as error:
        Population(exp, [Member(seed=0), Member(seed=1)])
    assert "\n" not in str(error.value)


def test_a_population_that_cannot_fit_is_refused_before_anything_is_built(tmp_path):
    """The memory floor counts every member: a model whose single run fits, in a population of 100,000
    (each member's training state stacked), is a one-line ConfigError before a parameter is made."""
    model = dataclasses.replace(TINY_MODEL, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                                num_attention_heads=8, num_key_value_heads=8, head_dim=64)
    exp = tiny_experiment(tmp_path, algorithm="dr_grpo", task=EMIT_X, model=model)
    with pytest.raises(ConfigError, match=r"the population of 100000 needs at least [\d,.]+ GiB of memory "
                                          r".*or the members fewer") as error:
        Population(exp, [Member(seed=i) for i in range(100_000)])
    assert "\n" not in str(error.value)


def test_members_are_checked_before_anything_is_built(tmp_path):
    exp = tiny_experiment(tmp_path, task=EMIT_X, algorithm="dr_grpo")
    with pytest.raises(ConfigError, match=r"Member.seed=-1"):
        Member(seed=-1)
    with pytest.raises(ConfigError, match=r"Member.hparams\['kl_coef'\]=nan"):
        Member(hparams={"kl_coef": float("nan")})
    with pytest.raises(ConfigError, match=r"Member.lr=0"):
        Member(lr=0)
    with pytest.raises(ConfigError, match=r"member 1 \(seed=0, divide_by_sdt=1\): algorithm.hparams: unknown "
                                          r"hyperparameter.*'divide_by_sdt'"):
        Population(exp, [Member(), Member(hparams={"divide_by_sdt": 1.0})])
    with pytest.raises(ConfigError, match=r"member 1 .*kl_coef=0.1 does nothing for dr_grpo"):
        Population(exp, [Member(), Member(hparams={"kl_coef": 0.1})])
    with pytest.raises(ConfigError, match="at least one member"):
        Population(exp, [])


if __name__ == "__main__":
    (pathlib.Path(sys.argv[1]) / "members_over_devices.json").write_text(json.dumps(members_over_devices(sys.argv[1])))
