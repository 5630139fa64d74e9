"""An experiment's configuration, the one place it is defined, read and checked.

An experiment file is a Python module with a function ``experiment()`` that returns an ``Experiment``
(``load``); every section it holds is imported from here (``from pgjax.config import Experiment,
TaskSection, RolloutConfig``). ``--set rollout.temperature=0.7`` replaces one setting (``override``:
dotted key, value parsed by the field's type); ``algorithm.hparams.<name>`` overrides one of the
algorithm's traced hyperparameters (``core.HParams``), and ``task.options.<name>`` one of the task's
own options (the value read as JSON where it parses, else kept as text). A renamed key (``RENAMED``) is
an unknown key whose message names the new one. Research code plugs in by import path where a
setting names it (``task.name``, ``task.reward.function``, ``task.tools.names``, ``logging.sinks``, ``model.family``,
``algorithm.preset``: ``pgjax.plugins``, docs/extending.md).

Every mistake a user can make in a configuration raises ``ConfigError`` (a ``ValueError``,
``pgjax.checks``) with one line naming the key, the value and what would be valid: an unknown key
(with the closest valid one), a value of the wrong type, a value out of its range (each section's
``__post_init__`` checks its own fields with ``pgjax.checks``, as ``RolloutConfig``, ``ModelConfig``,
``UpdateConfig`` and ``OptimConfig`` do in their own modules), and the checks that need several
sections (``validate``: a group baseline with one sample per prompt, batches that do not split into
micro-batches or over the mesh, a missing checkpoint or dataset, a run whose model and batches cannot
fit the machine's memory). The command line prints it as plain lines and exits with status 2.

The modules: ``task`` (the task section and its parts: options, prompt, reward, tools), ``sections``
(the other sections and ``Experiment``), ``update`` (the learner's and the optimizer's sections),
``keys`` (dotted keys, ``--set``, ``--print-config``, hints, earlier run records read today),
``files`` (experiment files), ``validate`` (the checks across sections).
"""
from pgjax.checks import MAX_SECONDS, ConfigError
from pgjax.config.files import load
from pgjax.config.keys import RENAMED, estimator_label, override, renamed, resolved, sections, upgraded, valid_keys
from pgjax.config.sections import (
    AlgorithmSection,
    Experiment,
    LoggingSection,
    LoRASection,
    ModelSection,
    RewardModelSection,
    WarmStartSection,
    stream_seed,
)
from pgjax.config.task import PromptSection, RewardSection, TaskSection, ToolsSection
from pgjax.config.update import OptimConfig, UpdateConfig
from pgjax.config.validate import check_batches, validate
from pgjax.parallel.mesh import MeshConfig
from pgjax.parallel.multihost import DistributedConfig
from pgjax.rollout.collect import RolloutConfig

__all__ = ["MAX_SECONDS", "RENAMED", "AlgorithmSection", "ConfigError", "DistributedConfig", "Experiment",
           "LoRASection", "LoggingSection", "MeshConfig", "ModelSection", "OptimConfig", "RewardModelSection",
           "RolloutConfig", "TaskSection", "UpdateConfig", "WarmStartSection", "check_batches", "estimator_label",
           "load", "override", "renamed", "resolved", "sections", "stream_seed", "upgraded", "valid_keys", "validate",
           "PromptSection", "RewardSection", "ToolsSection"]
