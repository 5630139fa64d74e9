"""A run's directory: finding it, its lock, the experiment it records and the changes a resume
makes to it, and ``RunDirectory``, which writes everything else there through ``checkpoints``
(``Checkpoints``) and ``sinks`` (the metric writers).

  experiment.json         the experiment the run uses (rewritten, atomically, when a resume changes it)
  changes.jsonl           each accepted change of the experiment on resume: the step, the keys, old and new
  metrics.jsonl, events.out.tfevents.*, wandb/, curves.png
                          the metric records (``pgjax.train.sinks``)
  checkpoints/<step>/, damaged_checkpoints/
                          verified orbax checkpoints (``pgjax.train.checkpoints``)
  tokenizer/              the tokenizer the run used (and the checkpoint's generation_config.json)
  final/                  the trained policy as a Hugging Face checkpoint (``from_pretrained`` loads it);
                          with LoRA also the PEFT adapter (``final/adapter``), whose recorded base is an
                          absolute path: ``model.path``, or ``final/base`` (written there) for a random base
  .lock                   held (an OS file lock) by the live run; names its PID and host

``RunDirectory(exp, resume)`` only finds the directory and checks it can be used (ConfigError
otherwise, nothing written): a new run never reuses a directory that holds checkpoints (without
``run_dir`` it takes the first of ``runs/<name>``, ``runs/<name>-2``, ... that holds none and is
not in use; ``--resume`` takes the last that holds some), and a resume whose experiment differs
from the saved one in anything that changes the maths or the data is refused with the list of
changed keys unless the changes are accepted (``accept_changes``). ``create`` takes the
directory's lock (a second run on a live directory gets a ConfigError naming the holder) and makes
it; ``start`` opens the metric sinks and writes a new run's first files. On several processes
every process writes its shards of each checkpoint and process 0 alone writes everything else
(and holds the lock).
"""
from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import pathlib
import shutil
import socket

from pgjax.models import hf, lora
from pgjax.parallel import multihost
from pgjax.train.checkpoints import Checkpoints, one_line, write_atomically
from pgjax.train.experiment import ConfigError, Experiment, resolved
from pgjax.train.sinks import MetricsFile, Sink, TensorBoard, WandB, plot, read_records


def _has_checkpoints(directory: pathlib.Path) -> bool:
    """Whether ``directory`` holds a checkpoint (a step folder under checkpoints/)."""
    folder = directory / "checkpoints"
    return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


class RunLock:
    """An exclusive OS file lock (``flock``) on ``<run>/.lock``, holding the PID and host of its holder.
    The OS releases it when the holder exits in any way, so a killed run leaves no stale lock."""

    def __init__(self, directory: pathlib.Path):
        self.path = directory / ".lock"
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or ConfigError naming the live run that holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 1024).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(f"run_dir={str(self.path.parent)!r} is in use by {holder}; wait for that run to end, "
                              "or choose another run_dir") from None
        os.ftruncate(fd, 0)
        since = datetime.datetime.now().isoformat(timespec="seconds")
        os.write(fd, f"PID {os.getpid()} on host {socket.gethostname()} (since {since})\n".encode())
        self.fd = fd

    def release(self) -> None:
        """Let the lock go (nothing if not held)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @staticmethod
    def held(directory: pathlib.Path) -> bool:
        """Whether a live run holds ``directory``'s lock."""
        if not (directory / ".lock").exists():
            return False
        probe = RunLock(directory)
        try:
            probe.acquire()
        except ConfigError:
            return True
        probe.release()
        return False


