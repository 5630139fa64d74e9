"""Content fingerprints of the files that define a run: what ``inputs.json`` in the run directory
records and ``--resume`` checks, so that a dataset edited in place or a checkpoint replaced at the
same path is found, not trained on silently.

  inputs.json   ``{"files": {label: {"path", "size", "sha256", "stat"}}}``, one entry per input file:
                ``task.options.path`` (a dataset), ``model.path/<file>`` (each file of the checkpoint that
                ``hf.load`` and the tokenizer read), ``task.reward.model/<file>`` (the same of the
                trained reward model RL scores with), ``<key>:module`` (the source file of a user's
                module plugged in by import path, ``pgjax.plugins``: ``task.name``, ``task.reward.function``,
                ``task.tools.names``, ``logging.sinks``, ``model.family``, ``algorithm.preset``, and the file
                defining an
                estimator object's class, ``algorithm.estimator:module``; a key whose
                entries come from several modules has one label per module, ``<key>:module:<module>``),
                and for a reward model's training ``reward_model.path`` / ``reward_model.eval_path`` (its
                preference pairs)

A file is identified by its label, not its path, so moving an unchanged dataset elsewhere is no
change. Hashing (SHA-256) reads every byte once; ``fingerprints(..., known=saved)`` skips it for a
file whose path, size, modification time, inode change time and inode all equal the saved ones (the
change time moves on every write and cannot be set back by a user, so an edit in place is always
re-hashed).
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re

from pgjax.config import renamed
from pgjax.models.hf import CHAT_TEMPLATE_DIR
from pgjax.plugins import is_import_path, module_of
from pgjax.train.checkpoints import file_sha256
from pgjax.train.learned_reward import reward_model_directory

INPUTS_FILE = "inputs.json"
CHECKPOINT_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja")   # what a checkpoint's loaders read


def _module_source(import_path: str) -> pathlib.Path | None:
    """The source file of the module of ``package.module:name`` (None for a built-in name or no file)."""
    if not is_import_path(import_path):
        return None
    try:
        spec = importlib.util.find_spec(module_of(import_path))
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return pathlib.Path(origin) if origin and os.path.isfile(origin) else None


def checkpoint_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The files of a Hugging Face checkpoint directory its loaders read (weights, configs, tokenizer,
    chat templates), not whatever else lies there."""
    files = [p for p in directory.iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES]
    templates = directory / CHAT_TEMPLATE_DIR
    if templates.is_dir():
        files += [p for p in templates.iterdir() if p.is_file()]
    return sorted(files)


def _checkpoint_inputs(key: str, root: pathlib.Path) -> dict[str, pathlib.Path]:
    """``{"<key>/<file>": path}`` of the ``checkpoint_files`` of the directory ``root`` (none if it is not one)."""
    return {f"{key}/{p.relative_to(root)}": p for p in checkpoint_files(root)} if root.is_dir() else {}


def input_files(exp) -> dict[str, pathlib.Path]:
    """``{label: path}`` of every input file of the experiment ``exp`` (see the module docstring)."""
    files = {}
    dataset = exp.task.options.get("path")
    if isinstance(dataset, str) and dataset and pathlib.Path(dataset).is_file():
        files["task.options.path"] = pathlib.Path(dataset)
    if exp.model.path:
        files.update(_checkpoint_inputs("model.path", pathlib.Path(exp.model.path)))
    if exp.task.reward.model:
        files.update(_checkpoint_inputs("task.reward.model", reward_model_directory(exp.task.reward.model)))
    if exp.stage != "rl":
        for key in ("path", "eval_path"):
            path = pathlib.Path(getattr(exp.reward_model, key))
            if getattr(exp.reward_model, key) and path.is_file():
                files[f"reward_model.{key}"] = path
    files.update(plugin_modules(exp))
    return files


