"""Experiment files: ``load`` runs a Python file's ``experiment()`` and says any mistake in one line
naming the file and line."""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import re

from pgjax.checks import ConfigError
from pgjax.config.keys import RENAMED, closest, section_types
from pgjax.config.sections import Experiment
from pgjax.tasks import error_text, raised_at

MOVED = {"pgjax.train.experiment": "pgjax.config"}      # modules an experiment file imported, by their new name


def load(path) -> Experiment:
    """``experiment()`` of the Python file ``path``: ConfigError if it is not a ``.py`` file, has no
    ``experiment()`` or a bad one, or if importing the file or calling ``experiment()`` raises (naming
    the file and line where)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"no experiment file {path}")
    if path.suffix != ".py":
        raise ConfigError(f"{path} is not a Python file: an experiment is a .py file defining experiment() "
                          "returning a pgjax Experiment (experiments/ holds examples)")
    spec = importlib.util.spec_from_file_location(f"pgjax_experiment_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:      # a SyntaxError, NameError, ImportError... in the file or what it imports
        raise ConfigError(f"{raised_at(error) or path}: {error_text(error)}{_moved_hint(error)}") from None
    if not hasattr(module, "experiment"):
        raise ConfigError(f"{path} must define experiment() returning a pgjax Experiment")
    try:
        experiment = module.experiment()
    except (ValueError, TypeError) as error:    # a section's own check, a field that does not exist or was renamed
        raise ConfigError(f"{raised_at(error) or path}: {_section_error(error)}") from None
    except Exception as error:       # the user's code in experiment() failed
        raise ConfigError(f"{raised_at(error) or path}: experiment() raised {error_text(error)}") from None
    if not isinstance(experiment, Experiment):
        raise ConfigError(f"{path}: experiment() returned {type(experiment).__name__}, not an Experiment")
    return experiment


def _moved_hint(error: Exception) -> str:
    """`` (NAME is now NEW: ...)`` for an import of a module that moved (``MOVED``); empty otherwise."""
    name = getattr(error, "name", None) if isinstance(error, ImportError) else None
    return f" ({name} is now {MOVED[name]}: from {MOVED[name]} import Experiment, ...)" if name in MOVED else ""


def _section_error(error: ValueError | TypeError) -> str:
    """What a section's constructor raised in an experiment file, said plainly: a section's own check
    as it says it (a ``ConfigError`` naming the key), a renamed field with its new key, an unknown
    field with the closest one."""
    moved = [f"{old.split('.')[-1]} is now {new}" for old, new in RENAMED.items()
             if f"'{old.split('.')[-1]}'" in str(error)]
    return f"{error}" + (f" ({'; '.join(moved)})" if moved else _field_hint(error))


def _field_hint(error: ValueError | TypeError) -> str:
    """``; did you mean FIELD?`` for a section constructor's unexpected keyword (``Experiment(stepz=3)``):
    the section's closest field, as ``--set`` hints an unknown key; empty otherwise."""
    found = re.search(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", str(error))
    if found is None:
        return ""
    section = next((kind for kind in section_types() if kind.__name__ == found[1]), None)
    if section is None:
        return ""
    close = closest(found[2], [f.name for f in dataclasses.fields(section)])
    return f"; did you mean {' or '.join(close)}?" if close else ""