def locate(exp: Experiment, resume: bool) -> pathlib.Path:
    """The run's directory (see the module docstring); ConfigError, with nothing created, when a new
    run's ``run_dir`` holds checkpoints, ``resume`` finds none, or the directory cannot be created."""
    if exp.run_dir:
        directory = pathlib.Path(exp.run_dir)
    else:
        nth = lambda i: pathlib.Path("runs") / (exp.name if i == 1 else f"{exp.name}-{i}")   # noqa: E731
        i = 1
        while _has_checkpoints(nth(i)) or (not resume and RunLock.held(nth(i))):
            i += 1
        directory = nth(max(i - 1, 1)) if resume else nth(i)
    _check_usable(directory, resume, exp.run_dir)
    existing = next(p for p in (directory, *directory.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir={str(directory)!r} cannot be written: {existing} is not a writable directory")
    return directory


def _check_usable(directory: pathlib.Path, resume: bool, explicit: str) -> None:
    """ConfigError when ``resume`` finds no checkpoint in ``directory``, or a new run would reuse one."""
    if resume and not _has_checkpoints(directory):
        raise ConfigError(f"--resume: no checkpoint to resume in {directory / 'checkpoints'}"
                          f"{'' if explicit else ' (set run_dir to resume a run stored elsewhere)'}")
    if not resume and _has_checkpoints(directory):
        raise ConfigError(f"run_dir={str(directory)!r} already holds checkpoints; pass --resume to continue it "
                          "or choose another run_dir (nothing was overwritten)")


OPERATIONAL_KEYS = ("name", "steps", "eval_every", "checkpoint_every", "run_dir", "logging.", "mesh.",
                    "distributed.", "update.micro_batches", "update.chunk_size", "update.max_skipped_steps",
                    "update.recompute_old_logprobs", "rollout.trim_padding", "model.remat")


def _flat(tree: dict, prefix: str = "") -> dict:
    """``{"a.b": value}`` for every leaf of a nested dict."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def experiment_record(exp: Experiment) -> dict:
    """The experiment as experiment.json holds it (JSON types: tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(exp), default=str))


def experiment_changes(saved: dict, exp: Experiment) -> dict[str, tuple]:
    """``{key: (saved value, new value)}`` for every key of ``exp`` that differs from the saved experiment."""
    old, new = _flat(saved), _flat(experiment_record(exp))
    return {key: (old.get(key), new.get(key)) for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)}


