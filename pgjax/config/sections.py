"""The sections of an experiment besides the task's (``pgjax.config.task``) and the learner's and
optimizer's (``pgjax.config.update``), and the ``Experiment`` that holds them all: each a frozen
dataclass whose ``__post_init__`` checks its own fields (``pgjax.checks``), so a mistake is a
``ConfigError`` naming its key however the section was built."""
from __future__ import annotations

import dataclasses
import math
import os
import pathlib

import numpy as np

from pgjax import core
from pgjax.checks import EXPECTED, ConfigError, check_types, fits, require
from pgjax.config.task import TaskSection, with_escapes
from pgjax.config.update import OptimConfig, UpdateConfig
from pgjax.models.lora import TARGETS, LoRAConfig
from pgjax.models.transformer import RUNTIME_OPTIONS, ModelConfig
from pgjax.parallel.mesh import MeshConfig
from pgjax.parallel.multihost import DistributedConfig
from pgjax.plugins import is_import_path, named_estimator
from pgjax.rollout.collect import RolloutConfig
from pgjax.tasks import FILE_FORMATS

HPARAMS = "algorithm.hparams."      # the traced hyperparameters' keys: algorithm.hparams.<core.HParams field>
# the longest name of a run directory, and of each folder above it, in bytes: a file system takes 255 a
# name, and --restart renames the directory to <name>-replaced-<date>
NAME_BYTES = 200


