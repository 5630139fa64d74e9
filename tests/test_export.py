"""The jitted training step and the sampler lower for an NVIDIA GPU and a TPU: ``jax.export`` with
``platforms=("cuda", "tpu")`` on this CPU (lowering only; nothing runs there), so that a first run on an
accelerator does not fail on an operation a CPU never lowered. The sampler's export for the CPU,
called, samples what the jitted sampler samples."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import sampled_rollout

from pgjax import core
from pgjax.config import OptimConfig, UpdateConfig
from pgjax.models.transformer import CausalLM, ModelConfig
from pgjax.sample import SamplingConfig
from pgjax.sample.sampler import _generate
from pgjax.train.learner import build_learner

ACCELERATORS = ("cuda", "tpu")
OPTIONS = {"plain": {}, "stacked layers, remat": {"scan_layers": True, "remat": "save_nothing"},
           "bfloat16": {"param_dtype": "bfloat16", "compute_dtype": "bfloat16"}}


def tiny_policy(**options) -> CausalLM:
    return CausalLM(ModelConfig(family="qwen2", vocab_size=12, hidden_size=16, intermediate_size=32,
                                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                **options), nnx.Rngs(0))


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])        # a reference policy; a critic
def test_the_training_step_lowers_for_cuda_and_tpu(algorithm, options):
    policy = tiny_policy(**options)
    learner = build_learner(policy, core.preset(algorithm), 4, UpdateConfig(), OptimConfig(lr=1e-2),
                            OptimConfig(lr=1e-2))
    state = learner.init_state(policy, jax.random.key(0))
    hp = core.HParams()
    rollout = learner.prepare(state, sampled_rollout(policy), hp)
    arguments = (state, rollout, jnp.arange(16), None, hp, None)
    exported = jax.export.export(learner._optimizer_step, platforms=ACCELERATORS)(*arguments)
    assert exported.platforms == ACCELERATORS
    want = jax.eval_shape(learner._optimizer_step, *arguments)
    assert jax.tree.structure(exported.out_tree.unflatten(exported.out_avals)) == jax.tree.structure(want)
    assert [(a.shape, a.dtype) for a in exported.out_avals] == [(a.shape, a.dtype) for a in jax.tree.leaves(want)]


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_the_sampler_lowers_for_cuda_and_tpu_and_its_cpu_export_samples_the_same_tokens(options):
    policy = tiny_policy(**options)
    graphdef, state = nnx.split(policy)
    prompts = jnp.asarray(np.tile(np.arange(2, 6), (4, 1)), jnp.int32)
    arguments = (graphdef, state, prompts, jnp.ones_like(prompts), jax.random.key(3),
                 SamplingConfig(max_new_tokens=5, eos_ids=(1,), n=4), None)
    assert jax.export.export(_generate, platforms=ACCELERATORS)(*arguments).platforms == ACCELERATORS
    on_cpu = jax.export.export(_generate, platforms=("cpu",))(*arguments)
    exported = on_cpu.call(*(a for i, a in enumerate(arguments) if i not in (0, 5, 6)))   # the static ones left out
    sampled = _generate(*arguments)
    np.testing.assert_array_equal(np.asarray(exported.tokens), np.asarray(sampled.tokens))
    np.testing.assert_array_equal(np.asarray(exported.logprobs), np.asarray(sampled.logprobs))