def plugin_modules(exp) -> dict[str, pathlib.Path]:
    """``{"<key>:module": source file}`` of every module a setting of ``exp`` names by import path
    (``pgjax.plugins``): one label per key, or, for a key whose entries come from several modules
    (``task.tools.names``, ``logging.sinks``), ``<key>:module:<module>`` for each."""
    named = {"task.name": [exp.task.name], "task.reward.function": [exp.task.reward.function],
             "task.tools.names": exp.task.tools.listed,
             "logging.sinks": exp.logging.sink_names, "model.family": [exp.model.family],
             "algorithm.preset": [exp.algorithm.preset]}
    files = {}
    for key, paths in named.items():
        found = {module_of(path): _module_source(path) for path in paths if is_import_path(path)}
        sources = {module: source for module, source in found.items() if source is not None}
        for module, source in sources.items():
            files[f"{key}:module" if len(sources) == 1 else f"{key}:module:{module}"] = source
    estimator_source = _estimator_source(exp.algorithm.estimator)
    if estimator_source is not None:
        files["algorithm.estimator:module"] = estimator_source
    return files


def _estimator_source(estimator) -> pathlib.Path | None:
    """The file that defines the class of an estimator object (``algorithm.estimator``: a module of the
    user's, or the experiment file itself), where its ``loss`` is written; None for none or no file."""
    loss = getattr(type(estimator), "loss", None) if estimator is not None else None
    code = getattr(loss, "__code__", None)
    return pathlib.Path(code.co_filename) if code is not None and os.path.isfile(code.co_filename) else None


def _stat(path: pathlib.Path) -> list[int]:
    """What changes whenever a file's bytes may have: size, modification and change times, inode."""
    s = path.stat()
    return [s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino]


def fingerprints(files: dict[str, pathlib.Path], known: dict | None = None) -> dict[str, dict]:
    """``{label: {"path", "size", "sha256", "stat"}}`` of ``files``; a file whose absolute path and
    ``stat`` equal its entry in ``known`` (a saved fingerprint) keeps that entry's hash unread."""
    out = {}
    for label, path in files.items():
        path = path.absolute()
        stat, saved = _stat(path), (known or {}).get(label)
        unchanged = isinstance(saved, dict) and saved.get("path") == str(path) and saved.get("stat") == stat
        digest = saved["sha256"] if isinstance(saved, dict) and unchanged else file_sha256(path)
        out[label] = {"path": str(path), "size": stat[0], "sha256": digest, "stat": stat}
    return out


def _counted(label: str) -> str:
    """For a file of a checkpoint directory (a label ``<key>/<file>``), a note saying which of its files
    are inputs (``checkpoint_files``); else nothing."""
    key, sep, _ = label.partition("/")
    if not sep:
        return ""
    return (f" (of {key}, the files ending in {', '.join(CHECKPOINT_SUFFIXES)} and those in {CHAT_TEMPLATE_DIR}/ "
            "are inputs: move a file that is not the checkpoint's out of it)")


def upgraded_labels(saved: dict) -> dict:
    """A run's saved ``fingerprints`` with each label's key under its current name (``config.renamed``:
    a run's dataset, once ``task.path``, is ``task.options.path``)."""
    out = {}
    for label, fingerprint in saved.items():
        key = re.sub(r"[/:].*", "", label)
        out[(renamed(key) or key) + label[len(key):]] = fingerprint
    return out


def differences(saved: dict, current: dict) -> dict[str, str]:
    """``{label: what changed}`` between two ``fingerprints``: a file gone, a new one (for a checkpoint's
    file, saying which of its files count), other bytes."""
    out = {}
    for label in sorted(set(saved) | set(current)):
        old, new = saved.get(label), current.get(label)
        if old is None:         # then the label is current's
            out[label] = f"{current[label]['path']} is new{_counted(label)}"
        elif new is None:
            out[label] = f"{old.get('path')} is no longer an input{_counted(label)}"
        elif old.get("sha256") != new["sha256"]:
            sizes = (f"{old.get('size')} -> {new['size']} bytes" if old.get("size") != new["size"]
                     else f"same size, {new['size']} bytes")
            out[label] = f"{new['path']} holds other bytes ({sizes}, SHA-256 {str(old.get('sha256'))[:12]} -> " \
                         f"{new['sha256'][:12]})"
    return out
