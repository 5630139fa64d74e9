"""What the training loops share: ``RunLoop``, the base of ``Trainer`` and ``RewardModelTrainer``."""
from __future__ import annotations

from typing import Any

import jax

from pgjax.errors import RunStopped
from pgjax.train import interrupts
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.interrupts import RunInterrupted
from pgjax.train.learner import all_finite
from pgjax.train.run_dir import RunDirectory

jitted_all_finite = jax.jit(all_finite)     # whether every array of a tree is finite, compiled once


class RunLoop:
    """What a training loop over checkpointed steps shares (``Trainer``, ``RewardModelTrainer``): a
    ``state``, a ``step_count`` and ``save(checkpoints)``; records written before their checkpoint, a
    stop signal honoured after a step, no checkpoint of a non-finite state."""

    state: Any          # the subclass's training state, a pytree of arrays (each subclass declares its own)
    step_count: int

    def save(self, checkpoints: Checkpoints) -> None:
        """A checkpoint of ``state`` at ``step_count`` (the subclass's)."""
        raise NotImplementedError

    def _check_finite(self, what: str) -> None:
        """RunStopped, before ``what`` is written, when the state holds a NaN or infinity."""
        if not bool(jitted_all_finite(self.state)):
            raise RunStopped(f"the training state at step {self.step_count} is not finite: {what} was not written "
                             "(the previous checkpoints are kept)")

    def _stop_if_asked(self, run: RunDirectory | None, checkpointed: bool) -> None:
        """RunInterrupted when a stop signal came (``interrupts``), after writing a checkpoint of the
        current step to ``run`` unless one was just ``checkpointed``."""
        signum = interrupts.requested()
        if signum is None:
            return
        if run is None:
            raise RunInterrupted(signum, f"after step {self.step_count} (no run directory: nothing saved)")
        if not checkpointed:
            self.save(run.created_checkpoints())
        raise RunInterrupted(signum, f"after step {self.step_count}, its checkpoint written; --resume continues "
                                     "from it")

    def _emit(self, record: dict, run: RunDirectory | None, checkpoint: bool = True,
              completions: list[dict] | None = None) -> None:
        """``record`` and the step's logged ``completions`` to ``run``, then its checkpoint (so that
        a resume, which drops what was logged after its checkpoint, never repeats nor loses a line)."""
        if run is not None:
            run.log(record, completions or ())
            if checkpoint:
                self.save(run.created_checkpoints())
