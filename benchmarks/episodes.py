"""Multi-turn episodes with the KV cache carried across turns, against re-prefilling each turn's history.

    python benchmarks/episodes.py --model models/smollm2-135m-instruct --turns 4 --rounds 6 \\
        --json benchmarks/results/episodes_smollm2.json

Matched work: the same ``word_math`` prompts through the model's chat template, ``--samples``
episodes of each, and an environment that answers every reply with the same user message
(``--observation``) until ``--turns`` replies. Carried: ``pgjax.train.episodes.run_episodes`` (one
prefill per prompt, each observation appended once to its row's cache). Re-prefilled: every turn,
``generate`` on each row's whole history so far (prompt, replies and observations, left-padded),
as a loop over a single-turn sampler plays episodes. Both sides draw turn t with the same key and
the same uniforms per row and step (``generate``'s rows are the episodes' rows, in order), so they
sample the same replies up to the float rounding of their different cache layouts; a row whose reply
is cut by ``--reply-tokens`` ends its episode on the carried side and is still decoded (its tokens
unused) on the re-prefilled one. Reported, so the match can be judged: the replies that agree, the
episodes cut, and the tokens each side's prefills read and its decode steps produce.

Rounds alternate the order (A B, then B A); each side's first call compiles and is left out.
Reported: the median seconds of a batch of episodes with a bootstrap interval and re-prefilled /
carried with its interval.
"""
import argparse
import pathlib
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from readme_tables import save_table  # noqa: E402
from stats import describe, median_interval, median_ratio  # noqa: E402

from pgjax.agents import Step  # noqa: E402
from pgjax.models import hf  # noqa: E402
from pgjax.rewards import make_task  # noqa: E402
from pgjax.sample import SamplingConfig, generate  # noqa: E402
from pgjax.train.episodes import EpisodeLimits, opening_turns, run_episodes  # noqa: E402
from pgjax.train.rollout import decode_responses, left_pad, pad_id, prompt_format_for, stop_tokens  # noqa: E402


class Echo:
    """Every reply is answered with the same user message; the episode runs to the turn limit."""

    def __init__(self, text: str):
        self.text = text

    def reset(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, reply):
        return Step(observation=[{"role": "user", "content": self.text}])


def carried(setup, key) -> dict:
    """``run_episodes``: seconds, tokens prefilled, replies, episodes cut."""
    model, tokenizer, prompt_format, examples, sampling, limits, width, text = setup
    start = time.perf_counter()
    episodes = run_episodes(model, tokenizer, lambda: Echo(text), examples, key, sampling, limits, prompt_format,
                            width)
    return {"seconds": time.perf_counter() - start, "prefilled": episodes.prefill_tokens,
            "generated": int(episodes.mask.sum()), "replies": episodes.replies, "cut": int(episodes.truncated.sum())}


def reprefilled(setup, key) -> dict:
    """Every turn ``generate`` on each row's whole history (all rows, in the episodes' order)."""
    model, tokenizer, prompt_format, examples, sampling, limits, width, text = setup
    start, prefilled, generated = time.perf_counter(), 0, 0
    turns = [opening_turns(prompt_format, Echo(text).reset(e)) for e in examples for _ in range(sampling.n)]
    histories = [tokenizer(prompt_format.render_turns(tokenizer, t), add_special_tokens=prompt_format.special_tokens
                           )["input_ids"] for t in turns]
    one = SamplingConfig(**{**sampling.decoding()}, eos_ids=sampling.eos_ids, pad_id=sampling.pad_id, n=1)
    replies, cut = [[] for _ in histories], np.zeros(len(histories), bool)
    for turn in range(limits.max_turns):
        tokens, mask = left_pad(tokenizer, histories, max(map(len, histories)))
        prefilled += int(mask.sum())
        samples = generate(model, tokens, mask, key if turn == 0 else jax.random.fold_in(key, turn), one)
        response, lengths = np.asarray(samples.response), np.asarray(samples.lengths)
        generated += int(lengths[~cut].sum())
        texts = decode_responses(tokenizer, response, lengths, sampling.eos_ids)
        for r, reply in enumerate(texts):
            ids = response[r, :lengths[r]].tolist()
            ended = bool(lengths[r]) and ids[-1] in sampling.eos_ids
            if not cut[r]:
                replies[r].append(reply)
            cut[r] |= not ended
            histories[r] = histories[r] + ids
            if turn < limits.max_turns - 1:
                observation = [{"role": "user", "content": text}]
                end_text = tokenizer.decode(ids[-1:]) if ended else ""
                following = prompt_format.continuation(tokenizer, turns[r], reply, end_text, observation)
                histories[r] = histories[r] + tokenizer(following, add_special_tokens=False)["input_ids"]
                turns[r] = [*turns[r], {"role": "assistant", "content": reply}, *observation]
    return {"seconds": time.perf_counter() - start, "prefilled": prefilled, "generated": generated,
            "replies": replies, "cut": int(cut.sum())}


