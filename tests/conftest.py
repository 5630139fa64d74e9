"""Shared test helpers: random batches whose log-probs are a function of parameters."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pgjax.core import Batch, token_logprobs

VOCAB = 5


# What XLA's CPU runtime prints when it gives up on a collective whose participants never all arrived.
XLA_COLLECTIVE_HANG = "Termination timeout for"


def simulated_devices(count: int) -> str:
    """XLA_FLAGS for ``count`` simulated CPU devices. On this 2-core machine an 8-device program now
    and then never completes a collective (seen in the sampler's while loop on a 2x2x2 mesh: the
    devices wait in different collectives; XLA aborts after 40 s by default, and a 10-minute limit
    hung just the same), so the wait is cut at 120 s and the caller may retry (``XLA_COLLECTIVE_HANG``)."""
    return (f"--xla_force_host_platform_device_count={count} --xla_cpu_collective_call_terminate_timeout_seconds=120"
            " --xla_cpu_collective_call_warn_stuck_timeout_seconds=60")


def make_batch(seed: int, prompts: int = 3, group_size: int = 4, length: int = 6, *, dtype=jnp.float32):
    """A batch of P * K rows with varied response lengths (one empty response, one full,
    i.e. truncated), binary rewards with one all-equal group, and behaviour / reference
    log-probs near the current ones so that some tokens are clipped.

    Returns ``(batch, theta, tokens)``; ``batch.logp == token_logprobs(theta, tokens)``.
    """
    rng = np.random.default_rng(seed)
    b = prompts * group_size
    lengths = rng.integers(1, length + 1, size=b)
    lengths[0], lengths[1] = 0, length
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float64)
    rewards = rng.integers(0, 2, size=b).astype(np.float64)
    rewards[group_size:2 * group_size] = 1.0  # prompt 1: every sample correct
    theta = rng.normal(size=(b, length, VOCAB))
    tokens = rng.integers(0, VOCAB, size=(b, length))
    theta, tokens = jnp.asarray(theta, dtype), jnp.asarray(tokens)
    logp = token_logprobs(theta, tokens)
    noise = lambda scale: jnp.asarray(rng.normal(scale=scale, size=(b, length)), dtype)
    batch = Batch(mask=jnp.asarray(mask, dtype), rewards=jnp.asarray(rewards, dtype), logp=logp,
                  old_logp=logp + noise(0.3), ref_logp=logp + noise(0.2),
                  values=noise(1.0), bootstrap=jnp.asarray(np.where(lengths == length, 0.5, 0.0), dtype),
                  greedy_rewards=jnp.asarray(rng.integers(0, 2, size=b), dtype), group_size=group_size)
    return batch, theta, tokens


def per_layer(grads, config) -> dict:
    """{(layer, name): array} of a gradient tree, stacked (``scan_layers``) or one subtree per layer."""
    flat = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads)):
        keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        if keys[0] == "layers" and config.scan_layers:
            flat.update(((i, tuple(keys[1:])), leaf[i]) for i in range(config.num_hidden_layers))
        elif keys[0] == "layers":
            flat[(keys[1], tuple(keys[2:]))] = leaf
        else:
            flat[(None, tuple(keys))] = leaf
    return flat


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield
