"""A sample of a step's completions for the logs (``logging.completions_every``).

Every ``completions_every`` steps, ``completions_per_step`` rows of the step's batch are drawn
without replacement with a seed stream of their own (``stream_seed(seed, "completions", step)``),
so a resumed run, a run driven step by step and the command line log the same rows. A row holds
what the host has after scoring, with no second decode and no scoring but a regular expression:

  step, row, group      the RL step; the row p * K + k of the batch and its prompt group p
  reward                the training reward the update saw (None where a reward function gave a
                        non-finite value), and its parts where the reward has them: ``format_reward``
                        (0 / 1, with ``task.reward.format_weight``), ``overlong_penalty`` (with
                        ``rollout.overlong_buffer``)
  advantage             the mean of the row's per-token advantages over the tokens the update counts:
                        the sequence's advantage for outcome-reward algorithms, whose tokens all carry
                        it; the mean of the per-token (GAE) advantages for PPO; None for a row left out
  correct               the task's verifier scores it 1 (as the ``accuracy`` metric counts)
  length, truncated     response tokens (with the stop token), whether it hit ``max_new_tokens``
  kept                  whether the row counts in the update (``rollout`` filters, non-finite rewards)
  prompt, completion    the task's prompt (what rewards see, without the chat template) and the
                        decoded response, each clipped to ``completions_max_chars`` (``clip``)

The pipeline draws the rows when it scores the batch (``sample_rows``; an asynchronous batch in
flight keeps them in its checkpoint), the trainer adds the advantages after ``Learner.prepare``
(``with_advantages``) and ``RunDirectory.log`` writes them: completions.jsonl,
TensorBoard text, a W&B table (``pgjax.train.sinks``). On several processes the rows are drawn
among process 0's (the others' texts never reach it).
"""
from __future__ import annotations

import numpy as np

from pgjax.config import Experiment, LoggingSection, stream_seed
from pgjax.parallel import multihost
from pgjax.rollout.batch import Rollout
from pgjax.rollout.collect import overlong_penalty
from pgjax.tasks import format_reward


def logged_at(logging: LoggingSection, step: int) -> bool:
    """Whether RL step ``step`` (1, 2, ...) logs completions: every ``completions_every`` steps (0: never)."""
    return logging.completions_every > 0 and step % logging.completions_every == 0


def pick_rows(seed: int, step: int, rows: slice, n: int) -> list[int]:
    """``min(n, len(rows))`` distinct rows of ``rows`` (increasing), a function of ``seed`` and ``step``."""
    size = rows.stop - rows.start
    rng = np.random.default_rng(stream_seed(seed, "completions", step))
    return sorted(rows.start + int(i) for i in rng.choice(size, min(n, size), replace=False))


def clip(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters; else its first ceil(limit / 2) and last
    floor(limit / 2) characters around ``…[N characters cut]…`` (the start of an answer and its end,
    where the result is)."""
    if len(text) <= limit:
        return text
    head, tail, cut = (limit + 1) // 2, limit // 2, len(text) - limit
    return f"{text[:head]}…[{cut} character{'s' if cut > 1 else ''} cut]…{text[len(text) - tail:]}"


def sample_rows(exp: Experiment, stats: dict, step: int, local: slice, format_pattern: str) -> list[dict]:
    """The logged rows (module docstring; ``advantage`` None until ``with_advantages``) of the batch of
    RL step ``step``: ``pick_rows`` among ``local``, this process's rows of the batch, whose
    statistics ``stats`` are (``rollout.collect``'s, with ``prompts`` and ``completions``);
    ``format_pattern``: the task's, scored where ``task.reward.format_weight`` puts it in the reward."""
    k, limit = exp.rollout.samples_per_prompt, exp.logging.completions_max_chars
    picked = pick_rows(exp.seed, step, local, exp.logging.completions_per_step)
    at = [row - local.start for row in picked]
    parts = {}
    if exp.task.reward.format_weight:
        parts["format_reward"] = format_reward(format_pattern)([stats["prompts"][i] for i in at],
                                                               [stats["completions"][i] for i in at])
    if exp.rollout.overlong_buffer:
        r = exp.rollout
        parts["overlong_penalty"] = overlong_penalty(stats["length"][at], r.max_new_tokens, r.overlong_buffer,
                                                     r.overlong_penalty)
    rows = []
    for j, (row, i) in enumerate(zip(picked, at, strict=True)):
        entry = {"step": step, "row": row, "group": row // k,
                 "reward": None if stats["nonfinite"][i] else float(stats["reward"][i]),
                 **{name: float(values[j]) for name, values in parts.items()},
                 "advantage": None, "correct": bool(stats["correct"][i] == 1.0), "length": int(stats["length"][i]),
                 "truncated": bool(stats["truncated"][i]), "kept": bool(stats["kept"][i]),
                 "prompt": clip(stats["prompts"][i], limit), "completion": clip(stats["completions"][i], limit)}
        rows.append(entry)
    return rows


def with_advantages(rows: list[dict], rollout: Rollout, mesh) -> list[dict]:
    """``rows`` with their ``advantage`` from the prepared ``rollout`` (global, on ``mesh``): the sum
    of the row's advantages times its mask over the sum of its mask (None where the mask is empty).
    Reads this process's rows of the advantages and mask back to the host; computes nothing on the
    device."""
    advantages, mask = multihost.to_host((rollout.batch.advantages, rollout.mask), mesh)
    first = multihost.process_rows(rollout.mask.shape[0], mesh).start
    out = []
    for row in rows:
        i = row["row"] - first
        counted = float(mask[i].sum())
        mean = float((advantages[i].astype(np.float64) * mask[i]).sum() / counted) if counted else None
        out.append({**row, "advantage": mean})
    return out
