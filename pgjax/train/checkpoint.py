"""Orbax checkpoints of a run: the ``TrainState`` and a JSON record (data position, step, config).

A checkpoint is written atomically (orbax finalises a step directory only when
complete), so a run killed at any moment resumes from the last complete step.
"""
from __future__ import annotations

import pathlib

import jax
import orbax.checkpoint as ocp


class Checkpoints:
    """Step-numbered checkpoints under ``directory``; keeps the newest ``keep``."""

    def __init__(self, directory, keep: int = 2):
        self.directory = pathlib.Path(directory).absolute()
        self.manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True), item_names=("state", "record"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, record: dict) -> None:
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         record=ocp.args.JsonSave(record)), force=True)
        self.manager.wait_until_finished()

    def restore(self, like, step: int | None = None):
        """(state, record) of ``step`` (default: the latest), shaped like the pytree ``like``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                       record=ocp.args.JsonRestore()))
        return restored.state, restored.record

    def close(self) -> None:
        self.manager.close()