@dataclasses.dataclass(frozen=True)
class LoRASection:
    """Low-rank adapters (``pgjax.models.lora``): ``rank`` 0 trains every weight (full fine-tuning);
    ``rank`` r >= 1 freezes the checkpoint and trains adapters of rank r on the ``targets``
    (comma-separated ``q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj``, or ``all``), scaled by
    ``alpha`` / r, with ``dropout`` on their input during the update. The KL reference is then the
    checkpoint itself (adapters off), checkpoints hold only the adapters, and ``final/`` holds the
    merged model plus the PEFT adapter in ``final/adapter``."""
    rank: int = 0
    alpha: float = 32.0
    dropout: float = 0.0
    targets: str = "all"

    def __post_init__(self):
        check_types(self, "model.lora.")
        require(self.rank >= 0, "model.lora.rank", self.rank, "an integer >= 0 (0: full fine-tuning)")
        self._lora_config(max(self.rank, 1))       # LoRAConfig checks every field, even while LoRA is off

    def config(self) -> LoRAConfig | None:
        """The ``LoRAConfig``, None for full fine-tuning (rank 0)."""
        return self._lora_config(self.rank) if self.rank else None

    def _lora_config(self, rank: int) -> LoRAConfig:
        targets = TARGETS if self.targets == "all" else tuple(t.strip() for t in self.targets.split(","))
        return LoRAConfig(rank=rank, alpha=self.alpha, dropout=self.dropout, targets=targets)


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """``path``: a local Hugging Face checkpoint directory (its config and weights; the architecture
    fields below are then ignored). Empty: a new random model of this architecture (``ModelConfig``'s
    fields, named as in Hugging Face's config.json) over the task's tokenizer, whose size is the
    vocabulary. Either way: ``param_dtype``, ``compute_dtype``; ``remat``, what each layer's
    backward pass recomputes instead of keeping (``off``, ``save_matmuls``, ``save_nothing``: see
    ``pgjax.models.transformer.REMAT_POLICIES``; same gradients, less activation memory); and
    ``scan_layers``: the layers stored stacked and run as one ``lax.scan`` (one traced layer, so
    compile time does not grow with depth; a run resumes only with the layout it started with).
    The defaults, stacked layers each recomputed in the backward pass, are the fastest and smallest
    update measured on SmolLM2-135M (docs/benchmarks.md, "The model options"); ``scan_layers=false``
    with ``remat=off`` resume a run begun when they were the default. ``attention``: ``einsum`` (every
    backend), ``blockwise`` (the same attention over blocks of keys in training and scoring: no T x T
    scores held, for long responses) or ``cudnn`` (cuDNN's fused attention on an NVIDIA GPU, with
    ``compute_dtype=bfloat16``; ``pgjax.models.transformer.ATTENTION``).

    ``family``: ``llama``, ``qwen2``, ``qwen3``, ``gemma3`` (``pgjax.models.transformer.FAMILIES``) or the
    import path ``package.module:NAME`` of a ``Family`` of your own (transformers' model_type and
    architecture class, and which of ``CausalLM``'s switches its layers use: docs/extending.md). With
    ``path`` the checkpoint's config.json names its family by its model_type; a family of your own
    named here by import path is the one its model_type must then be (``hf.load``'s ``family``)."""
    path: str = ""
    # ModelConfig's architecture fields (a test keeps the names in step), with a tiny model's defaults
    family: str = "qwen3"
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: str = "save_nothing"
    scan_layers: bool = True
    attention: str = "einsum"
    lora: LoRASection = LoRASection()

    def __post_init__(self):
        check_types(self, "model.")
        self.config(vocab_size=1)       # the architecture's checks are ModelConfig's own

    @property
    def checkpoint_family(self) -> str | None:
        """``family`` where it is an import path (a family of the user's, which a checkpoint at ``path``
        is read as: ``hf.load``'s ``family``), else None (a checkpoint names its built-in family)."""
        return self.family if is_import_path(self.family) else None

    def runtime_options(self) -> dict:
        """The ``RUNTIME_OPTIONS`` (dtypes, remat, scan_layers) to load a checkpoint with, and its
        ``family`` where that is a family of the user's (``checkpoint_family``)."""
        options = {name: self.lora.config() if name == "lora" else getattr(self, name) for name in RUNTIME_OPTIONS}
        return options if self.checkpoint_family is None else {**options, "family": self.checkpoint_family}

    def config(self, vocab_size: int) -> ModelConfig:
        """The architecture of a new model over a vocabulary of ``vocab_size`` tokens."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "path" and f.name not in RUNTIME_OPTIONS}
        return ModelConfig(vocab_size=vocab_size, **{**fields, **self.runtime_options()})



@dataclasses.dataclass(frozen=True)
class WarmStartSection:
    """Supervised warm start on demonstrations before RL: ``steps`` batches of ``batch_size`` (0 = off)."""
    steps: int = 200
    batch_size: int = 64
    optim: OptimConfig = OptimConfig(lr=3e-3, warmup_steps=20)

    def __post_init__(self):
        check_types(self, "warm_start.")
        require(self.steps >= 0, "warm_start.steps", self.steps, "an integer >= 0 (0: no warm start)")
        require(self.batch_size >= 1, "warm_start.batch_size", self.batch_size, "an integer >= 1")


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    """Where metrics go besides ``metrics.jsonl``: TensorBoard event files in the run directory
    (``tensorboard --logdir runs/``), and Weights & Biases when ``wandb`` is true (needs the
    ``wandb`` package; ``WANDB_MODE=offline`` keeps it local). ``progress_every``: seconds between
    progress lines when stderr is not a terminal (a terminal gets a live bar).

    Completions (``pgjax.train.completions``): every ``completions_every`` RL steps (0: off)
    ``completions_per_step`` rows of the step's batch (drawn from the seed: a resumed run logs the
    same rows), their prompt and completion each clipped to ``completions_max_chars`` characters
    (the cut marked), go to ``completions.jsonl``, TensorBoard text and a W&B table. The default, 4
    rows every 10 steps, is the default ``eval_every``: a look at the samples beside each evaluation,
    at most 4 x 2 x 2000 characters of text per logged step, and a W&B table (a file each) every
    tenth step rather than every step.

    ``sinks``: comma-separated import paths ``package.module:name`` of logging sinks of your own, each a
    ``pgjax.train.sinks.Sink`` subclass (or a factory of one) opened as ``factory(directory, since)``
    (the run directory; the step a resume starts after, None for a new run) and given every record
    and the step's logged completions after the run's own sinks; one that raises is reported and left
    out for the rest of the run, never touching the other records (docs/extending.md)."""
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "pgjax"
    progress_every: float = 30.0
    completions_every: int = 10
    completions_per_step: int = 4
    completions_max_chars: int = 2000
    sinks: str = ""

    def __post_init__(self):
        check_types(self, "logging.")
        require(all(map(is_import_path, self.sink_names)), "logging.sinks", self.sinks,
                 "comma-separated import paths package.module:name of Sink classes or factories of your own "
                 "(the built-in sinks have their own switches: logging.tensorboard, logging.wandb)")
        require(self.progress_every >= 0, "logging.progress_every", self.progress_every, ">= 0 seconds")
        require(self.completions_every >= 0, "logging.completions_every", self.completions_every,
                 "an integer >= 0 (RL steps between logged completions; 0: none)")
        require(self.completions_per_step >= 1, "logging.completions_per_step", self.completions_per_step,
                 "an integer >= 1 (rows logged per step, at most the batch's)")
        require(self.completions_max_chars >= 1, "logging.completions_max_chars", self.completions_max_chars,
                 "an integer >= 1 (characters kept of each prompt and completion)")

    @property
    def sink_names(self) -> tuple[str, ...]:
        """``sinks`` split at its commas."""
        return tuple(name.strip() for name in self.sinks.split(",")) if self.sinks else ()


@dataclasses.dataclass(frozen=True)
class AlgorithmSection:
    """The estimator (the paper's unified policy gradient, docs/design.md; your own: docs/estimators.md):
    ``preset``, a name of ``core.PRESETS`` (REINFORCE, ReMax, RLOO, PPO, GRPO, Dr. GRPO and
    relatives) or the import path ``package.module:name`` of your own estimator (a ``core.Estimator``,
    or a class or function called with no arguments that returns one); ``estimator``, an estimator
    object instead (Python only: an experiment file or ``Trainer(exp, algorithm=...)``; it replaces
    ``preset``); ``hparams``, its traced hyperparameters by name (a preset's: ``core.HParams``
    fields, e.g. ``{"kl_coef": 0.01}``) over its own; ``correction`` and ``correction_mode`` (presets
    only), what the loss does with the sampler's log-probs (the ``core.Spec`` fields of those names:
    ``ignore`` measures the learner-sampler mismatch only; importance weights pi_old / mu per
    ``token``, ``sequence`` or ``geometric`` mean, truncated or masked at ``hparams.is_cap`` /
    ``is_floor``; or ``behaviour_ratio``, the PPO clip against mu). In an experiment file
    ``algorithm="grpo"`` is short for ``AlgorithmSection(preset="grpo")``."""
    preset: str = "dr_grpo"
    hparams: dict = dataclasses.field(default_factory=dict)
    correction: str = "ignore"
    correction_mode: str = "truncate"
    estimator: core.Estimator | None = None

    def __post_init__(self):
        check_types(self, "algorithm.")
        for name, value in self.hparams.items():
            require(fits(value, float), f"{HPARAMS}{name}", value, EXPECTED[float])
        require(self.preset in core.PRESETS or ":" in self.preset, "algorithm.preset", self.preset,
                 f"one of {', '.join(core.PRESETS)}, or the import path package.module:name of your own estimator")
        require(self.correction in core.CORRECTIONS, "algorithm.correction", self.correction,
                 f"one of {', '.join(core.CORRECTIONS)}")
        require(self.correction_mode in core.IS_MODES, "algorithm.correction_mode", self.correction_mode,
                 f"one of {', '.join(core.IS_MODES)}")

    @property
    def key(self) -> str:
        """The setting that names the estimator, for messages: ``algorithm.preset=...`` or ``algorithm.estimator``."""
        return "algorithm.estimator" if self.estimator is not None else f"algorithm.preset={self.preset}"

    def build(self) -> core.Estimator:
        """The estimator (``estimator``, else ``preset`` looked up by ``pgjax.plugins.resolve``) with
        ``hparams`` applied, and a preset's off-policy correction when it is set: ConfigError for an
        import path that does not give a ``core.Estimator``, a correction the preset's ratio cannot
        take or set for an estimator of the user's, or an unknown or invalid hyperparameter."""
        algo = self.estimator if self.estimator is not None else _estimator(self.preset)
        correction = dict(correction=self.correction, correction_mode=self.correction_mode)
        if correction != {"correction": "ignore", "correction_mode": "truncate"}:
            if not isinstance(algo, core.Algorithm):
                raise ConfigError(f"algorithm.correction={self.correction!r}, algorithm.correction_mode="
                                  f"{self.correction_mode!r} are the presets' off-policy corrections; "
                                  f"{algo.name} reads the sampler's log-probs (batch.behaviour_logp) itself")
            try:
                algo = dataclasses.replace(algo, spec=algo.spec.replace(**correction))
            except ValueError as error:
                raise ConfigError(f"algorithm.correction={self.correction!r}: {error}") from None
        try:
            return algo.with_hparams(**self.hparams) if self.hparams else algo
        except (ValueError, TypeError) as error:
            raise ConfigError(f"algorithm.hparams: {error}") from None


