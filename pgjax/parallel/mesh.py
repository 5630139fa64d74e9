"""A device mesh from the config and one rule table from logical axis names to mesh axes.

Mesh axes: ``data`` (batch only), ``fsdp`` (batch, and parameters sharded along
their ``embed`` axis, ZeRO-3 style) and ``tensor`` (heads, MLP and vocabulary
split Megatron style). Every weight of ``pgjax.models`` carries
``logical_axes``; ``RULES`` maps each name to a mesh axis (``batch`` to
``data`` x ``fsdp``). A dimension that the mesh axes do not divide, or a mesh
axis already used by another dimension of the same array, stays replicated
(correct, just not split). Optimizer moments keep their parameter's metadata,
so they are sharded like it. Batches (rollouts, prompts, the sampler's KV
cache) are split over ``data`` x ``fsdp`` along their first axis. One device is
the trivial mesh: the same code path.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pgjax.checks import check_types, invalid, require

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
MEMBER_AXIS = "members"        # a population's members (pgjax.train.population), before MESH_AXES
RULES = {"batch": BATCH_AXES, "vocab": "tensor", "embed": "fsdp", "heads": "tensor", "kv_heads": "tensor",
         "mlp": "tensor", "head_dim": None, "norm": None, "layers": None}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the ``data``, ``fsdp`` and ``tensor`` axes; one of them may be -1 for "the rest"."""
    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        check_types(self, "mesh.")
        sizes = dict(zip(MESH_AXES, (self.data, self.fsdp, self.tensor), strict=True))
        for axis, size in sizes.items():
            require(size >= 1 or size == -1, f"mesh.{axis}", size, "an integer >= 1, or -1 (the rest of the devices)")
        rest = [axis for axis, size in sizes.items() if size == -1]
        if len(rest) > 1:
            raise invalid(f"mesh.{rest[1]}", -1, f"an integer >= 1 here: mesh.{rest[0]}=-1 takes the rest of the "
                          "devices already")

    def sizes(self, devices: int) -> tuple[int, int, int]:
        sizes = [self.data, self.fsdp, self.tensor]
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if devices % known:
                raise ValueError(f"mesh {sizes} does not fit {devices} devices")
            sizes[sizes.index(-1)] = devices // known
        if math.prod(sizes) != devices:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes, strict=True))} needs {math.prod(sizes)} devices, "
                             f"{devices} are present")
        return sizes[0], sizes[1], sizes[2]


def make_mesh(config: MeshConfig = MeshConfig(), devices=None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh over ``devices`` (default: all devices of all processes, in
    ``jax.devices()`` order, so each process's devices are a contiguous block of the batch axes)."""
    devices = jax.devices() if devices is None else devices
    shape = config.sizes(len(devices))
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def learner_and_sampler_meshes(config: MeshConfig, sampler_devices: int = 0, devices=None) -> tuple[Mesh, Mesh]:
    """(the learner's mesh, the sampler's): with ``sampler_devices`` = n >= 1 the last n devices form a
    data-parallel sampler mesh and ``config`` splits the others (one process only: the sampler's
    rows and the weight copy do not cross hosts); with 0 both are one mesh over every device."""
    devices = jax.devices() if devices is None else devices
    if not sampler_devices:
        mesh = make_mesh(config, devices)
        return mesh, mesh
    if jax.process_count() > 1:
        raise ValueError(f"sampler_devices={sampler_devices}: separate sampler devices need a single process, "
                         f"this run has {jax.process_count()}")
    if not 0 < sampler_devices < len(devices):
        raise ValueError(f"sampler_devices={sampler_devices} must leave the learner at least one of the "
                         f"{len(devices)} devices")
    return make_mesh(config, devices[:-sampler_devices]), make_mesh(MeshConfig(), devices[-sampler_devices:])


def population_mesh(config: MeshConfig, member_groups: int, devices=None) -> Mesh:
    """A ``(members, data, fsdp, tensor)`` mesh over ``devices`` (default: all): a population's members
    split into ``member_groups`` groups along ``members``, each group's devices split by ``config`` (the
    mesh each member trains on). ValueError when the groups do not split the devices evenly."""
    devices = jax.devices() if devices is None else devices
    if member_groups < 1 or len(devices) % member_groups:
        raise ValueError(f"{member_groups} member groups do not split the {len(devices)} devices evenly")
    shape = config.sizes(len(devices) // member_groups)
    return Mesh(np.asarray(devices).reshape(member_groups, *shape), (MEMBER_AXIS, *MESH_AXES))


def single_device_mesh() -> Mesh:
    """The trivial mesh of the first local device."""
    return make_mesh(MeshConfig(), jax.local_devices()[:1])


def _axis_size(mesh: Mesh, axis) -> int:
    return math.prod(mesh.shape[a] for a in ((axis,) if isinstance(axis, str) else axis))


def partition_spec(logical_axes, shape, mesh: Mesh) -> PartitionSpec:
    """The ``RULES`` mapping of one array's logical axes, replicated where a split does not fit."""
    used: set[str] = set()
    spec = []
    for name, size in zip(logical_axes, shape, strict=True):
        if name is not None and name not in RULES:
            raise KeyError(f"no sharding rule for logical axis {name!r}; rules: {sorted(RULES)}")
        axis = RULES.get(name)
        names = set() if axis is None else {axis} if isinstance(axis, str) else set(axis)
        fits = axis is not None and not names & used and size % _axis_size(mesh, axis) == 0
        spec.append(axis if fits else None)
        used |= names if fits else set()
    return PartitionSpec(*spec)


def logical_sharding(logical_axes, shape, mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(logical_axes, shape, mesh))


def constrain(x, logical_axes, mesh: Mesh | None):
    """``x`` inside ``jit`` constrained to its ``RULES`` sharding (unchanged without a mesh)."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, logical_sharding(logical_axes, x.shape, mesh))


def shardings(tree, mesh: Mesh):
    """``NamedSharding`` for every array of ``tree``: by its ``logical_axes`` for model variables
    (parameters and their optimizer moments), replicated for anything else (step, key, counts)."""
    def one(leaf):
        if isinstance(leaf, nnx.Variable):
            value = leaf.get_raw_value()
            axes = leaf.get_metadata().get("logical_axes", (None,) * value.ndim)
            return leaf.replace(logical_sharding(axes, value.shape, mesh))
        return replicated(mesh)
    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard(tree, mesh: Mesh):
    """``tree`` placed on ``mesh`` by ``shardings`` (every process passes the same values)."""
    return jax.device_put(tree, shardings(tree, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Split along the first axis over ``data`` x ``fsdp``."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def batch_shards(mesh: Mesh) -> int:
    """How many ways a batch is split: ``data`` x ``fsdp``; every batch size must be a multiple."""
    return _axis_size(mesh, BATCH_AXES)


def check_divisible_rows(rows: int, mesh: Mesh, what: str) -> None:
    """Raise a ValueError naming ``what`` unless ``rows`` % (data x fsdp) == 0, i.e. unless a batch of
    ``rows`` rows splits evenly over the mesh's batch axes."""
    if rows % batch_shards(mesh):
        raise ValueError(f"{what}: {rows} rows do not split over data x fsdp = {batch_shards(mesh)} devices of "
                         f"the mesh {dict(mesh.shape)}; make it a multiple or change the mesh sizes")


def shard_batch(tree, mesh: Mesh):
    """Every array of ``tree`` (the same values in every process) split along its first axis over
    ``data`` x ``fsdp``."""
    return jax.device_put(tree, batch_sharding(mesh))
