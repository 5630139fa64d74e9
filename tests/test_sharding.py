"""Sharded training and sampling on a simulated 8-device CPU mesh equal the single-device run.

The checks run in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must be set
before JAX starts); this file is also that subprocess's script.
"""
import os
import subprocess
import sys

import pytest

MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 1, 8)]


def check_meshes():
    import jax
    import numpy as np
    import optax
    from flax import nnx

    from pgjax import core
    from pgjax.models.transformer import CausalLM, ModelConfig
    from pgjax.sample import SamplingConfig, generate
    from pgjax.train import mesh as mesh_lib
    from pgjax.train.learner import Learner, Rollout, UpdateConfig

    assert len(jax.devices()) == 8
    config = ModelConfig(family="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=8, head_dim=4)
    policy = CausalLM(config, nnx.Rngs(0))
    algo = core.preset("ppo")
    # plain SGD: the parameter change is the gradient itself (Adam would amplify rounding in tiny gradients)
    learner = Learner(policy, algo, 4, UpdateConfig(minibatches=2, micro_batches=2), optax.sgd(1.0),
                      optax.sgd(1.0), use_reference=False)
    prompts = np.random.default_rng(0).integers(2, 64, (8, 5))
    sampling = SamplingConfig(max_new_tokens=6, eos_ids=(1,), n=4)
    samples = generate(policy, prompts, np.ones_like(prompts), jax.random.key(0), sampling)
    rollout = Rollout(tokens=samples.tokens, attention_mask=samples.attention_mask, mask=samples.response_mask,
                      rewards=(samples.response == 7).sum(1).astype(np.float32))

    def one_step(state, rollout):
        rollout = learner.prepare(state, rollout, algo.hparams)
        state, metrics = learner.update(state, rollout, algo.hparams)
        return jax.device_get((state.params, state.critic_params, metrics["policy_loss"]))

    want = one_step(learner.init_state(policy, jax.random.PRNGKey(0)), rollout)
    for sizes in MESHES:
        mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(*sizes))
        state = mesh_lib.shard(learner.init_state(policy, jax.random.PRNGKey(0)), mesh)
        gate = state.params["layers"][0]["mlp"]["gate"][...]
        fsdp, tensor = sizes[1], sizes[2]
        assert gate.addressable_shards[0].data.shape == (32 // fsdp, 64 // tensor), (sizes, gate.sharding)
        got = one_step(state, mesh_lib.shard_batch(rollout, mesh))
        close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
        jax.tree.map(close, got, want)
        sharded_policy = nnx.merge(nnx.graphdef(policy), mesh_lib.shard(nnx.state(policy), mesh))
        tokens = generate(sharded_policy, prompts, np.ones_like(prompts), jax.random.key(0), sampling).tokens
        np.testing.assert_array_equal(np.asarray(tokens), np.asarray(samples.tokens))
        print("mesh", sizes, "ok", flush=True)


@pytest.mark.slow
def test_sharded_update_and_sampling_equal_the_single_device_run():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" ok") == len(MESHES)


def test_mesh_sizes_resolve_minus_one_and_reject_misfits():
    from pgjax.train.mesh import MeshConfig
    assert MeshConfig(data=-1, fsdp=2, tensor=2).sizes(8) == (2, 2, 2)
    assert MeshConfig().sizes(1) == (1, 1, 1)
    for bad, match in ((MeshConfig(data=3), "needs 3 devices"), (MeshConfig(data=-1, fsdp=-1), "at most one -1"),
                       (MeshConfig(data=-1, fsdp=3), "does not fit")):
        with pytest.raises(ValueError, match=match):
            bad.sizes(8)


def test_partition_specs_follow_the_rule_table_and_fall_back_to_replication():
    import jax
    from jax.sharding import PartitionSpec

    from pgjax.train.mesh import make_mesh, partition_spec
    mesh = make_mesh(devices=jax.devices()[:1])
    assert partition_spec(("embed", "mlp"), (8, 16), mesh) == PartitionSpec("fsdp", "tensor")
    assert partition_spec(("norm",), (8,), mesh) == PartitionSpec(None)
    with pytest.raises(KeyError, match="no sharding rule for logical axis 'experts'"):
        partition_spec(("experts",), (4,), mesh)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    check_meshes()
