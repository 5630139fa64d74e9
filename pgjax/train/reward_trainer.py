"""Training a learned reward: ``RewardModelTrainer``, the ``Trainer`` pattern for
``stage="reward_model"`` and ``stage="process_reward_model"``.

A ``RewardModel`` (``pgjax.models.heads``: the checkpoint at ``model.path`` as its trunk, with LoRA
adapters where ``model.lora`` asks, and a scalar head that starts at 0) learns one of two kinds of data
(``pgjax.tasks.preferences``), read from ``reward_model.path``:

- **preference pairs** (``reward_model``): the Bradley-Terry loss (``core.bradley_terry_loss``)

    L = - mean_i log sigma(r(x_i, y_i+) - r(x_i, y_i-) - m_i),

  r(x, y) the head at the last token of the prompt and response as the model reads them
  (``PromptFormat.exchange``: the chat template's whole exchange, or the plain prompt then the reply);
  evaluated by the held-out pairs' pairwise accuracy (a tie counts half);
- **step labels** (``process_reward_model``): a response written as its steps joined by
  ``reward_model.step_separator``, the head's logit z_j at each step's last token trained to say
  whether the step is right (``core.step_classification_loss``, binary cross-entropy); evaluated by
  the held-out steps' accuracy (sigma(z_j) > 1/2 against the label).

Each step takes ``prompts_per_step`` records, the next of a fresh seeded permutation of the training
records per epoch (a step's records are a function of the seed and the step number, so a resumed run
trains on the same), and one AdamW step (``optim``; with LoRA the adapters and the head move, the
trunk stays). Every ``eval_every`` steps, and at step 0 and the end: the held-out accuracy with its
Wilson 95% interval, and the held-out loss.

``train`` (``python -m pgjax.run``) drives it as it drives RL: the same run directory, metrics,
checkpoints, ``--resume`` and signals. ``final/`` is a transformers classifier with the run's
tokenizer (``hf.save_reward_model``): a sequence classifier for a reward model, a token classifier
for a process reward model.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from pgjax import core
from pgjax.checks import ConfigError
from pgjax.config import Experiment, stream_seed
from pgjax.evaluation.statistics import wilson_interval
from pgjax.models import hf, lora
from pgjax.models.heads import RewardModel
from pgjax.parallel import mesh as mesh_lib
from pgjax.parallel import multihost
from pgjax.parallel.mesh import learner_and_sampler_meshes, shard
from pgjax.rollout.collect import pad_id, prompt_format_for, right_pad
from pgjax.tasks.data import Conversation
from pgjax.tasks.preferences import PreferenceFields, StepFields, load_preferences, load_step_labels
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.context import user_error
from pgjax.train.learned_reward import step_places
from pgjax.train.loop import RunLoop
from pgjax.train.optim import make_optimizer
from pgjax.train.progress import Progress
from pgjax.train.run_dir import RunDirectory


class Records:
    """Arrays of one row per record (the fields of a ``flax.struct.dataclass``), taken together."""

    if TYPE_CHECKING:       # each subclass is a dataclass
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __len__(self) -> int:
        return len(self.arrays()[0])

    def arrays(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def take(self, rows):
        """The records at ``rows``."""
        return type(self)(*(x[rows] for x in self.arrays()))


@flax.struct.dataclass
class Pairs(Records):
    """Encoded preference pairs, right-padded to ``reward_model.max_tokens``: tokens and attention mask
    [N, W] of the chosen and of the rejected exchange, and each pair's margin [N]."""
    chosen: np.ndarray
    chosen_mask: np.ndarray
    rejected: np.ndarray
    rejected_mask: np.ndarray
    margin: np.ndarray


def prompt_key(prompt) -> str:
    """What makes two records' prompts the same: a conversation's messages, else the text."""
    return json.dumps(prompt.messages) if isinstance(prompt, Conversation) else str(prompt)


class RecordError(ValueError):
    """A record the encoder cannot take (``row``: its index among the records encoded)."""

    def __init__(self, row: int, reason: str):
        super().__init__(f"record {row}: {reason}")
        self.row, self.reason = row, reason


