"""The RL loop as an object research code drives: ``Trainer``.

A ``Trainer`` is built once from an ``Experiment`` (checked first: every configuration mistake
raises ``ConfigError`` before anything is built or written). It owns the task context
(``context.task_context``), the policy and optimizer state (``TrainState``: parameters, Adam
moments, the reference policy and critic when the algorithm needs them, the PRNG key), the jitted
``Learner``, the rollout pipeline (``pipeline.RolloutPipeline``) and the step count, and exposes the
loop as methods: ``warm_start``, ``step``, ``evaluate``, ``save`` / ``restore``, ``fit``, ``export``
(docs/training.md shows them in use).

``train(exp)`` is what ``python -m pgjax.run`` does: find the run directory, build the trainer,
restore or start, ``fit``, export. A step is a deterministic function of the seed and the step
number (prompts, sampling keys, shuffles), so a resumed run, a run driven step by step from
Python and the command line all produce the same metrics.

One step: the pipeline hands over a sampled, decoded and scored batch (``RolloutPipeline.take``);
old / reference log-probs, critic values, the algorithm's advantages and value targets on the whole
rollout (``Learner.prepare``, one jitted call); then ``epochs`` x ``minibatches`` optimizer steps
(``Learner.update``), during which an asynchronous pipeline scores the batch it sampled ahead.
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from pgjax import core
from pgjax.checks import ConfigError
from pgjax.config import Experiment, stream_seed, validate
from pgjax.errors import RunStopped
from pgjax.evaluation.held_out import evaluate
from pgjax.models import hf
from pgjax.models.transformer import CausalLM
from pgjax.parallel import mesh as mesh_lib
from pgjax.parallel import multihost
from pgjax.parallel.mesh import learner_and_sampler_meshes, shard
from pgjax.rollout.batch import Rollout
from pgjax.rollout.collect import encode_prompts
from pgjax.rollout.episodes import episode_limits
from pgjax.tasks import RewardError, combine, format_reward, reward_function, with_timeout
from pgjax.train import interrupts
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.completions import logged_at, with_advantages
from pgjax.train.context import task_context, user_error
from pgjax.train.interrupts import RunInterrupted
from pgjax.train.learned_reward import LearnedReward, Mix
from pgjax.train.learner import TrainState, build_learner
from pgjax.train.loop import RunLoop
from pgjax.train.memory import check_memory
from pgjax.train.optim import make_optimizer
from pgjax.train.pipeline import RolloutPipeline
from pgjax.train.progress import Progress
from pgjax.train.records import RECORD_KEYS, step_record
from pgjax.train.reward_trainer import RewardModelTrainer
from pgjax.train.run_dir import RunDirectory
from pgjax.train.sft import demonstrations, episode_demonstrations, sft_step


class Callback:
    """Hooks into ``Trainer.step`` / ``Trainer.fit``; subclass and override the ones you need."""

    def before_update(self, trainer: Trainer, rollout: Rollout, examples: list[dict], stats: dict) -> dict:
        """Called by ``Trainer.step(callbacks)``, after the rollout is scored (``Learner.prepare``) and
        before the update: ``examples`` are the step's prompts (every process's), ``stats`` every row's
        reward / correct / length / truncated / kept. The floats returned join the step's record (their
        time counts in ``time_prepare``)."""
        return {}

    def after_step(self, trainer: Trainer, record: dict) -> None:
        """Called by ``Trainer.fit`` (not ``step``) after each RL step, with its record (evaluation
        included when one was due)."""



def check_widths(exp: Experiment, context, examples: list[dict], demonstrations) -> None:
    """The prompts of ``examples`` (the held-out ones) fit ``rollout.max_prompt_tokens`` and, with a
    warm start, ``demonstrations(examples)`` (the warm start's batch of them) fits
    ``rollout.max_new_tokens`` (ConfigError otherwise)."""
    try:
        encode_prompts(context.tokenizer, [e["prompt"] for e in examples], exp.rollout.max_prompt_tokens,
                       context.prompt_format)
    except ValueError as error:
        raise ConfigError(f"rollout.max_prompt_tokens={exp.rollout.max_prompt_tokens}: {error}") from None
    if exp.warm_start.steps:
        if "answer" not in examples[0]:
            raise ConfigError(f"task.name={exp.task.name!r}: its examples have no 'answer', which the warm start "
                              f"(warm_start.steps={exp.warm_start.steps}) trains on as demonstrations; set "
                              "warm_start.steps=0")
        r = exp.rollout
        setting = (f"warm_start.steps={exp.warm_start.steps} (rollout.max_new_tokens={r.max_new_tokens}, max_turns="
                   f"{r.max_turns}, max_episode_tokens={r.max_episode_tokens})" if context.environment
                   else f"rollout.max_new_tokens={r.max_new_tokens}")
        try:
            demonstrations(examples)
        except ValueError as error:
            raise ConfigError(f"{setting}: {error}") from None


def warm_start_batch(exp: Experiment, context, examples: list[dict]):
    """The warm start's batch of ``examples``: tokens, attention_mask, mask (``sft.demonstrations``, or
    with an environment its worked episodes, ``sft.episode_demonstrations``)."""
    r = exp.rollout
    if context.environment is None:
        return demonstrations(context.tokenizer, examples, r.max_prompt_tokens, r.max_new_tokens,
                              context.prompt_format, context.end_id)
    return episode_demonstrations(context.tokenizer, context.environment, examples, r.max_prompt_tokens,
                                  episode_limits(r), r.max_new_tokens, context.prompt_format, context.end_id)


def initial_policy(exp: Experiment, tokenizer, seed: int) -> CausalLM:
    """A run's policy at its start: the checkpoint at ``model.path``, else a new model of the section's
    architecture for ``tokenizer``'s vocabulary, initialised from ``seed``."""
    m = exp.model
    if m.path:
        return user_error("model.path", lambda: hf.load(m.path, **m.runtime_options()))
    return CausalLM(m.config(len(tokenizer)), nnx.Rngs(seed))


