"""A run's checkpoints: step-numbered orbax checkpoints of the training state, verified before
they are read.

  checkpoints/<step>/     the ``TrainState`` (orbax), a JSON record (step, data position) and
                          pgjax_files.json, the size and SHA-256 of each of the checkpoint's files
  damaged_checkpoints/    checkpoints found damaged on restore, set aside (never deleted)

A checkpoint whose file list is missing (a save cut short) or whose files are missing, shorter or
hold other bytes than written, or that then cannot be read, is reported in one line, set aside and
the next older one tried (``fallback=False`` refuses instead); what a save cut short left in orbax's
temporary directories is removed on resume (``remove_leftovers``). A checkpoint whose arrays do not have
the expected layout (a changed model, algorithm or optimizer) is refused naming the arrays that
differ (``layout``). On several processes every process writes its shards and process 0 the file
list. Also the two small helpers the run directory shares: ``write_atomically`` and ``one_line``.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pathlib
import shutil
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from pgjax.checks import ConfigError
from pgjax.errors import RunStopped
from pgjax.parallel import multihost

FILE_LIST = "pgjax_files.json"


class _DeliberateWait(logging.Filter):
    """Drops orbax's warning "Waiting for previous save to complete took N seconds": ``Checkpoints.save``
    waits for each save to finish on purpose, and orbax counts that wait as the next save's (its own
    code says so), so the warning would report the previous save's duration as a delay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Waiting for previous save to complete")


_ORBAX_LOG = logging.getLogger("absl")      # orbax logs through absl's logger


class _Damaged(Exception):
    """A checkpoint that cannot be restored as written (the message says why)."""


def write_atomically(path: pathlib.Path, text: str) -> None:
    """``path`` holds either its old contents or ``text``, never a part (write a sibling, then rename)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def no_space(error: BaseException) -> bool:
    """Whether ``error`` says the disk (or the user's quota) is full: an ENOSPC / EDQUOT OSError, or an
    error whose text quotes one
    (orbax's writers report ``RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='28']``).
    On several processes a process whose own write fails stops; the others are not told (they wait at
    the next collective until its timeout)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(os.strerror(code) in str(error) for code in (errno.ENOSPC, errno.EDQUOT))


def one_line(error: BaseException) -> str:
    """``Type: message`` of an exception on one line, at most 200 characters of message."""
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text[:200]}"


def file_sha256(path: pathlib.Path) -> str:
    """The SHA-256 of the bytes of the file ``path``, in hex."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _file_digests(folder: pathlib.Path) -> dict[str, list]:
    """``{relative path: [size, sha256]}`` of every file under ``folder`` but the file list itself."""
    return {str(path.relative_to(folder)): [path.stat().st_size, file_sha256(path)]
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != FILE_LIST}


def _check_files(folder: pathlib.Path) -> None:
    """_Damaged unless ``FILE_LIST`` in ``folder`` lists files and every one is there with its size and
    SHA-256."""
    try:
        listed = json.loads((folder / FILE_LIST).read_text())
        if not isinstance(listed, dict) or not all(isinstance(v, list) and len(v) == 2 for v in listed.values()):
            raise ValueError("not an object of [size, sha256] pairs")
    except (OSError, ValueError):
        raise _Damaged(f"its list of files ({FILE_LIST}) is missing or unreadable: a save cut short, or "
                       "damage") from None
    if not listed:
        raise _Damaged(f"its list of files ({FILE_LIST}) lists no file: it verifies nothing")
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


class Checkpoints:
    """Step-numbered orbax checkpoints under ``directory``; keeps the newest ``keep``. A checkpoint is
    written atomically (orbax finalises a step directory only when complete), so a run killed at any
    moment resumes from the last complete step; then the size and SHA-256 of each of its files are
    written to its ``pgjax_files.json``, and checked on restore. ``guard(writing)`` is called before
    each save and its file list, and when a save fails: a RunStopped from it stops the save (the run
    directory's check that it was not moved or deleted, ``RunDirectory.check_in_place``)."""

    def __init__(self, directory, keep: int = 2, guard=None):
        self.directory = pathlib.Path(directory).absolute()
        self.guard = guard or (lambda writing: None)
        if not any(isinstance(f, _DeliberateWait) for f in _ORBAX_LOG.filters):
            _ORBAX_LOG.addFilter(_DeliberateWait())
        self.manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True), item_handlers={"state": ocp.StandardCheckpointHandler(),
                                                           "record": ocp.JsonCheckpointHandler()})
        self.newest = self.manager.latest_step()    # the newest complete checkpoint: found, written or restored

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (None without one); not verified."""
        return self.manager.latest_step()

    def save(self, step: int, state, record: dict) -> None:
        """Write ``state`` and ``record`` as checkpoint ``step``, then its file list (process 0). A full
        disk is RunStopped in one line, the half-written checkpoint removed and the earlier ones kept
        (orbax reports it as an error whose text holds the OS's; ``no_space``)."""
        writing = f"the checkpoint of step {step}"
        self.guard(writing)
        try:
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                             record=ocp.args.JsonSave(record)), force=True)
            self.manager.wait_until_finished()
            self.guard(writing)
            if multihost.is_primary():
                write_atomically(self.directory / str(step) / FILE_LIST,
                                 json.dumps(_file_digests(self.directory / str(step))))
        except RunStopped:
            raise
        except Exception as error:
            self.guard(writing)             # a directory moved mid-save: say so, not what orbax met
            if not no_space(error):
                raise
            self._discard(step)
            raise RunStopped(f"the checkpoint of step {step} could not be written: no space left on the device of "
                             f"{self.directory} (the checkpoints before it are kept: free some space, then --resume)"
                             ) from None
        multihost.barrier("checkpoint_file_list")
        self.newest = step

    def _cut_short(self, step: int | str = "*") -> list[pathlib.Path]:
        """Orbax's temporary directories of the saves of ``step`` (default: any step), which only a save
        cut short leaves."""
        return sorted(self.directory.glob(f"{step}.orbax-checkpoint-tmp*"))

    def remove_leftovers(self) -> None:
        """Remove the temporary directories of saves cut short (a kill, a second signal), which are no
        checkpoint, saying so in one line (process 0; a resume, under the run's lock)."""
        leftovers = self._cut_short() if multihost.is_primary() else []
        for partial in leftovers:
            shutil.rmtree(partial)
        if leftovers:
            print(f"--resume: removed {', '.join(p.name for p in leftovers)} from {self.directory}: the temporary "
                  "files of a checkpoint write cut short (not a checkpoint)", file=sys.stderr)

    def _discard(self, step: int) -> None:
        """Remove what a failed save of ``step`` left: orbax's temporary directory, or a step directory
        without its file list (process 0)."""
        if not multihost.is_primary():
            return
        for partial in self._cut_short(step):
            shutil.rmtree(partial, ignore_errors=True)
        if (self.directory / str(step)).is_dir() and not (self.directory / str(step) / FILE_LIST).is_file():
            shutil.rmtree(self.directory / str(step), ignore_errors=True)

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
                restored = self._verified(like, candidate)
                if step is None:            # the damaged newer ones are set aside
                    self.newest = candidate
                return restored
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
        raise ConfigError(f"no intact checkpoint in {self.directory}: {'; '.join(damaged)} (--restart starts the run "
                          "again, its results moved aside, the damaged checkpoints kept)")

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
            raise _Damaged(f"its metadata cannot be read: {one_line(error)}") from None
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
            raise _Damaged(f"it cannot be read: {one_line(error)}") from None
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
        """Wait for orbax's background work and close its manager."""
        self.manager.close()
