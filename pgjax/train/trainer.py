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
"""
from __future__ import annotations

import pathlib
import sys
import time

import jax
import numpy as np
from flax import nnx

from pgjax import core
from pgjax.eval import evaluate
from pgjax.models import hf
from pgjax.models.transformer import CausalLM
from pgjax.parallel import multihost
from pgjax.parallel.mesh import make_mesh, shard
from pgjax.rewards import RewardError, combine, format_reward, import_object, make_task
from pgjax.train.experiment import ConfigError, Experiment, stream_seed, validate
from pgjax.train.learner import Learner, Rollout, all_finite
from pgjax.train.optim import make_optimizer
from pgjax.train.progress import Progress
from pgjax.train.rollout import collect, encode_prompts, prompt_format_for, stop_tokens
from pgjax.train.run_dir import Checkpoints, RunDirectory
from pgjax.train.sft import demonstrations, sft_step

STAT_KEYS = ("reward", "correct", "length", "truncated", "kept", "nonfinite")
TIMING_KEYS = ("time_sample", "time_prepare", "time_update", "time_step", "tokens_per_second")


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
        self.mesh = _user_error("mesh", lambda: make_mesh(exp.mesh))
        validate(exp, self.mesh)
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
        self.state = self.learner.init_state(policy, jax.random.PRNGKey(exp.seed))
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
        statistics, the finalized loss metrics and timings (see ``step_record``)."""
        exp, mesh = self.exp, self.mesh
        t0 = time.perf_counter()
        examples = self.task.examples(exp.prompts_per_step, seed=stream_seed(exp.seed, "train", self.step_count))
        try:
            rollout, stats = collect(self.policy, self.tokenizer, multihost.process_share(examples, mesh),
                                     self.reward_fn, self.task.reward_fn, jax.random.fold_in(self.state.key, 1),
                                     exp.rollout, greedy_baseline=self.algorithm.spec.baseline == "greedy",
                                     eos_ids=self.eos_ids, mesh=mesh, prompt_format=self.prompt_format)
        except RewardError as error:
            raise RunStopped(f"step {self.step_count + 1}: {error}") from None
        stats = multihost.gather_rows({k: stats[k] for k in STAT_KEYS},
                                      exp.prompts_per_step * exp.rollout.samples_per_prompt, mesh)
        t1 = time.perf_counter()
        rollout = jax.block_until_ready(self.learner.prepare(self.state, rollout, self.hparams))
        observed = {}
        for callback in callbacks:
            for key, value in (callback.before_update(self, rollout, examples, stats) or {}).items():
                if key in RECORD_KEYS:
                    raise ValueError(f"{type(callback).__name__}.before_update returned {key!r}, a key of the "
                                     "step's own record: name it differently")
                observed[key] = float(value)
        t2 = time.perf_counter()
        self.state, metrics = self.learner.update(self.state, rollout, self.hparams)
        metrics = jax.device_get(metrics)
        t3 = time.perf_counter()
        self.step_count += 1
        self.started = True
        all_skipped = metrics["skipped_updates"] == exp.update.epochs * exp.update.minibatches
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if all_skipped else 0
        times = {"time_sample": t1 - t0, "time_prepare": t2 - t1, "time_update": t3 - t2, "time_step": t3 - t0}
        return {"step": self.step_count, **step_record(stats, metrics, times), **observed}

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
        checkpoints.save(self.step_count, self.learner.checkpointed(self.state),
                         {"step": self.step_count, "data_position": self.step_count * self.exp.prompts_per_step})

    def restore(self, checkpoints: Checkpoints, step: int | None = None, fallback: bool = True) -> None:
        """The state and step count of a checkpoint (default: the newest intact one, see
        ``Checkpoints.restore``), on this trainer's mesh; ConfigError when none fits or is intact."""
        saved, record = checkpoints.restore(self.learner.checkpointed(self.state), step, fallback)
        self.state = self.learner.from_checkpoint(self.state, saved)
        self.step_count, self.started, self.warm_started = record["step"], True, True

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
               "kl_ref", "kl_old", "value_loss",
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
