"""A run's directory: finding it, its lock, the experiment and input files it records and the
changes a resume makes to them, and ``RunDirectory``, which writes everything else there through
``checkpoints`` (``Checkpoints``) and ``sinks`` (the metric writers).

  experiment.json         the experiment the run uses (rewritten, atomically, when a resume changes it)
  inputs.json             the content fingerprints of its input files (``pgjax.train.inputs``)
  changes.jsonl           each accepted change on resume: the step, the keys (old and new), the input files
  machines.jsonl          the machine of each sitting (``pgjax.machine.describe``): a line per start or resume,
                          with the step it started from; a resume drops the lines of steps it computes again
  metrics.jsonl, completions.jsonl, events.out.tfevents.*, wandb/, curves.png
                          the metric records and logged completions (``pgjax.train.sinks``)
  checkpoints/<step>/, damaged_checkpoints/
                          verified orbax checkpoints (``pgjax.train.checkpoints``)
  tokenizer/              the tokenizer the run used (and the checkpoint's generation_config.json)
  final/                  the trained policy as a Hugging Face checkpoint (``from_pretrained`` loads it);
                          with LoRA also the PEFT adapter (``final/adapter``), whose recorded base is an
                          absolute path: ``model.path``, or ``final/base`` (written there) for a random base;
                          written in final.partial/ and renamed (an old final/ is final.replaced/ meanwhile)
  .lock                   a note naming the holder of the lock (PID, host); the lock is on the directory

``RunDirectory(exp, resume)`` only finds the directory and checks it can be used (ConfigError
otherwise, nothing written): a directory belongs to one run, so a new run never writes into one
that holds another run's results (``run_results``; without ``run_dir`` it takes the first of
``runs/<name>``, ``runs/<name>-2``, ... that holds none and is not in use; ``--resume`` takes the
last that holds some; ``restart`` moves them aside first), and a resume whose experiment differs
from the saved one in anything that changes the maths or the data, or whose input files hold
other bytes, is refused with the list of changes unless they are accepted (``accept_changes``).
``create`` takes the directory's lock (a second run on a live directory gets a ConfigError naming
the holder) and makes it; ``start`` opens the metric sinks and completions.jsonl; the first record
writes a new run's first files or a resume's changes. Every record, checkpoint and final/ is written
only while the directory's path still leads to the directory locked (``check_in_place``): a run
whose directory was moved or deleted stops (RunStopped) and writes nothing into what is there now.
On several processes every process writes its shards of each checkpoint and process 0 alone writes
everything else (and holds the lock).
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
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax

from pgjax import core, machine
from pgjax.checks import ConfigError
from pgjax.config import Experiment, estimator_label, resolved, upgraded
from pgjax.errors import RunStopped
from pgjax.models import hf, lora
from pgjax.models.heads import RewardModel
from pgjax.parallel import multihost
from pgjax.train.checkpoints import Checkpoints, one_line, write_atomically
from pgjax.train.inputs import INPUTS_FILE, differences, fingerprints, input_files, upgraded_labels
from pgjax.train.sinks import (
    MACHINES_FILE,
    MetricsFile,
    Sink,
    WandB,
    open_sink,
    plot,
    read_machines,
    read_records,
    sink_factory,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _has_checkpoints(directory: pathlib.Path) -> bool:
    """Whether ``directory`` holds a checkpoint (a step folder under checkpoints/)."""
    folder = directory / "checkpoints"
    return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


RECORDS = ("experiment.json", "final", "changes.jsonl", "damaged_checkpoints")


def run_results(directory: pathlib.Path) -> list[str]:
    """What of a run ``directory`` holds: its experiment.json, final/, changes.jsonl, set-aside
    checkpoints, a non-empty metrics.jsonl, checkpoints (a run stopped before its first record
    holds none of them)."""
    found = [name for name in RECORDS if (directory / name).exists()]
    metrics = directory / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        found.append("metrics.jsonl")
    if _has_checkpoints(directory):
        found.append("checkpoints")
    return found


def _take(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd``: True when taken, False when another holds it (an
    OSError when the file system cannot lock it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class RunLock:
    """An exclusive OS lock (``flock``) on the run directory itself, so that no file a user may tidy
    away releases it; ``.lock`` is only a note naming the holder (PID, host, since). The OS releases
    the lock when its holder exits in any way, so a killed run leaves no stale lock. Where the file
    system cannot lock a directory (some network file systems), the note file is locked instead.
    The locked directory is held open (``directory_fd``), so that ``moved`` tells when its path no
    longer leads to it."""

    NOTE = ".lock"

    def __init__(self, directory: pathlib.Path):
        self.directory = pathlib.Path(directory)
        self.note = self.directory / self.NOTE
        self.fd: int | None = None
        self.directory_fd: int | None = None    # the locked directory (``fd`` too, but on the fallback)
        self.on_note = False        # the fallback: the lock is on the note file

    def _try(self) -> bool:
        """Take the lock if free (True), without writing the note."""
        directory_fd = fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            taken = _take(fd)
        except OSError:             # no locks on directories here: lock the note file instead
            fd = os.open(self.note, os.O_RDWR | os.O_CREAT, 0o644)
            self.on_note = True
            taken = _take(fd)
        if not taken:
            os.close(fd)
            if fd != directory_fd:
                os.close(directory_fd)
            return False
        self.fd, self.directory_fd = fd, directory_fd
        return True

    def watch(self) -> None:
        """Hold the directory open without locking it (a process but 0 of several, which holds no lock),
        for ``moved``."""
        self.directory_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)

    def moved(self) -> str | None:
        """None while the path leads to the directory held (or none is held); else what became of that
        directory: ``was deleted``, ``was moved to <path> (...)`` (where /proc says), ``was moved or
        deleted``."""
        if self.directory_fd is None:
            return None
        held = os.fstat(self.directory_fd)
        try:
            here = os.stat(self.directory)
            if (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino):
                return None
        except FileNotFoundError:
            pass
        if held.st_nlink == 0:
            return "was deleted"
        try:
            now = os.readlink(f"/proc/self/fd/{self.directory_fd}")
        except OSError:
            return "was moved or deleted"
        return f"was moved to {now} (the run's results so far are there)"

    def acquire(self) -> None:
        """Take the lock and write the note, or ConfigError naming the live run that holds it."""
        if not self._try():
            try:
                holder = self.note.read_text().splitlines()[0].strip()
            except (OSError, IndexError):
                holder = ""
            raise ConfigError(f"run_dir={str(self.directory)!r} is in use by {holder or 'another process'}; wait "
                              "for that run to end, or choose another run_dir")
        since = datetime.datetime.now().isoformat(timespec="seconds")
        text = (f"PID {os.getpid()} on host {socket.gethostname()} (since {since})\n"
                "the lock is held on the directory itself; this file only names its last holder\n")
        if self.on_note:
            assert self.fd is not None      # _try took the lock
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, text.encode(), 0)
        else:
            write_atomically(self.note, text)

    def release(self) -> None:
        """Let the lock go and the directory (nothing if not held)."""
        for fd in {fd for fd in (self.fd, self.directory_fd) if fd is not None}:
            os.close(fd)
        self.fd = self.directory_fd = None

    @staticmethod
    def held(directory: pathlib.Path) -> bool:
        """Whether a live run holds ``directory``'s lock (writes nothing)."""
        if not directory.is_dir():
            return False
        probe = RunLock(directory)
        if not probe._try():
            return True
        probe.release()
        return False


