"""Estimators of the user's (docs/estimators.md): the protocol's checks; the worked example (OPO, the docs'
copy of experiments/arithmetic_opo.py) against a float64 reference of its equation and an exact audit
written out in NumPy, its grids under vmap, and training through the Trainer, the command line, resume,
sharding and the planner; Dr. GRPO rewritten as a user's estimator trains bit for bit like the preset."""
import dataclasses
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EMIT_X, FAST_COMPILE, make_batch, tiny_experiment

from pgjax import core
from pgjax.config import (
    AlgorithmSection,
    ConfigError,
    Experiment,
    ModelSection,
    UpdateConfig,
    load,
    override,
    resolved,
    validate,
)
from pgjax.parallel.mesh import MeshConfig, single_device_mesh
from pgjax.plan import Planner
from pgjax.theory import mdp as mdp_lib
from pgjax.theory.audit import audit
from pgjax.train.inputs import input_files
from pgjax.train.run_dir import experiment_record
from pgjax.train.trainer import Trainer

ROOT = pathlib.Path(__file__).parent.parent
DOC = ROOT / "docs" / "estimators.md"

# Dr. GRPO (eq. 21) written from pgjax.core's pieces, as research code would: group mean baseline (1/K),
# the clipped ratio of eq. 16, prompt-mean aggregation; the preset's loss with its metrics
DR_GRPO = '''
import dataclasses

import jax
import jax.numpy as jnp

from pgjax import core
from pgjax.parallel.mesh import MeshConfig, single_device_mesh
from pgjax.plan import Planner


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClipHParams:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2


class MyDrGRPO(core.Estimator):
    name = "my_dr_grpo"
    min_group_size = 2

    def __init__(self, hparams=ClipHParams()):
        self.hparams = hparams

    def advantages(self, batch, hp):
        scores = core.sequence_scores(batch.rewards, batch.mask)
        return core.broadcast_over_tokens(core.group_advantages(scores, batch.group_size, 0.0, 0.0), batch.mask)

    def loss(self, batch, hp, norm):
        on = batch.mask > 0
        logp = jnp.where(on, batch.logp, 0.0)
        old = jax.lax.stop_gradient(logp)
        ratio = core.importance_ratio(logp, old)
        adv = jax.lax.stop_gradient(batch.advantages)
        objective = core.modified_ratio(ratio, adv, hp.clip_eps_low, hp.clip_eps_high, 0.0) * adv
        value = -core.aggregate(objective, batch.mask, "prompt_mean", norm)
        clipped = core.clipped_mask(ratio, adv, hp.clip_eps_low, hp.clip_eps_high, 0.0)
        return value, {"clipped_tokens": jnp.sum(clipped * batch.mask)}


class Untraceable(MyDrGRPO):
    name = "untraceable"

    def loss(self, batch, hp, norm):
        if jnp.sum(batch.advantages) > 0:          # a Python branch on a traced value
            return super().loss(batch, hp, norm)
        return -jnp.sum(batch.logp), {}


class VectorLoss(MyDrGRPO):
    name = "vector_loss"

    def loss(self, batch, hp, norm):
        return -jnp.sum(batch.advantages * batch.logp, axis=1), {}


class OwnCounts(MyDrGRPO):
    """Divides by its own micro-batch's token count instead of the normaliser's."""
    name = "own_counts"

    def loss(self, batch, hp, norm):
        per_token = jnp.where(batch.mask > 0, batch.advantages * batch.logp, 0.0)
        return -jnp.sum(per_token) / jnp.maximum(jnp.sum(batch.mask), 1.0), {}


class Unknown(MyDrGRPO):
    name = "unknown_needs"
    requires = frozenset({"critic_values"})


def not_an_estimator():
    return 42
'''


EXAMPLE = ROOT / "experiments" / "arithmetic_opo.py"


