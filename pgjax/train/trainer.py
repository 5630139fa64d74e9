"""The RL loop as an object research code drives: ``Trainer``.

A ``Trainer`` is built once from an ``Experiment`` (checked first: every configuration mistake
raises ``ConfigError`` before anything is built or written). It owns the task, tokenizer, policy
and optimizer state (``TrainState``: parameters, Adam moments, the reference policy and critic
when the algorithm needs them, the PRNG key), the jitted ``Learner`` and the step count, and
exposes the loop as methods:

    trainer = Trainer(experiment.load("experiments/arithmetic_dr_grpo.py"))
    trainer.warm_start()              # the experiment's supervised warm start (if any)
    record = trainer.step()           # sample, score, update: one RL step's metrics
    accuracy = trainer.evaluate()     # greedy accuracy on the held-out prompts
    trainer.save(checkpoints); trainer.restore(checkpoints)
    trainer.fit(run, callbacks)       # all remaining steps, with evaluation, logging, checkpoints

``train(exp)`` is what ``python -m pgjax.run`` does: find the run directory, build the trainer,
restore or start, ``fit``, export. A step is a deterministic function of the seed and the step
number (prompts, sampling keys, shuffles), so a resumed run, a run driven step by step from
Python and the command line all produce the same metrics.

One step: sample K responses to each of the step's prompts, decode and score them
(``rollout.collect``); old / reference log-probs, critic values, the algorithm's advantages and
value targets on the whole rollout (``Learner.prepare``, one jitted call); then ``epochs`` x
``minibatches`` optimizer steps (``Learner.update``).

Asynchronous rollouts (``rollout.staleness`` = s >= 1): step t updates on a batch sampled s
steps earlier and, while its update runs (JAX dispatches it and returns at once), samples the
batch of step t + s with a copy of the parameters step t starts from (the update donates the
state's own buffers; ``Trainer.sampler_weights`` is the explicit weight copy). The first s
batches come from the initial policy. ``in_flight`` holds the s batches sampled and not yet used;
a checkpoint saves them, so a resumed run continues exactly.
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pgjax import core
from pgjax.eval import evaluate
from pgjax.models import hf
from pgjax.models.transformer import CausalLM
from pgjax.parallel import multihost
from pgjax.parallel import mesh as mesh_lib
from pgjax.parallel.mesh import learner_and_sampler_meshes, shard
from pgjax.rewards import RewardError, combine, format_reward, import_object, make_task
from pgjax.train.experiment import ConfigError, Experiment, stream_seed, validate
from pgjax.train.learner import Learner, Rollout, all_finite
from pgjax.train.optim import make_optimizer
from pgjax.train.progress import Progress
from pgjax.sample import Samples
from pgjax.train.rollout import (collect, dispatch_samples, encode_prompts, keep_columns, pad_columns, pad_id,
                                 prompt_format_for, stop_tokens)
from pgjax.train.run_dir import Checkpoints, RunDirectory
from pgjax.train.sft import demonstrations, sft_step

STAT_KEYS = ("reward", "correct", "length", "truncated", "kept", "nonfinite")
TIMING_KEYS = ("time_sample", "time_prepare", "time_update", "time_step", "tokens_per_second")
MISMATCH_KEYS = ("mismatch_abs", "mismatch_abs_max", "mismatch_kl", "mismatch_outside")


class RunStopped(RuntimeError):
    """Training cannot go on: a reward function's NaN or infinity, repeated non-finite updates, or a
    non-finite state about to be saved. Nothing non-finite was written; the last checkpoint is intact."""


class Callback:
    """Hooks into ``Trainer.step`` / ``Trainer.fit``; subclass and override the ones you need."""

    def before_update(self, trainer: Trainer, rollout: Rollout, examples: list[dict], stats: dict) -> dict:
        """After the rollout is scored (``Learner.prepare``) and before the update: ``examples`` are the
        step's prompts (every process's), ``stats`` every row's reward / correct / length / truncated /
        kept. The floats returned join the step's record (their time counts in ``time_prepare``)."""
        return {}

    def after_step(self, trainer: Trainer, record: dict) -> None:
        """After each RL step of ``fit``, with its record (evaluation included when one was due)."""