def _automatic(exp: Experiment, i: int) -> pathlib.Path:
    """The ``i``-th automatic run directory of ``exp``: runs/<name>, runs/<name>-2, ..."""
    return pathlib.Path("runs") / (exp.name if i == 1 else f"{exp.name}-{i}")


def locate(exp: Experiment, resume: bool, restart: bool = False) -> pathlib.Path:
    """The run's directory: ``run_dir``; without it, for a new run the first of runs/<name>,
    runs/<name>-2, ... that holds no run's results and is not in use, for ``resume`` or ``restart``
    the last that holds results. ConfigError, with nothing created, when a new run's ``run_dir`` holds
    another run's results, ``resume`` finds no checkpoint, or the directory cannot be created."""
    if exp.run_dir:
        directory = pathlib.Path(exp.run_dir)
    else:
        i = 1
        while run_results(_automatic(exp, i)) or (not (resume or restart) and RunLock.held(_automatic(exp, i))):
            i += 1
        directory = _automatic(exp, max(i - 1, 1) if resume or restart else i)
    if not restart:
        _check_usable(directory, resume, exp.run_dir)
    existing = next(p for p in (directory, *directory.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir={str(directory)!r} cannot be written: {existing} is not a writable directory")
    return directory


def _check_usable(directory: pathlib.Path, resume: bool, explicit: str) -> None:
    """ConfigError when ``resume`` finds no checkpoint in ``directory``, or a new run would write into
    a directory that holds another run's results."""
    if resume and not _has_checkpoints(directory):
        held = run_results(directory)
        again = (f"; --restart starts the run again there, first moving {', '.join(held)} aside (nothing is "
                 "deleted)" if held else "")
        raise ConfigError(f"--resume: no checkpoint to resume in {directory / 'checkpoints'}"
                          f"{'' if explicit else ' (set run_dir to resume a run stored elsewhere)'}{again}")
    held = [] if resume else run_results(directory)
    if held:
        raise ConfigError(f"run_dir={str(directory)!r} holds another run's results ({', '.join(held)}); pass "
                          "--resume to continue that run, --restart to move them aside and start again, or choose "
                          "another run_dir (nothing was overwritten)")


def _aside(directory: pathlib.Path) -> pathlib.Path:
    """A new sibling name for ``directory``'s old contents: <dir>-replaced-<date>[-n]."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target, n = directory.with_name(f"{directory.name}-replaced-{stamp}"), 1
    while target.exists():
        n += 1
        target = directory.with_name(f"{directory.name}-replaced-{stamp}-{n}")
    return target


# the paths model.path, task.options.path and task.reward.model among them: their files' content is compared instead
OPERATIONAL_KEYS = ("name", "steps", "eval_every", "checkpoint_every", "run_dir", "logging.", "mesh.",
                    "distributed.", "update.micro_batches", "update.chunk_size", "update.max_skipped_steps",
                    "update.recompute_old_logprobs", "update.pack_width", "rollout.trim_padding", "model.remat",
                    "task.reward.timeout", "model.path", "task.options.path", "task.reward.model")


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
    """The experiment as experiment.json holds it (JSON types: tuples as lists; an estimator object as
    ``estimator_label`` with its hyperparameters)."""
    estimator = exp.algorithm.estimator
    if estimator is not None:
        exp = dataclasses.replace(exp, algorithm=dataclasses.replace(exp.algorithm, estimator=None))
    record = json.loads(json.dumps(dataclasses.asdict(exp), default=str))
    if estimator is not None:
        record["algorithm"]["estimator"] = {"label": estimator_label(estimator), "hparams": {
            name: float(value) for name, value in core.hparam_items(estimator.hparams).items()}}
    return record


def experiment_changes(saved: dict, exp: Experiment) -> dict[str, tuple]:
    """``{key: (saved value, new value)}`` for every key of ``exp`` that differs from the saved experiment.
    A key the saved experiment lacks (a run begun before pgjax had it) differs only when its value is
    not the key's default: a new key's default keeps the behaviour from before the key existed. Both
    are compared in this version's layout (``config.upgraded``: a renamed key under its new name, a
    task option at its default the same as one left out)."""
    old, new = _flat(upgraded(saved)), _flat(upgraded(experiment_record(exp)))
    defaults = _flat(upgraded(experiment_record(Experiment())))
    unchanged_new_key = lambda key: key not in old and key in defaults and new.get(key) == defaults[key]  # noqa: E731
    return {key: (old.get(key), new.get(key)) for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key) and not unchanged_new_key(key)}


def is_operational(key: str) -> bool:
    """Whether changing ``key`` leaves the maths and the data of a run alone (how long it runs, how
    often it evaluates or checkpoints, where it logs, how work is split over devices and memory)."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in OPERATIONAL_KEYS)


def _holds_tokenizer(folder: pathlib.Path) -> bool:
    """Whether ``folder`` holds a tokenizer: its tokenizer_config.json and a vocabulary."""
    return (folder / "tokenizer_config.json").is_file() and any(
        (folder / name).is_file() for name in ("tokenizer.json", "vocab.json", "tokenizer.model"))


def _check_export(partial: pathlib.Path, tokenizer: pathlib.Path, adapter: bool,
                  generation: pathlib.Path | None) -> None:
    """RunStopped naming what the export in ``partial`` lacks: the weights and config, a tokenizer,
    every tokenizer file of the run's ``tokenizer`` folder (generation config, chat template), the
    ``generation`` config of ``model.path`` where it has one, and with LoRA the PEFT adapter."""
    if not _holds_tokenizer(tokenizer):
        raise RunStopped(f"final/ was not written: {tokenizer} holds no tokenizer (tokenizer_config.json and a "
                         "vocabulary); --resume writes it again from the run's inputs")
    copied = {p.name for p in tokenizer.iterdir() if p.name in hf.COPIED_FILES} | (
        {generation.name} if generation is not None else set())
    needed = ["config.json", "model.safetensors", *sorted(copied)]
    if adapter:
        needed += ["adapter/adapter_config.json", "adapter/adapter_model.safetensors"]
    missing = [name for name in needed if not (partial / name).is_file()]
    if missing:
        raise RunStopped(f"final/ was not written: it would lack {', '.join(missing)} (the checkpoints are intact; "
                         f"--resume writes what {tokenizer} lacks again from the run's inputs)")


def _saved_json(path: pathlib.Path, what: str, accept: bool) -> dict:
    """The JSON object in ``path``, which ``--resume`` compares with ``what``; when it is missing or
    not an object, ConfigError, or {} when the changes are accepted anyway (``accept``)."""
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            raise ValueError(f"it holds a {type(saved).__name__}, not an object")
    except (OSError, ValueError) as error:
        if not accept:
            raise ConfigError(f"--resume: cannot read {path} ({one_line(error)}) to check that {what} unchanged; "
                              "pass --resume-with-changes to resume anyway") from None
        return {}
    return saved


class RunDirectory:
    """One run's directory, its lock and its writers: the checkpoints (``checkpoints``) and the metric
    sinks (``sinks``: metrics.jsonl, and TensorBoard and W&B where enabled, then the user's of
    ``logging.sinks``, each imported and checked here, before anything is written). ``accept_changes``:
    resume even if the experiment or an input file changed (each change is recorded in
    changes.jsonl); ``fallback``: resume from an older checkpoint when the newest is damaged;
    ``restart``: start the run again in the directory a resume would take, first moving its results
    aside to ``<dir>-replaced-<date>`` (never deleted)."""

    def __init__(self, exp: Experiment, resume: bool, accept_changes: bool = False, fallback: bool = True,
                 restart: bool = False):
        if restart and (resume or accept_changes):
            raise ConfigError("--restart starts the run again from scratch: it cannot be combined with --resume")
        self.exp, self.resume, self.fallback, self.restart = exp, resume or accept_changes, fallback, restart
        self.directory = locate(exp, self.resume, restart)
        self.primary = True         # until ``create``: no JAX call before jax.distributed starts
        self.checkpoints: Checkpoints | None = None
        self.sinks: list[Sink] = []
        self.completions_file: MetricsFile | None = None
        for name in exp.logging.sink_names:         # a user's sink: it imports and is a Sink (ConfigError)
            sink_factory(name)
        self.lock = RunLock(self.directory)
        self.changes = self._changes(accept_changes) if self.resume else {}
        self.saved_inputs = upgraded_labels(_saved_json(self.directory / INPUTS_FILE, "the input files are",
                                                        accept_changes).get("files", {}) if self.resume else {})
        try:
            self.inputs = fingerprints(input_files(exp), known=self.saved_inputs)
        except OSError as error:
            raise ConfigError(f"an input file cannot be read: {one_line(error)}") from None
        self.input_changes = self._input_changes(accept_changes) if self.resume else {}
        self.tokenizer: PreTrainedTokenizerBase | None = None     # the run's tokenizer (``start``)
        self.start_step = 0
        self.unrecorded = False     # the first files (a new run) or the changes (a resume) await the first record
        self.machine_unrecorded = False     # this sitting's line of machines.jsonl awaits the first record

    @property
    def metrics_path(self) -> pathlib.Path:
        return self.directory / "metrics.jsonl"

    @property
    def completions_path(self) -> pathlib.Path:
        return self.directory / "completions.jsonl"

    def _changes(self, accept: bool) -> dict[str, tuple]:
        """The keys this resume changes; ConfigError for a change of the maths or data not ``accept``-ed."""
        saved = _saved_json(self.directory / "experiment.json", "the experiment is", accept)
        changes = experiment_changes(saved, self.exp)
        refused = {k: v for k, v in changes.items() if not is_operational(k)}
        if refused and not accept:
            listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
            saved_layout = refused.get("model.scan_layers", (None,))[0]
            layout = "" if saved_layout is None else (
                "; model.scan_layers is the layout of the checkpoint's arrays, which a resume cannot change: "
                f"resume with --set model.scan_layers={str(saved_layout).lower()} (stacked layers became a "
                "run's default after runs with unrolled layers began)")
            raise ConfigError(f"--resume: the experiment differs from the one {self.directory} was trained with "
                              f"({listed}); pass --resume-with-changes to continue with the change (it is recorded "
                              f"in changes.jsonl), or undo it{layout}")
        return changes

    def _input_changes(self, accept: bool) -> dict[str, str]:
        """The input files whose content differs from the run's ``inputs.json``; ConfigError unless ``accept``."""
        changed = differences(self.saved_inputs, self.inputs)
        if changed and not accept:
            listed = "; ".join(f"{label}: {what}" for label, what in changed.items())
            raise ConfigError(f"--resume: an input of {self.directory} changed since the run began ({listed}); pass "
                              "--resume-with-changes to continue with it (it is recorded in changes.jsonl), or "
                              "restore it")
        return changed

    def create(self) -> None:
        """Make the directory and take its lock (process 0, see ``_claim``; the others hold it open),
        then its checkpoint manager, which checks the directory is in place before each save
        (``check_in_place``); a resume first removes what saves cut short left."""
        self.primary = multihost.is_primary()
        if self.primary:
            self._claim()
        multihost.barrier("run_directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.primary:
            self.lock.watch()
        self.checkpoints = Checkpoints(self.directory / "checkpoints", guard=self.check_in_place)
        if self.resume:
            self.checkpoints.remove_leftovers()

    def created_checkpoints(self) -> Checkpoints:
        """``checkpoints``, which ``create`` opens (RuntimeError before it)."""
        if self.checkpoints is None:
            raise RuntimeError(f"{self.directory}: the run directory's checkpoints are opened by create()")
        return self.checkpoints

    def check_in_place(self, writing: str) -> None:
        """RunStopped, before ``writing`` is written, when the run directory's path no longer leads to
        the directory this run locked (moved or deleted while the run was live; a new run may be there
        now): the run writes nothing more, at that path or elsewhere."""
        fate = self.lock.moved()
        if fate is not None:
            raise RunStopped(f"run_dir={str(self.directory)!r} {fate} while the run was live: {writing} was not "
                             f"written, nor anything after it (what is at {self.directory} now is not this run's)")

    def left_behind(self) -> str:
        """What a run stopped at once leaves to resume (``interrupts.graceful_stop``): its newest
        complete checkpoint, or none (then how to start again)."""
        newest = None if self.checkpoints is None else self.checkpoints.newest
        if newest is not None:
            return f"the checkpoint of step {newest} is the last complete one (--resume continues from it)"
        if self.resume:
            return "the run's checkpoints are as they were (--resume continues from the newest intact one)"
        again = "--restart starts it again" if run_results(self.directory) else "run it again to start over"
        return f"no checkpoint was written yet: nothing to resume; {again}"

    def _claim(self) -> None:
        """Make the directory, take its lock, and check again now that no run can race (ConfigError
        when it is in use or no longer usable; a new run without ``run_dir`` on one process moves on
        to the next free name instead); with ``restart``, move the old results aside."""
        while True:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                self.lock.acquire()
                if not self.restart:
                    _check_usable(self.directory, self.resume, self.exp.run_dir)
                break
            except ConfigError:
                self.lock.release()
                following = None if self.exp.run_dir or self.resume or self.restart or jax.process_count() > 1 \
                    else locate(self.exp, resume=False)
                if following is None or following == self.directory:
                    raise
                self.directory, self.lock = following, RunLock(following)
        if self.restart and run_results(self.directory):
            self._move_aside()

    def _move_aside(self) -> None:
        """Rename the directory (its lock goes with it) to ``<dir>-replaced-<date>`` and make a new one."""
        held, aside, old = run_results(self.directory), _aside(self.directory), self.lock
        os.replace(self.directory, aside)
        self.directory.mkdir()
        self.lock = RunLock(self.directory)
        try:
            self.lock.acquire()
        finally:
            old.release()
        print(f"--restart: moved the earlier run's {', '.join(held)} to {aside} (nothing was deleted)",
              file=sys.stderr)

    def start(self, tokenizer, start_step: int) -> None:
        """Open the metric sinks the experiment enables (see ``pgjax.train.sinks``: a resume drops what
        was logged after ``start_step``), the user's of ``logging.sinks`` first (its own code, which may
        fail: nothing else is written then) and last in the order records reach them, and
        completions.jsonl when ``logging.completions_every`` logs completions or the file is there (a new
        run empties it, a resume cuts it); a resume rewrites a missing tokenizer/ (process 0). A new
        run's experiment.json, inputs.json and tokenizer/, or a resume's changes, are written with the
        first record (``log``): a run stopped before it holds no results, a change that never ran is
        not recorded."""
        if not self.primary:
            return
        self.check_in_place("metrics.jsonl")
        self.tokenizer, self.start_step = tokenizer, start_step
        logging, since = self.exp.logging, start_step if self.resume else None
        for name in logging.sink_names:     # first: a user's sink that fails to open leaves nothing else written
            self.sinks.append(open_sink(name, self.directory, since))
        if logging.wandb:               # then W&B: a failing wandb.init leaves nothing else written
            self.sinks.insert(0, WandB(self.directory, logging.wandb_project, resolved(self.exp), self.resume))
        if logging.tensorboard:
            self.sinks.insert(0, open_sink("tensorboard", self.directory, since))
        self.sinks.insert(0, MetricsFile(self.metrics_path, since))
        if logging.completions_every or self.completions_path.exists():
            self.completions_file = MetricsFile(self.completions_path, since)
        self.unrecorded = not self.resume or bool(self.changes or self.input_changes)
        self.machine_unrecorded = True
        if self.resume:
            self._complete_tokenizer()
            if not self.unrecorded and self.inputs != self.saved_inputs:    # same bytes, new file times
                self._write_inputs()

    def _generation_config(self) -> pathlib.Path | None:
        """``model.path``'s generation_config.json, where it has one."""
        generation = pathlib.Path(self.exp.model.path) / "generation_config.json"
        return generation if self.exp.model.path and generation.is_file() else None

    def _save_tokenizer(self, folder: pathlib.Path) -> None:
        """The run's tokenizer into ``folder`` (tokenizer/), with the checkpoint's generation_config.json
        (its stop ids travel to final/ with the tokenizer)."""
        if self.tokenizer is None:
            raise RuntimeError("the run's tokenizer is saved after start(tokenizer, ...)")
        self.tokenizer.save_pretrained(folder)
        generation = self._generation_config()
        if generation is not None:
            shutil.copyfile(generation, folder / generation.name)

    def _complete_tokenizer(self) -> None:
        """Write again each file tokenizer/ lacks (the run's tokenizer and ``model.path``'s generation
        config, fingerprinted inputs, saved into a scratch folder and the missing files copied),
        saying so in one line."""
        folder = self.directory / "tokenizer"
        with tempfile.TemporaryDirectory() as scratch:
            self._save_tokenizer(pathlib.Path(scratch))
            missing = sorted(str(p.relative_to(scratch)) for p in pathlib.Path(scratch).rglob("*")
                             if p.is_file() and not (folder / p.relative_to(scratch)).is_file())
            for name in missing:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(pathlib.Path(scratch) / name, folder / name)
        if missing:
            print(f"{folder} was missing or incomplete: written again from the run's tokenizer (it lacked "
                  f"{', '.join(missing)})", file=sys.stderr)

    def _write_inputs(self) -> None:
        write_atomically(self.directory / INPUTS_FILE, json.dumps({"files": self.inputs}, indent=2))

    def _record_first(self) -> None:
        """A new run's experiment.json, inputs.json and tokenizer/; a resume's changes appended to
        changes.jsonl (the step they take effect at, the keys, the input files), then experiment.json
        and inputs.json rewritten."""
        if self.resume:
            entry = {"step": self.start_step, "changes": {k: list(v) for k, v in self.changes.items()}}
            if self.input_changes:
                entry["inputs"] = self.input_changes
            with (self.directory / "changes.jsonl").open("a") as f:
                f.write(json.dumps(entry, default=str) + "\n")
        else:
            self._save_tokenizer(self.directory / "tokenizer")
        self._write_inputs()
        write_atomically(self.directory / "experiment.json", json.dumps(experiment_record(self.exp), indent=2))

    def _record_machine(self) -> None:
        """This sitting's line of machines.jsonl: the step it started from, the date and
        ``machine.describe()``; the lines of earlier sittings from this step on are dropped (a resume
        computes those steps again), so that each line covers the steps after it up to the next line's."""
        path = self.directory / MACHINES_FILE
        earlier = read_machines(self.directory) if self.resume else []
        kept = [line for line in earlier if line.get("step", 0) < self.start_step]
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        kept.append({"step": self.start_step, "date": now, **machine.describe()})
        write_atomically(path, "".join(json.dumps(line) + "\n" for line in kept))

    def records(self) -> list[dict]:
        """The run's metric records so far (``read_records``)."""
        return read_records(self.directory)

    def log(self, record: dict, completions: Sequence[dict] = ()) -> None:
        """One step's record and its logged completions (``pgjax.train.completions``) to every sink,
        the completions to completions.jsonl too, a line per row (where ``logging.completions_every``
        logs any; nothing but on process 0); the first call after ``start`` writes what awaited it
        (``_record_first``). Nothing is written once the directory was moved or deleted
        (``check_in_place``)."""
        if self.primary:
            self.check_in_place(f"the record of step {record['step']}")
        if self.primary and self.unrecorded:
            self._record_first()
            self.unrecorded = False
        if self.primary and self.machine_unrecorded:
            self._record_machine()
            self.machine_unrecorded = False
        if self.completions_file is None:
            completions = ()
        elif self.primary:
            for row in completions:
                self.completions_file.log(row)
        for sink in self.sinks:
            sink.log(record, completions)

    def export(self, policy, classifier: str = "sequence") -> None:
        """``final/``: the policy as a Hugging Face checkpoint with the run's tokenizer (with LoRA: the
        adapters merged in, and the PEFT adapter alone in ``final/adapter``, see ``_adapter_base``),
        and the curves; a ``RewardModel`` as a transformers ``classifier`` (``hf.save_reward_model``'s
        kind; its adapters merged).
        ``policy`` holds full (gathered) parameters; process 0 writes. RunStopped, with no final/
        written, when it would lack a file (``_check_export``) or the directory was moved or deleted
        (``check_in_place``). It is written to final.partial/ and put in place by renames
        (``_put_in_place``): a kill at any moment leaves no half final/."""
        if self.primary:
            self.check_in_place("final/")
            partial = self.directory / "final.partial"
            tokenizer = self.directory / "tokenizer"
            shutil.rmtree(partial, ignore_errors=True)
            if isinstance(policy, RewardModel):
                hf.save_reward_model(_merged_reward_model(policy), partial, tokenizer_dir=tokenizer, kind=classifier)
            elif policy.config.lora is None:                                        # a kill leaves no half final/
                hf.save(policy, partial, tokenizer_dir=tokenizer)
            else:
                hf.save(lora.merged(policy), partial, tokenizer_dir=tokenizer)
                hf.save_peft(policy, partial / "adapter", base_model=self._adapter_base(policy, partial))
            _check_export(partial, tokenizer, not isinstance(policy, RewardModel) and policy.config.lora is not None,
                          self._generation_config())
            self.check_in_place("final/")
            self._put_in_place(partial)
            plot(self.records(), self.directory / "curves.png", self.exp.name)

    def _put_in_place(self, partial: pathlib.Path) -> None:
        """``partial`` renamed to final/: an old final/ is first renamed to final.replaced/ and removed
        after, so that final/ is always whole (the old or the new one) or, for a kill between the two
        renames, absent with the old one in final.replaced/ (removed by the next export)."""
        final, replaced = self.directory / "final", self.directory / "final.replaced"
        shutil.rmtree(replaced, ignore_errors=True)
        if final.exists():
            os.replace(final, replaced)
        os.replace(partial, final)
        shutil.rmtree(replaced, ignore_errors=True)

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


def _merged_reward_model(model: RewardModel) -> RewardModel:
    """``model`` with its trunk's LoRA adapters folded in (itself without adapters)."""
    if model.trunk.config.lora is None:
        return model
    merged = RewardModel(lora.merged(model.trunk))
    merged.head.set_value(model.head[...])
    merged.bias.set_value(model.bias[...])
    return merged