def _estimator(name: str) -> core.Estimator:
    """The estimator ``algorithm.preset`` names (``plugins.named_estimator``: a preset, or an import path);
    ConfigError otherwise."""
    try:
        return named_estimator(name)
    except ValueError as error:
        raise ConfigError(str(error)) from None


STAGES = ("rl", "reward_model", "process_reward_model")


@dataclasses.dataclass(frozen=True)
class RewardModelSection:
    """The learned reward a ``stage="reward_model"`` or ``"process_reward_model"`` run trains
    (``pgjax.train.reward_trainer``) on the file ``path`` (``pgjax.tasks.preferences``: the fields by
    name, the formats and checks of every dataset, ``skip_invalid``). A reward model: the
    Bradley-Terry loss on preference pairs (``prompt_field``, ``chosen_field``, ``rejected_field``),
    ``margin`` added to each pair's own (``margin_field``). A process reward model: each step's label
    at its last token (``steps_field``, ``labels_field``; the response is its steps joined by
    ``separator``, ``\n`` a line break). The held-out records are those of ``eval_path``, else
    ``eval_prompts`` records drawn from ``path`` with the run's seed, never trained on. ``max_tokens``:
    the most tokens a prompt and response may take as the model reads them (the task section's
    ``chat_template``, ``system_prompt`` and ``prompt_template`` render the prompt)."""
    path: str = ""
    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    margin_field: str = ""
    steps_field: str = "completions"
    labels_field: str = "labels"
    step_separator: str = "\\n"
    file_format: str = "auto"
    skip_invalid: bool = False
    eval_path: str = ""
    margin: float = 0.0
    max_tokens: int = 256

    def __post_init__(self):
        check_types(self, "reward_model.")
        require(self.file_format in FILE_FORMATS, "reward_model.file_format", self.file_format,
                 f"one of {', '.join(FILE_FORMATS)}")
        require(math.isfinite(self.margin), "reward_model.margin", self.margin, "a finite number")
        require(self.max_tokens >= 2, "reward_model.max_tokens", self.max_tokens, "an integer >= 2")
        require(bool(self.step_separator), "reward_model.step_separator", self.step_separator,
                 "a text that is not empty (escapes \\n and \\t allowed)")

    @property
    def separator(self) -> str:
        """``step_separator`` with its escapes read (``\\n`` a line break)."""
        return with_escapes(self.step_separator)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One run. The defaults are the README's main job: Dr. GRPO on 2-digit addition with a tiny
    Qwen3-style model and a short supervised warm start, sized for 2 CPU cores. ``steps`` RL steps
    of ``prompts_per_step`` prompts (0: only the warm start, then the export); greedy evaluation on
    ``eval_prompts`` held-out prompts every ``eval_every`` steps; a checkpoint every
    ``checkpoint_every`` steps. ``mesh``: how the devices of all processes are split (default: data
    parallel over all of them); ``distributed``: how the processes of a multi-host run meet (default:
    from the environment). ``stage``: ``rl``, or ``reward_model`` / ``process_reward_model`` to train the
    learned reward of the ``reward_model`` section instead (``steps`` of ``prompts_per_step`` records
    with ``optim``, held-out accuracy every ``eval_every`` steps; the algorithm, rollout, update and
    warm-start sections unused)."""
    name: str = "experiment"
    seed: int = 0
    stage: str = "rl"
    algorithm: AlgorithmSection = AlgorithmSection()
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
    logging: LoggingSection = LoggingSection()
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedConfig = DistributedConfig()
    reward_model: RewardModelSection = RewardModelSection()

    def __post_init__(self):
        if isinstance(self.algorithm, str):         # algorithm="grpo": the preset's name
            object.__setattr__(self, "algorithm", AlgorithmSection(preset=self.algorithm))
        check_types(self)
        require(self.name not in ("", ".", "..") and not {"/", "\0"} & set(self.name), "name", self.name,
                 "a non-empty name without '/', other than '.' and '..' (runs/<name> is the run directory)")
        require(_fits_file_names(self.name), "name", self.name,
                 f"at most {NAME_BYTES} bytes (runs/<name> is the run directory)")
        require("\0" not in self.run_dir and _fits_file_names(self.run_dir), "run_dir", self.run_dir,
                 f"a path without NUL whose every part is at most {NAME_BYTES} bytes")
        # jax.random.PRNGKey keeps the low 32 bits of a seed (2**32 would give seed 0's key) and
        # overflows from 2**63 on; the data streams' SeedSequence takes any
        require(0 <= self.seed < 2**32, "seed", self.seed, "an integer in [0, 2**32)")
        require(self.stage in STAGES, "stage", self.stage, f"one of {', '.join(STAGES)} (RL, or training the reward "
                 "model of the reward_model section)")
        require(self.steps >= 0, "steps", self.steps, "an integer >= 0 (0: only the warm start)")
        for name in ("prompts_per_step", "eval_every", "eval_prompts", "checkpoint_every"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")


def _fits_file_names(path: str) -> bool:
    """Whether every part of ``path`` is at most ``NAME_BYTES`` long in the file system's encoding."""
    return all(len(os.fsencode(part)) <= NAME_BYTES for part in pathlib.PurePath(path).parts)


def stream_seed(seed: int, stream: str, index: int) -> int:
    """Independent deterministic integer seeds for the data streams of a run (``train``, ``eval``,
    ``warm_start``), one per step."""
    return int(np.random.SeedSequence([seed, sum(map(ord, stream)), index]).generate_state(1)[0])


