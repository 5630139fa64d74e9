"""A run's directory: its layout, and everything a run writes or reads back.

  experiment.json         the experiment the run uses (rewritten, atomically, when a resume changes it)
  changes.jsonl           each accepted change of the experiment on resume: the step, the keys, old and new
  metrics.jsonl           one JSON line per RL step (and the step-0 evaluation); non-finite numbers as null
  events.out.tfevents.*   the same metrics for TensorBoard (``tensorboard --logdir runs/``)
  curves.png              reward / accuracy / length / KL / entropy curves, drawn at the end
  checkpoints/<step>/     orbax checkpoints: the ``TrainState``, a JSON record (step, data position) and
                          pgjax_files.json, the size and SHA-256 of each of the checkpoint's files
  damaged_checkpoints/    checkpoints found damaged on resume, set aside (never deleted)
  tokenizer/              the tokenizer the run used (and the checkpoint's generation_config.json)
  final/                  the trained policy as a Hugging Face checkpoint (``from_pretrained`` loads it)
  .lock                   held (an OS file lock) by the live run; names its PID and host

``RunDirectory(exp, resume)`` only finds the directory and checks it can be used (ConfigError
otherwise, nothing written): a new run never reuses a directory that holds checkpoints (without
``run_dir`` it takes the first of ``runs/<name>``, ``runs/<name>-2``, ... that holds none and is
not in use; ``--resume`` takes the last that holds some), and a resume whose experiment differs
from the saved one in anything that changes the maths or the data is refused with the list of
changed keys unless the changes are accepted (``accept_changes``). ``create`` takes the
directory's lock (a second run on a live directory gets a ConfigError naming the holder) and makes
it; ``start`` opens the metric writers and writes a new run's first files. On several processes
every process writes its shards of each checkpoint and process 0 alone writes everything else
(and holds the lock).

Checkpoints are verified on restore, before orbax reads them: a checkpoint whose file list is
missing (a save cut short) or whose files are missing, shorter or hold other bytes than written,
or that then cannot be read, is reported in one line, set aside and the next older one tried
(``fallback=False`` refuses instead).
"""
from __future__ import annotations

import dataclasses
import datetime
import fcntl
import hashlib
import json
import math
import os
import pathlib
import shutil
import socket
import sys
import uuid

import jax
import numpy as np
import orbax.checkpoint as ocp

from pgjax.models import hf, lora
from pgjax.parallel import multihost
from pgjax.train.experiment import ConfigError, Experiment, resolved

CURVES = (("reward", "reward"), ("accuracy", "sampled accuracy"), ("eval_accuracy", "greedy eval accuracy"),
          ("length_correct", "length (correct)"), ("length_incorrect", "length (incorrect)"),
          ("entropy", "entropy"), ("kl_ref", "KL to reference"), ("clip_fraction", "clip fraction"))


FILE_LIST = "pgjax_files.json"


class _Damaged(Exception):
    """A checkpoint that cannot be restored as written (the message says why)."""