_all_finite = jax.jit(all_finite)


@dataclasses.dataclass(frozen=True)
class Sampled:
    """A scored batch waiting for its update: the ``Rollout``, its rows' statistics (``STAT_KEYS``,
    every process's rows) and ``sampled_at``, the step count of the parameters that sampled it."""
    rollout: Rollout
    stats: dict
    sampled_at: int

    def saved(self, prompt_width: int, budget: int) -> tuple[Rollout, dict]:
        """(the rollout at full width, for a checkpoint's fixed layout; the JSON record to restore it)."""
        response = self.rollout.mask.shape[1]
        stats = {k: [str(np.asarray(v).dtype), np.asarray(v).tolist()] for k, v in self.stats.items()}
        record = {"prompt_columns": self.rollout.tokens.shape[1] - response, "response_columns": response,
                  "sampled_at": self.sampled_at, "stats": stats}
        return pad_columns(self.rollout, prompt_width, budget), record

    @classmethod
    def restored(cls, rollout: Rollout, record: dict, trimmed: bool) -> Sampled:
        """The batch ``saved`` gave ``rollout`` (full width) and ``record`` for, exactly as it was."""
        if trimmed:
            rollout = keep_columns(rollout, record["prompt_columns"], record["response_columns"])
        stats = {k: np.asarray(values, dtype) for k, (dtype, values) in record["stats"].items()}
        return cls(rollout, stats, record["sampled_at"])


def _user_error(what: str, build):
    """``build()``, with a user's mistake in ``what`` (a bad option, a missing or malformed file) as ConfigError."""
    try:
        return build()
    except (ValueError, TypeError, KeyError, OSError) as error:
        raise ConfigError(f"{what}: {error}") from None