def is_operational(key: str) -> bool:
    """Whether changing ``key`` leaves the maths and the data of a run alone (how long it runs, how
    often it evaluates or checkpoints, where it logs, how work is split over devices and memory)."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in OPERATIONAL_KEYS)


class RunDirectory:
    """One run's directory, its lock and its writers: the checkpoints (``checkpoints``) and the metric
    sinks (``sinks``: metrics.jsonl, and TensorBoard and W&B where enabled). ``accept_changes``:
    resume even if the experiment changes the maths or the data (each change is recorded in
    changes.jsonl); ``fallback``: resume from an older checkpoint when the newest is damaged."""

    def __init__(self, exp: Experiment, resume: bool, accept_changes: bool = False, fallback: bool = True):
        self.exp, self.resume, self.fallback = exp, resume or accept_changes, fallback
        self.directory = locate(exp, self.resume)
        self.metrics_path = self.directory / "metrics.jsonl"
        self.primary = True         # until ``create``: no JAX call before jax.distributed starts
        self.checkpoints: Checkpoints | None = None
        self.sinks: list[Sink] = []
        self.lock = RunLock(self.directory)
        self.changes = self._changes(accept_changes) if self.resume else {}

    def _changes(self, accept: bool) -> dict[str, tuple]:
        """The keys this resume changes; ConfigError for a change of the maths or data not ``accept``-ed."""
        path = self.directory / "experiment.json"
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            if not accept:
                raise ConfigError(f"--resume: cannot read {path} ({one_line(error)}) to check that the experiment "
                                  "is unchanged; pass --resume-with-changes to resume anyway") from None
            saved = {}
        changes = experiment_changes(saved, self.exp)
        refused = {k: v for k, v in changes.items() if not is_operational(k)}
        if refused and not accept:
            listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
            raise ConfigError(f"--resume: the experiment differs from the one {self.directory} was trained with "
                              f"({listed}); pass --resume-with-changes to continue with the change (it is recorded "
                              "in changes.jsonl), or undo it")
        return changes

    def create(self) -> None:
        """Take the directory's lock (ConfigError if a live run holds it), then make the directory and
        its checkpoint manager."""
        self.primary = multihost.is_primary()
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.primary:
            self.lock.acquire()
            try:
                _check_usable(self.directory, self.resume, self.exp.run_dir)   # again, now that no run can race
            except ConfigError:
                self.lock.release()
                raise
        self.checkpoints = Checkpoints(self.directory / "checkpoints")

    def start(self, tokenizer, start_step: int) -> None:
        """Open the metric sinks the experiment enables (see ``pgjax.train.sinks``: a resume drops what
        was logged after ``start_step``); then a new run writes its experiment.json, tokenizer and an
        empty metrics.jsonl, and a resumed one records its changes of the experiment (process 0)."""
        if not self.primary:
            return
        logging, since = self.exp.logging, start_step if self.resume else None
        if logging.wandb:               # first: a failing wandb.init leaves nothing else written
            self.sinks.append(WandB(self.directory, logging.wandb_project, resolved(self.exp), self.resume))
        if logging.tensorboard:
            self.sinks.insert(0, TensorBoard(self.directory, since))
        if not self.resume:
            self._write_first_files(tokenizer)
        self.sinks.insert(0, MetricsFile(self.metrics_path, since))
        if self.resume and self.changes:
            self._record_changes(start_step)

    def _write_first_files(self, tokenizer) -> None:
        """A new run's experiment.json and tokenizer/ (with the checkpoint's generation_config.json)."""
        write_atomically(self.directory / "experiment.json", json.dumps(experiment_record(self.exp), indent=2))
        tokenizer.save_pretrained(self.directory / "tokenizer")
        generation = pathlib.Path(self.exp.model.path) / "generation_config.json"
        if self.exp.model.path and generation.is_file():       # its stop ids travel to final/ with the tokenizer
            shutil.copyfile(generation, self.directory / "tokenizer" / generation.name)

    def _record_changes(self, start_step: int) -> None:
        """Append this resume's changes to changes.jsonl and rewrite experiment.json."""
        with (self.directory / "changes.jsonl").open("a") as f:
            f.write(json.dumps({"step": start_step, "changes": {k: list(v) for k, v in self.changes.items()}},
                               default=str) + "\n")
        write_atomically(self.directory / "experiment.json", json.dumps(experiment_record(self.exp), indent=2))

    def records(self) -> list[dict]:
        """The run's metric records so far (``read_records``)."""
        return read_records(self.directory)

    def log(self, record: dict) -> None:
        """One step's record to every sink (none but on process 0)."""
        for sink in self.sinks:
            sink.log(record)

    def export(self, policy) -> None:
        """``final/``: the policy as a Hugging Face checkpoint with the run's tokenizer (with LoRA: the
        adapters merged in, and the PEFT adapter alone in ``final/adapter``, see ``_adapter_base``),
        and the curves. ``policy`` holds full (gathered) parameters; process 0 writes."""
        if self.primary:
            final, partial = self.directory / "final", self.directory / "final.partial"
            tokenizer = self.directory / "tokenizer"
            shutil.rmtree(partial, ignore_errors=True)
            if policy.config.lora is None:                                          # a kill leaves no half final/
                hf.save(policy, partial, tokenizer_dir=tokenizer)
            else:
                hf.save(lora.merged(policy), partial, tokenizer_dir=tokenizer)
                hf.save_peft(policy, partial / "adapter", base_model=self._adapter_base(policy, partial))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
            plot(self.records(), self.directory / "curves.png", self.exp.name)

    def _adapter_base(self, policy, partial: pathlib.Path) -> str:
        """The absolute path of the LoRA ``policy``'s base checkpoint, which its adapter records:
        ``model.path`` resolved; for a random base (no ``model.path``) ``final/base``, where the base
        weights are written (into ``partial``, the future final/) with the run's tokenizer."""
        if self.exp.model.path:
            return str(pathlib.Path(self.exp.model.path).resolve())
        hf.save(lora.base(policy), partial / "base", tokenizer_dir=self.directory / "tokenizer")
        return str(self.directory.resolve() / "final" / "base")

    def close(self, failed: bool = False) -> None:
        """Close the checkpoints and the sinks, then release the lock."""
        if self.checkpoints is not None:
            self.checkpoints.close()
        for sink in self.sinks:
            sink.close(failed)
        self.lock.release()