def test_the_worked_example_in_the_docs_is_the_experiment_file():
    block = re.search(r"<!-- example:opo -->\n```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    source = EXAMPLE.read_text()
    assert block == source[source.index("import dataclasses"):]


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    """The worked example (OPO) as the module ``my_estimators`` and the test's estimators as
    ``research_estimators``, importable."""
    folder = tmp_path_factory.mktemp("plugins")
    (folder / "my_estimators.py").write_text(EXAMPLE.read_text())
    (folder / "research_estimators.py").write_text(DR_GRPO)
    sys.path.insert(0, str(folder))
    import my_estimators
    import research_estimators
    yield folder, my_estimators, research_estimators
    sys.path.remove(str(folder))
    for name in ("my_estimators", "research_estimators"):
        sys.modules.pop(name, None)


# ---------------------------------------------------------------- OPO against its equation


def opo_reference(rewards, mask, k, power):
    """float64: A_i = r_i - sum_j |o_j|^p r_j / sum_j |o_j|^p per group, and the gradient of the loss
    with respect to log pi: dL/dlogp_it = -A_i m_it / N, N the batch's tokens."""
    rewards, mask = np.asarray(rewards, np.float64), np.asarray(mask, np.float64)
    lengths = np.maximum(mask.sum(1), 1.0)
    adv = np.zeros(len(rewards))
    for g in range(len(rewards) // k):
        rows = slice(g * k, (g + 1) * k)
        w = lengths[rows] ** power
        adv[rows] = rewards[rows] - (w * rewards[rows]).sum() / w.sum()
    per_token = adv[:, None] * mask
    return per_token, -per_token / max(mask.sum(), 1.0)


@pytest.mark.parametrize("power", [0.0, 0.5, 1.0])
def test_opo_matches_a_float64_reference_of_its_equation(plugins, power):
    opo = plugins[1].OPO(plugins[1].OPOHParams(length_power=power))
    batch, _, _ = make_batch(3, prompts=3, group_size=4)
    adv_want, grad_want = opo_reference(batch.rewards, batch.mask, 4, power)
    adv = jax.jit(opo.advantages)(batch, opo.hparams)
    np.testing.assert_allclose(np.asarray(adv), adv_want, rtol=1e-5, atol=1e-6)
    prepared = batch.replace(advantages=adv)
    norm = core.loss_normalizer(batch.mask, 4)
    grad = jax.jit(jax.grad(lambda logp: opo.loss(prepared.replace(logp=logp), opo.hparams, norm)[0]))(batch.logp)
    np.testing.assert_allclose(np.asarray(grad), grad_want, rtol=1e-5, atol=1e-7)
    # the token weights of core.token_weights are -dL/dlogp, the same function for any estimator
    np.testing.assert_allclose(np.asarray(core.token_weights(opo, prepared, opo.hparams, norm)), -grad_want,
                               rtol=1e-5, atol=1e-7)


def test_opo_at_power_zero_has_dr_grpos_advantages(plugins):
    """p = 0 weighs every response alike: the plain group mean, Dr. GRPO's baseline (eq. 21)."""
    opo = plugins[1].OPO(plugins[1].OPOHParams(length_power=0.0))
    batch, _, _ = make_batch(5)
    np.testing.assert_allclose(np.asarray(opo.advantages(batch, opo.hparams)),
                               np.asarray(core.preset("dr_grpo").advantages(batch)), atol=1e-7)


def test_a_grid_over_an_estimators_own_hyperparameters_is_one_vmapped_call(plugins):
    opo = plugins[1].OPO()
    grid, settings = core.hparam_grid(opo, length_power=[0.0, 0.5, 1.0])
    assert [s["length_power"] for s in settings] == [0.0, 0.5, 1.0]
    batch, _, _ = make_batch(1)
    norm = core.loss_normalizer(batch.mask, 4)

    def loss(hp):
        return opo.loss(batch.replace(advantages=opo.advantages(batch, hp)), hp, norm)

    values, metrics = jax.jit(jax.vmap(loss))(grid)
    for i, power in enumerate([0.0, 0.5, 1.0]):
        one = opo.with_hparams(length_power=power)
        want = loss(one.hparams)
        np.testing.assert_allclose(float(values[i]), float(want[0]), rtol=1e-6)
        np.testing.assert_allclose(float(metrics["advantage_abs_sum"][i]), float(want[1]["advantage_abs_sum"]),
                                   rtol=1e-6)
    with pytest.raises(ValueError, match="unknown hyperparameter 'lenght_power' of opo; did you mean length_power"):
        core.hparam_grid(opo, lenght_power=[1.0])
    with pytest.raises(ValueError, match="length_power=.*must be finite"):
        opo.with_hparams(length_power=float("nan"))


# ---------------------------------------------------------------- the exact audit accepts any estimator


def _enumerated_opo_mean(mdp, policy, theta, k, power):
    """E[g] of OPO by a plain NumPy loop over prompts and K-tuples of trajectories: g = -dL/dtheta =
    (1/N) sum_i A_i grad log pi(tau_i), N the tuple's tokens (the score vectors by jax.jacrev of the MDP's
    trajectory log-probs, the only library function used)."""
    logits_fn, _ = policy
    logits = logits_fn(theta)
    traj_logp = np.asarray(jnp.sum(mdp_lib.step_logprobs(mdp, logits), axis=2))             # [P, N]
    scores = np.asarray(jax.jacrev(lambda th: jnp.sum(mdp_lib.loss_logprobs(mdp, logits_fn(th)), axis=2))(theta))
    scores = scores.reshape(scores.shape[:2] + (-1,))                                        # [P, N, D]
    lengths = np.asarray(mdp_lib.loss_mask(mdp)).sum(1)                                      # [N]
    mean = np.zeros(scores.shape[-1])
    for p in range(mdp.num_prompts):
        for rows in itertools.product(range(mdp.num_trajectories), repeat=k):
            rows = list(rows)
            prob = mdp.prompt_probs[p] * np.exp(traj_logp[p, rows].sum())
            r = np.asarray(mdp.outcome_rewards)[p, rows]
            w = np.maximum(lengths[rows], 1.0) ** power
            adv = r - (w * r).sum() / w.sum()
            tokens = max(lengths[rows].sum(), 1.0)
            mean += prob * (adv[:, None] * scores[p, rows]).sum(0) / tokens
    return mean


def test_the_exact_audit_takes_a_users_estimator(plugins, x64):
    """The audit's E[g] of OPO equals a NumPy enumeration of its equation; on an MDP whose responses
    differ in length OPO's own-inclusive, length-weighted baseline (and its token mean) leave it biased in
    direction, which the audit measures."""
    mdp = mdp_lib.make_mdp(vocab=3, horizon=3, prompts=2, reward="outcome", seed=0)
    policy = mdp_lib.tabular_policy(mdp)
    theta = jnp.asarray(np.random.default_rng(1).normal(size=policy[1]) * 0.5)
    for power in (1.0, 0.0):
        opo = plugins[1].OPO(plugins[1].OPOHParams(length_power=power))
        result = audit(mdp, policy, theta, opo, k=2)
        want = _enumerated_opo_mean(mdp, policy, theta, 2, power)
        np.testing.assert_allclose(result.mean, want, rtol=1e-9, atol=1e-12)
        assert result.direction_bias > 1e-3
        assert result.ess_fraction == pytest.approx(1.0)


def test_the_audit_command_line_audits_a_users_estimator(plugins, capsys):
    """``python -m pgjax.theory.audit --estimator my_estimators:OPO`` adds OPO's row to both tables, the
    numbers of ``audit`` on the command's MDP; a path that does not import is one line."""
    from pgjax.theory import audit as audit_lib
    audit_lib.main(["--k", "2", "--estimator", "my_estimators:OPO"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| my_estimators:OPO |")]
    assert len(rows) == 2
    with jax.enable_x64(True):
        mdp = mdp_lib.make_mdp(3, 3, 3, "outcome", 0)
        policy = mdp_lib.tabular_policy(mdp)
        theta = jnp.asarray(np.random.default_rng(1).normal(size=policy[1]) * 0.5, jnp.float64)
        result = audit(mdp, policy, theta, plugins[1].OPO(), k=2)
    assert rows[1] == (f"| my_estimators:OPO | {result.scale:.4f} | {result.direction_bias:.2e} | {result.cosine:.4f} "
                       f"| {result.total_variance:.4f} |")
    with pytest.raises(SystemExit):
        audit_lib.main(["--estimator", "no_such_module:OPO"])
    assert "--estimator='no_such_module:OPO' cannot be imported" in capsys.readouterr().err


# ---------------------------------------------------------------- the protocol's checks


@pytest.mark.parametrize("name, message", [
    ("Untraceable", r"untraceable: loss\(batch, hp, norm\) cannot be traced by jax.jit: "
                    r"TracerBoolConversionError.*branch with jnp.where or lax.cond"),
    ("VectorLoss", r"vector_loss: loss\(batch, hp, norm\) must return a float scalar loss first, got float32\[4\]"),
    ("Unknown", r"unknown_needs: requires \['critic_values'\], which training cannot provide"),
    ("not_an_estimator", r"algorithm.preset='research_estimators:not_an_estimator' is an int \(42\), not an "
                         r"estimator: subclass pgjax.core.Estimator"),
])
def test_an_estimator_that_breaks_the_protocol_is_a_one_line_config_error(plugins, tmp_path, name, message):
    exp = tiny_experiment(tmp_path, task=EMIT_X, algorithm=AlgorithmSection(preset=f"research_estimators:{name}"))
    with pytest.raises(ConfigError, match=message):
        Trainer(exp)
    assert not (tmp_path / "run").exists()


def test_a_loss_not_additive_over_micro_batches_is_refused_only_where_it_matters(plugins, tmp_path):
    """Dividing by its own micro-batch's tokens makes update.micro_batches change the gradient: refused
    with micro-batches, accepted without; the preset rewritten with the normaliser passes with them."""
    research = plugins[2]
    exp = tiny_experiment(tmp_path, task=EMIT_X, update=UpdateConfig(micro_batches=2))
    with pytest.raises(ConfigError, match=r"own_counts: the loss is not additive over micro-batches: .* summed over 2 "
                                          r"micro-batches.*divide by the normaliser norm.*or set "
                                          r"update.micro_batches=1"):
        Trainer(exp, algorithm=research.OwnCounts())
    validate(dataclasses.replace(exp, update=UpdateConfig(),
                                 algorithm=AlgorithmSection(estimator=research.OwnCounts())),
             single_device_mesh())
    core.check_estimator(research.MyDrGRPO(), 4, micro_batches=4)
    core.check_estimator(plugins[1].OPO(), 4, micro_batches=4)


def test_hyperparameters_of_a_users_estimator_from_the_command_line(plugins):
    exp = override(Experiment(), ["algorithm.preset=my_estimators:OPO", "algorithm.hparams.length_power=0.25"])
    built = exp.algorithm.build()
    assert built.name == "opo" and float(built.hparams.length_power) == 0.25
    assert resolved(exp)["algorithm.hparams.length_power"] == 0.25
    typo = override(Experiment(), ["algorithm.preset=my_estimators:OPO", "algorithm.hparams.lenght_power=1"])
    with pytest.raises(ConfigError, match="unknown hyperparameter 'lenght_power' of opo; did you mean length_power"):
        typo.algorithm.build()
    with pytest.raises(ConfigError, match="unknown config key 'algorithm.hparams.lenght_power'"):
        override(Experiment(), ["algorithm.hparams.lenght_power=1"])        # a preset's keys are known
    with pytest.raises(ConfigError, match="are the presets' off-policy corrections; opo reads"):
        override(exp, ["algorithm.correction=token"]).algorithm.build()
    with pytest.raises(ConfigError, match="algorithm.preset='my_estimators:Nope' cannot be imported"):
        override(Experiment(), ["algorithm.preset=my_estimators:Nope"]).algorithm.build()


# ---------------------------------------------------------------- training


def _trained(exp, algorithm=None, steps=2):
    trainer = Trainer(exp, algorithm=algorithm)
    records = [trainer.step() for _ in range(steps)]
    return trainer, records


def _without_timings(records):
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "tokens_per_second"} for r in records]


@pytest.mark.slow
def test_dr_grpo_written_as_a_users_estimator_trains_bit_for_bit_like_the_preset(plugins, tmp_path):
    """The same sampled tokens, rewards, losses and parameters after two steps, with two micro-batches."""
    exp = tiny_experiment(tmp_path, task=EMIT_X, algorithm="dr_grpo", update=UpdateConfig(micro_batches=2))
    preset, want = _trained(exp)
    mine, got = _trained(exp, plugins[2].MyDrGRPO())
    assert _without_timings(got) == _without_timings(want)
    for a, b in zip(jax.tree.leaves(mine.state.params), jax.tree.leaves(preset.state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_opo_trains_on_the_main_job(plugins, tmp_path):
    """The main job (the default Experiment: a tiny Qwen3-style policy on 2-digit addition), shortened to
    its 200-step warm start, then 3 RL steps of 8 prompts: OPO's records carry its own metric and the learner's."""
    exp = Experiment(name="opo", run_dir=str(tmp_path / "run"), steps=3, prompts_per_step=8, eval_prompts=16)
    trainer = Trainer(exp, algorithm=plugins[1].OPO())
    trainer.warm_start()
    started = jax.device_get(trainer.state.params)
    records = [trainer.step() for _ in range(3)]
    for record in records:
        assert np.isfinite(record["policy_loss"]) and record["skipped_updates"] == 0
        assert record["advantage_abs_mean"] > 0 and record["kl_old"] == pytest.approx(0.0, abs=1e-6)
        assert record["clip_fraction"] is None          # OPO counts no clipped tokens
    moved = [np.max(np.abs(np.asarray(a) - b)) for a, b in zip(jax.tree.leaves(trainer.state.params),
                                                             jax.tree.leaves(started), strict=True)]
    assert max(moved) > 0           # the updates were applied


def _run(args, cwd, folder, check=True):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT / "tests"), str(ROOT)])}
    result = subprocess.run([sys.executable, "-m", "pgjax.run", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=600)
    assert not check or result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_a_users_estimator_from_the_command_line_resumes_exactly_and_its_source_is_fingerprinted(plugins, tmp_path):
    """``--set algorithm.preset=my_estimators:OPO``: 4 steps straight equal 2 steps, a stop, and a resume from
    the step-2 checkpoint; inputs.json holds the estimator's module, and editing it is a change --resume reports."""
    folder = plugins[0]
    file = tmp_path / "exp.py"
    file.write_text("import pathlib\nfrom helpers import EMIT_X, tiny_experiment\n\n"
                    "def experiment():\n"
                    f"    return tiny_experiment(pathlib.Path({str(tmp_path)!r}), task=EMIT_X)\n")
    opo = ["--set", "algorithm.preset=my_estimators:OPO", "--set", "algorithm.hparams.length_power=0.5"]
    _run([str(file), *opo, "--set", "run_dir=" + str(tmp_path / "straight")], tmp_path, folder)
    _run([str(file), *opo, "--set", "run_dir=" + str(tmp_path / "resumed"), "--set", "steps=2"], tmp_path, folder)
    _run([str(file), *opo, "--set", "run_dir=" + str(tmp_path / "resumed"), "--resume"], tmp_path, folder)
    def read(run):
        return _without_timings([json.loads(line) for line in (tmp_path / run / "metrics.jsonl").open()])
    straight, resumed = read("straight"), read("resumed")
    assert [r["step"] for r in straight] == [0, 1, 2, 3, 4] and resumed == straight
    assert straight[-1]["advantage_abs_mean"] > 0
    inputs = json.loads((tmp_path / "straight" / "inputs.json").read_text())["files"]
    assert inputs["algorithm.preset:module"]["path"] == str(folder / "my_estimators.py")
    record = json.loads((tmp_path / "straight" / "experiment.json").read_text())
    assert record["algorithm"]["preset"] == "my_estimators:OPO"
    assert record["algorithm"]["hparams"] == {"length_power": 0.5}


def test_an_estimator_objects_defining_file_is_fingerprinted(plugins):
    """An estimator handed over as an object is fingerprinted by the file its class is written in: a
    module of the user's, or the experiment file that defines it (experiments/arithmetic_opo.py)."""
    exp = Experiment(algorithm=AlgorithmSection(estimator=plugins[1].OPO()))
    assert input_files(exp)["algorithm.estimator:module"] == plugins[0] / "my_estimators.py"
    assert input_files(load(EXAMPLE))["algorithm.estimator:module"] == EXAMPLE
    assert "algorithm.estimator:module" not in input_files(Experiment())
    record = experiment_record(exp)["algorithm"]["estimator"]
    assert record == {"label": "my_estimators:OPO (opo)", "hparams": {"length_power": 1.0}}


def test_the_memory_planner_plans_a_users_estimator(plugins):
    model = dataclasses.replace(ModelSection(), hidden_size=32, intermediate_size=64).config(vocab_size=16)
    mesh = MeshConfig()
    planner = Planner(model, mesh, 4, 4, devices=1, algorithm="my_estimators:OPO", group_size=4)
    assert planner.algorithm.name == "opo" and not planner.reference
    assert planner.plan(8).total > 0
    with pytest.raises(ValueError, match="group size 1: opo needs at least 2"):
        Planner(model, mesh, 4, 4, devices=1, algorithm="my_estimators:OPO", group_size=1)


def check_user_estimator_shards(plugin_folder: str):
    """(Run in a subprocess with 4 simulated devices.) OPO's update with two micro-batches on a data x fsdp
    = 2 x 2 mesh equals its single-device update with one micro-batch: the same gradient, parameters and
    metrics (float32 rounding of a different summation order)."""
    import optax
    from flax import nnx

    from pgjax.models.transformer import CausalLM, ModelConfig
    from pgjax.parallel import mesh as mesh_lib
    from pgjax.rollout.batch import Rollout
    from pgjax.sample import SamplingConfig, generate
    from pgjax.train.learner import Learner

    sys.path.insert(0, plugin_folder)
    import my_estimators

    assert len(jax.devices()) == 4
    config = ModelConfig(family="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    policy = CausalLM(config, nnx.Rngs(0))
    opo = my_estimators.OPO()
    prompts = np.random.default_rng(0).integers(2, 64, (4, 5))
    samples = generate(policy, prompts, np.ones_like(prompts), jax.random.key(0),
                       SamplingConfig(max_new_tokens=6, eos_ids=(1, 2, 3, 4, 5, 6), n=4))
    rollout = Rollout(tokens=samples.tokens, attention_mask=samples.attention_mask,
                      batch=core.Batch(mask=samples.response_mask, logp=None, group_size=4,
                                       rewards=(samples.response % 3 == 0).sum(1).astype(np.float32)))

    def one_step(update, mesh=None):
        learner = Learner(policy, opo, 4, update, optax.sgd(1.0), None, use_reference=False, mesh=mesh)
        state = learner.init_state(policy, jax.random.PRNGKey(0))
        prepared = learner.prepare(state, rollout, opo.hparams)
        grads = learner.policy_gradient(state, prepared, opo.hparams)
        state, metrics = learner.update(state, prepared, opo.hparams)
        return jax.device_get((grads, state.params, {k: metrics[k] for k in ("policy_loss", "advantage_abs_sum")}))

    want = one_step(UpdateConfig())
    assert float(want[2]["advantage_abs_sum"]) > 0
    got = one_step(UpdateConfig(micro_batches=2), mesh_lib.make_mesh(mesh_lib.MeshConfig(data=2, fsdp=2, tensor=1)))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5),
                 got, want)
    print("user estimator on the mesh ok", flush=True)


@pytest.mark.slow
def test_a_users_estimator_shards_and_micro_batches_exactly(plugins):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count=4 {FAST_COMPILE}",
           "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    result = subprocess.run([sys.executable, __file__, str(plugins[0])], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0 and "user estimator on the mesh ok" in result.stdout, result.stderr[-3000:]


if __name__ == "__main__":
    check_user_estimator_shards(sys.argv[1])
