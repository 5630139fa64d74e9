"""Sharded training and sampling on a simulated 8-device CPU mesh equal the single-device run.

The checks run in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must be set
before JAX starts); this file is also that subprocess's script.
"""
import os
import subprocess
import sys
import tempfile

import pytest

from pgjax.checks import ConfigError
from pgjax.models.lora import LoRAConfig

MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 1, 8)]


def check_meshes():
    import jax
    import numpy as np
    import optax
    from flax import nnx

    from pgjax import core
    from pgjax.config import UpdateConfig
    from pgjax.models.transformer import CausalLM, ModelConfig
    from pgjax.parallel import mesh as mesh_lib
    from pgjax.rollout.batch import Rollout
    from pgjax.sample import SamplingConfig, generate
    from pgjax.train.learner import Learner

    assert len(jax.devices()) == 8
    config = ModelConfig(family="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=8, head_dim=4)
    policy = CausalLM(config, nnx.Rngs(0))
    algo = core.preset("ppo")
    # plain SGD: the parameter change is the gradient itself (Adam would amplify rounding in tiny gradients)
    def make_learner(mesh=None):
        return Learner(policy, algo, 4, UpdateConfig(minibatches=2, micro_batches=2), optax.sgd(1.0), optax.sgd(1.0),
                       use_reference=False, mesh=mesh)
    prompts = np.random.default_rng(0).integers(2, 64, (8, 5))
    sampling = SamplingConfig(max_new_tokens=6, eos_ids=(1,), n=4)
    samples = generate(policy, prompts, np.ones_like(prompts), jax.random.key(0), sampling)
    ragged = SamplingConfig(max_new_tokens=6, eos_ids=tuple(range(1, 32)), n=4)   # the decode batch shrinks
    ragged_samples = generate(policy, prompts, np.ones_like(prompts), jax.random.key(0), ragged)
    lengths = np.asarray(ragged_samples.lengths)
    assert (lengths > 3).sum() <= 8 and lengths.max() > 4                          # ... to 8 rows, then decodes
    rollout = Rollout(tokens=samples.tokens, attention_mask=samples.attention_mask,
                      batch=core.Batch(mask=samples.response_mask, logp=None, group_size=4,
                                       rewards=(samples.response == 7).sum(1).astype(np.float32)))

    def one_step(learner, rollout):
        state = learner.init_state(policy, jax.random.PRNGKey(0))
        gate = {s.data.shape for s in state.params["layers"][0]["mlp"]["gate"][...].addressable_shards}
        rollout = learner.prepare(state, rollout, algo.hparams)
        grads = learner.policy_gradient(state, rollout, algo.hparams)
        state, metrics = learner.update(state, rollout, algo.hparams)
        return gate, jax.device_get((grads, state.params, state.critic_params, metrics["policy_loss"]))

    _, want = one_step(make_learner(), rollout)
    for sizes in MESHES:
        mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(*sizes))
        gate, got = one_step(make_learner(mesh), rollout)
        fsdp, tensor = sizes[1], sizes[2]
        # each device holds 1/(fsdp * tensor) of the weight
        assert gate == {(32 // fsdp, 64 // tensor)}, (sizes, gate)
        def close(a, b):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
        jax.tree.map(close, got, want)
        sharded_policy = nnx.merge(nnx.graphdef(policy), mesh_lib.shard(nnx.state(policy), mesh))
        for config, single in ((sampling, samples), (ragged, ragged_samples)):
            sharded = generate(sharded_policy, prompts, np.ones_like(prompts), jax.random.key(0), config, mesh=mesh)
            assert sharded.tokens.sharding.is_equivalent_to(mesh_lib.batch_sharding(mesh), 2), sharded.tokens.sharding
            np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(single.tokens))
        print("mesh", sizes, "ok", flush=True)

    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(2, 2, 2))      # packed rows split over 4 batch devices
    packed = Learner(policy, algo, 4, UpdateConfig(minibatches=2, micro_batches=2, pack_width=2), optax.sgd(1.0),
                     optax.sgd(1.0), use_reference=False, mesh=mesh)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5),
                 one_step(packed, rollout)[1], want)
    print("packed update on the mesh", "ok", flush=True)

    check_model_options(policy, algo, rollout)

    from pgjax.config import ConfigError, Experiment
    from pgjax.train.trainer import train
    with tempfile.TemporaryDirectory() as tmp:   # the runner refuses before it writes anything
        exp = Experiment(prompts_per_step=6, mesh=mesh_lib.MeshConfig(data=2, fsdp=2, tensor=2), run_dir=tmp + "/r")
        try:
            train(exp, progress=False)
            raise AssertionError("a batch of 6 prompts on a 4-way batch split must raise")
        except ConfigError as error:
            assert "do not split over data x fsdp = 4" in str(error), error
        assert not os.path.exists(tmp + "/r")


# model options against the plain float32 gradient (a relative tolerance on the whole gradient's norm);
# LoRA (adapter gradients only) against its own single-device gradient
OPTIONS = [(dict(scan_layers=True), 1e-5), (dict(remat="save_nothing"), 1e-5),
           (dict(scan_layers=True, remat="save_matmuls"), 1e-5), (dict(compute_dtype="bfloat16"), 2e-2),
           (dict(lora=LoRAConfig(rank=4, alpha=8.0), scan_layers=True), 1e-5)]