class Trainer:
    """The task, tokenizer, policy, optimizer state, learner and step count of one experiment."""

    def __init__(self, exp: Experiment):
        _user_error("distributed", lambda: multihost.initialize(exp.distributed))   # before any other JAX call
        self.exp = exp
        mesh_options = "mesh, rollout.sampler_devices" if exp.rollout.sampler_devices else "mesh"
        self.mesh, self.sampler_mesh = _user_error(mesh_options, lambda: learner_and_sampler_meshes(
            exp.mesh, exp.rollout.sampler_devices))
        validate(exp, self.mesh)
        _user_error("rollout.sampler_devices", lambda: mesh_lib.check_batch(
            exp.prompts_per_step, self.sampler_mesh, "prompts_per_step (over the sampler's devices)"))
        self.algorithm = exp.algorithm_preset()
        self.hparams = self.algorithm.hparams
        self.task = _user_error("task", lambda: make_task(exp.task.name, **exp.task.options()))
        _user_error("task", lambda: self.task.examples(1, seed=0))     # a malformed dataset fails here, first
        self.tokenizer = self._tokenizer()
        t = exp.task
        self.prompt_format = _user_error("task", lambda: prompt_format_for(self.tokenizer, t.chat_template,
                                                                            t.system_prompt))
        self.eos_ids, self.end_id = _user_error("model.path", lambda: stop_tokens(self.tokenizer, self.prompt_format,
                                                                                  [exp.model.path]))
        self._check_dataset()
        self.eval_examples = self.task.examples(exp.eval_prompts, seed=stream_seed(exp.seed, "eval", 0))
        self._check_widths()
        policy = self._policy()
        spec = self.algorithm.spec
        use_reference = bool(np.asarray(self.hparams.kl_coef) > 0) and spec.kl_placement != "none"
        critic_optimizer = make_optimizer(exp.critic_optim) if spec.baseline == "value" else None
        self.learner = Learner(policy, self.algorithm, exp.rollout.samples_per_prompt, exp.update,
                               make_optimizer(exp.optim), critic_optimizer, use_reference, self.mesh)
        self.reward_fn = self._reward_function()
        self.sampler_graphdef = self._sampler_graphdef(policy)
        self.in_flight: list[Sampled] = []      # rollout.staleness batches sampled ahead (oldest first)
        self.state = self.learner.init_state(policy, jax.random.PRNGKey(exp.seed))
        self.sampler_weights = self._weight_copy()
        self.step_count = 0
        self.skipped_in_a_row = 0    # consecutive steps whose every update was non-finite (and skipped)
        self.warm_started = not exp.warm_start.steps      # nothing to do, or done (or restored)
        self.started = False        # the step-0 evaluation is logged (or the run restored): fit goes on from here

    def _tokenizer(self):
        """The task's own tokenizer, else the checkpoint's (``model.path``)."""
        tokenizer = self.task.tokenizer()
        if tokenizer is not None:
            return tokenizer
        if not self.exp.model.path:
            raise ConfigError(f"task.name={self.exp.task.name!r} has no tokenizer of its own: set model.path to a "
                              "checkpoint directory with one")
        return _user_error("model.path", lambda: hf.load_tokenizer(self.exp.model.path))

    def _check_dataset(self) -> None:
        """A dataset task's prompts all fit ``rollout.max_prompt_tokens`` (``fit_prompts``: ConfigError
        naming the file, line and field, or with ``task.skip_invalid`` the record left out); a summary
        of what was left out is printed."""
        if hasattr(self.task, "fit_prompts"):
            render = lambda prompts: self.prompt_format.render(self.tokenizer, prompts)     # noqa: E731
            _user_error("task", lambda: self.task.fit_prompts(self.tokenizer, self.exp.rollout.max_prompt_tokens,
                                                              render))
        summary = self.task.summary() if hasattr(self.task, "summary") else None
        if summary and multihost.is_primary():
            print(f"dataset {summary}", file=sys.stderr)

    def _check_widths(self) -> None:
        """The evaluation prompts fit ``rollout.max_prompt_tokens`` and, with a warm start, their
        demonstrations fit ``rollout.max_new_tokens`` (ConfigError otherwise)."""
        exp = self.exp
        examples = self.eval_examples
        try:
            encode_prompts(self.tokenizer, [e["prompt"] for e in examples], exp.rollout.max_prompt_tokens,
                           self.prompt_format)
        except ValueError as error:
            raise ConfigError(f"rollout.max_prompt_tokens={exp.rollout.max_prompt_tokens}: {error}") from None
        if exp.warm_start.steps:
            try:
                demonstrations(self.tokenizer, examples, exp.rollout.max_prompt_tokens, exp.rollout.max_new_tokens,
                               self.prompt_format, self.end_id)
            except ValueError as error:
                raise ConfigError(f"rollout.max_new_tokens={exp.rollout.max_new_tokens}: {error}") from None

    def _policy(self) -> CausalLM:
        """The checkpoint at ``model.path``, else a new model of the section's architecture."""
        m = self.exp.model
        if m.path:
            return _user_error("model.path", lambda: hf.load(m.path, **m.runtime_options()))
        return CausalLM(m.config(len(self.tokenizer)), nnx.Rngs(self.exp.seed))

    def _reward_function(self):
        """The training reward: the task's verifier (or ``task.reward``), plus the format reward."""
        t = self.exp.task
        reward = import_object(t.reward, "task.reward") if t.reward else self.task.reward_fn
        if t.format_weight:
            return combine((reward, 1.0), (format_reward(self.task.format_pattern), t.format_weight))
        return reward

    @property
    def policy(self) -> CausalLM:
        """The current policy (a view of ``state.params``)."""
        return self.learner.policy(self.state.params)

    def _sampler_graphdef(self, policy: CausalLM):
        """The sampler's model graph: the policy's, or with ``rollout.compute_dtype`` set to another
        dtype the same parameters computing in that dtype."""
        dtype = self.exp.rollout.compute_dtype
        if not dtype or dtype == policy.config.compute_dtype:
            return self.learner.graphdef
        config = dataclasses.replace(policy.config, compute_dtype=dtype)
        return nnx.graphdef(nnx.eval_shape(lambda: CausalLM(config, nnx.Rngs(0))))

    def _weight_copy(self):
        """``sampler_weights(params)``: a copy of the parameters for the sampler, in new buffers (the
        update donates the state's) on the sampler's devices: a jitted copy on the one mesh, a
        transfer to a separate sampler mesh (replicated there, placed by the ``RULES``)."""
        params_sharding = self.learner.state_sharding.params
        if self.sampler_mesh is self.mesh:
            return jax.jit(lambda params: jax.tree.map(jnp.copy, params), out_shardings=params_sharding)
        target = mesh_lib.shardings(jax.eval_shape(lambda: self.state.params), self.sampler_mesh)
        return lambda params: jax.device_put(params, target)

    def _sampler_params(self, copy: bool):
        """The parameters the sampler reads now: the state's own, or a copy (``sampler_weights``) when
        the update is to run meanwhile (``copy``) or the sampler has devices of its own."""
        return self.sampler_weights(self.state.params) if copy or self.sampler_mesh is not self.mesh \
            else self.state.params

    @functools.partial(jax.profiler.annotate_function, name="pgjax/sample_dispatch")
    def _dispatch(self, index: int, params, key) -> tuple[int, list[dict], Samples]:
        """Start sampling the batch of step ``index`` (its prompts are a function of the seed and
        ``index``) with the sampler's model on ``params`` (on the sampler's mesh) and ``key``: (index,
        this process's prompts, the dispatched samples); ``_score`` finishes it."""
        exp, mesh = self.exp, self.sampler_mesh
        if mesh is not self.mesh:
            key = jax.device_put(key, mesh_lib.replicated(mesh))
        examples = self.task.examples(exp.prompts_per_step, seed=stream_seed(exp.seed, "train", index - 1))
        share = multihost.process_share(examples, mesh)
        sampling = exp.rollout.sampling(self.eos_ids, pad_id(self.tokenizer))
        samples = dispatch_samples(nnx.merge(self.sampler_graphdef, params), self.tokenizer, share,
                                   exp.rollout.max_prompt_tokens, key, sampling, mesh, self.prompt_format)
        return index, share, samples

    @functools.partial(jax.profiler.annotate_function, name="pgjax/score")
    def _score(self, dispatched: tuple[int, list[dict], Samples], params, key) -> Sampled:
        """The dispatched batch read back, decoded and scored (``rollout.collect``; ReMax's greedy
        responses sampled here with ``params`` and ``key``), placed on the learner's devices."""
        exp, mesh = self.exp, self.sampler_mesh
        index, share, samples = dispatched
        if mesh is not self.mesh:
            key = jax.device_put(key, mesh_lib.replicated(mesh))
        try:
            rollout, stats = collect(nnx.merge(self.sampler_graphdef, params), self.tokenizer, share, self.reward_fn,
                                     self.task.reward_fn, key, exp.rollout,
                                     greedy_baseline=self.algorithm.spec.baseline == "greedy", eos_ids=self.eos_ids,
                                     mesh=mesh, prompt_format=self.prompt_format, samples=samples)
        except RewardError as error:
            raise RunStopped(f"step {index}: {error}") from None
        stats = multihost.gather_rows({k: stats[k] for k in STAT_KEYS},
                                      exp.prompts_per_step * exp.rollout.samples_per_prompt, mesh)
        if mesh is not self.mesh:
            rollout = jax.device_put(rollout, mesh_lib.batch_sharding(self.mesh))
        return Sampled(rollout, stats, self.step_count)

    def _sample(self, index: int, params, key) -> Sampled:
        """The batch of step ``index``, sampled and scored (``_dispatch``, then ``_score``)."""
        return self._score(self._dispatch(index, params, key), params, key)

    def _sampling_key(self, ahead: int):
        """The sampling key of the batch ``ahead`` steps after the current one (1: the next step's),
        from the current state's key."""
        key = jax.random.fold_in(self.state.key, 1)
        return key if ahead == 1 else jax.random.fold_in(key, ahead)

    def _fill_pipeline(self) -> None:
        """Sample with the current parameters until ``rollout.staleness`` batches are in flight (the
        first steps of a run)."""
        while len(self.in_flight) < self.exp.rollout.staleness:
            ahead = len(self.in_flight) + 1
            self.in_flight.append(self._sample(self.step_count + ahead, self._sampler_params(copy=False),
                                               self._sampling_key(ahead)))

    def warm_start(self) -> None:
        """``warm_start.steps`` supervised steps on fresh demonstrations (seeded per step, sharded like
        the RL update; each process encodes its rows of each batch); the optimizer state, reference
        policy and critic then start from the warm-started policy. Does nothing when done already, after
        a step or a restore."""
        ws, exp = self.exp.warm_start, self.exp
        if self.warm_started or self.step_count:
            return
        optimizer = make_optimizer(ws.optim)
        params, frozen = self.learner.trainable(shard(self.state.params, self.mesh))   # sft_step donates params:
        self.state = None                               # the state is rebuilt below; only the supervised one is held
        opt_state = optimizer.init(params)
        for step in range(ws.steps):
            examples = self.task.examples(ws.batch_size, seed=stream_seed(exp.seed, "warm_start", step))
            batch = demonstrations(self.tokenizer, multihost.process_share(examples, self.mesh),
                                   exp.rollout.max_prompt_tokens, exp.rollout.max_new_tokens, self.prompt_format,
                                   self.end_id)
            params, opt_state, loss = sft_step(self.learner.graphdef, optimizer, params, opt_state, frozen,
                                               *multihost.to_global(batch, self.mesh), mesh=self.mesh)
            if (step % 50 == 0 or step == ws.steps - 1) and multihost.is_primary():
                print(f"warm start {step + 1}/{ws.steps}: loss {float(loss):.3f}", file=sys.stderr)
        policy = self.learner.policy(self.learner.join(params, frozen))
        self.state = self.learner.init_state(policy, jax.random.PRNGKey(exp.seed))
        self.warm_started = True

    def step(self, callbacks=()) -> dict:
        """One RL step (sample, score, update) on the step's prompts; returns its record: rollout
        statistics, the finalized loss metrics, timings (see ``step_record``) and ``policy_lag``, the
        updates between the parameters that sampled the batch and those it updates.

        With ``rollout.staleness`` = s the batch of step t + s is dispatched first (with a copy of
        this step's parameters), then this step's update; the host decodes and scores that batch
        while the device runs the update (a separate sampler mesh also samples meanwhile). In a
        ``jax.profiler`` trace the phases are named ``pgjax/sample_dispatch``, ``pgjax/prepare``,
        ``pgjax/update_dispatch``, ``pgjax/score`` (in it ``pgjax/read_back``, waiting for the sampler, and
        ``pgjax/decode_and_score``) and ``pgjax/update_wait``."""
        exp, staleness = self.exp, self.exp.rollout.staleness
        t0 = time.perf_counter()
        if staleness:
            self._fill_pipeline()
            batch = self.in_flight.pop(0)
            weights, key = self._sampler_params(copy=True), self._sampling_key(staleness + 1)
            ahead = self._dispatch(self.step_count + 1 + staleness, weights, key)
        else:
            batch = self._sample(self.step_count + 1, self._sampler_params(copy=False), self._sampling_key(1))
        t1 = time.perf_counter()
        examples = self.task.examples(exp.prompts_per_step, seed=stream_seed(exp.seed, "train", self.step_count))
        with jax.profiler.TraceAnnotation("pgjax/prepare"):
            rollout = jax.block_until_ready(self.learner.prepare(self.state, batch.rollout, self.hparams))
        observed = {}
        for callback in callbacks:
            for name, value in (callback.before_update(self, rollout, examples, batch.stats) or {}).items():
                if name in RECORD_KEYS:
                    raise ValueError(f"{type(callback).__name__}.before_update returned {name!r}, a key of the "
                                     "step's own record: name it differently")
                observed[name] = float(value)
        t2 = time.perf_counter()
        with jax.profiler.TraceAnnotation("pgjax/update_dispatch"):
            self.state, metrics = self.learner.update(self.state, rollout, self.hparams)    # not finished
        scoring = 0.0
        if staleness:       # read back, decode and score the next batch while the update runs
            self.in_flight.append(self._score(ahead, weights, key))
            scoring = time.perf_counter() - t2
        with jax.profiler.TraceAnnotation("pgjax/update_wait"):
            metrics = jax.device_get(metrics)
        t3 = time.perf_counter()
        lag = self.step_count - batch.sampled_at
        self.step_count += 1
        self.started = True
        all_skipped = metrics["skipped_updates"] == exp.update.epochs * exp.update.minibatches
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if all_skipped else 0
        times = {"time_sample": t1 - t0 + scoring, "time_prepare": t2 - t1, "time_update": t3 - t2 - scoring,
                 "time_step": t3 - t0}
        return {"step": self.step_count, "policy_lag": lag, **step_record(batch.stats, metrics, times), **observed}

    def evaluate(self) -> float:
        """Greedy accuracy on ``eval_prompts`` evaluation examples, the same at every call (drawn from
        the task with a seed stream of their own; generated tasks rarely repeat a training prompt, a
        dataset file's are drawn from the same file); ``pgjax.eval.evaluate``'s greedy pass, each
        process scoring its rows."""
        exp = self.exp
        results = evaluate(self.policy, self.tokenizer, self.task, self.eval_examples, samples=0,
                           decoding=exp.rollout, max_prompt_tokens=exp.rollout.max_prompt_tokens,
                           eos_ids=self.eos_ids, key=jax.random.PRNGKey(0), mesh=self.mesh,
                           nonfinite=exp.rollout.nonfinite_rewards, prompt_format=self.prompt_format)
        return results["metrics"]["greedy_accuracy"]["value"]

    def _check_finite(self, what: str) -> None:
        """RunStopped, before ``what`` is written, when the state holds a NaN or infinity."""
        if not bool(_all_finite(self.state)):
            raise RunStopped(f"the training state at step {self.step_count} is not finite: {what} was not written "
                             "(the previous checkpoints are kept)")

    def save(self, checkpoints: Checkpoints) -> None:
        """A checkpoint of the state at the current step (every process writes its shards); never of a
        non-finite state (RunStopped)."""
        self._check_finite(f"the checkpoint of step {self.step_count}")
        state = self.learner.checkpointed(self.state)
        record = {"step": self.step_count, "data_position": self.step_count * self.exp.prompts_per_step}
        if self.exp.rollout.staleness:      # the batches in flight too (sampled first at step 0)
            self._fill_pipeline()
            r = self.exp.rollout
            saved = [batch.saved(r.max_prompt_tokens, r.max_new_tokens) for batch in self.in_flight]
            state = {"train": state, "in_flight": tuple(rollout for rollout, _ in saved)}
            record["in_flight"] = [meta for _, meta in saved]
        checkpoints.save(self.step_count, state, record)

    def restore(self, checkpoints: Checkpoints, step: int | None = None, fallback: bool = True) -> None:
        """The state and step count of a checkpoint (default: the newest intact one, see
        ``Checkpoints.restore``), on this trainer's mesh, and the batches it had in flight;
        ConfigError when none fits or is intact."""
        like = self.learner.checkpointed(self.state)
        r = self.exp.rollout
        if r.staleness:
            like = {"train": like, "in_flight": (self._full_width_rollout(),) * r.staleness}
        saved, record = checkpoints.restore(like, step, fallback)
        if r.staleness:
            self.in_flight = [Sampled.restored(rollout, meta, r.trim_padding)
                              for rollout, meta in zip(saved["in_flight"], record["in_flight"], strict=True)]
            saved = saved["train"]
        self.state = self.learner.from_checkpoint(self.state, saved)
        self.step_count, self.started, self.warm_started = record["step"], True, True

    def _full_width_rollout(self) -> Rollout:
        """A rollout of zeros with the layout of a batch in flight as checkpoints hold it (full width),
        placed like the sampler's."""
        exp, r = self.exp, self.exp.rollout
        rows, width = exp.prompts_per_step * r.samples_per_prompt, r.max_prompt_tokens + r.max_new_tokens
        responses = np.zeros((rows, r.max_new_tokens), np.float32)
        batch = core.Batch(mask=responses, rewards=np.zeros(rows, np.float32), logp=None, behaviour_logp=responses,
                           greedy_rewards=np.zeros(rows, np.float32) if self.algorithm.spec.baseline == "greedy"
                           else None, group_size=r.samples_per_prompt)
        tokens = np.zeros((rows, width), np.int32)
        return jax.device_put(Rollout(tokens=tokens, attention_mask=tokens, batch=batch),
                              mesh_lib.batch_sharding(self.mesh))

    def fit(self, run: RunDirectory | None = None, callbacks=(), progress: bool = True) -> None:
        """Train to ``steps``: a fresh trainer first runs the warm start and logs the step-0 evaluation;
        then each step, with evaluation every ``eval_every`` steps and at the end. With a ``run``
        directory every record is logged and a checkpoint written every ``checkpoint_every`` steps
        and at the end; ``callbacks`` see every step."""
        exp, callbacks = self.exp, tuple(callbacks)
        if run is not None and run.checkpoints is None:
            raise ValueError("fit(run): call run.create() and run.start(...) first (as train() does)")
        if not self.started:
            self.warm_start()
            self._emit({"step": 0, "eval_accuracy": self.evaluate()}, run)
            self.started = True
        bar = Progress(exp.steps, self.step_count, exp.logging.progress_every,
                       enabled=progress and multihost.is_primary())
        while self.step_count < exp.steps:
            record = self.step(callbacks)
            if self.step_count % exp.eval_every == 0 or self.step_count == exp.steps:
                record["eval_accuracy"] = self.evaluate()
            for callback in callbacks:
                callback.after_step(self, record)
            bar.update(record)
            self._emit(record, run, checkpoint=self.step_count % exp.checkpoint_every == 0
                       or self.step_count == exp.steps)
            if self.skipped_in_a_row >= exp.update.max_skipped_steps:
                raise RunStopped(f"steps {self.step_count - self.skipped_in_a_row + 1}..{self.step_count}: every "
                                 "update had a non-finite loss, gradient or result and was skipped "
                                 f"(update.max_skipped_steps={exp.update.max_skipped_steps}); the parameters are "
                                 f"those of step {self.step_count - self.skipped_in_a_row}. Lower optim.lr, check "
                                 "the rewards' scale, or raise update.max_skipped_steps")
        bar.close()

    def _emit(self, record: dict, run: RunDirectory | None, checkpoint: bool = True) -> None:
        if run is not None:
            run.log(record)
            if checkpoint:
                self.save(run.checkpoints)

    def export(self, run: RunDirectory) -> None:
        """The trained policy into ``run``'s ``final/`` (every process takes part in the gather); never a
        non-finite one (RunStopped)."""
        self._check_finite("final/")
        params = multihost.gather(self.state.params)
        run.export(self.learner.policy(params))