def _exchange_ids(tokenizer, prompt_format, prompt, reply: str, row: int) -> list[int]:
    """The token ids of a prompt and reply as the model reads them; RecordError where the prompt
    cannot be rendered (a conversation without a chat template)."""
    try:
        text = prompt_format.exchange(tokenizer, prompt, reply)
    except ValueError as error:
        raise RecordError(row, str(error)) from None
    return tokenizer(text, add_special_tokens=prompt_format.special_tokens)["input_ids"]


def encode_pairs(tokenizer, prompt_format, records: list[dict], width: int, margin: float = 0.0) -> Pairs:
    """``records`` (``load_preferences``'s) as ``Pairs``: each exchange tokenized as the model reads it,
    its margin plus ``margin``; RecordError naming the first pair (by index) that cannot be rendered or
    is longer than ``width``."""
    arrays = {}
    for side in ("chosen", "rejected"):
        ids = [_exchange_ids(tokenizer, prompt_format, record["prompt"], record[side], row)
               for row, record in enumerate(records)]
        for row, one in enumerate(ids):
            if len(one) > width:
                raise RecordError(row, f"its {side} prompt and response take {len(one)} tokens; "
                                       f"reward_model.max_tokens={width}")
        arrays[side], arrays[f"{side}_mask"] = right_pad(tokenizer, ids, width)
    return Pairs(**arrays, margin=np.array([r["margin"] + margin for r in records], np.float32))


@flax.struct.dataclass
class Steps(Records):
    """Encoded step-labelled responses, right-padded to ``reward_model.max_tokens``: tokens and
    attention mask [N, W] of each exchange, ``step_mask`` [N, W] 1 at each step's last token and
    ``labels`` [N, W] its label there (0 elsewhere)."""
    tokens: np.ndarray
    mask: np.ndarray
    step_mask: np.ndarray
    labels: np.ndarray


def encode_steps(tokenizer, prompt_format, records: list[dict], width: int, separator: str = "\n") -> Steps:
    """``records`` (``load_step_labels``') as ``Steps``: each response is its steps joined by
    ``separator``, written with its prompt as the model reads the exchange; a step's label sits on the
    last token of the exchange's text up to the step's last character (``learned_reward.step_places``,
    as RL reads it). RecordError naming the record (by index) that is longer than ``width``, whose template
    rewrites the response, or two of whose steps end in one token."""
    step_mask, labels = (np.zeros((len(records), width), np.int32) for _ in range(2))
    encoded = []
    for row, record in enumerate(records):
        lengths = [len(step) for step in record["steps"]]
        ends = np.cumsum(lengths) + len(separator) * np.arange(len(lengths)) - 1    # each step's last character
        try:
            ids, tokens = step_places(tokenizer, prompt_format, record["prompt"], separator.join(record["steps"]),
                                      ends)
        except ValueError as error:
            raise RecordError(row, str(error)) from None
        if len(ids) > width:
            raise RecordError(row, f"its prompt and steps take {len(ids)} tokens; reward_model.max_tokens={width}")
        encoded.append(ids)
        for token, label in zip(tokens, record["labels"], strict=True):
            if step_mask[row, token]:
                raise RecordError(row, f"two steps end in one token ({tokenizer.decode([ids[token]])!r})")
            step_mask[row, token], labels[row, token] = 1, label
    return Steps(*right_pad(tokenizer, encoded, width), step_mask, labels)


def pair_objective(model: RewardModel, pairs: Pairs, mesh=None):
    """The Bradley-Terry loss of a batch of pairs, and its metrics: the pairwise accuracy (a tie
    counts half) and the mean chosen and rejected scores."""
    chosen = model.scores(pairs.chosen, pairs.chosen_mask, mesh)
    rejected = model.scores(pairs.rejected, pairs.rejected_mask, mesh)
    return core.bradley_terry_loss(chosen, rejected, pairs.margin), {
        "accuracy": jnp.mean(core.pairwise_wins(chosen, rejected)), "chosen_score": jnp.mean(chosen),
        "rejected_score": jnp.mean(rejected)}


def pair_counts(model: RewardModel, pairs: Pairs, weights, mesh=None):
    """(pairwise wins, Bradley-Terry losses, pairs), each summed over the pairs of weight 1."""
    chosen = model.scores(pairs.chosen, pairs.chosen_mask, mesh)
    rejected = model.scores(pairs.rejected, pairs.rejected_mask, mesh)
    count = jnp.sum(weights)
    return (jnp.sum(weights * core.pairwise_wins(chosen, rejected)),
            core.bradley_terry_loss(chosen, rejected, pairs.margin, weights) * count, count)