def _file_digests(folder: pathlib.Path) -> dict[str, list]:
    """``{relative path: [size, sha256]}`` of every file under ``folder`` but the file list itself."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != FILE_LIST:
            with path.open("rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            out[str(path.relative_to(folder))] = [path.stat().st_size, digest]
    return out


def _check_files(folder: pathlib.Path) -> None:
    """_Damaged unless every file ``FILE_LIST`` names in ``folder`` is there with its size and SHA-256."""
    try:
        listed = json.loads((folder / FILE_LIST).read_text())
    except (OSError, ValueError):
        raise _Damaged(f"its list of files ({FILE_LIST}) is missing or unreadable: a save cut short, or "
                       "damage") from None
    found = _file_digests(folder)
    for name, (size, digest) in listed.items():
        if name not in found:
            raise _Damaged(f"{name} is missing")
        if found[name][0] != size:
            raise _Damaged(f"{name} has {found[name][0]} bytes, {size} were written")
        if found[name][1] != digest:
            raise _Damaged(f"{name} does not hold the bytes written (SHA-256 differs)")


def _key_name(entry) -> str:
    """The name of one step of a pytree path (a dict key, an attribute, a sequence index)."""
    for attribute in ("key", "name", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def layout(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{"params.layers.0.attention.k.value": (shape, dtype)}`` for every array of ``tree`` (a state,
    or orbax's metadata of one: both name their arrays the same way)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(map(_key_name, path)): (tuple(leaf.shape), np.dtype(leaf.dtype).name) for path, leaf in leaves}


def _describe(entry: tuple | None) -> str:
    """``float32[32, 64]`` for a ``layout`` entry, ``absent`` for None."""
    return "absent" if entry is None else f"{entry[1]}{list(entry[0])}"


def _layout_difference(saved: dict, expected: dict, limit: int = 3) -> str:
    """One line naming the arrays whose shape or dtype differ between two ``layout``s."""
    lines = [f"{name}: {_describe(saved.get(name))} in the checkpoint, {_describe(expected.get(name))} here"
             for name in sorted(set(saved) | set(expected)) if saved.get(name) != expected.get(name)]
    more = f"; and {len(lines) - limit} more" if len(lines) > limit else ""
    return "; ".join(lines[:limit]) + more


def _one_line(error: BaseException) -> str:
    """``Type: message`` of an exception on one line, at most 200 characters of message."""
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text[:200]}"


class Checkpoints:
    """Step-numbered orbax checkpoints under ``directory``; keeps the newest ``keep``. A checkpoint is
    written atomically (orbax finalises a step directory only when complete), so a run killed at any
    moment resumes from the last complete step; then the size and SHA-256 of each of its files are
    written to its ``pgjax_files.json``, and checked on restore."""

    def __init__(self, directory, keep: int = 2):
        self.directory = pathlib.Path(directory).absolute()
        self.manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True), item_handlers={"state": ocp.StandardCheckpointHandler(),
                                                           "record": ocp.JsonCheckpointHandler()})

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, record: dict) -> None:
        """Write ``state`` and ``record`` as checkpoint ``step``, then its file list (process 0)."""
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         record=ocp.args.JsonSave(record)), force=True)
        self.manager.wait_until_finished()
        if multihost.is_primary():
            _write_atomically(self.directory / str(step) / FILE_LIST,
                              json.dumps(_file_digests(self.directory / str(step))))
        multihost.barrier("checkpoint_file_list")

    def restore(self, like, step: int | None = None, fallback: bool = True):
        """(state, record) of ``step`` (default: the newest intact one), shaped like the pytree ``like``.

        Each candidate is verified (``_verified``). A damaged one is reported in one line on stderr and
        moved to ``damaged_checkpoints/``, and the next older one is tried; with ``fallback=False`` (or
        an explicit ``step``) a damaged checkpoint is a ConfigError instead."""
        candidates = [step] if step is not None else sorted(self.manager.all_steps(), reverse=True)
        if not candidates:
            raise ConfigError(f"no complete checkpoint in {self.directory}")
        damaged = []
        for candidate in candidates:
            try:
                return self._verified(like, candidate)
            except _Damaged as error:
                damaged.append(f"step {candidate}: {error}")
                where = self.directory / str(candidate)
                if not fallback or step is not None:
                    raise ConfigError(f"checkpoint {where} is damaged ({error}); without --no-fallback a resume "
                                      "goes on from the newest intact checkpoint") from None
                aside = self._set_aside(candidate)
                if multihost.is_primary():
                    print(f"checkpoint {where} is damaged ({error}); moved to {aside}, trying the one before",
                          file=sys.stderr)
        raise ConfigError(f"no intact checkpoint in {self.directory}: {'; '.join(damaged)}")

    def _verified(self, like, step: int):
        """(state, record) of checkpoint ``step``: _Damaged unless its files are those written
        (``pgjax_files.json``), it restores without error and its record names the step; ConfigError
        naming the arrays that differ when its arrays do not have ``like``'s layout (the experiment
        changed: an older checkpoint would not fit either)."""
        _check_files(self.directory / str(step))
        expected = layout(like)
        try:
            metadata = self.manager.item_metadata(step)["state"]
            if metadata is None:
                raise ValueError("orbax found no metadata of the state")
            saved = layout(getattr(metadata, "tree", metadata))
        except Exception as error:      # unreadable metadata: a damaged checkpoint, whatever orbax raises
            raise _Damaged(f"its metadata cannot be read: {_one_line(error)}") from None
        if saved != expected:
            raise ConfigError(f"the checkpoint {self.directory / str(step)} does not fit this experiment's "
                              f"training state (a changed model, algorithm or optimizer): "
                              f"{_layout_difference(saved, expected)}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), record=ocp.args.JsonRestore()))
            state, record = restored.state, dict(restored.record)
        except Exception as error:      # a missing, truncated or corrupt file
            raise _Damaged(f"it cannot be read: {_one_line(error)}") from None
        if record.get("step") != step:
            raise _Damaged(f"its record names step {record.get('step')!r}")
        return state, record

    def _set_aside(self, step: int) -> pathlib.Path:
        """Move the damaged checkpoint ``step`` to ``damaged_checkpoints/<step>[-n]`` (process 0) and
        forget it."""
        folder = self.directory.parent / "damaged_checkpoints"
        target, n = folder / str(step), 1
        while target.exists():
            n += 1
            target = folder / f"{step}-{n}"
        if multihost.is_primary():
            folder.mkdir(exist_ok=True)
            os.replace(self.directory / str(step), target)
        multihost.barrier("set_aside_checkpoint")
        self.manager.reload()
        return target

    def close(self) -> None:
        self.manager.close()


def _metric_lines(path: pathlib.Path) -> tuple[list[tuple[int, dict]], int]:
    """(end offset, record) of every complete line of a metrics file, and the size of a torn last line
    (one without its newline, or not JSON: a write cut short) to drop; a bad line before the last is a
    ValueError naming it."""
    data = path.read_bytes() if path.exists() else b""
    lines, offset, torn = [], 0, 0
    chunks = data.split(b"\n")
    for number, chunk in enumerate(chunks, start=1):
        end = offset + len(chunk) + 1
        last = number >= len(chunks) - 1
        if chunk.strip():
            try:
                record = json.loads(chunk)
                if end > len(data):          # no newline after it: cut short, whatever it parses to
                    raise ValueError("no newline")
                lines.append((end, record))
            except ValueError:
                if not last:
                    raise ValueError(f"{path}:{number}: not a JSON record: {chunk[:80]!r}") from None
                torn = len(data) - offset
        offset = end
    return lines, torn


def read_records(directory) -> list[dict]:
    """The metric records of the run in ``directory`` (none before its first line; a torn last line,
    from a run killed while writing it, is left out)."""
    return [record for _, record in _metric_lines(pathlib.Path(directory) / "metrics.jsonl")[0]]


def _has_checkpoints(directory: pathlib.Path) -> bool:
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


def _write_atomically(path: pathlib.Path, text: str) -> None:
    """``path`` holds either its old contents or ``text``, never a part (write a sibling, then rename)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


