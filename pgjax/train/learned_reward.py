"""A trained reward model as the training reward of RL (``task.reward_model``).

``LearnedReward`` is a reward function like any other, ``fn(prompts, completions, **fields)``, so it sits
in the rollout's one path from samples to rewards (``rollout.sample_and_score``: sample, decode,
score): each completion is written with its prompt as the reward model read its pairs
(``PromptFormat.exchange``, with the reward model's own tokenizer and chat template), tokenized,
and scored on the device in batches of ``batch_rows`` (its parameters and the batch split over the
policy's mesh, as the policy's are).

``collect`` mixes the scores into the training reward (``Mix``):

    r = verifier_weight * r_task + reward_model_weight * f(r_model) - length_penalty * |y| / T

with f the identity or, for ``reward_model_normalize="batch"``, the whitening over the step's responses
(mean 0, standard deviation 1; a learned reward has no scale of its own). The step's record keeps
the raw scores' mean (``learned_reward``) beside the verifier's accuracy on the same responses and
their agreement (``reward_model_agreement``: of the pairs of a prompt's responses the verifier tells
apart, the share the reward model orders the same way, a tie counting half): when optimising the
learned reward stops improving the true one, the score keeps rising while these stop or fall.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from functools import partial

import jax
import numpy as np
from flax import nnx

from pgjax.models import hf
from pgjax.parallel import multihost
from pgjax.parallel.mesh import batch_shards, shard, single_device_mesh
from pgjax.train.rollout import prompt_format_for, right_pad

NORMALIZE = ("none", "batch")
WIDTH_UNIT = 32         # scored widths are rounded up to this: few compiled shapes


@partial(jax.jit, static_argnames=("graphdef", "mesh"))
def _scores(graphdef, params, tokens, mask, mesh=None):
    return nnx.merge(graphdef, params).scores(tokens, mask, mesh)


def reward_model_directory(path) -> pathlib.Path:
    """The classifier checkpoint of ``path``: itself, or a pgjax run's ``final/``."""
    path = pathlib.Path(path)
    final = path / "final"
    return final if (final / "config.json").is_file() and not (path / "config.json").is_file() else path


class LearnedReward:
    """r(x, y) of the reward model at ``path`` (a transformers sequence classifier, or a pgjax
    reward-model run whose ``final/`` is one; its run's chat template, system prompt and prompt
    template render the exchanges, as in its training)."""

    def __init__(self, path, mesh=None, batch_rows: int = 64):
        directory = reward_model_directory(path)
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"{path}: no config.json (a trained reward model: a stage=reward_model run "
                                    "directory, or a transformers sequence classifier)")
        self.mesh = single_device_mesh() if mesh is None else mesh
        self.tokenizer = hf.load_tokenizer(directory)
        task = {}
        saved = directory.parent / "experiment.json"
        if directory.name == "final" and saved.is_file():
            task = json.loads(saved.read_text()).get("task", {})
        self.prompt_format = prompt_format_for(self.tokenizer, task.get("chat_template", "auto"),
                                               task.get("system_prompt", ""), task.get("prompt_template", "{prompt}"))
        self.graphdef, params = nnx.split(hf.load_reward_model(directory))
        self.params = shard(params, self.mesh)
        self.batch_rows = max(batch_rows, batch_shards(self.mesh))
        self.__name__ = f"reward_model:{directory}"

    def __call__(self, prompts, completions, **_) -> np.ndarray:
        """The score of each completion [R] (this process's rows; every process calls it together)."""
        texts = [self.prompt_format.exchange(self.tokenizer, p, c) for p, c in zip(prompts, completions)]
        ids = self.tokenizer(texts, add_special_tokens=self.prompt_format.special_tokens)["input_ids"]
        width = multihost.largest(-(-max(map(len, ids)) // WIDTH_UNIT) * WIDTH_UNIT, self.mesh)   # one shape
        tokens, mask = right_pad(self.tokenizer, ids, width)
        local = max(1, batch_shards(self.mesh) // jax.process_count())
        chunk = -(-min(self.batch_rows // jax.process_count(), len(ids)) // local) * local
        out = []
        for start in range(0, len(ids), chunk):
            rows = np.arange(start, min(start + chunk, len(ids)))
            padded = np.concatenate([rows, np.full(chunk - len(rows), rows[0])])
            part = multihost.to_global((tokens[padded], mask[padded]), self.mesh)
            scores = _scores(self.graphdef, self.params, *part, mesh=self.mesh)
            out.append(np.asarray(multihost.to_host(scores, self.mesh))[:len(rows)])
        return np.concatenate(out).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Mix:
    """How ``collect`` builds the training reward from the verifier's (``reward_fn``) and a learned one
    (module docstring)."""
    reward_model: LearnedReward | None = None
    reward_model_weight: float = 1.0
    normalize: str = "none"

    def combine(self, task_rewards: np.ndarray, learned: np.ndarray | None, reference: np.ndarray | None = None):
        """``task_rewards`` + weight * f(``learned``); ``reference``: the scores whose mean and standard
        deviation whiten (default: ``learned`` itself; a ReMax greedy batch uses its sampled batch's)."""
        if self.reward_model is None:
            return task_rewards
        return task_rewards + self.reward_model_weight * self.transform(learned, reference)

    def transform(self, learned: np.ndarray, reference: np.ndarray | None = None) -> np.ndarray:
        """f(``learned``): itself, or whitened by the mean and standard deviation of ``reference``
        (default: ``learned``) over every process's rows (each process holds its own share)."""
        if self.normalize == "none":
            return learned
        reference = learned if reference is None else reference
        sums = np.array([reference.sum(), np.square(reference, dtype=np.float64).sum(), reference.size], np.float64)
        if jax.process_count() > 1:
            sums = np.asarray(multihost.gather(sums)).reshape(-1, 3).sum(0)
        mean = sums[0] / sums[2]
        std = np.sqrt(max(sums[1] / sums[2] - mean * mean, 0.0))
        return ((learned - mean) / max(std, 1e-6)).astype(np.float32)


    def statistics(self, learned: np.ndarray, correct: np.ndarray, group_size: int) -> dict:
        """Per row [R] of a step's responses (groups of ``group_size``): the raw score ``learned``; and,
        over the row's prompt's other responses the verifier scores lower, how many pairs there are
        (``agreement_pairs``) and how many the learned reward orders the same way, a tie counting half
        (``agreement_wins``). Summed over any rows, wins / pairs is ``reward_model_agreement``."""
        scores, right = learned.reshape(-1, group_size), np.asarray(correct).reshape(-1, group_size)
        better = right[:, :, None] > right[:, None, :]                       # [P, K, K]: row i over row j
        order = np.where(scores[:, :, None] > scores[:, None, :], 1.0,
                         np.where(scores[:, :, None] == scores[:, None, :], 0.5, 0.0))
        return {"learned": learned, "agreement_pairs": better.sum(2).reshape(-1).astype(np.float32),
                "agreement_wins": (order * better).sum(2).reshape(-1).astype(np.float32)}