SIDES = {"carried": carried, "re-prefilled": reprefilled}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a checkpoint directory with a chat template")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--reply-tokens", type=int, default=64)
    parser.add_argument("--observation", default="Check your answer once more, then give it again.",
                        help="the environment's message after every reply but the last")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds per side (after one compiling round)")
    parser.add_argument("--json", help="save the table and the per-round data here")
    args = parser.parse_args(argv)
    model, tokenizer = hf.load(args.model), hf.load_tokenizer(args.model)
    prompt_format = prompt_format_for(tokenizer)
    eos_ids, _ = stop_tokens(tokenizer, prompt_format, (args.model,))
    examples = make_task("word_math", digits=2).examples(args.prompts, seed=0)
    openings = [prompt_format.render_turns(tokenizer, opening_turns(prompt_format, Echo("").reset(e)))
                for e in examples]
    width = max(map(len, tokenizer(openings, add_special_tokens=prompt_format.special_tokens)["input_ids"]))
    sampling = SamplingConfig(max_new_tokens=args.reply_tokens, temperature=1.0, eos_ids=eos_ids, n=args.samples,
                              pad_id=pad_id(tokenizer))
    limits = EpisodeLimits(max_turns=args.turns, max_tokens=10 ** 6, max_observation_tokens=256)
    setup = (model, tokenizer, prompt_format, examples, sampling, limits, width, args.observation)
    runs = {side: [] for side in SIDES}
    for round_ in range(args.rounds + 1):
        order = list(SIDES) if round_ % 2 == 0 else list(SIDES)[::-1]
        for side in order:
            result = SIDES[side](setup, jax.random.key(round_))
            if round_:
                runs[side].append(result)
            print(f"round {round_} {side}: {result['seconds']:.2f} s, {result['prefilled']} prefilled, "
                  f"{result['generated']} generated, {result['cut']} cut", flush=True)
    agree = np.mean([a == b for x, y in zip(runs["carried"], runs["re-prefilled"])
                     for a, b in zip(x["replies"], y["replies"])])
    seconds = {side: [r["seconds"] for r in runs[side]] for side in SIDES}
    ratio = median_ratio(seconds["re-prefilled"], seconds["carried"])
    rows = args.prompts * args.samples
    table = [f"{rows} episodes ({args.prompts} `word_math` prompts x {args.samples}) of up to {args.turns} replies "
             f"(at most {args.reply_tokens} tokens each) on `{args.model}`, a fixed observation after each but the "
             f"last; {args.rounds} timed rounds per side after a compiling one; {agree:.0%} of the episodes' "
             "replies the same on both sides:", "",
             "| side | s per batch (median [95% interval]) | tokens prefilled | tokens generated | episodes cut "
             "| re-prefilled / carried |", "|---|---:|---:|---:|---:|---:|"]
    for side in SIDES:
        m = median_interval(seconds[side])
        medians = [int(np.median([r[key] for r in runs[side]])) for key in ("prefilled", "generated", "cut")]
        table.append(f"| {side} | {m['median']:.2f} [{m['low']:.2f}, {m['high']:.2f}] | "
                     + " | ".join(map(str, medians)) + f" | {describe(ratio) if side == 'carried' else '1'} |")
    save_table(args.json, argv if argv is not None else sys.argv[1:], table, seconds=seconds, ratio=ratio,
               agree=float(agree), prefilled={s: [r["prefilled"] for r in runs[s]] for s in SIDES},
               generated={s: [r["generated"] for r in runs[s]] for s in SIDES})


if __name__ == "__main__":
    main()
