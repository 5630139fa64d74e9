"""A study's typed jobs and the two ways a training job runs: in this process or as ``python -m pgjax.run``."""
from __future__ import annotations

import pathlib
import subprocess
import sys
from dataclasses import dataclass

from pgjax import config as config_lib
from pgjax.train.trainer import train


@dataclass(frozen=True)
class TrainJob:
    """Train ``method`` with ``seed``; named ``train:METHOD:SEED``."""
    method: str
    seed: int

    def __str__(self) -> str:
        return f"train:{self.method}:{self.seed}"


@dataclass(frozen=True)
class EvalJob:
    """Evaluation ``kind`` of ``model`` (a reference or a trained run) in ``variant`` (``""``: the one
    variant of an evaluation without variants); named ``KIND:MODEL`` or ``KIND:MODEL:VARIANT``."""
    kind: str
    model: str
    variant: str = ""

    def __str__(self) -> str:
        return f"{self.kind}:{self.model}" + (f":{self.variant}" if self.variant else "")


Job = TrainJob | EvalJob


def resuming(directory: pathlib.Path) -> bool:
    """Whether run ``directory`` holds a checkpoint to resume from."""
    return any((directory / "checkpoints").glob("*"))


@dataclass(frozen=True)
class Subprocess:
    """Each training job a ``python -m pgjax.run`` process (it survives the session that started it, and a
    run with checkpoints is resumed): for studies of real models, hours a run."""

    def train(self, experiment: str | config_lib.Experiment, sets: list[str], directory: pathlib.Path) -> None:
        """Train experiment file ``experiment`` with the ``--set`` overrides ``sets`` (which name ``directory``
        as its ``run_dir``), resumed when ``directory`` has checkpoints."""
        assert isinstance(experiment, str), "Study refuses an Experiment object for a Subprocess runner"
        resume = ["--resume"] if resuming(directory) else []
        command = [sys.executable, "-m", "pgjax.run", experiment, "--no-progress",
                   *[arg for s in sets for arg in ("--set", s)], *resume]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)


@dataclass(frozen=True)
class InProcess:
    """Each training job run by ``pgjax.train.trainer.train`` in this process, with the trainer ``callbacks``:
    the runs share their compiled programs, which keeps studies of tiny models fast."""
    callbacks: tuple = ()

    def train(self, experiment: str | config_lib.Experiment, sets: list[str], directory: pathlib.Path) -> None:
        """Train ``experiment`` (an experiment file or an ``Experiment``) with the ``--set`` overrides ``sets``
        (which name ``directory`` as its ``run_dir``), resumed when ``directory`` has checkpoints."""
        exp = config_lib.load(experiment) if isinstance(experiment, str) else experiment
        train(config_lib.override(exp, sets), resume=resuming(directory), progress=False, callbacks=self.callbacks)


Runner = Subprocess | InProcess
