"""A trained reward model as the training reward of RL (``task.reward.model``); a process reward
model's per-step scores as per-token rewards (``Mix.token_rewards``).

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

from pgjax import core
from pgjax.config.keys import upgraded
from pgjax.models import hf
from pgjax.parallel import multihost
from pgjax.parallel.mesh import batch_shards, shard, single_device_mesh
from pgjax.rollout.collect import prompt_format_for, right_pad
from pgjax.tasks import RewardError

WIDTH_UNIT = 32         # scored widths are rounded up to this: few compiled shapes


@partial(jax.jit, static_argnames=("graphdef", "per_token", "mesh"))
def _outputs(graphdef, params, tokens, mask, per_token: bool, mesh=None):
    """A reward model's scores [B], or its logits at every token [B, W] (``per_token``)."""
    model = nnx.merge(graphdef, params)
    return model(tokens, mask, mesh) if per_token else model.scores(tokens, mask, mesh)


def reward_model_directory(path) -> pathlib.Path:
    """The classifier checkpoint of ``path``: itself, or a pgjax run's ``final/``."""
    path = pathlib.Path(path)
    final = path / "final"
    return final if (final / "config.json").is_file() and not (path / "config.json").is_file() else path


def step_places(tokenizer, prompt_format, prompt, response: str, ends) -> tuple[list[int], list[int]]:
    """How a process reward model reads ``response``'s steps, in its training
    (``reward_trainer.encode_steps``) and in RL (``LearnedReward.step_logits``) alike: (the token ids of
    the exchange, for each step's last character ``ends`` (indices into ``response``) the last token of
    the exchange's text up to it). ValueError where the template does not write the response as it
    is after the prompt (the steps could not be placed)."""
    text = prompt_format.exchange(tokenizer, prompt, response)
    start = len(prompt_format.render_turns(tokenizer, prompt_format.turns(prompt)))
    if text[start:start + len(response)] != response:
        raise ValueError(f"the template does not write the response as it is after the prompt ({response[:60]!r})")
    special = prompt_format.special_tokens
    return (tokenizer(text, add_special_tokens=special)["input_ids"],
            [len(tokenizer(text[:start + end + 1], add_special_tokens=special)["input_ids"]) - 1 for end in ends])


