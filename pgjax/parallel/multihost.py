"""Multi-process runs (JAX's multi-controller runtime): start-up, and each process's slice of a batch.

Every process runs the same program on its own local devices; jitted
functions see *global* arrays whose shards live on all processes' devices.
Host-side work (tokenising prompts, decoding and scoring responses) is split:
a process handles only the rows of a batch that its devices hold
(``process_rows``), turns them into its part of a global array
(``to_global``) and reads its rows of a global result back (``to_host``).
With one process all of this is the identity on the whole batch.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, PartitionSpec

from pgjax.checks import check_types, require
from pgjax.parallel.mesh import BATCH_AXES, batch_sharding, check_divisible_rows


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How the processes of a multi-host run find each other.

    ``initialize``: ``auto`` starts ``jax.distributed`` when a cluster is visible in the
    environment (``JAX_COORDINATOR_ADDRESS``, SLURM with several tasks, Open MPI with several
    ranks, a multi-host TPU slice); ``on`` always; ``off`` never (one process).
    ``coordinator_address`` (host:port of process 0), ``num_processes`` and ``process_id``
    override the environment (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
    ``JAX_PROCESS_ID``); left unset, JAX detects them on SLURM, Open MPI and Cloud TPU.
    """
    initialize: str = "auto"
    coordinator_address: str = ""
    num_processes: int = 0
    process_id: int = -1

    def __post_init__(self):
        check_types(self, "distributed.")
        require(self.initialize in ("auto", "on", "off"), "distributed.initialize", self.initialize,
                "one of auto, on, off")
        require(self.num_processes >= 0, "distributed.num_processes", self.num_processes,
                "an integer >= 0 (0: from the environment)")
        require(self.process_id == -1 or 0 <= self.process_id < (self.num_processes or self.process_id + 1),
                "distributed.process_id", self.process_id,
                f"in [0, num_processes={self.num_processes}), or -1 (from the environment)")


def cluster_detected(environ=os.environ) -> bool:
    """Whether the environment describes a run of more than one process."""
    if environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    many = lambda key: int(environ.get(key, "1") or "1") > 1  # noqa: E731
    return (many("SLURM_NTASKS") or many("OMPI_COMM_WORLD_SIZE")
            or "," in environ.get("TPU_WORKER_HOSTNAMES", ""))


def initialize(config: DistributedConfig = DistributedConfig(), environ=os.environ) -> bool:
    """Start ``jax.distributed`` as ``config`` says (before any other JAX call); True if started."""
    explicit = bool(config.coordinator_address)
    if config.initialize == "off" or jax.distributed.is_initialized():
        return False
    if config.initialize == "auto" and not (explicit or cluster_detected(environ)):
        return False
    num = config.num_processes or int(environ.get("JAX_NUM_PROCESSES", 0)) or None
    pid = config.process_id if config.process_id >= 0 else environ.get("JAX_PROCESS_ID")
    jax.distributed.initialize(coordinator_address=config.coordinator_address or None, num_processes=num,
                               process_id=None if pid is None else int(pid))
    if jax.process_count() > 1 and jax.default_backend() == "cpu":
        # JAX's persistent cache is written by process 0 and read by every process; on CPU, with it warm,
        # a 2-process run hung in its first cross-process decode every time, and never with it cold or
        # off (the cause inside XLA not pinned down: docs/scaling.md), so CPU runs of several processes
        # compile afresh
        jax.config.update("jax_enable_compilation_cache", False)
    return True


def is_primary() -> bool:
    """Process 0: the one that writes metrics, plots and exported checkpoints."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier ``name`` (nothing to wait for with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def largest(value: int, mesh: Mesh | None) -> int:
    """The largest of every process's ``value`` (this process's own with one process or no mesh): what
    host-side loops agree on before a collective, so that every process calls it, with one shape."""
    if mesh is None or jax.process_count() == 1:
        return int(value)
    return int(np.max(multihost_utils.process_allgather(np.asarray(value, np.int64))))


def process_rows(rows: int, mesh: Mesh) -> slice:
    """The rows of a ``rows``-row global batch that this process's devices hold (and feed)."""
    check_divisible_rows(rows, mesh, "global batch")
    # (jax's Index | None: a device that holds none of the array's data, which holds no rows)
    indices = [i for i in batch_sharding(mesh).addressable_devices_indices_map((rows,)).values() if i is not None]
    starts = sorted({(i[0].start or 0, rows if i[0].stop is None else i[0].stop) for i in indices})
    lo, hi = starts[0][0], starts[-1][1]
    if sum(b - a for a, b in starts) != hi - lo:
        raise ValueError(f"this process's devices do not hold a contiguous block of the batch in mesh {mesh}")
    return slice(lo, hi)


def process_share(items, mesh: Mesh):
    """This process's part (``process_rows``) of a sequence every process holds whole."""
    return items[process_rows(len(items), mesh)]


def to_global(tree, mesh: Mesh):
    """This process's rows (``process_rows``) of every array of ``tree`` -> global arrays split
    over ``data`` x ``fsdp``."""
    return multihost_utils.host_local_array_to_global_array(
        jax.tree.map(np.asarray, tree), mesh, PartitionSpec(BATCH_AXES))


def to_host(tree, mesh: Mesh):
    """This process's rows of every (batch-split) global array of ``tree``, as NumPy arrays."""
    local = multihost_utils.global_array_to_host_local_array(tree, mesh, PartitionSpec(BATCH_AXES))
    return jax.tree.map(np.asarray, local)


def gather_rows(tree, rows: int, mesh: Mesh):
    """Every process's rows (``process_rows``) of each NumPy array of ``tree`` -> all ``rows`` rows,
    on every process (for metrics)."""
    mine = process_rows(rows, mesh)
    if mine.stop - mine.start == rows:
        return tree
    starts = multihost_utils.process_allgather(np.asarray(mine.start))
    first = {int(s): p for p, s in reversed(list(enumerate(starts)))}
    order = [first[s] for s in sorted(first)]

    def one(x):
        every = multihost_utils.process_allgather(np.asarray(x))      # [processes, local rows, ...]
        return np.concatenate([every[p] for p in order])
    return jax.tree.map(one, tree)


def gather(tree):
    """Full NumPy copies of every (sharded, global) array of ``tree`` on every process."""
    return multihost_utils.process_allgather(tree, tiled=True)
