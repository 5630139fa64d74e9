"""Training a reward model: ``RewardModelTrainer``, the ``Trainer`` pattern for ``stage="reward_model"``.

A ``RewardModel`` (``pgjax.models.heads``: the checkpoint at ``model.path`` as its trunk, with LoRA
adapters where ``model.lora`` asks, and a scalar head that starts at 0) learns the preference pairs of
``reward_model.path`` (``pgjax.rewards.preferences``) by the Bradley-Terry loss
(``core.bradley_terry_loss``):

    L = - mean_i log sigma(r(x_i, y_i+) - r(x_i, y_i-) - m_i)

r(x, y) is the head at the last token of the prompt and response as the model reads them
(``PromptFormat.exchange``: the chat template's whole exchange, or the plain prompt then the reply).
Each step takes ``prompts_per_step`` pairs, the next of a fresh seeded permutation of the training
pairs per epoch (a step's pairs are a function of the seed and the step number, so a resumed run
trains on the same), and one AdamW step (``optim``; with LoRA the adapters and the head move, the
trunk stays). Every ``eval_every`` steps, and at step 0 and the end: the held-out pairs' pairwise
accuracy (a tie counts half) with its Wilson 95% interval, and their loss.

``train`` (``python -m pgjax.run``) drives it as it drives RL: the same run directory, metrics,
checkpoints, ``--resume`` and signals. ``final/`` is a transformers
``AutoModelForSequenceClassification`` directory (``hf.save_reward_model``) with the run's tokenizer.
"""
from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import flax
import optax
from flax import nnx

from pgjax import core
from pgjax.models import hf
from pgjax.models.heads import RewardModel
from pgjax.parallel import multihost
from pgjax.parallel import mesh as mesh_lib
from pgjax.parallel.mesh import learner_and_sampler_meshes, shard
from pgjax.rewards.preferences import PreferenceFields, load_preferences
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.context import user_error
from pgjax.train.evaluation import wilson_interval
from pgjax.train.experiment import ConfigError, Experiment, stream_seed
from pgjax.train.loop import RunLoop
from pgjax.train.optim import make_optimizer
from pgjax.train.progress import Progress
from pgjax.train.rollout import pad_id, prompt_format_for
from pgjax.train.run_dir import RunDirectory


@flax.struct.dataclass
class Pairs:
    """Encoded preference pairs, right-padded to ``reward_model.max_tokens``: tokens and attention mask
    [N, W] of the chosen and of the rejected exchange, and each pair's margin [N]."""
    chosen: np.ndarray
    chosen_mask: np.ndarray
    rejected: np.ndarray
    rejected_mask: np.ndarray
    margin: np.ndarray

    def __len__(self) -> int:
        return len(self.margin)

    def arrays(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def take(self, rows) -> Pairs:
        return Pairs(*(x[rows] for x in self.arrays()))


def encode_pairs(tokenizer, prompt_format, records: list[dict], width: int, margin: float = 0.0) -> Pairs:
    """``records`` (``load_preferences``'s) as ``Pairs``: each exchange tokenized as the model reads it,
    its margin plus ``margin``; ValueError naming the first pair (by index) longer than ``width``."""
    pad = pad_id(tokenizer)
    arrays = {}
    for side in ("chosen", "rejected"):
        texts = [prompt_format.exchange(tokenizer, r["prompt"], r[side]) for r in records]
        ids = tokenizer(texts, add_special_tokens=prompt_format.special_tokens)["input_ids"]
        tokens, mask = np.full((len(ids), width), pad, np.int32), np.zeros((len(ids), width), np.int32)
        for row, one in enumerate(ids):
            if len(one) > width:
                raise ValueError(f"pair {row}: its {side} prompt and response take {len(one)} tokens; "
                                 f"reward_model.max_tokens={width}")
            tokens[row, :len(one)], mask[row, :len(one)] = one, 1
        arrays[side], arrays[f"{side}_mask"] = tokens, mask
    return Pairs(**arrays, margin=np.array([r["margin"] + margin for r in records], np.float32))


def _head_and_adapters(path, _value) -> bool:
    """The parameters a LoRA reward model trains: its head (w, b) and the trunk's adapters."""
    return path[0] in ("head", "bias") or any(isinstance(p, str) and p.startswith("lora_") for p in path)


@partial(jax.jit, static_argnames=("graphdef", "optimizer", "mesh"), donate_argnames=("trainable", "opt_state"))
def bradley_terry_step(graphdef, optimizer, trainable, opt_state, frozen, pairs: Pairs, mesh=None):
    """One AdamW step on the Bradley-Terry loss of a batch of pairs; the loss, the batch's pairwise
    wins and its mean chosen and rejected scores."""
    def loss_fn(params):
        model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)
        chosen = model.scores(pairs.chosen, pairs.chosen_mask, mesh)
        rejected = model.scores(pairs.rejected, pairs.rejected_mask, mesh)
        return core.bradley_terry_loss(chosen, rejected, pairs.margin), (chosen, rejected)

    (loss, (chosen, rejected)), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    metrics = {"loss": loss, "accuracy": jnp.mean(core.pairwise_wins(chosen, rejected)),
               "chosen_score": jnp.mean(chosen), "rejected_score": jnp.mean(rejected),
               "grad_norm": optax.tree.norm(grads)}
    return optax.apply_updates(trainable, updates), opt_state, metrics