def step_ends(response: str, separator: str) -> list[int]:
    """The last character of each step of ``response``: its parts between ``separator``, blank ones
    skipped."""
    ends, at = [], 0
    for step in response.split(separator):
        at += len(step)
        if step.strip():
            ends.append(at - 1)
        at += len(separator)
    return ends


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
        task, section = {}, {}
        saved = directory.parent / "experiment.json"
        if directory.name == "final" and saved.is_file():
            record = upgraded(json.loads(saved.read_text()))
            task, section = record["task"].get("prompt", {}), record.get("reward_model", {})
        # a process reward model's steps, split as in its training (with_escapes: "\\n" is a line break)
        self.separator = section.get("step_separator", "\\n").replace("\\n", "\n").replace("\\t", "\t")
        self.prompt_format = prompt_format_for(self.tokenizer, task.get("chat_template", "auto"),
                                               task.get("system_prompt", ""), task.get("template", "{prompt}"))
        architectures = json.loads((directory / "config.json").read_text()).get("architectures") or []
        self.kind = "token" if any(a.endswith("ForTokenClassification") for a in architectures) else "sequence"
        self.graphdef, params = nnx.split(hf.load_reward_model(directory))
        self.params = shard(params, self.mesh)
        self.batch_rows = max(batch_rows, batch_shards(self.mesh))
        self.__name__ = f"reward_model:{directory}"

    def __call__(self, prompts, completions, **_) -> np.ndarray:
        """The score of each completion [R] (this process's rows; every process calls it together)."""
        texts = [self.prompt_format.exchange(self.tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
        ids = self.tokenizer(texts, add_special_tokens=self.prompt_format.special_tokens)["input_ids"]
        return self._run(ids, per_token=False)

    def step_logits(self, prompts, completions) -> list[list[tuple[int, float]]]:
        """A process reward model's view of each completion [R]: (the step's last character in the
        completion, the model's logit there) per step, the completion split at ``separator`` (its
        training run's ``reward_model.step_separator``; blank steps skipped), each logit read at the
        last token of the exchange up to the step's end, as in its training
        (``reward_trainer.encode_steps``). RewardError for a completion the chat template does not
        write as it is, or a logit that is not finite."""
        rows, ids, places = [], [], []
        for prompt, completion in zip(prompts, completions, strict=True):
            ends = step_ends(completion, self.separator)
            try:
                one, tokens = step_places(self.tokenizer, self.prompt_format, prompt, completion, ends)
            except ValueError as error:
                raise RewardError(f"{self.__name__}: {error}, so its steps cannot be placed") from None
            rows.append(ends)
            ids.append(one)
            places.append(tokens)
        logits = self._run(ids, per_token=True)
        out = [[(end, float(logits[r, token])) for end, token in zip(rows[r], places[r], strict=True)]
               for r in range(len(rows))]
        bad = next(((r, z) for r, row in enumerate(out) for _, z in row if not np.isfinite(z)), None)
        if bad is not None:
            raise RewardError(f"{self.__name__} returned {bad[1]} for a step of row {bad[0]} of {len(out)}")
        return out

    def _run(self, ids: list[list[int]], per_token: bool) -> np.ndarray:
        """The model's scores [R] or logits [R, W] of token sequences, right-padded to one width agreed
        by every process and run in chunks of ``batch_rows`` on the mesh."""
        width = multihost.largest(-(-max(map(len, ids)) // WIDTH_UNIT) * WIDTH_UNIT, self.mesh)   # one shape
        tokens, mask = right_pad(self.tokenizer, ids, width)
        local = max(1, batch_shards(self.mesh) // jax.process_count())
        chunk = -(-min(self.batch_rows // jax.process_count(), len(ids)) // local) * local
        out = []
        for start in range(0, len(ids), chunk):
            rows = np.arange(start, min(start + chunk, len(ids)))
            padded = np.concatenate([rows, np.full(chunk - len(rows), rows[0])])
            part = multihost.to_global((tokens[padded], mask[padded]), self.mesh)
            outputs = _outputs(self.graphdef, self.params, *part, per_token, mesh=self.mesh)
            out.append(np.asarray(multihost.to_host(outputs, self.mesh))[:len(rows)])
        return np.concatenate(out).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Mix:
    """How ``collect`` builds the training reward from the verifier's (``reward_fn``) and a learned one
    (module docstring)."""
    reward_model: LearnedReward | None = None
    reward_model_weight: float = 1.0
    normalize: str = "none"

    @property
    def per_step(self) -> bool:
        """Whether the learned reward is a process reward model (its rewards per step, ``token_rewards``)."""
        return getattr(self.reward_model, "kind", "sequence") == "token"

    def token_rewards(self, tokenizer, prompts, completions, response, lengths, eos_ids):
        """A process reward model's rewards on the policy's tokens [R, N] and each response's learned
        score [R] (their sum): each step's reward, weight x f(sigma(z)) (f: ``transform`` over every
        step of the batch), on the policy token that holds the step's last character (``tokenizer``
        decodes ``response`` [R, N] token by token, as the completions were decoded)."""
        steps = self.reward_model.step_logits(prompts, completions)
        logits = np.array([z for row in steps for _, z in row], np.float32)
        values = self.transform(np.asarray(core.step_rewards(logits, np.ones_like(logits)), np.float32))
        rewards, at = np.zeros(np.asarray(response).shape, np.float32), 0
        for r, row in enumerate(steps):
            ends = character_ends(tokenizer, np.asarray(response)[r], int(lengths[r]), eos_ids)
            for end, _ in row:
                rewards[r, min(int(np.searchsorted(ends, end, side="right")), len(ends) - 1)] += (
                    self.reward_model_weight * values[at])
                at += 1
        return rewards, rewards.sum(1)

    def combine(self, task_rewards: np.ndarray, learned: np.ndarray | None, reference: np.ndarray | None = None):
        """``task_rewards`` + weight * f(``learned``); ``reference``: the scores whose mean and standard
        deviation whiten (default: ``learned`` itself; a ReMax greedy batch uses its sampled batch's)."""
        if self.reward_model is None:
            return task_rewards
        if learned is None:
            raise ValueError("a run with a reward model combines its scores: learned is None")
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


def character_ends(tokenizer, ids, length: int, eos_ids) -> np.ndarray:
    """[n] the end (exclusive) in the decoded response of each of its first n tokens (the response's
    ``length`` tokens, its final stop token left out as ``decode_responses`` leaves it out): token i
    holds the characters ends[i-1] .. ends[i] - 1."""
    ids = list(ids[:length])
    if ids and ids[-1] in eos_ids:
        ids = ids[:-1]
    ends = np.array([len(tokenizer.decode(ids[:i + 1])) for i in range(len(ids))] or [0], np.int64)
    return np.maximum.accumulate(ends)    # a byte-fallback token decodes to fewer characters until it is whole