def check_model_options(policy, algo, rollout):
    """On the 2x2x2 mesh each option's policy gradient of one prepared rollout equals the plain
    single-device float32 one (bfloat16 compute: within its tolerance; LoRA: its own on one device)."""
    import jax
    import numpy as np
    import optax
    from helpers import per_layer

    from pgjax.config import UpdateConfig
    from pgjax.models import hf
    from pgjax.parallel import mesh as mesh_lib
    from pgjax.train.learner import Learner

    def gradient(mesh, **options):
        with tempfile.TemporaryDirectory() as directory:
            hf.save(policy, directory)
            model = hf.load(directory, **options)
        learner = Learner(model, algo, 4, UpdateConfig(), optax.sgd(1.0), optax.sgd(1.0), use_reference=False,
                          mesh=mesh)
        state = learner.init_state(model, jax.random.PRNGKey(0))
        grads = learner.policy_gradient(state, learner.prepare(state, rollout, algo.hparams), algo.hparams)
        return per_layer(jax.device_get(grads), model.config)

    plain = gradient(None)
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(2, 2, 2))
    for options, tolerance in OPTIONS:
        want = gradient(None, **options) if "lora" in options else plain
        norm = np.sqrt(sum(np.sum(np.square(g)) for g in want.values()))
        got = gradient(mesh, **options)
        assert got.keys() == want.keys(), options
        error = np.sqrt(sum(np.sum(np.square(np.float32(got[k]) - want[k])) for k in want))
        assert error <= tolerance * norm, (options, error / norm)
        print("options", options, "relative gradient error", error / norm, "ok", flush=True)


@pytest.mark.slow
def test_sharded_update_and_sampling_equal_the_single_device_run():
    from helpers import XLA_COLLECTIVE_HANG, simulated_devices
    env = {**os.environ, "XLA_FLAGS": simulated_devices(8), "JAX_PLATFORMS": "cpu"}
    for _ in range(3):       # only XLA's CPU collective hang (see simulated_devices) is retried
        done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
        if done.returncode == 0 or XLA_COLLECTIVE_HANG not in done.stderr:
            break
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" ok") == len(MESHES) + 1 + len(OPTIONS)


def test_mesh_sizes_resolve_minus_one_and_reject_misfits():
    from pgjax.parallel.mesh import MeshConfig
    assert MeshConfig(data=-1, fsdp=2, tensor=2).sizes(8) == (2, 2, 2)
    assert MeshConfig().sizes(1) == (1, 1, 1)
    for bad, match in ((MeshConfig(data=3), "needs 3 devices"), (MeshConfig(data=-1, fsdp=3), "does not fit")):
        with pytest.raises(ValueError, match=match):
            bad.sizes(8)
    for sizes, match in ((dict(data=-1, fsdp=-1), r"mesh\.fsdp=-1 is invalid: .* mesh\.data=-1 takes the rest"),
                         (dict(tensor=0), r"mesh\.tensor=0 is invalid: an integer >= 1, or -1 \(the rest")):
        with pytest.raises(ConfigError, match=match):     # refused when the config is made
            MeshConfig(**sizes)


def test_partition_specs_follow_the_rule_table_and_fall_back_to_replication():
    import jax
    from jax.sharding import PartitionSpec

    from pgjax.parallel.mesh import make_mesh, partition_spec
    mesh = make_mesh(devices=jax.devices()[:1])
    assert partition_spec(("embed", "mlp"), (8, 16), mesh) == PartitionSpec("fsdp", "tensor")
    assert partition_spec(("norm",), (8,), mesh) == PartitionSpec(None)
    with pytest.raises(KeyError, match="no sharding rule for logical axis 'experts'"):
        partition_spec(("experts",), (4,), mesh)


def test_a_cluster_is_detected_from_the_usual_environment_variables():
    from pgjax.parallel.multihost import cluster_detected
    assert not cluster_detected({})
    assert not cluster_detected({"SLURM_NTASKS": "1", "OMPI_COMM_WORLD_SIZE": "1", "TPU_WORKER_HOSTNAMES": "w0"})
    for env in ({"JAX_COORDINATOR_ADDRESS": "node0:1234"}, {"SLURM_NTASKS": "4"}, {"OMPI_COMM_WORLD_SIZE": "2"},
                {"TPU_WORKER_HOSTNAMES": "w0,w1"}):
        assert cluster_detected(env), env


def test_one_process_without_a_cluster_does_not_start_jax_distributed():
    from pgjax.parallel.multihost import DistributedConfig, initialize
    assert not initialize(DistributedConfig(), environ={})
    assert not initialize(DistributedConfig(initialize="off"), environ={"SLURM_NTASKS": "4"})
    with pytest.raises(ConfigError, match="distributed.initialize='yes' is invalid: one of auto, on, off"):
        initialize(DistributedConfig(initialize="yes"), environ={})


def test_one_process_feeds_and_reads_back_every_row():
    import jax
    import numpy as np

    from pgjax.parallel.mesh import make_mesh
    from pgjax.parallel.multihost import gather_rows, process_rows, to_global, to_host
    mesh = make_mesh(devices=jax.devices()[:1])
    assert process_rows(6, mesh) == slice(0, 6)
    rows = np.arange(12).reshape(6, 2)
    assert to_global(rows, mesh).shape == (6, 2)
    np.testing.assert_array_equal(to_host(to_global(rows, mesh), mesh), rows)
    np.testing.assert_array_equal(gather_rows(rows, 6, mesh), rows)


def test_a_batch_that_does_not_split_over_the_batch_axes_raises_naming_it():
    import types

    from pgjax.parallel.mesh import check_divisible_rows
    mesh = types.SimpleNamespace(shape={"data": 2, "fsdp": 2, "tensor": 2})
    check_divisible_rows(8, mesh, "prompts_per_step")
    with pytest.raises(ValueError, match="prompts_per_step: 6 rows do not split over data x fsdp = 4"):
        check_divisible_rows(6, mesh, "prompts_per_step")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    check_meshes()