def step_objective(model: RewardModel, steps: Steps, mesh=None):
    """The step classification loss of a batch, and its metrics: the steps' accuracy and the mean
    predicted probability that a step is right."""
    logits = model(steps.tokens, steps.mask, mesh)
    count = jnp.maximum(jnp.sum(steps.step_mask), 1)
    hits = (logits > 0) == (steps.labels > 0)
    return core.step_classification_loss(logits, steps.labels, steps.step_mask), {
        "accuracy": jnp.sum(steps.step_mask * hits) / count,
        "step_probability": jnp.sum(steps.step_mask * jax.nn.sigmoid(logits)) / count}


def step_counts(model: RewardModel, steps: Steps, weights, mesh=None):
    """(steps classified right, their cross-entropies, steps), each summed over the records of weight 1."""
    logits = model(steps.tokens, steps.mask, mesh)
    scored = steps.step_mask * weights[:, None]
    count = jnp.sum(scored)
    return (jnp.sum(scored * ((logits > 0) == (steps.labels > 0))),
            core.step_classification_loss(logits, steps.labels, scored) * count, count)


# per stage: (the data's reader and encoder, the training objective, the evaluation counts, the export)
OBJECTIVES = {"reward_model": (pair_objective, pair_counts, "sequence"),
              "process_reward_model": (step_objective, step_counts, "token")}


@partial(jax.jit, static_argnames=("graphdef", "optimizer", "objective", "mesh"),
         donate_argnames=("trainable", "opt_state"))
def train_step(graphdef, optimizer, objective, trainable, opt_state, frozen, batch, mesh=None):
    """One AdamW step on ``objective``'s loss of ``batch``; the loss, its metrics and the gradient norm."""
    def loss_fn(params):
        model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)
        return objective(model, batch, mesh)

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    metrics = {"loss": loss, **metrics, "grad_norm": optax.tree.norm(grads)}
    return optax.apply_updates(trainable, updates), opt_state, metrics


@partial(jax.jit, static_argnames=("graphdef", "counts", "mesh"))
def evaluation_counts(graphdef, counts, params, batch, weights, mesh=None):
    """``counts``' sums (hits, losses, items) over the records of ``batch`` with weight 1."""
    return counts(nnx.merge(graphdef, params), batch, weights, mesh)


@flax.struct.dataclass
class RewardModelState:
    """What a checkpoint of reward-model training holds: the trained parameters (with LoRA the
    adapters and the head: the trunk is reloaded from ``model.path``) and the optimizer state."""
    params: nnx.State
    opt_state: optax.OptState