class RunDirectory:
    """One run's directory, its lock and its writers (metrics, TensorBoard, Weights & Biases,
    checkpoints). ``accept_changes``: resume even if the experiment changes the maths or the data
    (each change is recorded in changes.jsonl); ``fallback``: resume from an older checkpoint when the
    newest is damaged."""

    def __init__(self, exp: Experiment, resume: bool, accept_changes: bool = False, fallback: bool = True):
        self.exp, self.resume, self.fallback = exp, resume or accept_changes, fallback
        self.directory = locate(exp, self.resume)
        self.metrics_path = self.directory / "metrics.jsonl"
        self.primary = True         # until ``create``: no JAX call before jax.distributed starts
        self.checkpoints = self.tensorboard = self.wandb = None
        self.lock = RunLock(self.directory)
        self.changes = self._changes(accept_changes) if self.resume else {}

    def _changes(self, accept: bool) -> dict[str, tuple]:
        """The keys this resume changes; ConfigError for a change of the maths or data not ``accept``-ed."""
        path = self.directory / "experiment.json"
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            if not accept:
                raise ConfigError(f"--resume: cannot read {path} ({_one_line(error)}) to check that the experiment "
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
        """Open the metric writers the experiment enables; then a new run writes its experiment.json,
        tokenizer and an empty metrics.jsonl (leftovers of a run that never checkpointed are not its),
        and a resumed one cuts metrics.jsonl after the last line at or before ``start_step`` (and a
        torn last line, saying so) and records its changes of the experiment. TensorBoard discards
        earlier events after ``start_step`` (a new run: all of them). A W&B run keeps its id in
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
            self._cut_metrics(start_step)
            if self.changes:
                with (self.directory / "changes.jsonl").open("a") as f:
                    f.write(json.dumps({"step": start_step, "changes": {k: list(v) for k, v in self.changes.items()}},
                                       default=str) + "\n")
                _write_atomically(self.directory / "experiment.json", json.dumps(experiment_record(self.exp), indent=2))
            return
        _write_atomically(self.directory / "experiment.json", json.dumps(experiment_record(self.exp), indent=2))
        tokenizer.save_pretrained(self.directory / "tokenizer")
        generation = pathlib.Path(self.exp.model.path) / "generation_config.json"
        if self.exp.model.path and generation.is_file():       # its stop ids travel to final/ with the tokenizer
            shutil.copy(generation, self.directory / "tokenizer" / generation.name)
        self.metrics_path.write_text("")

    def _cut_metrics(self, start_step: int) -> None:
        """Truncate metrics.jsonl after its last record at or before ``start_step`` (the lines after it
        are redone); a torn last line is dropped with a message."""
        try:
            lines, torn = _metric_lines(self.metrics_path)
        except ValueError as error:
            raise ConfigError(f"--resume: {error}; repair or remove that line") from None
        if torn:
            print(f"{self.metrics_path}: dropped a torn last line ({torn} bytes, a write cut short)", file=sys.stderr)
        keep = 0
        for end, record in lines:
            if record.get("step", 0) > start_step:
                break
            keep = end
        if self.metrics_path.exists():
            os.truncate(self.metrics_path, keep)

    def records(self) -> list[dict]:
        return read_records(self.directory)

    def log(self, record: dict) -> None:
        """One step's record to metrics.jsonl and to each enabled writer (numbers only there)."""
        if not self.primary:
            return
        record = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
        step = record["step"]
        numbers = {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        if self.tensorboard is not None:
            for key, value in numbers.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)

    def export(self, policy) -> None:
        """``final/``: the policy as a Hugging Face checkpoint with the run's tokenizer (with LoRA: the
        adapters merged in, and the PEFT adapter alone in ``final/adapter``), and the curves.
        ``policy`` holds full (gathered) parameters; process 0 writes."""
        if self.primary:
            final, partial = self.directory / "final", self.directory / "final.partial"
            shutil.rmtree(partial, ignore_errors=True)
            if policy.config.lora is None:                                          # a kill leaves no half final/
                hf.save(policy, partial, tokenizer_dir=self.directory / "tokenizer")
            else:
                hf.save(lora.merged(policy), partial, tokenizer_dir=self.directory / "tokenizer")
                hf.save_peft(policy, partial / "adapter", base_model=self.exp.model.path)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
            plot(self.records(), self.directory / "curves.png", self.exp.name)

    def close(self, failed: bool = False) -> None:
        """Close the writers, then release the lock."""
        for writer in (self.checkpoints, self.tensorboard):
            if writer is not None:
                writer.close()
        if self.wandb is not None:
            self.wandb.finish(exit_code=1 if failed else 0)
        self.lock.release()


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
