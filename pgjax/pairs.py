"""Preference pairs from a verifiable task, for training a reward model with no data downloaded: sample
a policy K times per prompt and let the task's verifier label the pairs.

    python -m pgjax.pairs MODEL_OR_RUN --task NAME [--set task.KEY=VALUE ...] --out PAIRS.jsonl
                          [--prompts P] [--samples K] [--max-new-tokens T] [--temperature 1.0] [--seed S]
                          [--pairs-per-prompt 2] [--shorter | --steps] [--batch-rows 512]

The prompts are the task's examples drawn with ``--seed`` as ``pgjax.eval`` draws its held-out ones
(pick a seed other than the evaluation's, so the reward model never sees the prompts its policy is
evaluated on); the responses are sampled and scored by the same path as evaluation
(``rollout.sample_and_score``). For each prompt, up to ``--pairs-per-prompt`` pairs are drawn at random,
without repeating a response, from:

- ``correct_over_incorrect``: a response the verifier scores higher (reward 1) over one it scores
  lower, their texts different;
- ``shorter_correct`` (with ``--shorter``): of two correct responses of different lengths (tokens),
  the shorter over the longer; a reward model trained on them learns to counter a length bias.

With ``--steps`` it writes step labels for a process reward model instead: each distinct response as
``{"prompt", "completions", "labels", "reward", "tags"}``, its lines the steps and each label whether
the solution is still right there (``pgjax.tasks.step_checks``: its arithmetic checked exactly, the
last step's answer by the verifier), the format ``stage="process_reward_model"`` reads.

A prompt whose K responses are all right or all wrong gives no ``correct_over_incorrect`` pair. Each
line of ``--out`` is ``{"prompt", "chosen", "rejected", "kind", "chosen_reward", "rejected_reward",
"tags"}`` (``tags``: the example's, e.g. ``difficulty``; a chat prompt as its list of messages), the
format ``pgjax.tasks.preferences`` reads (``stage="reward_model"``). An existing ``--out`` is never
overwritten; the file appears whole or not at all.

Exit status: 0 done; 1 a reward function failed on the responses; 2 a mistake in the arguments or
the task, found before any sampling.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import numpy as np

from pgjax import eval as eval_cli
from pgjax.evaluation.held_out import BATCH_ROWS, _in_batches, strata_of
from pgjax.parallel import multihost
from pgjax.parallel.mesh import single_device_mesh
from pgjax.rollout.collect import pad_id, sample_and_score
from pgjax.tasks import RewardError
from pgjax.tasks.data import Conversation
from pgjax.tasks.step_checks import checked_steps
from pgjax.train.checkpoints import write_atomically

KINDS = ("correct_over_incorrect", "shorter_correct")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pgjax.pairs", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", metavar="MODEL_OR_RUN", help="a Hugging Face checkpoint directory or a pgjax run "
                                                              "directory (its final/ policy)")
    parser.add_argument("--task", help="the task (required for a checkpoint directory; default for a run: the run's)")
    parser.add_argument("--set", action="append", default=[], metavar="task.KEY=VALUE", help="a task option")
    parser.add_argument("--out", required=True, help="the JSON Lines file to write (must not exist)")
    parser.add_argument("--prompts", type=int, default=256, help="prompts to sample")
    parser.add_argument("--samples", type=int, default=8, help="responses per prompt (K >= 2)")
    parser.add_argument("--max-new-tokens", help="response budget (default: the run's)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and the sampling")
    parser.add_argument("--pairs-per-prompt", type=int, default=2, help="pairs of each kind drawn per prompt, at most")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--shorter", action="store_true", help="also pair a shorter correct response over a longer one")
    kind.add_argument("--steps", action="store_true",
                      help="write step-labelled responses for a process reward model instead of pairs (their steps "
                           "the lines)")
    parser.add_argument("--batch-rows", type=int, default=BATCH_ROWS, help="responses per sampler call")
    return parser.parse_args(argv)


def pairs_of(prompt_responses: list[str], rewards: np.ndarray, lengths: np.ndarray, per_prompt: int, shorter: bool,
             rng: np.random.Generator) -> list[tuple[int, int, str]]:
    """(chosen index, rejected index, kind) of one prompt's K responses: up to ``per_prompt`` of each
    kind (module docstring), drawn with ``rng``, no response in two pairs of a kind, texts different."""
    out = []
    candidates = {"correct_over_incorrect": [(i, j) for i in range(len(rewards)) for j in range(len(rewards))
                                             if rewards[i] == 1.0 and rewards[j] < rewards[i]]}
    if shorter:
        candidates["shorter_correct"] = [(i, j) for i in range(len(rewards)) for j in range(len(rewards))
                                         if rewards[i] == rewards[j] == 1.0 and lengths[i] < lengths[j]]
    for kind, pairs in candidates.items():
        used, taken = set(), 0
        for index in rng.permutation(len(pairs)):
            i, j = pairs[index]
            if taken == per_prompt:
                break
            if i in used or j in used or prompt_responses[i] == prompt_responses[j]:
                continue
            out.append((i, j, kind))
            used |= {i, j}
            taken += 1
    return out


def _prompt_json(prompt):
    """A prompt as a preference record holds it: a chat prompt's messages, else its text."""
    return list(prompt.messages) if isinstance(prompt, Conversation) else str(prompt)


