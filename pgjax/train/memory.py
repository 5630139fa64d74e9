"""What a run holds in memory, before anything is built: the floor its configuration is checked
against, and the one line for running out of memory.

``check_run_memory`` (``check_memory`` for an experiment, before the Trainer builds anything) refuses a
run whose floor (``run_floor``) exceeds the machine: the bytes the run certainly holds at once, counted
from the configuration alone, none twice. On each device: the training state, exactly as the Learner
shards it (parameters, Adam moments, the reference policy and the critic; ``abstract_learner``, from
models of one and two layers, each layer adding the same bytes) and the KV cache of a step's rollout. On
the host: the token ids and masks of the held-out prompts, a step's sampled responses, a warm-start
batch and the update's packed rows. Where the devices are the CPU, all of it shares the host's memory.
Activations, gradients and logits come on top; ``python -m pgjax.plan`` compiles a step to count them. A
run the check refuses starts anyway with ``PGJAX_SKIP_MEMORY_CHECK=1``.

``out_of_memory`` turns XLA's RESOURCE_EXHAUSTED and Python's MemoryError into the one line the
command lines print.
"""
from __future__ import annotations

import dataclasses
import math
import os
import pathlib

import jax
import jax.numpy as jnp
from flax import nnx

from pgjax.checks import ConfigError
from pgjax.config import OptimConfig, UpdateConfig
from pgjax.models import hf
from pgjax.models.transformer import CausalLM, ModelConfig
from pgjax.train.learner import Learner, build_learner

SKIP_MEMORY_CHECK = "PGJAX_SKIP_MEMORY_CHECK"   # =1: start a run that check_run_memory refuses
INT32 = 4                                       # bytes of a token id, mask or segment id


def human(size: float) -> str:
    """Bytes in GiB, MiB or KiB (two decimals)."""
    unit = next(u for u in (3, 2, 1, 0) if size >= 2 ** (10 * u) or not u)
    return f"{size / 2 ** (10 * unit):,.2f} {('B', 'KiB', 'MiB', 'GiB')[unit]}"


def shard_bytes(tree) -> int:
    """Bytes one device holds of ``tree``'s ShapeDtypeStructs (the largest shard of each leaf)."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def placed(tree, shardings):
    """``tree``'s ShapeDtypeStructs carrying ``shardings`` (one per leaf, or one for all)."""
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def abstract_learner(model: ModelConfig, algorithm, group_size: int, update: UpdateConfig, mesh: jax.sharding.Mesh,
                     reference: bool | None = None) -> tuple[Learner, object]:
    """The Learner of a ``model`` trained with ``algorithm`` (a ``core.Algorithm``) on ``mesh``, and its
    TrainState as ShapeDtypeStructs with the Learner's shardings; ``reference``: ``build_learner``'s.

    Both are built inside ``jax.eval_shape``: the Learner's constructor copies the policy's arrays
    (its own ``jax.eval_shape`` of a fresh state), which tracers allow and the ShapeDtypeStructs of
    an ``nnx.eval_shape`` policy do not. What the Learner keeps of the policy is its graph definition."""
    built = {}

    def state():
        policy = CausalLM(model, nnx.Rngs(0))
        built["learner"] = build_learner(policy, algorithm, group_size, update, OptimConfig(), OptimConfig(), mesh,
                                         reference)
        return built["learner"].init_state(policy, jax.random.PRNGKey(0))

    abstract = jax.eval_shape(state)
    return built["learner"], placed(abstract, built["learner"].state_sharding)


def run_state_bytes(exp, model: ModelConfig, mesh: jax.sharding.Mesh) -> int:
    """The bytes of the training state of a run of ``exp`` (an ``Experiment``) on each device of the
    learner's ``mesh``, from the states of ``model`` with one and with two layers: each layer adds the
    same bytes, and building even an abstract model takes a time that grows with its depth."""
    algorithm = exp.algorithm.build()

    def of(layers: int) -> int:
        shallow = dataclasses.replace(model, num_hidden_layers=layers, scan_layers=True,
                                      layer_types=model.layer_types and model.layer_types[:layers])
        return shard_bytes(abstract_learner(shallow, algorithm, exp.rollout.samples_per_prompt, exp.update, mesh)[1])

    one = of(1)
    return one + (model.num_hidden_layers - 1) * (of(2) - one)


def run_floor(exp, model: ModelConfig, mesh: jax.sharding.Mesh) -> dict[str, int]:
    """Bytes a run of ``exp`` (an ``Experiment``) with the learner's ``mesh`` certainly holds, by part,
    none counted twice: ``state``, the training state on each device of the mesh (``run_state_bytes``);
    ``kv_cache``, the KV cache of a step's rollout, all devices together (every sampled row over its
    response budget and one prompt token); ``host``, on this process's host, the token ids and masks of
    the held-out prompts (``rollout.max_prompt_tokens`` wide), a step's sampled responses, a warm-start
    batch of demonstrations and the ids and segments of a packed row per micro-batch
    (``update.pack_width`` rows of two tokens at the least)."""
    r, warm, update = exp.rollout, exp.warm_start, exp.update
    budget = r.episode_budget() if exp.task.tools.names else r.max_new_tokens
    rows = exp.prompts_per_step * r.samples_per_prompt
    kv_cache = (model.num_hidden_layers * 2 * rows * model.num_key_value_heads * (1 + budget) * model.head_dim
                * jnp.dtype(r.compute_dtype or model.compute_dtype).itemsize)
    tokens = (2 * exp.eval_prompts * r.max_prompt_tokens + rows * budget
              + (2 * warm.batch_size * (r.max_prompt_tokens + budget) if warm.steps else 0)
              + 2 * update.micro_batches * 2 * update.pack_width)
    return {"state": run_state_bytes(exp, model, mesh), "kv_cache": kv_cache, "host": INT32 * tokens}