RECORD_KEYS = ("step", "reward", "accuracy", "length", "length_correct", "length_incorrect", "truncated", "kept",
               "nonfinite_rewards", "skipped_updates", "policy_loss", "clip_fraction", "grad_norm", "entropy",
               "kl_ref", "kl_old", "value_loss", "policy_lag", *MISMATCH_KEYS, "is_weight", "is_limited",
               "eval_accuracy", *TIMING_KEYS)


def step_record(stats: dict, metrics: dict, times: dict) -> dict:
    """The record of one step: rollout statistics, finalized loss metrics (per applied optimizer step
    where they are sums; None when every update was skipped), timing."""
    correct = stats["correct"] == 1.0
    lengths = stats["length"].astype(float)
    fm = {k: float(v) for k, v in core.finalize_metrics(metrics).items()}
    steps = fm.pop("optimizer_steps")       # the applied ones: skipped updates add nothing to the sums
    out = {
        "reward": float(stats["reward"].mean()), "accuracy": float(correct.mean()),
        "length": float(lengths.mean()),
        "length_correct": float(lengths[correct].mean()) if correct.any() else None,
        "length_incorrect": float(lengths[~correct].mean()) if (~correct).any() else None,
        "truncated": float(stats["truncated"].mean()), "kept": float(stats["kept"].mean()),
        "nonfinite_rewards": int(stats["nonfinite"].sum()), "skipped_updates": int(fm.pop("skipped_updates")),
    }
    losses = {"policy_loss": fm.pop("policy_loss") / max(steps, 1), "clip_fraction": fm["clip_fraction"],
              "grad_norm": fm["grad_norm_max"], "entropy": fm.get("entropy_mean"),
              "kl_ref": fm.get("ref_kl_mean"), "kl_old": fm["approx_kl_mean"]}
    if "value_loss" in fm:
        losses["value_loss"] = fm["value_loss"] / max(steps, 1)
    losses.update({key: fm.get(key if key.endswith("_max") else f"{key}_mean") for key in MISMATCH_KEYS})
    if "is_weight_mean" in fm:
        losses.update(is_weight=fm["is_weight_mean"], is_limited=fm["is_limited_mean"])
    out.update({k: v if steps else None for k, v in losses.items()})
    generated = float(lengths.sum())
    out.update(times, tokens_per_second=generated / max(times["time_sample"], 1e-9))
    return out


def train(exp: Experiment, resume: bool = False, progress: bool = True, callbacks=(), accept_changes: bool = False,
          fallback: bool = True) -> pathlib.Path:
    """A whole run of ``exp`` in its run directory (``run_dir``); returns the directory. Every
    configuration mistake raises ConfigError before anything is written (as does a live run in the
    same directory); ``resume`` continues from the newest intact checkpoint (``fallback=False``: the
    newest, or a ConfigError if it is damaged), dropping metric lines written after it, and refuses an
    experiment that changes the maths or the data unless ``accept_changes`` (see ``RunDirectory``).
    A reward function's NaN, repeated non-finite updates or a non-finite state raise RunStopped with
    the last checkpoint intact."""
    run = RunDirectory(exp, resume, accept_changes, fallback)
    resume = run.resume
    trainer = Trainer(exp)
    run.create()
    try:
        if resume:
            trainer.restore(run.checkpoints, fallback=fallback)
            print(f"resumed {run.directory} at step {trainer.step_count}", file=sys.stderr)
        run.start(trainer.tokenizer, trainer.step_count)
        trainer.fit(run, callbacks, progress)
        trainer.export(run)
    except BaseException:
        run.close(failed=True)
        raise
    run.close()
    return run.directory