@partial(jax.jit, static_argnames=("graphdef", "mesh"))
def pair_sums(graphdef, params, pairs: Pairs, weights, mesh=None):
    """(sum of the pairwise wins, sum of the Bradley-Terry losses) of the pairs of a batch with weight 1
    (``weights`` [N]: 0 on padding)."""
    model = nnx.merge(graphdef, params)
    chosen = model.scores(pairs.chosen, pairs.chosen_mask, mesh)
    rejected = model.scores(pairs.rejected, pairs.rejected_mask, mesh)
    losses = jax.nn.softplus(-(chosen - rejected - pairs.margin))
    return jnp.sum(weights * core.pairwise_wins(chosen, rejected)), jnp.sum(weights * losses)


@flax.struct.dataclass
class RewardModelState:
    """What a checkpoint of reward-model training holds: the trained parameters (with LoRA the
    adapters and the head: the trunk is reloaded from ``model.path``) and the optimizer state."""
    params: nnx.State
    opt_state: optax.OptState


class RewardModelTrainer(RunLoop):
    """The preference pairs, reward model, optimizer state and step count of a ``stage="reward_model"``
    experiment; ``step``, ``evaluate``, ``save`` / ``restore``, ``fit``, ``export`` as ``Trainer``'s."""

    def __init__(self, exp: Experiment):
        user_error("distributed", lambda: multihost.initialize(exp.distributed))
        self.exp = exp
        self.mesh = user_error("mesh", lambda: learner_and_sampler_meshes(exp.mesh)[0])
        if not exp.model.path:
            raise ConfigError("stage=reward_model: model.path must name the checkpoint the reward model starts from "
                              "(its trunk and tokenizer)")
        task = exp.task
        self._tokenizer = user_error("model.path", lambda: hf.load_tokenizer(exp.model.path))
        self.prompt_format = user_error("task.chat_template", lambda: prompt_format_for(
            self._tokenizer, task.chat_template, task.system_prompt, task.prompt_template))
        self.train_pairs, self.eval_pairs = self._pairs()
        user_error("prompts_per_step", lambda: mesh_lib.check_divisible_rows(
            exp.prompts_per_step, self.mesh, "prompts_per_step (pairs a step)"))
        model = user_error("model.path", lambda: RewardModel(hf.load(exp.model.path, **exp.model.runtime_options())))
        self.graphdef, params = nnx.split(model)
        self.lora = model.trunk.config.lora is not None
        self.optimizer = make_optimizer(exp.optim)
        trainable, _ = self.trainable(shard(params, self.mesh))
        self.state = RewardModelState(params=shard(params, self.mesh), opt_state=self.optimizer.init(trainable))
        self.step_count, self.started = 0, False

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def model(self) -> RewardModel:
        """The current reward model (a view of ``state.params``)."""
        return nnx.merge(self.graphdef, self.state.params)

    def _pairs(self) -> tuple[Pairs, Pairs]:
        """The training and held-out pairs, encoded (ConfigError naming the file and line of a bad record
        or a pair too long for ``reward_model.max_tokens``, before anything is written)."""
        exp, section = self.exp, self.exp.reward_model
        fields = PreferenceFields(section.prompt_field, section.chosen_field, section.rejected_field,
                                  section.margin_field)
        if not section.path:
            raise ConfigError("stage=reward_model: reward_model.path must name the preference pairs")

        def read(path: str, key: str):
            data = user_error(f"reward_model.{key}", lambda: load_preferences(path, fields, section.skip_invalid,
                                                                               section.file_format))
            for place, reason in data.skipped[:3]:
                print(f"{path}:{place}: skipped: {reason}")
            records, places = data.records, data.places
            try:
                return encode_pairs(self._tokenizer, self.prompt_format, records, section.max_tokens, section.margin)
            except ValueError as error:
                row = int(str(error).split(":")[0].split()[1])
                raise ConfigError(f"reward_model.max_tokens: {path}:{places[row]}: "
                                  f"{str(error).split(': ', 1)[1]}") from None
        pairs = read(section.path, "path")
        if section.eval_path:
            held_out, train = read(section.eval_path, "eval_path"), pairs
        else:
            order = np.random.default_rng(stream_seed(exp.seed, "eval", 0)).permutation(len(pairs))
            if len(pairs) <= exp.eval_prompts:
                raise ConfigError(f"reward_model.path holds {len(pairs)} pairs: holding out eval_prompts="
                                  f"{exp.eval_prompts} leaves none to train on (lower eval_prompts, or give "
                                  "reward_model.eval_path)")
            held_out, train = pairs.take(order[:exp.eval_prompts]), pairs.take(np.sort(order[exp.eval_prompts:]))
        return train, held_out

    def trainable(self, params) -> tuple[nnx.State, nnx.State | None]:
        """(what the optimizer moves, the frozen rest): with LoRA the head and the adapters, else all."""
        return nnx.split_state(params, _head_and_adapters, ...) if self.lora else (params, None)

    def _join(self, trainable, frozen) -> nnx.State:
        return trainable if frozen is None else nnx.merge_state(trainable, frozen)

    def batch_rows(self, step: int) -> np.ndarray:
        """The training pairs of step ``step`` (0-based): the next ``prompts_per_step`` of the epochs'
        permutations (epoch e's drawn with seed stream ``train``, e)."""
        size, count = self.exp.prompts_per_step, len(self.train_pairs)
        positions = np.arange(step * size, (step + 1) * size)
        epochs = positions // count
        orders = {e: np.random.default_rng(stream_seed(self.exp.seed, "train", int(e))).permutation(count)
                  for e in np.unique(epochs)}
        return np.array([orders[e][p % count] for e, p in zip(epochs, positions)])

    def _global(self, *arrays):
        """This process's rows of ``arrays`` (each with every process's rows) as global arrays split over
        the mesh's batch axes."""
        rows = multihost.process_rows(len(arrays[0]), self.mesh)
        return multihost.to_global(tuple(a[rows] for a in arrays), self.mesh)

    def step(self) -> dict:
        """One optimizer step on the step's pairs; its record (loss, batch accuracy, mean scores and
        their gap, gradient norm)."""
        pairs = Pairs(*self._global(*self.train_pairs.take(self.batch_rows(self.step_count)).arrays()))
        trainable, frozen = self.trainable(self.state.params)
        opt_state, self.state = self.state.opt_state, None      # donated: the step's result replaces them
        trainable, opt_state, metrics = bradley_terry_step(self.graphdef, self.optimizer, trainable, opt_state, frozen,
                                                           pairs, mesh=self.mesh)
        self.state = RewardModelState(self._join(trainable, frozen), opt_state)
        self.step_count += 1
        self.started = True
        record = {name: float(value) for name, value in jax.device_get(metrics).items()}
        record["score_gap"] = record["chosen_score"] - record["rejected_score"]
        return {"step": self.step_count, **record}

    def evaluate(self, chunk: int = 64) -> dict:
        """The held-out pairs' pairwise accuracy (``eval_accuracy``) with its Wilson 95% interval
        (``eval_accuracy_low``, ``eval_accuracy_high``) and their mean loss (``eval_loss``), in chunks of
        ``chunk`` pairs (the last padded with weight 0: one compiled shape)."""
        pairs, wins, loss = self.eval_pairs, 0.0, 0.0
        shards = mesh_lib.batch_shards(self.mesh)
        chunk = -(-min(chunk, len(pairs)) // shards) * shards
        for start in range(0, len(pairs), chunk):
            rows = np.arange(start, min(start + chunk, len(pairs)))
            weights = (np.arange(chunk) < len(rows)).astype(np.float32)
            part = pairs.take(np.concatenate([rows, np.zeros(chunk - len(rows), int)])).arrays()
            *part, weights = self._global(*part, weights)
            w, lo = pair_sums(self.graphdef, self.state.params, Pairs(*part), weights, mesh=self.mesh)
            wins, loss = wins + float(w), loss + float(lo)
        n = len(pairs)
        low, high = wilson_interval(wins, n)
        return {"eval_accuracy": wins / n, "eval_accuracy_low": low, "eval_accuracy_high": high,
                "eval_loss": loss / n}

    def save(self, checkpoints: Checkpoints) -> None:
        """A checkpoint of the trained parameters and optimizer state at the current step."""
        self._check_finite(f"the checkpoint of step {self.step_count}")
        saved = RewardModelState(self.trainable(self.state.params)[0], self.state.opt_state)
        checkpoints.save(self.step_count, saved, {"step": self.step_count,
                                                  "data_position": self.step_count * self.exp.prompts_per_step})

    def restore(self, checkpoints: Checkpoints, step: int | None = None, fallback: bool = True) -> None:
        """The state and step count of a checkpoint (default: the newest intact one)."""
        trainable, frozen = self.trainable(self.state.params)
        saved, record = checkpoints.restore(RewardModelState(trainable, self.state.opt_state), step, fallback)
        self.state = RewardModelState(self._join(saved.params, frozen), saved.opt_state)
        self.step_count, self.started = record["step"], True

    def fit(self, run: RunDirectory | None = None, callbacks=(), progress: bool = True) -> None:
        """Train to ``steps``: the step-0 evaluation first (a fresh trainer), then each step, with an
        evaluation every ``eval_every`` steps and at the end; with a ``run`` directory every record and a
        checkpoint every ``checkpoint_every`` steps and at the end. A stop signal ends the loop after the
        current step with its checkpoint written (RunInterrupted)."""
        exp = self.exp
        if run is not None and run.checkpoints is None:
            raise ValueError("fit(run): call run.create() and run.start(...) first (as train() does)")
        if not self.started:
            self._emit({"step": 0, **self.evaluate()}, run)
            self.started = True
            self._stop_if_asked(run, checkpointed=True)
        bar = Progress(exp.steps, self.step_count, exp.logging.progress_every,
                       enabled=progress and multihost.is_primary())
        while self.step_count < exp.steps:
            record = self.step()
            if self.step_count % exp.eval_every == 0 or self.step_count == exp.steps:
                record.update(self.evaluate())
            for callback in callbacks:
                callback.after_step(self, record)
            bar.update(record)
            checkpoint = self.step_count % exp.checkpoint_every == 0 or self.step_count == exp.steps
            self._emit(record, run, checkpoint)
            self._stop_if_asked(run, checkpoint)
        bar.close()

    def export(self, run: RunDirectory) -> None:
        """The trained reward model into ``run``'s ``final/`` (a transformers sequence classifier)."""
        self._check_finite("final/")
        run.export(nnx.merge(self.graphdef, multihost.gather(self.state.params)))