def host_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its control group's limit where lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            total = min(total, int(pathlib.Path(limit).read_text()))
        except (OSError, ValueError):       # no such control group, or no limit ("max")
            pass
    return total


def device_memory(device) -> int | None:
    """Bytes ``device`` can allocate (its ``memory_stats``' ``bytes_limit``); None for a CPU device,
    whose memory is the host's."""
    stats = None if device.platform == "cpu" else device.memory_stats()
    return (stats or {}).get("bytes_limit")


def check_run_memory(exp, model: ModelConfig, mesh: jax.sharding.Mesh, members: int = 1, groups: int = 1) -> None:
    """A ValueError when what a run of ``exp`` certainly holds (``run_floor``) exceeds this machine's
    memory: a device's (``device_memory``) and the host's (``host_memory``), or where the devices are
    the CPU, the host's alone, shared with the host's arrays. For a population (``pgjax.train.population``)
    of ``members`` in ``groups`` groups, each group on its devices (``mesh``: one group's): each device
    holds the states of its group's members and the host every member's arrays (the KV cache: one
    member's at the least). Nothing is built; ``PGJAX_SKIP_MEMORY_CHECK=1`` skips it."""
    if os.environ.get(SKIP_MEMORY_CHECK) == "1":
        return
    floor, ram, device = run_floor(exp, model, mesh), host_memory(), mesh.local_devices[0]
    floor = {"state": floor["state"] * (members // groups), "kv_cache": floor["kv_cache"],
             "host": floor["host"] * members}
    limit = device_memory(device)
    if limit is None:
        checks = [(groups * len(mesh.local_devices) * floor["state"] + floor["kv_cache"] // jax.process_count()
                   + floor["host"], ram, "of memory", "this machine's")]
    else:
        share = floor["kv_cache"] // jax.device_count()        # the cache's share of a device, at the least
        on_device = max(floor["state"], share) if exp.rollout.sampler_devices else floor["state"] + share
        checks = [(on_device, limit, f"on a {device.platform} device", "its"),
                  (floor["host"], ram, "of host memory", "this machine's")]
    for need, room, where, whose in checks:
        if need > room:
            whole = "the run" if members == 1 else f"the population of {members}"
            fewer = "" if members == 1 else ", or the members fewer"
            raise ValueError(f"{whole} needs at least {human(need)} {where} (training state {human(floor['state'])} "
                             f"per device, the KV cache of a step's rollout {human(floor['kv_cache'])}, prompts and "
                             f"tokens on the host {human(floor['host'])}), more than {whose} {human(room)}: make the "
                             f"model, batch or token budgets smaller{fewer}; python -m pgjax.plan plans a training "
                             f"step's memory per device ({SKIP_MEMORY_CHECK}=1 starts the run anyway)")


def out_of_memory(error: BaseException) -> str | None:
    """The one line for ``error`` where it is running out of memory: Python's (NumPy's) MemoryError,
    the host's, or XLA's status RESOURCE_EXHAUSTED (raised as a ``JaxRuntimeError`` or, by some of
    JAX's paths, a ValueError), a device's (on the CPU the host's); None otherwise."""
    message = str(error).strip()
    if isinstance(error, MemoryError):
        what = f"out of host memory ({' '.join(message.split()) or 'MemoryError'})"
    elif message.startswith("RESOURCE_EXHAUSTED:"):
        what = f"out of {jax.default_backend()} memory (XLA: {message.splitlines()[0]})"
    else:
        return None
    return (f"{what}: python -m pgjax.plan plans a training step's memory per device; fewer prompts_per_step or "
            "rollout.samples_per_prompt, a smaller rollout.max_new_tokens, more update.micro_batches or "
            "model.lora.rank > 0 need less")


def check_memory(exp, mesh: jax.sharding.Mesh, members: int = 1, groups: int = 1) -> None:
    """ConfigError unless what a run of ``exp`` certainly holds fits this machine's memory
    (``check_run_memory``; a population's: ``members`` in ``groups`` groups, ``mesh`` one group's), for
    the architecture of ``model.path`` or a new model's (its vocabulary left out: the task's tokenizer
    is not loaded yet)."""
    try:
        model = (hf.load_config(exp.model.path, **exp.model.runtime_options()) if exp.model.path
                 else exp.model.config(vocab_size=1))
    except (ValueError, TypeError, KeyError, OSError) as error:
        raise ConfigError(f"model.path: {error}") from None
    try:
        check_run_memory(exp, model, mesh, members, groups)
    except ValueError as error:
        raise ConfigError(str(error)) from None
