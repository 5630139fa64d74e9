"""The rollout pipeline: the batches a run samples, scores and holds until their update (``RolloutPipeline``).

Synchronous (``rollout.staleness`` = 0): step t's batch is sampled with the parameters step t starts
from, then updated on. Asynchronous (s >= 1): step t updates on a batch sampled s steps earlier and,
while its update runs (JAX dispatches it and returns at once), samples the batch of step t + s with
a copy of the parameters step t starts from (the update donates the state's own buffers, so the
sampler reads a weight copy). The first s batches come from the initial policy. ``in_flight`` holds
the s batches sampled and not yet used; a checkpoint saves them (``saved`` / ``restore``), so a
resumed run continues exactly.

The sampler runs on the learner's mesh, or with ``rollout.sampler_devices`` on a mesh of its own
(the weights are copied there before each sampling and the batch back afterwards), with
``rollout.compute_dtype`` on the same parameters computing in another dtype, and with
``rollout.weight_dtype`` on the same parameters rounded to that dtype once per sampling
(``CausalLM.prepare_decoding``). The prompts of step t
and its sampling key are functions of the seed, t and the state's key, so a resumed run, a run
driven step by step and the command line sample the same batches.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pgjax.config import Experiment, stream_seed
from pgjax.errors import RunStopped
from pgjax.models.transformer import CausalLM
from pgjax.parallel import mesh as mesh_lib
from pgjax.parallel import multihost
from pgjax.rollout.batch import Rollout, placeholder_rollout
from pgjax.rollout.collect import collect, dispatch_samples, keep_columns, pad_columns, pad_id
from pgjax.rollout.episodes import (
    ENVIRONMENT_ERROR_REPEATS,
    EPISODE_STATS,
    Episodes,
    collect_episodes,
    episode_rollout,
    error_id,
)
from pgjax.sample import Samples
from pgjax.tasks import RewardError
from pgjax.train.completions import logged_at, sample_rows
from pgjax.train.context import TaskContext
from pgjax.train.learner import Learner, TrainState
from pgjax.train.records import LEARNED_STATS, STAT_KEYS


@dataclasses.dataclass(frozen=True)
class Sampled:
    """A scored batch waiting for its update: the ``Rollout``, its rows' statistics (``STAT_KEYS``,
    every process's rows), ``sampled_at``, the step count of the parameters that sampled it, and
    ``logged``, the rows of it the step logs (``completions.sample_rows``; None on other steps)."""
    rollout: Rollout
    stats: dict
    sampled_at: int
    logged: list[dict] | None = None

    def saved(self, prompt_width: int, budget: int) -> tuple[Rollout, dict]:
        """(the rollout at full width, for a checkpoint's fixed layout; the JSON record to restore it)."""
        response = self.rollout.mask.shape[1]
        stats = {k: [str(np.asarray(v).dtype), np.asarray(v).tolist()] for k, v in self.stats.items()}
        record = {"prompt_columns": self.rollout.tokens.shape[1] - response, "response_columns": response,
                  "sampled_at": self.sampled_at, "stats": stats, "logged": self.logged}
        return pad_columns(self.rollout, prompt_width, budget), record

    @classmethod
    def restored(cls, rollout: Rollout, record: dict, trimmed: bool) -> Sampled:
        """The batch ``saved`` gave ``rollout`` (full width) and ``record`` for, exactly as it was."""
        if trimmed:
            rollout = keep_columns(rollout, record["prompt_columns"], record["response_columns"])
        stats = {k: np.asarray(values, dtype) for k, (dtype, values) in record["stats"].items()}
        return cls(rollout, stats, record["sampled_at"], record.get("logged"))


class EnvironmentErrors:
    """Environment errors step after step: the run stops when one error (by its message's id, the same
    on every process) ended episodes in ``ENVIRONMENT_ERROR_REPEATS`` steps in a row."""

    def __init__(self) -> None:
        self.streaks: dict[int, int] = {}          # error id -> steps in a row it occurred in
        self.texts: dict[int, str] = {}            # error id -> its message, where this process saw it

    def check(self, index: int, stats: dict, texts: list[str | None]) -> str:
        """Count step ``index``'s errors (``stats["environment_error_ids"]``, every process's rows;
        ``texts``: this process's rows' messages); RunStopped at a repeat. Returns the step's first
        message this process saw ("" if none), which the step record holds."""
        self.texts.update((error_id(text), text) for text in texts if text)
        ids = {int(i) for i in np.unique(stats["environment_error_ids"]) if i}
        self.streaks = {i: self.streaks.get(i, 0) + 1 for i in ids}
        for i, streak in self.streaks.items():
            if streak >= ENVIRONMENT_ERROR_REPEATS:
                raise RunStopped(f"step {index}: the same environment error ended episodes in {streak} steps in a "
                                 f"row: {self.texts.get(i, 'an error another process saw')}")
        return next((text for text in texts if text), "")


def sampling_key(state: TrainState, ahead: int):
    """The sampling key of the batch ``ahead`` steps after the state's step (1: the next step's),
    from the state's key."""
    key = jax.random.fold_in(state.key, 1)
    return key if ahead == 1 else jax.random.fold_in(key, ahead)



def sampler_graphdef(exp, learner_graphdef, policy: CausalLM):
    """The sampler's model graph: the learner's (``learner_graphdef``), or that of the learner's model
    computing in ``rollout.compute_dtype`` and multiplying its weights in ``rollout.weight_dtype``
    where they are set and differ (the same parameters by name and shape)."""
    r, config = exp.rollout, policy.config
    changes = {"compute_dtype": r.compute_dtype or config.compute_dtype,
               "matmul_dtype": r.weight_dtype or config.matmul_dtype}
    if all(getattr(config, name) == value for name, value in changes.items()):
        return learner_graphdef
    return nnx.graphdef(policy.reconfigured(**changes))

class RolloutPipeline:
    """Samples and scores the batches of ``exp`` (its task ``context``, training ``reward_fn``) for the
    ``learner`` on ``mesh``, the sampler on ``sampler_mesh`` (``mesh`` itself or devices of its own)."""

    def __init__(self, exp: Experiment, context: TaskContext, learner: Learner, policy: CausalLM, reward_fn,
                 mesh: jax.sharding.Mesh, sampler_mesh: jax.sharding.Mesh, params_like, mix=None):
        """``policy``: the learner's model (its config); ``params_like``: the state's parameters (their
        shapes place the sampler's weight copy); ``mix``: a learned reward mixed in (``rollout.collect``)."""
        self.exp, self.context, self.learner, self.reward_fn, self.mix = exp, context, learner, reward_fn, mix
        self.mesh, self.sampler_mesh = mesh, sampler_mesh
        self.greedy_baseline = learner.uses_greedy
        self.graphdef = sampler_graphdef(exp, learner.graphdef, policy)
        self.weight_copy = self._weight_copy(params_like)
        self.in_flight: list[Sampled] = []      # rollout.staleness batches sampled ahead (oldest first)
        # the batch dispatched during this step: score's (index, dispatched, weights, key, sampled_at)
        self._ahead: tuple[int, tuple[list[dict], Samples | Episodes], Any, Any, int] | None = None
        # the response columns of a full-width rollout: a reply's, or an episode's after its prompt
        self.response_budget = exp.rollout.episode_budget() if context.environment else exp.rollout.max_new_tokens
        self.environment_errors = EnvironmentErrors()

    def _weight_copy(self, params_like):
        """``copy(params)``: a copy of the parameters for the sampler, in new buffers (the update
        donates the state's) on the sampler's devices: a jitted copy on the one mesh, a transfer to a
        separate sampler mesh (replicated there, placed by the ``RULES``)."""
        if self.sampler_mesh is self.mesh:
            return jax.jit(lambda params: jax.tree.map(jnp.copy, params),
                           out_shardings=self.learner.state_sharding.params)
        target = mesh_lib.shardings(jax.eval_shape(lambda: params_like), self.sampler_mesh)
        return lambda params: jax.device_put(params, target)

    def sampler_params(self, params, copy: bool):
        """The parameters the sampler reads: ``params`` themselves, or a copy (``weight_copy``) when the
        update is to run meanwhile (``copy``) or the sampler has devices of its own."""
        return self.weight_copy(params) if copy or self.sampler_mesh is not self.mesh else params

    def _on_sampler(self, key):
        """``key`` placed on the sampler's mesh."""
        return key if self.sampler_mesh is self.mesh else jax.device_put(key, mesh_lib.replicated(self.sampler_mesh))

    @functools.partial(jax.profiler.annotate_function, name="pgjax/sample_dispatch")
    def dispatch(self, index: int, params, key) -> tuple[list[dict], Samples | Episodes]:
        """Start sampling the batch of step ``index`` (its prompts are a function of the seed and
        ``index``) with the sampler's model on ``params`` and ``key``: (this process's prompts, the
        dispatched samples); ``score`` finishes it."""
        exp, context = self.exp, self.context
        examples = context.task.examples(exp.prompts_per_step, seed=stream_seed(exp.seed, "train", index - 1))
        share = multihost.process_share(examples, self.sampler_mesh)
        policy = nnx.merge(self.graphdef, params)
        if context.environment is not None:      # episodes: the host drives every turn, so they run here
            try:
                return share, collect_episodes(policy, context.tokenizer, share, context.environment,
                                               self._on_sampler(key), exp.rollout, context.eos_ids, self.sampler_mesh,
                                               context.prompt_format)
            except RewardError as error:
                raise RunStopped(f"step {index}: {error}") from None
        sampling = exp.rollout.sampling(context.eos_ids, pad_id(context.tokenizer), n=exp.rollout.samples_per_prompt)
        samples = dispatch_samples(policy, context.tokenizer, share, exp.rollout.max_prompt_tokens,
                                   self._on_sampler(key), sampling, self.sampler_mesh, context.prompt_format)
        return share, samples

    @functools.partial(jax.profiler.annotate_function, name="pgjax/score")
    def score(self, index: int, dispatched: tuple[list[dict], Samples | Episodes], params, key,
              sampled_at: int) -> Sampled:
        """The dispatched batch of step ``index`` read back, decoded and scored (``rollout.collect``;
        ReMax's greedy responses sampled here with ``params`` and ``key``), placed on the learner's
        devices; ``sampled_at``: the step count of ``params``. On a step that logs completions, the
        rows it logs are drawn here, from this process's texts (``completions.sample_rows``)."""
        exp, context, mesh = self.exp, self.context, self.sampler_mesh
        share, samples = dispatched
        try:
            if isinstance(samples, Episodes):
                rollout, stats = episode_rollout(samples, share, context.tokenizer, exp.rollout, mesh)
            else:
                rollout, stats = collect(nnx.merge(self.graphdef, params), context.tokenizer, share, self.reward_fn,
                                         context.task.reward_fn, self._on_sampler(key), exp.rollout,
                                         greedy_baseline=self.greedy_baseline, eos_ids=context.eos_ids, mesh=mesh,
                                         prompt_format=context.prompt_format, samples=samples, mix=self.mix)
        except RewardError as error:
            raise RunStopped(f"step {index}: {error}") from None
        rows = exp.prompts_per_step * exp.rollout.samples_per_prompt
        logged = (sample_rows(exp, stats, index, multihost.process_rows(rows, mesh), context.task.format_pattern)
                  if logged_at(exp.logging, index) else None)
        error_texts = stats.get("environment_error_texts")
        stats = multihost.gather_rows({k: stats[k] for k in (*STAT_KEYS, *LEARNED_STATS, *EPISODE_STATS) if k in stats},
                                      rows, mesh)
        if error_texts is not None:
            stats["environment_error"] = np.asarray(self.environment_errors.check(index, stats, error_texts))
        if mesh is not self.mesh:
            rollout = jax.device_put(rollout, mesh_lib.batch_sharding(self.mesh))
        return Sampled(rollout, stats, sampled_at, logged)

    def _sample(self, index: int, params, key, sampled_at: int) -> Sampled:
        """The batch of step ``index``, sampled and scored (``dispatch``, then ``score``)."""
        return self.score(index, self.dispatch(index, params, key), params, key, sampled_at)

    def fill(self, state: TrainState, step: int) -> None:
        """Sample with ``state``'s parameters (those of step ``step``) until ``rollout.staleness``
        batches are in flight (the first steps of a run, and before a checkpoint)."""
        while len(self.in_flight) < self.exp.rollout.staleness:
            ahead = len(self.in_flight) + 1
            self.in_flight.append(self._sample(step + ahead, self.sampler_params(state.params, copy=False),
                                               sampling_key(state, ahead), step))

    def take(self, state: TrainState, step: int) -> Sampled:
        """The batch step ``step`` + 1 updates on. On-policy: sampled now with ``state``'s parameters.
        With staleness s: the oldest batch in flight; the batch of step ``step`` + 1 + s is dispatched
        with a copy of ``state``'s parameters (``score_ahead`` finishes it while the update runs)."""
        s = self.exp.rollout.staleness
        if not s:
            return self._sample(step + 1, self.sampler_params(state.params, copy=False), sampling_key(state, 1), step)
        self.fill(state, step)
        weights, key = self.sampler_params(state.params, copy=True), sampling_key(state, s + 1)
        self._ahead = (step + 1 + s, self.dispatch(step + 1 + s, weights, key), weights, key, step)
        return self.in_flight.pop(0)

    def score_ahead(self) -> None:
        """Read back, decode and score the batch ``take`` dispatched (nothing on-policy)."""
        if self._ahead is not None:
            self.in_flight.append(self.score(*self._ahead))
            self._ahead = None

    def saved(self) -> tuple[tuple[Rollout, ...], list[dict]]:
        """The batches in flight as a checkpoint holds them: full-width rollouts and their records."""
        r = self.exp.rollout
        saved = [batch.saved(r.max_prompt_tokens, self.response_budget) for batch in self.in_flight]
        return tuple(rollout for rollout, _ in saved), [record for _, record in saved]

    def saved_like(self) -> tuple[Rollout, ...]:
        """What ``saved`` gives, as placeholders of zeros placed like the sampler's batches (a restore's
        target layout)."""
        exp, r = self.exp, self.exp.rollout
        rollout = placeholder_rollout(exp.prompts_per_step * r.samples_per_prompt, r.max_prompt_tokens,
                                      self.response_budget, r.samples_per_prompt, self.greedy_baseline,
                                      token_rewards=self.context.environment is not None)
        return (jax.device_put(rollout, mesh_lib.batch_sharding(self.mesh)),) * r.staleness

    def restore(self, rollouts, records: list[dict]) -> None:
        """The batches in flight from a checkpoint's ``saved`` rollouts and records."""
        self.in_flight = [Sampled.restored(rollout, record, self.exp.rollout.trim_padding)
                          for rollout, record in zip(rollouts, records, strict=True)]
