"""Typed experiment configuration, loaded from a Python file and overridden by ``key=value`` strings.

An experiment file is a Python module with a function ``experiment()`` that
returns an ``Experiment``. ``--set rollout.temperature=0.7`` replaces one
field (dotted path, value parsed by the field's type); an unknown key raises
and lists every valid key. ``hparams.<name>`` overrides one of the algorithm's
traced hyperparameters (``core.HParams``).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import types
import typing

from pgjax import core
from pgjax.parallel.mesh import MeshConfig
from pgjax.parallel.multihost import DistributedConfig
from pgjax.train.learner import UpdateConfig
from pgjax.train.optim import OptimConfig
from pgjax.train.rollout import RolloutConfig


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """``path``: a local Hugging Face checkpoint directory; empty = a new random model of this shape
    (tied embeddings) over the task's tokenizer."""
    path: str = ""
    family: str = "qwen3"
    hidden_size: int = 128
    intermediate_size: int = 384
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    param_dtype: str = "float32"
    compute_dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """``name``: ``arithmetic`` (``digits``, ``ops``), ``arithmetic_mix`` (1..``digits``-digit operands in equal
    shares, tagged by difficulty), ``scratchpad_arithmetic`` (``digits``, ``ops``, ``max_scratch``: the
    demonstrations' longest free text, ``working``: ``before`` or ``after`` the answer), ``countdown``
    (``numbers``) or ``jsonl_math`` (a user's JSONL file at ``dataset`` with the math verifier);
    ``format_weight`` adds the task's format reward."""
    name: str = "arithmetic"
    digits: int = 2
    ops: str = "+"
    max_scratch: int = 8
    working: str = "before"
    numbers: int = 3
    dataset: str = ""
    prompt_field: str = "question"
    answer_field: str = "answer"
    format_weight: float = 0.0


@dataclasses.dataclass(frozen=True)
class WarmStartSection:
    """Supervised warm start on demonstrations before RL: ``steps`` batches of ``batch_size`` (0 = off)."""
    steps: int = 200
    batch_size: int = 64
    optim: OptimConfig = OptimConfig(lr=3e-3, warmup_steps=20)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One run. The defaults are the README's main job: Dr. GRPO on 2-digit addition with a tiny
    Qwen3-style model and a short supervised warm start, sized for 2 CPU cores. ``mesh``: how the
    devices of all processes are split (default: data parallel over all of them); ``distributed``:
    how the processes of a multi-host run meet (default: from the environment)."""
    name: str = "experiment"
    seed: int = 0
    algorithm: str = "dr_grpo"
    hparams: dict = dataclasses.field(default_factory=dict)
    steps: int = 250
    prompts_per_step: int = 32
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    rollout: RolloutConfig = RolloutConfig(samples_per_prompt=8, max_prompt_tokens=8, max_new_tokens=6)
    update: UpdateConfig = UpdateConfig()
    optim: OptimConfig = OptimConfig(lr=5e-4, warmup_steps=5)
    critic_optim: OptimConfig = OptimConfig(lr=1e-3, warmup_steps=5)
    warm_start: WarmStartSection = WarmStartSection()
    eval_every: int = 10
    eval_prompts: int = 256
    checkpoint_every: int = 50
    run_dir: str = ""
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedConfig = DistributedConfig()

    def algorithm_preset(self) -> core.Algorithm:
        """The preset named ``algorithm`` with ``hparams`` applied (unknown names raise)."""
        algo = core.preset(self.algorithm)
        return dataclasses.replace(algo, hparams=algo.hparams.replace(**self.hparams))


def load(path) -> Experiment:
    """``experiment()`` of the Python file ``path``."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no experiment file {path}")
    spec = importlib.util.spec_from_file_location(f"pgjax_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "experiment"):
        raise AttributeError(f"{path} must define experiment() returning a pgjax Experiment")
    experiment = module.experiment()
    if not isinstance(experiment, Experiment):
        raise TypeError(f"{path}: experiment() returned {type(experiment).__name__}, not an Experiment")
    return experiment


def valid_keys(config=Experiment, prefix: str = "") -> list[str]:
    """Every dotted key ``override`` accepts."""
    keys = []
    for field in dataclasses.fields(config):
        kind = _field_type(config, field.name)
        if dataclasses.is_dataclass(kind):
            keys += valid_keys(kind, f"{prefix}{field.name}.")
        elif field.name == "hparams" and config is Experiment:
            keys += [f"hparams.{name}" for name in core.algorithms.field_names(core.HParams)]
        else:
            keys.append(prefix + field.name)
    return keys


def override(experiment: Experiment, assignments: list[str]) -> Experiment:
    """Apply ``key=value`` strings in order."""
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {assignment!r}")
        if key.strip() not in valid_keys():
            raise KeyError(f"unknown config key {key!r}; valid keys:\n  " + "\n  ".join(valid_keys()))
        experiment = _replace_path(experiment, key.strip().split("."), text.strip())
    return experiment


def _replace_path(config, path: list[str], text: str):
    head, rest = path[0], path[1:]
    if head == "hparams" and isinstance(config, Experiment):
        return dataclasses.replace(config, hparams={**config.hparams, rest[0]: float(text)})
    if rest:
        return dataclasses.replace(config, **{head: _replace_path(getattr(config, head), rest, text)})
    return dataclasses.replace(config, **{head: _parse(text, _field_type(type(config), head), head)})


def _field_type(config: type, name: str):
    return typing.get_type_hints(config)[name]


def _parse(text: str, kind, key: str):
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{key} is a bool: use true or false, got {text!r}")
        return text.lower() in ("true", "1")
    if isinstance(kind, types.UnionType):
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    try:
        return kind(text)
    except ValueError as error:
        raise ValueError(f"{key} must be {kind.__name__}, got {text!r}") from error