class RewardModelTrainer(RunLoop):
    """The data, reward model, optimizer state and step count of a ``stage="reward_model"`` or
    ``"process_reward_model"`` experiment; ``step``, ``evaluate``, ``save`` / ``restore``, ``fit``,
    ``export`` as ``Trainer``'s."""

    state: RewardModelState

    def __init__(self, exp: Experiment):
        user_error("distributed", lambda: multihost.initialize(exp.distributed))
        self.exp = exp
        self.mesh = user_error("mesh", lambda: learner_and_sampler_meshes(exp.mesh)[0])
        self.objective, self.counts, self.classifier = OBJECTIVES[exp.stage]
        if not exp.model.path:
            raise ConfigError(f"stage={exp.stage}: model.path must name the checkpoint the reward model starts from "
                              "(its trunk and tokenizer)")
        task = exp.task
        self._tokenizer = user_error("model.path", lambda: hf.load_tokenizer(exp.model.path))
        self.prompt_format = user_error("task.prompt.chat_template", lambda: prompt_format_for(
            self._tokenizer, task.prompt.chat_template, task.prompt.system_prompt, task.prompt.template))
        self.train_data, self.eval_data = self._data()
        user_error("prompts_per_step", lambda: mesh_lib.check_divisible_rows(
            exp.prompts_per_step, self.mesh, "prompts_per_step (records a step)"))
        trunk = user_error("model.path", lambda: hf.load(exp.model.path, **exp.model.runtime_options()))
        if trunk.config.pad_token_id is None:       # where the score is read, and what the export tells transformers
            trunk.config = dataclasses.replace(trunk.config, pad_token_id=pad_id(self._tokenizer))
        model = RewardModel(trunk)
        self.graphdef, params = nnx.split(model)
        self.lora = model.trunk.config.lora is not None
        self.optimizer = make_optimizer(exp.optim)
        params = shard(params, self.mesh)
        self.state = RewardModelState(params=params, opt_state=self.optimizer.init(self.trainable(params)[0]))
        self.step_count, self.started = 0, False

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def model(self) -> RewardModel:
        """The current reward model (a view of ``state.params``)."""
        return nnx.merge(self.graphdef, self.state.params)

    def _read(self, path: str, key: str) -> tuple[Pairs | Steps, list]:
        """The records of ``path`` encoded for the stage, and each one's prompt (ConfigError naming the
        file and line of a bad record, one that cannot be rendered or one too long for
        ``reward_model.max_tokens``, before anything is written; with ``skip_invalid`` those are left out
        and the first few listed)."""
        section = self.exp.reward_model
        encode: Callable[[list[dict]], Pairs | Steps]
        if self.exp.stage == "reward_model":
            fields = PreferenceFields(section.prompt_field, section.chosen_field, section.rejected_field,
                                      section.margin_field)
            load = lambda: load_preferences(path, fields, section.skip_invalid, section.file_format)    # noqa: E731
            encode = lambda records: encode_pairs(self._tokenizer, self.prompt_format, records,    # noqa: E731
                                                  section.max_tokens, section.margin)
        else:
            step_fields = StepFields(section.prompt_field, section.steps_field, section.labels_field)
            load = lambda: load_step_labels(path, step_fields, section.skip_invalid, section.file_format)  # noqa: E731
            encode = lambda records: encode_steps(self._tokenizer, self.prompt_format, records,    # noqa: E731
                                                  section.max_tokens, section.separator)
        data = user_error(f"reward_model.{key}", load)
        kept = []
        for record, place in zip(data.records, data.places, strict=True):
            try:
                encode([record])
                kept.append(record)
            except RecordError as error:
                if not section.skip_invalid:
                    raise ConfigError(f"reward_model.{key}: {path}:{place}: {error.reason}") from None
                data.reject(place, error.reason, skip=True)
        data.skipped.sort()
        for place, reason in data.skipped[:3]:
            print(f"{path}:{place}: skipped: {reason}", file=sys.stderr)
        if not kept:
            raise ConfigError(f"reward_model.{key}: {path} holds no record the model can read: "
                              f"{len(data.skipped)} skipped ({data.listing()})")
        return encode(kept), [prompt_key(r["prompt"]) for r in kept]

    def _data(self) -> tuple[Pairs | Steps, Pairs | Steps]:
        """The training and held-out records, encoded: those of ``reward_model.eval_path`` held out, else
        the records of prompts drawn with the seed until they number ``eval_prompts`` (whole prompts:
        no prompt is both trained and evaluated on)."""
        exp, section = self.exp, self.exp.reward_model
        if not section.path:
            raise ConfigError(f"stage={exp.stage}: reward_model.path must name the data file")
        data, prompts = self._read(section.path, "path")
        if section.eval_path:
            return data, self._read(section.eval_path, "eval_path")[0]
        distinct = sorted(set(prompts))
        order = np.random.default_rng(stream_seed(exp.seed, "eval", 0)).permutation(len(distinct))
        held, count = set(), 0
        for index in order:
            if count >= exp.eval_prompts:
                break
            held.add(distinct[index])
            count += prompts.count(distinct[index])
        rows = np.array([p in held for p in prompts])
        if rows.all() or count < exp.eval_prompts:
            raise ConfigError(f"reward_model.path holds {len(data)} records of {len(distinct)} prompts: holding out "
                              f"eval_prompts={exp.eval_prompts} records leaves none to train on (lower eval_prompts, "
                              "or give reward_model.eval_path)")
        return data.take(np.flatnonzero(~rows)), data.take(np.flatnonzero(rows))

    def trainable(self, params) -> tuple[nnx.State, nnx.State | None]:
        """(what the optimizer moves, the frozen rest): with LoRA the trunk's adapters and the head, else
        every weight; the head's bias b only for a process reward model (Bradley-Terry gives it no
        gradient, and a sequence classifier has none: it stays 0)."""
        bias = self.exp.stage == "process_reward_model"

        def moves(path, value) -> bool:
            if path[0] in ("head", "bias"):
                return path[0] == "head" or bias
            return not self.lora or isinstance(value, lora.LoRAParam)
        trainable, frozen = nnx.split_state(params, moves, ...)
        return (trainable, frozen) if jax.tree.leaves(frozen) else (params, None)

    def _join(self, trainable, frozen) -> nnx.State:
        return trainable if frozen is None else nnx.merge_state(trainable, frozen)

    def batch_rows(self, step: int) -> np.ndarray:
        """The training records of step ``step`` (0-based): the next ``prompts_per_step`` of the epochs'
        permutations (epoch e's drawn with seed stream ``train``, e)."""
        size, count = self.exp.prompts_per_step, len(self.train_data)
        positions = np.arange(step * size, (step + 1) * size)
        epochs = positions // count
        orders = {e: np.random.default_rng(stream_seed(self.exp.seed, "train", int(e))).permutation(count)
                  for e in np.unique(epochs)}
        return np.array([orders[e][p % count] for e, p in zip(epochs, positions, strict=True)])

    def _global(self, *arrays):
        """This process's rows of ``arrays`` (each with every process's rows) as global arrays split over
        the mesh's batch axes."""
        rows = multihost.process_rows(len(arrays[0]), self.mesh)
        return multihost.to_global(tuple(a[rows] for a in arrays), self.mesh)

    def step(self) -> dict:
        """One optimizer step on the step's records; its record: the loss, the batch's accuracy, the
        gradient norm, and the mean chosen and rejected scores and their gap (pairs) or the mean
        probability of a right step (step labels)."""
        batch = self.train_data.take(self.batch_rows(self.step_count))
        batch = type(batch)(*self._global(*batch.arrays()))
        trainable, frozen = self.trainable(self.state.params)
        # donated: the step's result replaces them
        opt_state, self.state = self.state.opt_state, None  # type: ignore[assignment]  # None until then
        trainable, opt_state, metrics = train_step(self.graphdef, self.optimizer, self.objective, trainable, opt_state,
                                                   frozen, batch, mesh=self.mesh)
        self.state = RewardModelState(self._join(trainable, frozen), opt_state)
        self.step_count += 1
        self.started = True
        record = {name: float(value) for name, value in jax.device_get(metrics).items()}
        if "chosen_score" in record:
            record["score_gap"] = record["chosen_score"] - record["rejected_score"]
        return {"step": self.step_count, **record}

    def evaluate(self, chunk: int = 64) -> dict:
        """The held-out accuracy (``eval_accuracy``: pairs ordered right, a tie counting half; or steps
        classified right) with its Wilson 95% interval (``eval_accuracy_low``, ``eval_accuracy_high``;
        the steps of one response are counted as independent, which they are not) and the mean loss
        (``eval_loss``), in chunks of ``chunk`` records (the last padded with weight 0: one compiled
        shape)."""
        data, totals = self.eval_data, np.zeros(3)
        shards = mesh_lib.batch_shards(self.mesh)
        chunk = -(-min(chunk, len(data)) // shards) * shards
        for start in range(0, len(data), chunk):
            rows = np.arange(start, min(start + chunk, len(data)))
            weights = (np.arange(chunk) < len(rows)).astype(np.float32)
            part = data.take(np.concatenate([rows, np.zeros(chunk - len(rows), int)]))
            *arrays, weights = self._global(*part.arrays(), weights)
            sums = evaluation_counts(self.graphdef, self.counts, self.state.params, type(part)(*arrays), weights,
                                     mesh=self.mesh)
            totals += np.asarray([float(x) for x in sums])
        hits, loss, count = totals
        low, high = wilson_interval(hits, count)
        return {"eval_accuracy": hits / count, "eval_accuracy_low": low, "eval_accuracy_high": high,
                "eval_loss": loss / count}

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
        """The trained reward model into ``run``'s ``final/`` (a transformers sequence classifier, or a
        token classifier for a process reward model)."""
        self._check_finite("final/")
        run.export(nnx.merge(self.graphdef, multihost.gather(self.state.params)), classifier=self.classifier)