def training_reward(exp: Experiment, task):
    """The training reward's programmatic part: ``task``'s verifier (or ``task.reward.function``) weighted by
    ``task.reward.verifier_weight``, plus the format reward."""
    r = exp.task.reward
    reward = with_timeout(reward_function(r.function), r.timeout) if r.function else task.reward_fn
    if r.format_weight or r.verifier_weight != 1.0:
        terms = [(reward, r.verifier_weight)]
        terms += [(format_reward(task.format_pattern), r.format_weight)] if r.format_weight else []
        return combine(*terms)
    return reward


class Trainer(RunLoop):
    """The task context, policy, optimizer state, learner, rollout pipeline and step count of one experiment."""

    state: TrainState

    def __init__(self, exp: Experiment, algorithm: core.Estimator | None = None):
        """``algorithm``: an estimator object to train instead of ``exp.algorithm``'s (a preset with other
        settings, or your own ``core.Estimator``; the same as ``exp.algorithm.estimator``)."""
        user_error("distributed", lambda: multihost.initialize(exp.distributed))   # before any other JAX call
        if algorithm is not None:
            exp = dataclasses.replace(exp, algorithm=dataclasses.replace(exp.algorithm, estimator=algorithm))
        self.exp = exp
        mesh_options = "mesh, rollout.sampler_devices" if exp.rollout.sampler_devices else "mesh"
        self.mesh, sampler_mesh = user_error(mesh_options, lambda: learner_and_sampler_meshes(
            exp.mesh, exp.rollout.sampler_devices))
        validate(exp, self.mesh)
        check_memory(exp, self.mesh)
        held_out = exp.task.option("held_out", "none")
        if held_out != "none":     # word_math's held-out phrasings stay out of training
            raise ConfigError(f"task.options.held_out={held_out!r} is a held-out evaluation split that training "
                              "never draws: train with task.options.held_out=none, evaluate with python -m pgjax.eval "
                              f"RUN --set task.options.held_out={held_out}")
        user_error("rollout.sampler_devices", lambda: mesh_lib.check_divisible_rows(
            exp.prompts_per_step, sampler_mesh, "prompts_per_step (over the sampler's devices)"))
        self.algorithm = exp.algorithm.build()
        self.hparams = self.algorithm.hparams
        self.context = task_context(exp, fit_to=exp.rollout.max_prompt_tokens)
        self._check_widths()
        policy = initial_policy(exp, self.tokenizer, exp.seed)
        self.learner = build_learner(policy, self.algorithm, exp.rollout.samples_per_prompt, exp.update, exp.optim,
                                     exp.critic_optim, self.mesh)
        self.state = self.learner.init_state(policy, jax.random.PRNGKey(exp.seed))
        self.pipeline = RolloutPipeline(exp, self.context, self.learner, policy, training_reward(exp, self.task),
                                        self.mesh, sampler_mesh, self.state.params, self._mix(sampler_mesh))
        self.step_count = 0
        self.skipped_in_a_row = 0    # consecutive steps whose every update was non-finite (and skipped)
        self.warm_started = not exp.warm_start.steps      # nothing to do, or done (or restored)
        self.started = False        # the step-0 evaluation is logged (or the run restored): fit goes on from here
        self.completions: list[dict] | None = None      # the last step's logged completions (pgjax.train.completions)

    @property
    def tokenizer(self):
        """The task's tokenizer, else the checkpoint's (``TaskContext.tokenizer``)."""
        return self.context.tokenizer

    @property
    def task(self):
        """The task: prompts, verifier, format pattern (``TaskContext.task``)."""
        return self.context.task

    def _check_widths(self) -> None:
        check_widths(self.exp, self.context, self.context.eval_examples,
                     lambda examples: warm_start_batch(self.exp, self.context, examples))

    def _mix(self, mesh) -> Mix:
        """The learned reward of ``task.reward.model`` (on the sampler's ``mesh``), and how it is mixed in;
        ConfigError for a reward model that cannot be loaded, or with multi-turn episodes."""
        t = self.exp.task.reward
        if not t.model:
            return Mix()
        if self.context.environment is not None:
            raise ConfigError("task.reward.model scores single responses; multi-turn episodes (task.tools.names or the "
                              "task's environment) are scored by the environment")
        model = user_error("task.reward.model", lambda: LearnedReward(t.model, mesh))
        if model.kind == "token" and self.learner.uses_greedy:
            raise ConfigError(f"task.reward.model={t.model!r} is a process reward model, whose rewards sit "
                              f"on the response's steps; {self.algorithm.name}'s greedy baseline takes one "
                              "reward per response: use another algorithm")
        if model.kind == "token" and self.exp.rollout.mask_truncated:
            raise ConfigError(f"task.reward.model={t.model!r} is a process reward model: with "
                              "rollout.mask_truncated a cut response's rewards would leave its group's baseline "
                              "(per-token rewards are summed over the kept tokens); set rollout.mask_truncated=false")
        return Mix(model, t.model_weight, t.model_normalize)

    @property
    def policy(self) -> CausalLM:
        """The current policy (a view of ``state.params``)."""
        return self.learner.policy(self.state.params)

    def warm_start(self) -> None:
        """``warm_start.steps`` supervised steps on fresh demonstrations (seeded per step, sharded like
        the RL update; each process encodes its rows of each batch); the optimizer state, reference
        policy and critic then start from the warm-started policy. Does nothing when done already, after
        a step or a restore. A stop signal (``interrupts``) ends it after the current supervised step
        with RunInterrupted (nothing is saved: no checkpoint holds a warm start)."""
        ws, exp = self.exp.warm_start, self.exp
        if self.warm_started or self.step_count:
            return
        optimizer = make_optimizer(ws.optim)
        params, frozen = self.learner.trainable(shard(self.state.params, self.mesh))   # sft_step donates params:
        self.state = None  # type: ignore[assignment]  # rebuilt below; only the supervised state is held
        opt_state = shard(optimizer.init(params), self.mesh)     # its step count too, or step 2 compiles again
        for step in range(ws.steps):
            examples = self.task.examples(ws.batch_size, seed=stream_seed(exp.seed, "warm_start", step))
            batch = warm_start_batch(exp, self.context, multihost.process_share(examples, self.mesh))
            params, opt_state, loss = sft_step(self.learner.graphdef, optimizer, params, opt_state, frozen,
                                               *multihost.to_global(batch, self.mesh), mesh=self.mesh)
            if (step % 50 == 0 or step == ws.steps - 1) and multihost.is_primary():
                print(f"warm start {step + 1}/{ws.steps}: loss {float(loss):.3f}", file=sys.stderr)
            signum = interrupts.requested()
            if signum is not None:
                raise RunInterrupted(signum, f"during the warm start ({step + 1} of {ws.steps} "
                                     "steps), before the first checkpoint: nothing to resume; run again to start over")
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
        ``pgjax/decode_and_score``) and ``pgjax/update_wait``.

        On a step that logs completions (``logging.completions_every``) ``self.completions`` holds the
        rows drawn from the batch, with their advantages (``pgjax.train.completions``); else None."""
        exp, staleness = self.exp, self.exp.rollout.staleness
        t0 = time.perf_counter()
        batch = self.pipeline.take(self.state, self.step_count)
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
        self.pipeline.score_ahead()      # with staleness: the batch sampled ahead, scored while the update runs
        scoring = time.perf_counter() - t2 if staleness else 0.0
        with jax.profiler.TraceAnnotation("pgjax/update_wait"):
            metrics = jax.device_get(metrics)
        t3 = time.perf_counter()
        logged = batch.logged if batch.logged is not None and logged_at(exp.logging, self.step_count + 1) else None
        self.completions = with_advantages(logged, rollout, self.mesh) if logged is not None else None
        lag = self.step_count - batch.sampled_at
        self.step_count += 1
        self.started = True
        all_skipped = metrics["skipped_updates"] == exp.update.epochs * exp.update.minibatches
        if batch.stats["nonfinite"].all():      # rollout.nonfinite_rewards="mask" left every row out
            all_skipped = True
            if multihost.is_primary():
                print(f"step {self.step_count}: every reward was non-finite; rollout.nonfinite_rewards='mask' left all "
                      f"{batch.stats['nonfinite'].size} rows out of the update", file=sys.stderr)
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if all_skipped else 0
        times = {"time_sample": t1 - t0 + scoring, "time_prepare": t2 - t1, "time_update": t3 - t2 - scoring,
                 "time_step": t3 - t0}
        padding = 1.0 - float(jnp.mean(rollout.attention_mask))        # of the positions the update computes on
        return {"step": self.step_count, "policy_lag": lag, **step_record(batch.stats, metrics, times),
                "padding": padding, **observed}

    def evaluate(self) -> float:
        """Greedy accuracy on ``eval_prompts`` evaluation examples, the same at every call (drawn from
        the task with a seed stream of their own; generated tasks rarely repeat a training prompt, a
        dataset file's are drawn from the same file); ``evaluation.evaluate``'s greedy pass, each
        process scoring its rows; greedy episodes where the task has an environment."""
        exp = self.exp
        context = self.context
        try:
            results = evaluate(self.policy, context.tokenizer, context.task, context.eval_examples, samples=0,
                               decoding=exp.rollout, max_prompt_tokens=exp.rollout.max_prompt_tokens,
                               eos_ids=context.eos_ids, key=jax.random.PRNGKey(0), mesh=self.mesh,
                               nonfinite=exp.rollout.nonfinite_rewards, prompt_format=context.prompt_format,
                               environment=context.environment, limits=episode_limits(exp.rollout))
        except RewardError as error:
            raise RunStopped(f"evaluation at step {self.step_count}: {error}") from None
        return results["metrics"]["greedy_accuracy"]["value"]

    def save(self, checkpoints: Checkpoints) -> None:
        """A checkpoint of the state at the current step (every process writes its shards); never of a
        non-finite state (RunStopped)."""
        self._check_finite(f"the checkpoint of step {self.step_count}")
        state: TrainState | dict[str, Any] = self.learner.checkpointed(self.state)
        record: dict[str, Any] = {"step": self.step_count,
                                  "data_position": self.step_count * self.exp.prompts_per_step}
        if self.exp.rollout.staleness:      # the batches in flight too (sampled first at step 0)
            self.pipeline.fill(self.state, self.step_count)
            rollouts, record["in_flight"] = self.pipeline.saved()
            state = {"train": state, "in_flight": rollouts}
        checkpoints.save(self.step_count, state, record)

    def restore(self, checkpoints: Checkpoints, step: int | None = None, fallback: bool = True) -> None:
        """The state and step count of a checkpoint (default: the newest intact one, see
        ``Checkpoints.restore``), on this trainer's mesh, and the batches it had in flight;
        ConfigError when none fits or is intact."""
        like: TrainState | dict[str, Any] = self.learner.checkpointed(self.state)
        if self.exp.rollout.staleness:
            like = {"train": like, "in_flight": self.pipeline.saved_like()}
        saved, record = checkpoints.restore(like, step, fallback)
        if self.exp.rollout.staleness:
            self.pipeline.restore(saved["in_flight"], record["in_flight"])
            saved = saved["train"]
        self.state = self.learner.from_checkpoint(self.state, saved)
        self.step_count, self.started, self.warm_started = record["step"], True, True

    def fit(self, run: RunDirectory | None = None, callbacks=(), progress: bool = True) -> None:
        """Train to ``steps``: a fresh trainer first runs the warm start and logs the step-0 evaluation;
        then each step, with evaluation every ``eval_every`` steps and at the end. With a ``run``
        directory every record and the logged completions are written, and a checkpoint every
        ``checkpoint_every`` steps and at the end; ``callbacks`` see every step. A stop signal
        (``interrupts.graceful_stop``) ends the loop after the current step with its checkpoint
        written: RunInterrupted."""
        exp, callbacks = self.exp, tuple(callbacks)
        if run is not None and run.checkpoints is None:
            raise ValueError("fit(run): call run.create() and run.start(...) first (as train() does)")
        if not self.started:
            self.warm_start()
            self._emit({"step": 0, "eval_accuracy": self.evaluate()}, run)
            self.started = True
            self._stop_if_asked(run, checkpointed=True)
        bar = Progress(exp.steps, self.step_count, exp.logging.progress_every,
                       enabled=progress and multihost.is_primary())
        while self.step_count < exp.steps:
            record = self.step(callbacks)
            if self.step_count % exp.eval_every == 0 or self.step_count == exp.steps:
                record["eval_accuracy"] = self.evaluate()
            for callback in callbacks:
                callback.after_step(self, record)
            bar.update(record)
            checkpoint = self.step_count % exp.checkpoint_every == 0 or self.step_count == exp.steps
            self._emit(record, run, checkpoint, self.completions)
            if self.skipped_in_a_row >= exp.update.max_skipped_steps:
                raise RunStopped(f"steps {self.step_count - self.skipped_in_a_row + 1}..{self.step_count}: every "
                                 "update had a non-finite loss, gradient or result (or no finite reward) and was "
                                 "skipped "
                                 f"(update.max_skipped_steps={exp.update.max_skipped_steps}); the parameters are "
                                 f"those of step {self.step_count - self.skipped_in_a_row}. Lower optim.lr, check "
                                 "the rewards' scale, or raise update.max_skipped_steps")
            self._stop_if_asked(run, checkpoint)
        bar.close()

    def export(self, run: RunDirectory) -> None:
        """The trained policy into ``run``'s ``final/`` (every process takes part in the gather); never a
        non-finite one (RunStopped)."""
        self._check_finite("final/")
        params = multihost.gather(self.state.params)
        run.export(self.learner.policy(params))


def train(exp: Experiment, resume: bool = False, progress: bool = True, callbacks=(), accept_changes: bool = False,
          fallback: bool = True, restart: bool = False,
          grace_period: float = interrupts.DEFAULT_GRACE_PERIOD) -> pathlib.Path:
    """A whole run of ``exp`` in its run directory (``run_dir``); returns the directory. Every
    configuration mistake raises ConfigError before anything is written (as does a live run in the
    same directory); ``resume`` continues from the newest intact checkpoint (``fallback=False``: the
    newest, or a ConfigError if it is damaged), dropping metric lines written after it, and refuses an
    experiment or an input file that changes the maths or the data unless ``accept_changes`` (see
    ``RunDirectory``); ``restart`` starts again in the directory a resume would take, its old results
    moved aside. A reward function's NaN, repeated non-finite updates or a non-finite state raise
    RunStopped with the last checkpoint intact. SIGTERM, SIGHUP or Ctrl-C stop the run after its current
    step with a checkpoint, or after final/ when it is being written (RunInterrupted; ``grace_period``:
    see ``interrupts.graceful_stop``). A ``stage="reward_model"`` or ``"process_reward_model"``
    experiment trains its learned reward the same way (``RewardModelTrainer``)."""
    run = RunDirectory(exp, resume, accept_changes, fallback, restart)      # writes nothing
    with interrupts.graceful_stop(run.left_behind, grace_period):
        trainer = (Trainer if exp.stage == "rl" else RewardModelTrainer)(exp)
        run.create()
        try:
            if run.resume:
                trainer.restore(run.created_checkpoints(), fallback=fallback)
                print(f"resumed {run.directory} at step {trainer.step_count}", file=sys.stderr)
            run.start(trainer.tokenizer, trainer.step_count)
            trainer.fit(run, callbacks, progress)
            with interrupts.finishing("writing final/", "final/"):
                trainer.export(run)
            signum = interrupts.requested()
            if signum is not None:
                raise RunInterrupted(signum, "after writing final/: the run is complete")
        except BaseException:
            run.close(failed=True)
            raise
        run.close()
    return run.directory
