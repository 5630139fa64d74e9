"""A run's directory: its layout, and everything a run writes or reads back.

  experiment.json         the experiment as given (written once, at the start)
  metrics.jsonl           one JSON line per RL step (and the step-0 evaluation)
  events.out.tfevents.*   the same metrics for TensorBoard (``tensorboard --logdir runs/``)
  curves.png              reward / accuracy / length / KL / entropy curves, drawn at the end
  checkpoints/<step>/     orbax checkpoints: the ``TrainState`` and a JSON record (step, data position)
  tokenizer/              the tokenizer the run used
  final/                  the trained policy as a Hugging Face checkpoint (``from_pretrained`` loads it)

``RunDirectory(exp, resume)`` only finds the directory and checks it can be used (ConfigError
otherwise); ``create`` makes it, ``start`` opens the metric writers and writes a new run's first
files. A new run never reuses a directory that holds
checkpoints: without ``run_dir`` it takes the first of ``runs/<name>``, ``runs/<name>-2``, ... that
holds none; ``--resume`` takes the last that does. On several processes every process writes its
shards of each checkpoint and process 0 alone writes everything else.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import uuid

import jax
import orbax.checkpoint as ocp

from pgjax.models import hf
from pgjax.parallel import multihost
from pgjax.train.experiment import ConfigError, Experiment, resolved

CURVES = (("reward", "reward"), ("accuracy", "sampled accuracy"), ("eval_accuracy", "greedy eval accuracy"),
          ("length_correct", "length (correct)"), ("length_incorrect", "length (incorrect)"),
          ("entropy", "entropy"), ("kl_ref", "KL to reference"), ("clip_fraction", "clip fraction"))


class Checkpoints:
    """Step-numbered orbax checkpoints under ``directory``; keeps the newest ``keep``. A checkpoint is
    written atomically (orbax finalises a step directory only when complete), so a run killed at any
    moment resumes from the last complete step."""

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


def read_records(directory) -> list[dict]:
    """The metric records of the run in ``directory`` (none before its first line)."""
    path = pathlib.Path(directory) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _has_checkpoints(directory: pathlib.Path) -> bool:
    folder = directory / "checkpoints"
    return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def locate(exp: Experiment, resume: bool) -> pathlib.Path:
    """The run's directory (see the module docstring); ConfigError, with nothing created, when a new
    run's ``run_dir`` holds checkpoints, ``resume`` finds none, or the directory cannot be created."""
    if exp.run_dir:
        directory = pathlib.Path(exp.run_dir)
    else:
        nth = lambda i: pathlib.Path("runs") / (exp.name if i == 1 else f"{exp.name}-{i}")
        i = 1
        while _has_checkpoints(nth(i)):
            i += 1
        directory = nth(max(i - 1, 1)) if resume else nth(i)
    if resume and not _has_checkpoints(directory):
        raise ConfigError(f"--resume: no checkpoint to resume in {directory / 'checkpoints'}"
                          f"{'' if exp.run_dir else ' (set run_dir to resume a run stored elsewhere)'}")
    if not resume and _has_checkpoints(directory):
        raise ConfigError(f"run_dir={str(directory)!r} already holds checkpoints; pass --resume to continue it "
                          "or choose another run_dir (nothing was overwritten)")
    existing = next(p for p in (directory, *directory.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir={str(directory)!r} cannot be written: {existing} is not a writable directory")
    return directory


class RunDirectory:
    """One run's directory and its writers (metrics, TensorBoard, Weights & Biases, checkpoints)."""

    def __init__(self, exp: Experiment, resume: bool):
        self.exp, self.resume = exp, resume
        self.directory = locate(exp, resume)
        self.metrics_path = self.directory / "metrics.jsonl"
        self.primary = True         # until ``create``: no JAX call before jax.distributed starts
        self.checkpoints = self.tensorboard = self.wandb = None

    def create(self) -> None:
        """Make the directory and its checkpoint manager."""
        self.primary = multihost.is_primary()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.checkpoints = Checkpoints(self.directory / "checkpoints")

    def start(self, tokenizer, start_step: int) -> None:
        """Open the metric writers the experiment enables; then a new run writes its experiment.json,
        tokenizer and an empty metrics.jsonl (leftovers of a run that never checkpointed are not its),
        and a resumed one drops the metric lines after ``start_step``. TensorBoard discards earlier
        events after ``start_step`` (a new run: all of them). A W&B run keeps its id in
        ``wandb_run_id``, so a resumed run continues it (W&B ignores re-logged steps at or below the
        last one it has)."""
        if not self.primary:
            return
        logging = self.exp.logging
        if logging.wandb:
            import wandb
            id_file = self.directory / "wandb_run_id"
            run_id = id_file.read_text().strip() if self.resume and id_file.exists() else uuid.uuid4().hex[:16]
            try:
                self.wandb = wandb.init(project=logging.wandb_project, name=self.directory.name, id=run_id,
                                        dir=str(self.directory), config=resolved(self.exp),
                                        resume="allow" if self.resume else "never")
            except Exception as error:      # no login, no network, a bad project: the user's setting
                raise ConfigError(f"logging.wandb: wandb.init failed ({error}); log in, or set "
                                  "WANDB_MODE=offline, or logging.wandb=false") from None
            id_file.write_text(run_id)
        if logging.tensorboard:
            from tensorboardX import SummaryWriter
            self.tensorboard = SummaryWriter(str(self.directory), purge_step=start_step + 1 if self.resume else 0)
        if self.resume:
            kept = [r for r in self.records() if r["step"] <= start_step]
            self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
            return
        (self.directory / "experiment.json").write_text(json.dumps(dataclasses.asdict(self.exp), indent=2,
                                                                   default=str))
        tokenizer.save_pretrained(self.directory / "tokenizer")
        self.metrics_path.write_text("")

    def records(self) -> list[dict]:
        return read_records(self.directory)

    def log(self, record: dict) -> None:
        """One step's record to metrics.jsonl and to each enabled writer (numbers only there)."""
        if not self.primary:
            return
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        step = record["step"]
        numbers = {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        if self.tensorboard is not None:
            for key, value in numbers.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)

    def export(self, policy) -> None:
        """``final/``: the policy as a Hugging Face checkpoint with the run's tokenizer, and the curves.
        ``policy`` holds full (gathered) parameters; process 0 writes."""
        if self.primary:
            hf.save(policy, self.directory / "final", tokenizer_dir=self.directory / "tokenizer")
            plot(self.records(), self.directory / "curves.png", self.exp.name)

    def close(self, failed: bool = False) -> None:
        for writer in (self.checkpoints, self.tensorboard):
            if writer is not None:
                writer.close()
        if self.wandb is not None:
            self.wandb.finish(exit_code=1 if failed else 0)


def plot(records: list[dict], path, title: str) -> None:
    """One PNG with a panel per curve of ``CURVES`` that the run logged."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(k, label) for k, label in CURVES if any(r.get(k) is not None for r in records)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.8), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        ax.plot(*zip(*points, strict=True), marker="." if len(points) < 30 else None)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
