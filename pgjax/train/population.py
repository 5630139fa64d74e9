"""Population training: N members of one experiment trained as one compiled program (``Population``).

The members share the model's shape, the task and the static estimator (its ``Spec``, or an
estimator class of the user's), and differ in traced values: the estimator's hyperparameters (any
field of ``algorithm.hparams``: the paper's switches, clip epsilons, KL and entropy coefficients),
the policy's learning rate, and the seed. Their parameters, optimizer states and PRNG keys are
stacked on a leading member axis, and every jitted phase of a step is one program over it
(``over_members``: ``jax.vmap`` over all members, or with ``vmap_width`` w < N a loop over chunks
of w vmapped members; the default is every member vmapped on an accelerator and one member at a time
on CPU, where a step is compute-bound already and the vmapped one measured slower):

- sampling (the KV-cache sampler, ``sample.generate_state``), each member on its own prompts (drawn
  from its seed, ``stream_seed(seed, "train", step)``) with its own sampling key;
- scoring (``Learner.prepare``): old / reference log-probs and the advantages under each member's
  hyperparameters;
- the update (``Learner._step``, the optimizer step): each member's gradient, clipping and AdamW step.
  A member whose loss, gradient or new state is not finite keeps its state and counts
  ``skipped_updates`` (under vmap the ``lax.cond`` of ``_step`` becomes a per-member select): the
  others train on. A member stops when its reward function fails or ``update.max_skipped_steps``
  steps in a row skipped its every update; its state is not changed from then on.

Rewards are per member on the host: each member's rows are decoded and scored by the task's
verifier (``rollout.collect``, as a single run's pipeline does), and each member gets the record a
single run's ``Trainer.step`` returns. The rollouts of all members are cut to the widest member's
trimmed width (``rollout.trim_padding``), so the stacked batch has one shape.

A member's learning rate is a traced scale on its optimizer's update, lr_i / ``optim.lr``
(``member_scale``): AdamW's update is the learning-rate schedule times a direction that does not
depend on the learning rate (the schedule is ``optim.lr`` times a linear warm-up fraction, and
weight decay sits inside the scaled direction), so the scaled update is the update of a run with
lr_i up to float rounding. Member i with seed s starts where a single run of seed s starts (a new
model ``CausalLM(config, nnx.Rngs(s))``; a checkpoint at ``model.path`` is the same for all), and its
warm start draws its own demonstrations (members of one seed share one warm start: it is the same).

Members over devices: the devices form a ``(members, data, fsdp, tensor)`` mesh
(``parallel.mesh.population_mesh``): the members are split into ``member_groups`` groups along
``members`` (each group's state and rollouts on its devices alone, ``over_members`` vmapping over the
groups with ``spmd_axis_name``), and each group's devices are split by ``exp.mesh`` as a single run's
would be (data parallelism and sharding within a member). ``fit`` checkpoints the whole population
(``checkpoints.Checkpoints``) and resumes it exactly; the memory check (``memory.check_memory``) counts every
member, and ``python -m pgjax.plan --members`` plans a group's programs.

``Population.member_experiment(i)`` is the single run member i equals (tests/test_population.py
compares them; docs/population.md says to what tolerance). Not supported yet (each a ConfigError):
several processes, multi-turn episodes (``task.tools.names``, a task's environment), a learned reward
(``task.reward.model``), a greedy baseline (ReMax), asynchronous rollouts (``rollout.staleness``), a
separate sampler mesh (``rollout.sampler_devices``), packed updates (``update.pack_width``), LoRA and
Weights & Biases.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import pathlib
import sys
import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pgjax import core
from pgjax.checks import ConfigError
from pgjax.config import Experiment, stream_seed, validate
from pgjax.errors import RunStopped
from pgjax.models import hf
from pgjax.models.transformer import CausalLM
from pgjax.parallel import multihost
from pgjax.parallel.mesh import MEMBER_AXIS, MESH_AXES, population_mesh, single_device_mesh
from pgjax.rollout.batch import Rollout
from pgjax.rollout.collect import collect, encode_prompts, keep_columns, pad_id, sample_and_score, trim_padding
from pgjax.sample import Samples
from pgjax.sample.sampler import generate_state
from pgjax.tasks import RewardError
from pgjax.train import interrupts
from pgjax.train.checkpoints import Checkpoints, one_line, write_atomically
from pgjax.train.context import task_context, user_error
from pgjax.train.interrupts import RunInterrupted
from pgjax.train.learner import TrainState, build_learner
from pgjax.train.loop import RunLoop, jitted_all_finite
from pgjax.train.memory import check_memory
from pgjax.train.optim import make_optimizer
from pgjax.train.pipeline import sampler_graphdef
from pgjax.train.records import STAT_KEYS, step_record
from pgjax.train.run_dir import RunLock, experiment_changes, experiment_record, is_operational
from pgjax.train.sft import sft_step
from pgjax.train.sinks import MetricsFile, open_sink, plot, read_records
from pgjax.train.trainer import check_widths, initial_policy, training_reward, warm_start_batch

POPULATION_FILE = "population.json"


@dataclasses.dataclass(frozen=True)
class Member:
    """One member of a population: its ``seed`` (the experiment's ``seed`` for this member: initial
    model, warm-start demonstrations, prompts, sampling keys), its ``hparams`` over the experiment's
    ``algorithm.hparams`` (name -> float) and its policy learning rate ``lr`` (None: ``optim.lr``)."""
    seed: int = 0
    hparams: dict = dataclasses.field(default_factory=dict)
    lr: float | None = None

    def __post_init__(self):
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ConfigError(f"Member.seed={self.seed!r} is invalid: an integer in [0, 2**32)")
        if not isinstance(self.hparams, dict):
            raise ConfigError(f"Member.hparams={self.hparams!r} is invalid: a dict of name -> float")
        for name, value in self.hparams.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"Member.hparams[{name!r}]={value!r} is invalid: a finite number")
        if self.lr is not None and (isinstance(self.lr, bool) or not isinstance(self.lr, int | float)
                                    or not (math.isfinite(self.lr) and self.lr > 0)):
            raise ConfigError(f"Member.lr={self.lr!r} is invalid: a finite number > 0 (None: optim.lr)")

    def describe(self) -> dict:
        """The member as population.json holds it."""
        return {"seed": self.seed, "hparams": dict(self.hparams), "lr": self.lr}


class MemberScaleState(NamedTuple):
    """``member_scale``'s state: the factor on the optimizer's update (lr_i / ``optim.lr``)."""
    scale: jax.Array


def member_scale() -> optax.GradientTransformation:
    """Multiplies the updates by a factor held in the state (1 at ``init``; a population sets each
    member's to lr_i / lr). After AdamW, whose update is linear in its learning rate, this is the
    update of lr_i, traced: one compiled program for every member's learning rate."""
    def init(params):
        return MemberScaleState(jnp.ones((), jnp.float32))

    def update(updates, state, params=None):
        return jax.tree.map(lambda u: u * state.scale.astype(u.dtype), updates), state

    return optax.GradientTransformation(init, update)


def over_members(fn, width: int, members: int, groups: int = 1, carried: int = 0):
    """``fn`` over the leading (member) axis of every argument, in one program. Within a group of
    members: ``jax.vmap`` over all of them when ``width`` >= its members, else a loop over chunks of
    ``width`` members, each chunk vmapped (``width`` 1: one member at a time, each computed as a single
    run computes). With ``groups`` > 1 the N members are split into that many groups of N / ``groups``
    consecutive members, vmapped with ``spmd_axis_name=MEMBER_AXIS``: each group's work (and every
    sharding constraint inside ``fn``) goes to its devices of the ``members`` mesh axis.

    ``carried`` = c > 0: ``fn``'s first c arguments are state it returns updated as its first c
    outputs (``fn(s_1..s_c, *rest) -> (s_1'..s_c', *more)``); the loop then carries the stacked state
    and writes each chunk's new state into it in place (``member_loop``), so that with the state
    donated a step holds one copy of every member's state, not the input's and the output's."""
    if groups > 1:
        per_group = over_members(fn, width, members // groups, carried=carried)

        def grouped(*args):
            split = jax.tree.map(lambda x: x.reshape(groups, members // groups, *x.shape[1:]), args)
            out = jax.vmap(per_group, spmd_axis_name=MEMBER_AXIS)(*split)
            return jax.tree.map(lambda x: x.reshape(members, *x.shape[2:]), out)
        return grouped
    if width >= members:
        return jax.vmap(fn)
    if carried and members % width == 0:
        return partial(member_loop, jax.vmap(fn) if width > 1 else fn, width, members, carried)
    return lambda *args: jax.lax.map(lambda a: fn(*a), args, batch_size=width if width > 1 else None)


def member_loop(fn, width: int, members: int, carried: int, *args):
    """``fn`` over chunks of ``width`` of the ``members`` stacked along every argument's leading axis,
    one chunk after another in a ``lax.fori_loop``: chunk j's slices of the arguments in, its outputs
    written into the stacked outputs at j. The first ``carried`` arguments are the loop's carry,
    updated in place (``fn``'s first ``carried`` outputs are their new values); its other outputs are
    written into buffers the loop allocates. ``fn`` takes a chunk (``width`` > 1, its arguments with a
    leading axis) or one member."""
    take = (lambda x, j: jax.lax.dynamic_slice_in_dim(x, j * width, width)) if width > 1 else (
        lambda x, j: jax.lax.dynamic_index_in_dim(x, j, keepdims=False))
    put = (lambda x, y, j: jax.lax.dynamic_update_slice_in_dim(x, y, j * width, 0)) if width > 1 else (
        lambda x, y, j: jax.lax.dynamic_update_index_in_dim(x, y, j, 0))
    state, rest = args[:carried], args[carried:]
    chunk = lambda tree, j: jax.tree.map(lambda x: take(x, j), tree)       # noqa: E731
    shapes = jax.eval_shape(fn, *chunk(args, 0))[carried:]
    stacked = (lambda x: (members, *x.shape[1:])) if width > 1 else (lambda x: (members, *x.shape))
    outputs = jax.tree.map(lambda x: jnp.zeros(stacked(x), x.dtype), shapes)

    def body(j, carry):
        state, outputs = carry
        new = fn(*chunk(state, j), *chunk(rest, j))
        write = lambda whole, part: jax.tree.map(lambda x, y: put(x, y, j), whole, part)   # noqa: E731
        return write(state, tuple(new[:carried])), write(outputs, tuple(new[carried:]))

    state, outputs = jax.lax.fori_loop(0, members // width, body, (tuple(state), outputs))
    return (*state, *outputs)


def default_vmap_width(members: int) -> int:
    """``vmap_width`` None: every member vmapped on an accelerator; one member at a time on CPU, where a
    step is compute-bound already (the vmapped one measured slower, docs/population.md) and each member
    then computes as its single run does."""
    return members if jax.default_backend() != "cpu" else 1


def _stack(trees):
    """The trees stacked along a new leading (member) axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _member(tree, i: int):
    """Member ``i`` of a stacked tree."""
    return jax.tree.map(lambda x: x[i], tree)


class Population(RunLoop):
    """N members of one experiment (``Member``: seed, hyperparameters, learning rate), trained as one
    program over a stacked member axis: ``warm_start``, ``step`` (one record per member), ``evaluate``,
    ``fit``, ``export``. Member i equals the single run of ``member_experiment(i)`` up to float rounding."""

    state: TrainState       # every member's, stacked

    def __init__(self, exp: Experiment, members: list[Member], algorithm: core.Estimator | None = None,
                 vmap_width: int | None = None, member_groups: int | None = None):
        """``algorithm``: an estimator object instead of ``exp.algorithm``'s (as ``Trainer`` takes one);
        ``member_groups``: how many groups of devices the members are split over (the ``members`` axis
        of ``parallel.mesh.population_mesh``; each group's devices split by ``exp.mesh`` train its
        members, data-parallel or sharded as a single run on them is); None: the greatest common divisor
        of the members and the devices (every member on a device of its own where they divide);
        ``vmap_width``: how many of a group's members one vmapped computation takes (``over_members``):
        w >= a group's members vmaps every phase over them, w < maps over chunks of w vmapped members
        in the same program; None: ``default_vmap_width`` (all on an accelerator, 1 on CPU)."""
        user_error("distributed", lambda: multihost.initialize(exp.distributed))
        if algorithm is not None:
            exp = dataclasses.replace(exp, algorithm=dataclasses.replace(exp.algorithm, estimator=algorithm))
        members = list(members)
        if not members or not all(isinstance(m, Member) for m in members):
            raise ConfigError("a population needs at least one member, each a pgjax.train.population.Member")
        if vmap_width is not None and (isinstance(vmap_width, bool) or not isinstance(vmap_width, int)
                                       or vmap_width < 1):
            raise ConfigError(f"vmap_width={vmap_width!r} is invalid: an integer >= 1 (members per vmapped "
                              "computation), or None (all on an accelerator, 1 on CPU)")
        self.exp, self.members = exp, members
        self.member_groups = self._groups(member_groups)
        per_group = len(members) // self.member_groups
        self.vmap_width = default_vmap_width(per_group) if vmap_width is None else min(vmap_width, per_group)
        self._check_supported()
        self.mesh = user_error("mesh", lambda: population_mesh(exp.mesh, self.member_groups))
        self.member_mesh = Mesh(self.mesh.devices[0], MESH_AXES)    # the devices of one group: a member's mesh
        checked = set()
        for i in range(len(members)):         # every setting as a single run checks it
            setting = json.dumps(self._setting(i), sort_keys=True)
            if setting not in checked:
                checked.add(setting)
                try:
                    member = self.member_experiment(i)
                    validate(member, self.member_mesh)
                    check_memory(member, self.member_mesh, len(members), self.member_groups)
                except ConfigError as error:
                    raise ConfigError(f"member {i} ({self._label(i)}): {error}") from None
        self.estimators = [self.member_experiment(i).algorithm.build() for i in range(len(members))]
        self.estimator = self._shared_estimator()
        self.hparams = self._place(core.stack_hparams([e.hparams for e in self.estimators]))
        self.context = task_context(exp, fit_to=exp.rollout.max_prompt_tokens)
        if self.context.environment is not None:
            raise ConfigError(f"task.name={exp.task.name!r} plays multi-turn episodes (an environment): populations "
                              "sample single responses only, for now")
        self.seeds = list(dict.fromkeys(m.seed for m in members))        # distinct, in order of appearance
        self._seed_index = np.array([self.seeds.index(m.seed) for m in members])
        self.eval_examples = {s: self.context.task.examples(exp.eval_prompts, seed=stream_seed(s, "eval", 0))
                              for s in self.seeds}
        self._check_widths()
        if exp.model.path:                  # every seed starts from the checkpoint
            policies = dict.fromkeys(self.seeds, initial_policy(exp, self.context.tokenizer, self.seeds[0]))
        else:
            policies = {s: initial_policy(exp, self.context.tokenizer, s) for s in self.seeds}
        first = policies[self.seeds[0]]
        self.learner = build_learner(first, self.estimator, exp.rollout.samples_per_prompt, exp.update, exp.optim,
                                     exp.critic_optim, self.mesh,
                                     optimizer=optax.chain(make_optimizer(exp.optim), member_scale()))
        self.graphdef = sampler_graphdef(exp, self.learner.graphdef, first)
        self.reward_fn = training_reward(exp, self.context.task)
        self.state = self._states({s: nnx.state(p) for s, p in policies.items()})
        self.active = np.ones(len(members), bool)       # False: stopped (self.stopped[i] says why)
        self.stopped: list[str | None] = [None] * len(members)
        self.skipped_in_a_row = np.zeros(len(members), int)
        self.step_count = 0
        self.warm_started = not exp.warm_start.steps
        self._compile()

    # ---------------------------------------------------------------- building

    @classmethod
    def grid(cls, exp: Experiment, seeds=(0,), lr=None, algorithm: core.Estimator | None = None,
             vmap_width: int | None = None, member_groups: int | None = None, **axes) -> Population:
        """Every combination of the hyperparameter ``axes`` (name -> list of values) and learning rates
        ``lr`` (a list; None: ``optim.lr``), each with every seed of ``seeds``: member index
        ``setting * len(seeds) + seed index``; the other arguments are ``Population``'s."""
        names = list(axes)
        settings = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(axes[n] for n in names))]
        members = [Member(seed=int(seed), hparams={k: float(v) for k, v in setting.items()}, lr=rate)
                   for setting in settings for rate in (lr if lr is not None else [None]) for seed in seeds]
        return cls(exp, members, algorithm, vmap_width, member_groups)

    def _setting(self, i: int) -> dict:
        m = self.members[i]
        return {"hparams": m.hparams, "lr": m.lr}

    def _label(self, i: int) -> str:
        m = self.members[i]
        parts = [f"seed={m.seed}", *(f"{k}={v:g}" for k, v in m.hparams.items())]
        return ", ".join(parts + ([f"lr={m.lr:g}"] if m.lr is not None else []))

    def member_experiment(self, i: int) -> Experiment:
        """The experiment of member ``i`` alone: the single run it equals (``Trainer(member_experiment(i))``)."""
        exp, m = self.exp, self.members[i]
        algorithm = dataclasses.replace(exp.algorithm, hparams={**exp.algorithm.hparams, **m.hparams})
        optim = exp.optim if m.lr is None else dataclasses.replace(exp.optim, lr=float(m.lr))
        return dataclasses.replace(exp, seed=m.seed, algorithm=algorithm, optim=optim)

    def _groups(self, member_groups: int | None) -> int:
        """The member groups (``__init__``): checked, or the default."""
        members, devices = len(self.members), jax.device_count()
        if member_groups is None:
            return math.gcd(members, devices)
        if isinstance(member_groups, bool) or not isinstance(member_groups, int) or member_groups < 1:
            raise ConfigError(f"member_groups={member_groups!r} is invalid: an integer >= 1, or None")
        if members % member_groups or devices % member_groups:
            raise ConfigError(f"member_groups={member_groups} must divide both the {members} members and the "
                              f"{devices} devices (each group: the same number of members on the same number of "
                              "devices)")
        return member_groups

    def _check_supported(self) -> None:
        """ConfigError for what populations do not support yet (docs/population.md)."""
        exp = self.exp
        held_out = exp.task.option("held_out", "none")
        unsupported = [
            (exp.stage != "rl", f"stage={exp.stage!r}: populations train RL policies only"),
            (jax.process_count() > 1, f"{jax.process_count()} processes: a population runs in one process for now"),
            (exp.rollout.sampler_devices > 0, f"rollout.sampler_devices={exp.rollout.sampler_devices}: a population "
                                              "samples on its members' devices (no separate sampler mesh), for now"),
            (bool(exp.task.tools.names), f"task.tools.names={exp.task.tools.names!r}: multi-turn episodes are "
                                         "not supported in populations yet"),
            (bool(exp.task.reward.model), f"task.reward.model={exp.task.reward.model!r}: learned rewards are not "
                                          "supported in populations yet"),
            (held_out != "none", f"task.options.held_out={held_out!r} is a held-out evaluation split that training "
                                 "never draws"),
            (exp.rollout.staleness > 0, f"rollout.staleness={exp.rollout.staleness}: populations sample on-policy "
                                        "(staleness 0) for now"),
            (exp.update.pack_width > 0, f"update.pack_width={exp.update.pack_width}: packed updates are not "
                                        "supported in populations yet"),
            (exp.model.lora.rank > 0, f"model.lora.rank={exp.model.lora.rank}: LoRA is not supported in "
                                      "populations yet"),
            (exp.logging.wandb, "logging.wandb=true: populations log to metrics.jsonl, TensorBoard and the user's "
                                "sinks (logging.sinks), for now"),
        ]
        for bad, message in unsupported:
            if bad:
                raise ConfigError(message)

    def _shared_estimator(self) -> core.Estimator:
        """The estimator the learner is built with: one whose requirements cover every member's (a KL
        term's reference policy when any member has one); ConfigError when members need different
        inputs otherwise (ReMax's greedy baseline: not supported)."""
        needs = [core.estimator.requirements(e) for e in self.estimators]
        if any("greedy_rewards" in n for n in needs):
            raise ConfigError(f"{self.exp.algorithm.key}: a greedy baseline (ReMax) is not supported in populations "
                              "yet")
        if len({n - {"ref_logp"} for n in needs}) > 1:
            raise ConfigError("the members' hyperparameters give estimators that need different inputs "
                              f"({sorted(map(sorted, set(needs)))}): one population, one estimator")
        return self.estimators[max(range(len(needs)), key=lambda i: len(needs[i]))]

    def _check_widths(self) -> None:
        """Each seed's evaluation prompts and warm-start demonstrations fit the rollout's widths, as a
        single run checks (``trainer.check_widths``)."""
        for examples in self.eval_examples.values():
            check_widths(self.exp, self.context, examples,
                         lambda examples: warm_start_batch(self.exp, self.context, examples))

    def _states(self, params_by_seed: dict) -> TrainState:
        """Every member's fresh ``TrainState`` from its seed's parameters (``Learner.init_state``: new
        optimizer states, the reference policy and critic from the policy, the key ``PRNGKey(seed)``),
        stacked, each member's learning-rate scale set. Each member's state is written into the stacked
        one as it is made (a donated update in place), so building holds the stacked states and one
        member's, not every member's twice."""
        sharding = NamedSharding(self.mesh, PartitionSpec(MEMBER_AXIS))
        write = jax.jit(lambda whole, part, i: jax.tree.map(lambda w, x: w.at[i].set(x), whole, part),
                        donate_argnums=0)
        state = None
        for i, m in enumerate(self.members):
            one = self.learner.init_state(self.learner.policy(params_by_seed[m.seed]), jax.random.PRNGKey(m.seed))
            if state is None:
                state = jax.jit(lambda tree: jax.tree.map(lambda x: jnp.zeros((self.size, *x.shape), x.dtype), tree),
                                out_shardings=sharding)(one)
            state = write(state, one, i)
        if state is None:
            raise ConfigError("a population needs at least one member")
        lr = self.exp.optim.lr
        scales = np.asarray([1.0 if m.lr is None else m.lr / lr for m in self.members], np.float32)
        inner, _ = state.opt_state
        return state.replace(opt_state=(inner, MemberScaleState(self._place(scales))))

    def _place(self, tree):
        """``tree``'s arrays (each with a leading member axis) split along it over the ``members`` mesh
        axis: each group's members on its devices (replicated over them). Every input of a phase is
        placed so, so that each phase compiles once."""
        return jax.device_put(tree, NamedSharding(self.mesh, PartitionSpec(MEMBER_AXIS)))

    def _compile(self) -> None:
        """The vmapped programs: sampling, ``prepare``, the optimizer step (state donated)."""
        learner, exp = self.learner, self.exp
        sampling = exp.rollout.sampling(self.context.eos_ids, pad_id(self.context.tokenizer),
                                        n=exp.rollout.samples_per_prompt)
        greedy = exp.rollout.sampling(self.context.eos_ids, pad_id(self.context.tokenizer), greedy=True)
        over = partial(over_members, width=self.vmap_width, members=self.size, groups=self.member_groups)
        self._sample = jax.jit(over(partial(generate_state, self.graphdef, config=sampling)))
        self._greedy = jax.jit(over(partial(generate_state, self.graphdef, config=greedy)))
        self._prepare = jax.jit(over(learner._prepare))

        def member_step(state, active, rollout, rows, hp):
            new, metrics = learner._step(state, rollout, rows, None, hp, None)
            return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, state), metrics

        self._step = jax.jit(over(member_step, carried=1), donate_argnums=0)
        self.sampling, self.greedy_sampling = sampling, greedy

    # ---------------------------------------------------------------- the loop

    @property
    def size(self) -> int:
        return len(self.members)

    def policy(self, i: int) -> CausalLM:
        """Member ``i``'s current policy."""
        return self.learner.policy(_member(self.state.params, i))

    def warm_start(self) -> None:
        """Each seed's supervised warm start (``warm_start.steps`` SFT steps, one program over the distinct
        seeds, each on its own demonstrations, ``stream_seed(seed, "warm_start", step)``), then every
        member's fresh state from its seed's warm-started policy. Nothing when done already or after a
        step."""
        ws = self.exp.warm_start
        if self.warm_started or self.step_count:
            return
        optimizer = make_optimizer(ws.optim)
        params = _stack([_member(self.state.params, int(np.argmax(self._seed_index == s)))
                         for s in range(len(self.seeds))])
        self.state = None  # type: ignore[assignment]  # rebuilt below; only the supervised parameters are held
        opt_state = jax.vmap(optimizer.init)(params)
        graphdef = self.learner.graphdef
        step = jax.jit(over_members(lambda p, o, t, a, m: sft_step(graphdef, optimizer, p, o, None, t, a, m),
                                    self.vmap_width, len(self.seeds), carried=2), donate_argnums=(0, 1))
        for index in range(ws.steps):
            batches = [warm_start_batch(self.exp, self.context, self.context.task.examples(
                ws.batch_size, seed=stream_seed(s, "warm_start", index))) for s in self.seeds]
            params, opt_state, loss = step(params, opt_state, *(np.stack(x) for x in zip(*batches, strict=True)))
            if index % 50 == 0 or index == ws.steps - 1:
                losses = ", ".join(f"{float(x):.3f}" for x in np.asarray(loss))
                print(f"warm start {index + 1}/{ws.steps}: loss {losses} (seeds {self.seeds})", file=sys.stderr)
        self.state = self._states({s: _member(params, k) for k, s in enumerate(self.seeds)})
        self.warm_started = True

    def _prompts(self, examples_by_seed: dict):
        """Each member's prompts, encoded and stacked: tokens, mask [N, P, W]."""
        exp, context = self.exp, self.context
        encoded = {s: encode_prompts(context.tokenizer, [e["prompt"] for e in examples], exp.rollout.max_prompt_tokens,
                                     context.prompt_format) for s, examples in examples_by_seed.items()}
        return self._place((np.stack([encoded[m.seed][0] for m in self.members]).astype(np.int32),
                            np.stack([encoded[m.seed][1] for m in self.members]).astype(np.int32)))

    def _collect(self, samples: Samples, examples_by_seed: dict):
        """Each active member's rows decoded and scored (``rollout.collect``, its padding kept): the
        member's rollouts and row statistics; a member whose reward function fails is stopped."""
        exp = self.exp
        config = dataclasses.replace(exp.rollout, trim_padding=False)
        host = jax.device_get(samples)
        rollouts, stats = [], []
        for i, member in enumerate(self.members):
            rows = _member(host, i)
            rollout = stat = None
            if self.active[i]:
                try:
                    rollout, stat = collect(None, self.context.tokenizer, examples_by_seed[member.seed],
                                            self.reward_fn, self.context.task.reward_fn, None, config,
                                            eos_ids=self.context.eos_ids, mesh=None,
                                            prompt_format=self.context.prompt_format, samples=rows)
                    stat = {k: stat[k] for k in STAT_KEYS}
                except RewardError as error:
                    self._stop(i, f"step {self.step_count + 1}: {error}")
            if rollout is None:             # a stopped member: its rows count for nothing (its update is off)
                zeros = np.zeros(rows.response.shape, np.float32)
                # host arrays (as collect's rollouts hold) until every rollout is made of jnp arrays below
                batch = core.Batch(mask=zeros, rewards=np.zeros(zeros.shape[0], np.float32),  # type: ignore[arg-type]
                                   logp=None, behaviour_logp=rows.logprobs, group_size=exp.rollout.samples_per_prompt)
                rollout = Rollout(tokens=rows.tokens, attention_mask=rows.attention_mask, batch=batch)
            rollouts.append(rollout)
            stats.append(stat)
        if exp.rollout.trim_padding:        # every member cut to the widest member's trimmed width
            widths = [trim_padding(r, rows_lengths) for r, rows_lengths in zip(rollouts, host.lengths, strict=True)]
            response = max(r.mask.shape[1] for r in widths)
            prompt = max(r.tokens.shape[1] - r.mask.shape[1] for r in widths)
            rollouts = [keep_columns(r, prompt, response) for r in rollouts]
        rollouts = [jax.tree.map(jnp.asarray, r) for r in rollouts]
        return self._place(_stack(rollouts)), stats

    def _stop(self, i: int, reason: str) -> None:
        """Member ``i`` stops: its state is kept as it is, its updates are off, it gets no more records."""
        self.active[i] = False
        self.stopped[i] = reason
        print(f"member {i} ({self._label(i)}) stopped: {reason}", file=sys.stderr)

    def step(self) -> list[dict | None]:
        """One RL step of every member; returns each member's record (the keys of ``Trainer.step``'s;
        None for a stopped member, ``stopped[i]`` says why). The timings are the population's step's,
        shared by every record, and ``tokens_per_second`` counts every member's tokens. A member whose
        every update was skipped ``update.max_skipped_steps`` steps in a row, or whose reward function
        failed, stops here (where its single run's ``fit`` stops); the others go on."""
        exp = self.exp
        if not self.active.any():
            raise RunStopped("every member of the population has stopped: " + "; ".join(
                f"member {i}: {reason}" for i, reason in enumerate(self.stopped)))
        t0 = time.perf_counter()
        examples = {s: self.context.task.examples(exp.prompts_per_step, seed=stream_seed(s, "train", self.step_count))
                    for s in self.seeds}
        tokens, mask = self._prompts(examples)
        keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(self.state.key)     # pipeline.sampling_key(state, 1)
        samples = self._sample(self.state.params, tokens, mask, keys)
        rollout, stats = self._collect(samples, examples)
        t1 = time.perf_counter()
        rollout = jax.block_until_ready(self._prepare(self.state, rollout, self.hparams))
        t2 = time.perf_counter()
        self.state, metrics = self._update(rollout)
        metrics = jax.device_get(metrics)
        t3 = time.perf_counter()
        self.step_count += 1
        times = {"time_sample": t1 - t0, "time_prepare": t2 - t1, "time_update": t3 - t2, "time_step": t3 - t0}
        generated = sum(float(s["length"].sum()) for s in stats if s is not None)
        padding = 1.0 - np.asarray(jnp.mean(rollout.attention_mask, axis=(1, 2)))
        records: list[dict | None] = []
        for i, stat in enumerate(stats):
            if stat is None:
                records.append(None)
                continue
            record = {"step": self.step_count, "policy_lag": 0,
                      **step_record(stat, {k: v[i] for k, v in metrics.items()}, times), "padding": float(padding[i])}
            record["tokens_per_second"] = generated / max(times["time_sample"], 1e-9)
            records.append(record)
            all_skipped = record["skipped_updates"] == exp.update.epochs * exp.update.minibatches
            if stat["nonfinite"].all():
                all_skipped = True
                print(f"step {self.step_count}, member {i}: every reward was non-finite; "
                      f"rollout.nonfinite_rewards='mask' left all {stat['nonfinite'].size} rows out of the update",
                      file=sys.stderr)
            self.skipped_in_a_row[i] = self.skipped_in_a_row[i] + 1 if all_skipped else 0
            if self.skipped_in_a_row[i] >= exp.update.max_skipped_steps:
                self._stop(i, f"steps {self.step_count - self.skipped_in_a_row[i] + 1}..{self.step_count}: every "
                              "update had a non-finite loss, gradient or result (or no finite reward) and was "
                              f"skipped (update.max_skipped_steps={exp.update.max_skipped_steps}); its parameters "
                              f"are those of step {self.step_count - self.skipped_in_a_row[i]}")
        return records

    def _update(self, rollout: Rollout):
        """Every member's ``epochs`` x ``minibatches`` optimizer steps, as ``Learner.update`` takes them
        (each member shuffles its prompt groups with its own key); stopped members keep their state."""
        cfg, k = self.exp.update, self.learner.group_size
        prompts = rollout.mask.shape[1] // k
        cfg.check(prompts, k)
        keys = jax.vmap(lambda key: jax.random.split(key, 3))(self.state.key)
        key, shuffle_key = keys[:, 0], keys[:, 1]
        active = self._place(jnp.asarray(self.active))
        state, metrics = self.state, None
        for epoch in range(cfg.epochs):
            order = jax.vmap(lambda key, epoch=epoch: jax.random.permutation(jax.random.fold_in(key, epoch), prompts)
                             )(shuffle_key)
            for groups in jnp.split(order, cfg.minibatches, axis=1):
                rows = self._place((groups[..., None] * k + jnp.arange(k)).reshape(groups.shape[0], -1))
                state, step_metrics = self._step(state, active, rollout, rows, self.hparams)
                metrics = step_metrics if metrics is None else core.combine_metrics(metrics, step_metrics)
        new = state.replace(step=state.step + 1, key=key)
        keep = lambda a, b: jnp.where(active.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)     # noqa: E731
        return state.replace(step=keep(new.step, state.step), key=keep(new.key, state.key)), metrics

    def evaluate(self) -> list[float | None]:
        """Each member's greedy accuracy on its seed's held-out prompts (``eval_prompts``, drawn as a
        single run draws them): one vmapped greedy sampling, each member's rows scored by the task's
        verifier (None for a stopped member; a member whose verifier fails here stops)."""
        exp, context = self.exp, self.context
        tokens, mask = self._prompts(self.eval_examples)
        keys = self._place(jnp.zeros((self.size, 2), jnp.uint32))         # greedy: the key draws nothing
        host = jax.device_get(self._greedy(self.state.params, tokens, mask, keys))
        accuracies = []
        for i, member in enumerate(self.members):
            accuracy = None
            if self.active[i]:
                try:
                    scored = sample_and_score(None, context.tokenizer, self.eval_examples[member.seed],
                                              exp.rollout.max_prompt_tokens, None, self.greedy_sampling,
                                              {"correct": context.task.reward_fn}, single_device_mesh(),
                                              exp.rollout.nonfinite_rewards, context.prompt_format,
                                              samples=_member(host, i))
                    accuracy = float(np.mean(scored.scores["correct"] == 1.0))
                except RewardError as error:
                    self._stop(i, f"evaluation at step {self.step_count}: {error}")
            accuracies.append(accuracy)
        return accuracies

    def fit(self, run_dir=None, progress: bool = True, resume: bool = False) -> pathlib.Path:
        """Train every member to ``steps``: the warm start and the step-0 evaluation, then each step with
        evaluation every ``eval_every`` steps and at the end, and a checkpoint of the whole population
        after the step-0 evaluation, every ``checkpoint_every`` steps and at the end. Writes ``run_dir``
        (default: the experiment's ``run_dir``, else ``runs/<name>-population``): ``population.json`` (the
        experiment, each member's seed, hyperparameters and learning rate, the members stopped and why),
        ``checkpoints/<step>/`` (``checkpoints.Checkpoints``: the stacked state, each member's stop) and
        per member ``member-<i>/`` with ``metrics.jsonl``, TensorBoard events (``logging.tensorboard``),
        the user's sinks (``logging.sinks``) and ``curves.png``.

        A new population refuses a directory that holds one (ConfigError); ``resume=True`` continues the
        one there from its newest intact checkpoint, exactly (the records after it are dropped and
        redone), refusing other members or an experiment changed in more than its operational keys
        (``run_dir.is_operational``: ``steps``, ``eval_every``, ...). The directory is locked while it
        trains (``run_dir.RunLock``). A stop signal (SIGTERM, SIGINT, SIGHUP) ends it after the current
        step with that step's checkpoint written: ``interrupts.RunInterrupted``."""
        exp = self.exp
        directory = pathlib.Path(run_dir or exp.run_dir or f"runs/{exp.name}-population")
        directory.mkdir(parents=True, exist_ok=True)
        lock = RunLock(directory)
        lock.acquire()
        try:
            since: int | None = None
            if resume:
                since = self._resume(directory)
            else:
                self._claim(directory)
            checkpoints = Checkpoints(directory / "checkpoints", guard=partial(self._check_in_place, lock))
            try:
                with interrupts.graceful_stop(lambda: self._left_behind(checkpoints)):
                    self._train(directory, checkpoints, since, progress)
            finally:
                checkpoints.close()
        finally:
            lock.release()
        return directory

    def _claim(self, directory: pathlib.Path) -> None:
        """A new population's directory: ConfigError when it holds one already (or a run's records)."""
        held = [name for name in (POPULATION_FILE, "checkpoints", "metrics.jsonl") if (directory / name).exists()]
        if held:
            raise ConfigError(f"{directory} holds a population or a run already ({', '.join(held)}): choose another "
                              "run_dir, or resume=True to continue the population there")

    def _resume(self, directory: pathlib.Path) -> int:
        """Restore the population of ``directory`` from its newest intact checkpoint (the step it is at,
        returned); ConfigError when there is none, or when its members or experiment differ (but in
        operational keys)."""
        saved_path = directory / POPULATION_FILE
        if not saved_path.is_file():
            raise ConfigError(f"resume: {directory} holds no population ({POPULATION_FILE} is missing)")
        try:
            saved = json.loads(saved_path.read_text())
            members = [{k: m[k] for k in ("seed", "hparams", "lr")} for m in saved["members"]]
            changes = experiment_changes(saved["experiment"], self.exp)
        except (ValueError, KeyError, TypeError) as error:
            raise ConfigError(f"resume: {saved_path} cannot be read ({one_line(error)})") from None
        if members != [m.describe() for m in self.members]:
            raise ConfigError(f"resume: {directory} holds another population's members ({len(members)}: "
                              f"{members[:2]}...); build the population with the members of its {POPULATION_FILE}")
        changed = {k: v for k, v in changes.items() if not is_operational(k)}
        if changed:
            listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in list(changed.items())[:4])
            raise ConfigError(f"resume: the experiment differs from the population's in {directory} ({listed}); "
                              "only operational keys (steps, eval_every, checkpoint_every, logging, ...) may change")
        checkpoints = Checkpoints(directory / "checkpoints")
        try:
            checkpoints.remove_leftovers()
            state, record = checkpoints.restore(self.state)
        finally:
            checkpoints.close()
        self.state = state
        self.step_count, self.warm_started = record["step"], True
        self.active = np.asarray(record["active"], bool)
        self.stopped = list(record["stopped"])
        self.skipped_in_a_row = np.asarray(record["skipped_in_a_row"], int)
        print(f"resumed the population of {self.size} in {directory} at step {self.step_count}", file=sys.stderr)
        return self.step_count

    @staticmethod
    def _check_in_place(lock: RunLock, writing: str) -> None:
        """RunStopped before ``writing`` when the run directory was moved or deleted."""
        moved = lock.moved()
        if moved:
            raise RunStopped(f"the population's directory {lock.directory} {moved}: {writing} was not written")

    def _left_behind(self, checkpoints: Checkpoints) -> str:
        """What a stop at once leaves to resume from."""
        step = checkpoints.newest
        return (f"the checkpoint of step {step} is left (resume=True continues from it)" if step is not None
                else "no checkpoint is left")

    def _save(self, checkpoints: Checkpoints) -> None:
        """A checkpoint of the whole population at the current step: the stacked state and each member's
        stop; never of a non-finite state (RunStopped)."""
        self._check_finite(f"the checkpoint of step {self.step_count}")
        checkpoints.save(self.step_count, self.state, {
            "step": self.step_count, "active": self.active.tolist(), "stopped": list(self.stopped),
            "skipped_in_a_row": self.skipped_in_a_row.tolist()})

    def _open_sinks(self, folder: pathlib.Path, since: int | None) -> list:
        """Member ``folder``'s sinks: metrics.jsonl, TensorBoard, the user's (``logging.sinks``)."""
        logging = self.exp.logging
        return ([MetricsFile(folder / "metrics.jsonl", since)]
                + ([open_sink("tensorboard", folder, since)] if logging.tensorboard else [])
                + [open_sink(name, folder, since) for name in logging.sink_names])

    def _train(self, directory: pathlib.Path, checkpoints: Checkpoints, since: int | None, progress: bool) -> None:
        """``fit``'s loop: records before their checkpoint, a stop signal heeded after a step."""
        exp = self.exp
        folders = [directory / f"member-{i}" for i in range(self.size)]
        for folder in folders:
            folder.mkdir(exist_ok=True)
        sinks = []
        try:
            for folder in folders:
                sinks.append(self._open_sinks(folder, since))
            self._write_population(directory)

            def emit(i, record):
                for sink in sinks[i]:
                    sink.log(record)

            if since is None:
                self.warm_start()
                for i, accuracy in enumerate(self.evaluate()):
                    if accuracy is not None:
                        emit(i, {"step": 0, "eval_accuracy": accuracy})
                self._save(checkpoints)
            started, last = time.perf_counter(), time.perf_counter()
            while self.step_count < exp.steps and self.active.any():
                step_records = self.step()
                if self.step_count % exp.eval_every == 0 or self.step_count == exp.steps:
                    for record, accuracy in zip(step_records, self.evaluate(), strict=True):
                        if record is not None and accuracy is not None:
                            record["eval_accuracy"] = accuracy
                for i, record in enumerate(step_records):
                    if record is not None:
                        emit(i, record)
                checkpointed = self.step_count % exp.checkpoint_every == 0 or self.step_count == exp.steps
                if checkpointed:
                    self._save(checkpoints)
                self._stop_population_if_asked(checkpoints, checkpointed)
                now = time.perf_counter()
                if progress and (now - last >= exp.logging.progress_every or self.step_count == exp.steps):
                    last = now
                    live = [r for r in step_records if r is not None]
                    print(f"step {self.step_count}/{exp.steps} ({now - started:.0f} s): {len(live)} of {self.size} "
                          f"members, reward {np.mean([r['reward'] for r in live]):.3f} (mean), accuracy "
                          f"{min(r['accuracy'] for r in live):.2f}..{max(r['accuracy'] for r in live):.2f}",
                          file=sys.stderr, flush=True)
            if checkpoints.newest != self.step_count:
                self._save(checkpoints)     # every member stopped before the end: the last state
        finally:
            for i, member_sinks in enumerate(sinks):
                for sink in member_sinks:
                    sink.close()
                records = read_records(folders[i])
                if records:
                    plot(records, folders[i] / "curves.png", f"{exp.name} member {i}: {self._label(i)}")
            self._write_population(directory)

    def _stop_population_if_asked(self, checkpoints: Checkpoints, checkpointed: bool) -> None:
        """RunInterrupted when a stop signal came, after this step's checkpoint (``interrupts``)."""
        signum = interrupts.requested()
        if signum is None:
            return
        if not checkpointed:
            self._save(checkpoints)
        raise RunInterrupted(signum, f"after step {self.step_count} of the population, its checkpoint written; "
                                     "fit(resume=True) continues from it")

    def _write_population(self, directory: pathlib.Path) -> None:
        """population.json (atomically): the experiment, the members (seed, hyperparameters as given and
        as resolved, learning rate), the step reached and the members stopped."""
        members = []
        for i, (member, estimator) in enumerate(zip(self.members, self.estimators, strict=True)):
            resolved = {k: float(v) for k, v in core.hparam_items(estimator.hparams).items()}
            members.append({"member": i, "directory": f"member-{i}", **member.describe(),
                            "lr_resolved": member.lr if member.lr is not None else self.exp.optim.lr,
                            "hparams_resolved": resolved, "stopped": self.stopped[i]})
        record = {"experiment": experiment_record(self.exp), "steps_done": self.step_count, "members": members}
        write_atomically(directory / POPULATION_FILE, json.dumps(record, indent=2) + "\n")

    def export(self, i: int, directory) -> pathlib.Path:
        """Member ``i``'s policy as a Hugging Face checkpoint in ``directory`` (``hf.save``) with the
        task's tokenizer; never a non-finite one (RunStopped)."""
        if not 0 <= i < self.size:
            raise IndexError(f"member {i} of a population of {self.size}")
        params = _member(self.state.params, i)
        if not bool(jitted_all_finite(params)):
            raise RunStopped(f"member {i}'s parameters at step {self.step_count} are not finite: not exported")
        directory = pathlib.Path(directory)
        hf.save(self.learner.policy(params), directory)
        if hasattr(self.context.tokenizer, "save_pretrained"):
            self.context.tokenizer.save_pretrained(directory)
        return directory