def generate(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """The pairs and a summary (counts per kind, prompts with a pair) from the command line."""
    if args.samples < 2 or args.pairs_per_prompt < 1:
        raise ValueError(f"--samples must be >= 2 and --pairs-per-prompt >= 1, got {args.samples} and "
                         f"{args.pairs_per_prompt}")
    if pathlib.Path(args.out).exists():
        raise ValueError(f"--out {args.out} exists: pgjax.pairs never overwrites a file (remove it or pick another)")
    settings = eval_cli.setup(argparse.Namespace(
        model=args.model, task=args.task, set=args.set, prompts=args.prompts, samples=args.samples, k=None,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, by=None,
        batch_rows=args.batch_rows))
    if settings["environment"] is not None:
        raise ValueError("pgjax.pairs pairs single responses: the task's episodes call tools "
                         "(task.tools.names); drop it")
    examples, tokenizer, k = settings["examples"], settings["tokenizer"], args.samples
    mesh = single_device_mesh()
    sampling = settings["decodings"][0].sampling(settings["eos_ids"], pad_id(tokenizer), n=k)

    def play(batch, key):
        scored = sample_and_score(settings["policy"], tokenizer, batch, settings["max_prompt_tokens"], key, sampling,
                                  {"reward": settings["task"].reward_fn}, mesh, "error", settings["prompt_format"])
        return {"reward": scored.scores["reward"], "length": scored.lengths,
                "completion": np.array(scored.completions, dtype=object)}
    rows = _in_batches(multihost.process_share(examples, mesh), jax.random.split(settings["key"])[1], k, mesh,
                       args.batch_rows, play)
    tags = strata_of(examples)
    if args.steps:
        return step_records(examples, rows, tags, k)
    rng = np.random.default_rng(args.seed)
    records, with_pair = [], 0
    for p, example in enumerate(examples):
        texts = list(rows["completion"][p * k:(p + 1) * k])
        rewards, lengths = rows["reward"][p * k:(p + 1) * k], rows["length"][p * k:(p + 1) * k]
        found = pairs_of(texts, rewards, lengths, args.pairs_per_prompt, args.shorter, rng)
        with_pair += bool(found)
        records += [{"prompt": _prompt_json(example["prompt"]), "chosen": texts[i], "rejected": texts[j], "kind": kind,
                     "chosen_reward": float(rewards[i]), "rejected_reward": float(rewards[j]),
                     "tags": {tag: values[p] for tag, values in tags.items()}} for i, j, kind in found]
    summary = {"prompts": len(examples), "samples": k, "prompts_with_a_pair": with_pair,
               "pairs": {kind: sum(r["kind"] == kind for r in records) for kind in KINDS},
               "sampled_accuracy": float(np.mean(rows["reward"] == 1.0))}
    return records, summary


def step_records(examples: list[dict], rows: dict, tags: dict, k: int) -> tuple[list[dict], dict]:
    """``--steps``: each distinct response of each prompt as a step-labelled record
    (``step_checks.checked_steps``, the verifier's reward judging the answer) and a summary."""
    records = []
    for p, example in enumerate(examples):
        seen = set()
        for i in range(p * k, (p + 1) * k):
            text, reward = rows["completion"][i], float(rows["reward"][i])
            checked = None if text in seen else checked_steps(text, reward == 1.0)
            seen.add(text)
            if checked:
                records.append({"prompt": _prompt_json(example["prompt"]), "completions": checked[0],
                                "labels": checked[1], "reward": reward,
                                "tags": {tag: values[p] for tag, values in tags.items()}})
    labels = [label for r in records for label in r["labels"]]
    return records, {"prompts": len(examples), "samples": k, "records": len(records), "steps": len(labels),
                     "steps_right": float(np.mean(labels)) if labels else None,
                     "sampled_accuracy": float(np.mean(rows["reward"] == 1.0))}


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        records, summary = generate(args)
    except RewardError as error:
        print(f"pgjax.pairs: stopped: {error}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, OSError, KeyError) as error:
        print(f"pgjax.pairs: error: {error}", file=sys.stderr)
        return 2
    if not records:
        why = ("no response had a step" if args.steps else
               "every prompt's responses were all right or all wrong; sample more, or at another temperature")
        print(f"pgjax.pairs: nothing to write: {json.dumps(summary)} ({why})", file=sys.stderr)
        return 2
    write_atomically(pathlib.Path(args.out), "".join(json.dumps(r) + "\n" for r in records))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
