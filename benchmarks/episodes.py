"""Multi-turn episodes with the KV cache carried across turns, against re-prefilling each turn's history.

    python benchmarks/episodes.py --model models/smollm2-135m-instruct --turns 4 --rounds 6 \\
        --json benchmarks/results/episodes_smollm2.json

Matched work: the same ``word_math`` prompts through the model's chat template, ``--samples``
episodes of each, and an environment that answers every reply with the same user message
(``--observation``) until ``--turns`` replies. Carried: ``pgjax.rollout.episodes.run_episodes`` (one
prefill per prompt, each observation appended once to its row's cache). Re-prefilled: every turn,
``generate`` on each row's whole history so far (prompt, replies and observations, left-padded),
as a loop over a single-turn sampler plays episodes. A reply cut by ``--reply-tokens`` ends its
episode on both sides. Both sides draw turn t with the same key, so while every episode goes on
they sample the same replies (the same uniforms per row and step, up to the float rounding of their
different cache layouts); once some have ended the re-prefilled batch holds only the others, its
rows draw other uniforms, and the two sides' later replies match in distribution, not token for
token. Reported, so the match can be judged: the replies that agree, the episodes cut, and the
tokens each side's prefills read and its decode steps produce.

Rounds alternate the order (A B, then B A); each side's first call compiles and is left out, and
from every later call the seconds JAX spent tracing, lowering and compiling are taken out (a shape
first met: the re-prefilled side pads its histories to a multiple of ``WIDTH_UNIT`` tokens and its
batch to a multiple of ``ROW_UNIT`` rows, as a loop over ``generate`` would to reuse its programs;
the filler rows' tokens are not counted).
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

from pgjax import markdown  # noqa: E402
from pgjax.agents import Step  # noqa: E402
from pgjax.evaluation.statistics import describe_ratio, median_interval, median_ratio  # noqa: E402
from pgjax.models import hf  # noqa: E402
from pgjax.rollout.collect import decode_responses, left_pad, pad_id, prompt_format_for, stop_tokens  # noqa: E402
from pgjax.rollout.episodes import EpisodeLimits, opening_ids, opening_turns, run_episodes  # noqa: E402
from pgjax.sample import SamplingConfig, generate  # noqa: E402
from pgjax.tasks import make_task  # noqa: E402


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
    """Every turn ``generate`` on the whole history of each row whose episode goes on (a row whose reply
    is cut ends, as on the carried side)."""
    model, tokenizer, prompt_format, examples, sampling, limits, width, text = setup
    start, prefilled, generated = time.perf_counter(), 0, 0
    turns = [opening_turns(prompt_format, Echo(text).reset(e)) for e in examples for _ in range(sampling.n)]
    histories = [tokenizer(prompt_format.render_turns(tokenizer, t), add_special_tokens=prompt_format.special_tokens
                           )["input_ids"] for t in turns]
    one = SamplingConfig(**{**sampling.decoding()}, eos_ids=sampling.eos_ids, pad_id=sampling.pad_id, n=1)
    replies, live, cut = [[] for _ in histories], list(range(len(histories))), np.zeros(len(histories), bool)
    for turn in range(limits.max_turns):
        if not live:
            break
        # a few shapes, each compiled once: widths in WIDTH_UNIT steps, rows filled up to a ROW_UNIT multiple
        width = -(-max(len(histories[r]) for r in live) // WIDTH_UNIT) * WIDTH_UNIT
        batch = [histories[r] for r in live]
        batch += [batch[0]] * (-len(batch) % ROW_UNIT)
        tokens, mask = left_pad(tokenizer, batch, width)
        prefilled += int(mask[:len(live)].sum())
        samples = generate(model, tokens, mask, key if turn == 0 else jax.random.fold_in(key, turn), one)
        response, lengths = np.asarray(samples.response), np.asarray(samples.lengths)
        generated += int(lengths[:len(live)].sum())
        texts = decode_responses(tokenizer, response, lengths, sampling.eos_ids)
        going = []
        for row, (r, reply) in enumerate(zip(live, texts, strict=False)):
            ids = response[row, :lengths[row]].tolist()
            replies[r].append(reply)
            cut[r] = not (ids and ids[-1] in sampling.eos_ids)
            if cut[r] or turn == limits.max_turns - 1:
                continue                                   # cut (or the last turn): the episode ends
            observation = [{"role": "user", "content": text}]
            following = prompt_format.continuation(tokenizer, turns[r], reply, tokenizer.decode(ids[-1:]), observation)
            histories[r] = histories[r] + ids + tokenizer(following, add_special_tokens=False)["input_ids"]
            turns[r] = [*turns[r], {"role": "assistant", "content": reply}, *observation]
            going.append(r)
        live = going
    return {"seconds": time.perf_counter() - start, "prefilled": prefilled, "generated": generated,
            "replies": replies, "cut": int(cut.sum())}


SIDES = {"carried": carried, "re-prefilled": reprefilled}
WIDTH_UNIT = 64                 # the re-prefilled side pads each turn's histories to a multiple of this
ROW_UNIT = 8                    # and fills its batch up to a multiple of this many rows (copies, unused)
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
COMPILED = {"n": 0, "s": 0.0}


def _count_compile(event, duration, **_):
    if event in COMPILE_EVENTS:
        COMPILED["s"] += duration
        COMPILED["n"] += event == COMPILE_EVENTS[-1]


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def _side_row(side: str, seconds: list[float], runs: list[dict], ratio: dict) -> list[str]:
    """One side's row of the table: its median time [95% interval], the median tokens prefilled and
    generated and episodes cut, and (for the carried side) re-prefilled / carried."""
    m = median_interval(seconds)
    medians = [str(int(np.median([r[key] for r in runs]))) for key in ("prefilled", "generated", "cut")]
    return [side, f"{m['median']:.2f} [{m['low']:.2f}, {m['high']:.2f}]", *medians,
            describe_ratio(ratio) if side == "carried" else "1"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a checkpoint directory with a chat template")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--reply-tokens", type=int, default=64)
    parser.add_argument("--observation", default="Check your answer once more, then give it again.",
                        help="the environment's message after every reply but the last")
    parser.add_argument("--observation-tokens", type=int, default=32,
                        help="EpisodeLimits.max_observation_tokens: sizes the carried side's cache")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds per side (after one compiling round)")
    parser.add_argument("--json", help="save the table and the per-round data here")
    args = parser.parse_args(argv)
    model, tokenizer = hf.load(args.model), hf.load_tokenizer(args.model)
    prompt_format = prompt_format_for(tokenizer)
    eos_ids, _ = stop_tokens(tokenizer, prompt_format, (args.model,))
    examples = make_task("word_math", digits=2).examples(args.prompts, seed=0)
    width = max(map(len, opening_ids(tokenizer, prompt_format, [Echo("").reset(e) for e in examples])))
    sampling = SamplingConfig(max_new_tokens=args.reply_tokens, temperature=1.0, eos_ids=eos_ids, n=args.samples,
                              pad_id=pad_id(tokenizer))
    limits = EpisodeLimits(max_turns=args.turns, max_tokens=10 ** 6, max_observation_tokens=args.observation_tokens)
    setup = (model, tokenizer, prompt_format, examples, sampling, limits, width, args.observation)
    runs = {side: [] for side in SIDES}
    for round_ in range(args.rounds + 1):
        order = list(SIDES) if round_ % 2 == 0 else list(SIDES)[::-1]
        for side in order:
            compiles, compile_seconds = COMPILED["n"], COMPILED["s"]
            result = SIDES[side](setup, jax.random.key(round_))
            result["compiled"] = COMPILED["n"] - compiles
            result["compile_seconds"] = COMPILED["s"] - compile_seconds
            result["seconds"] -= result["compile_seconds"]
            if round_:
                runs[side].append(result)
            print(f"round {round_} {side}: {result['seconds']:.2f} s, {result['prefilled']} prefilled, "
                  f"{result['generated']} generated, {result['cut']} cut, {result['compiled']} compiled "
                  f"({result['compile_seconds']:.1f} s, not counted)", flush=True)
    agree = np.mean([a == b for x, y in zip(runs["carried"], runs["re-prefilled"], strict=True)
                     for a, b in zip(x["replies"], y["replies"], strict=True)])
    seconds = {side: [r["seconds"] for r in runs[side]] for side in SIDES}
    ratio = median_ratio(seconds["re-prefilled"], seconds["carried"])
    rows = args.prompts * args.samples
    capacity = width + args.turns * args.reply_tokens + (args.turns - 1) * args.observation_tokens
    table = [f"{rows} episodes ({args.prompts} `word_math` prompts x {args.samples}) of up to {args.turns} replies "
             f"(at most {args.reply_tokens} tokens each; the carried side's cache {capacity} slots: "
             f"max_observation_tokens {args.observation_tokens}) on `{args.model}`, a fixed observation after each "
             f"but the last; {args.rounds} rounds per side after a compiling one, JAX's tracing, lowering and "
             f"compiling left out of each call ({sum(r['compiled'] for r in runs['re-prefilled'])} programs compiled "
             f"in the re-prefilled side's timed rounds, {sum(r['compiled'] for r in runs['carried'])} in the "
             f"carried side's); {agree:.0%} of the episodes' replies the same on both sides:", "",
             *markdown.table(["side", "s per batch (median [95% interval])", "tokens prefilled", "tokens generated",
                              "episodes cut", "re-prefilled / carried"],
                             [_side_row(side, seconds[side], runs[side], ratio) for side in SIDES]).splitlines()]
    save_table(args.json, argv if argv is not None else sys.argv[1:], table, seconds=seconds, ratio=ratio,
               agree=float(agree), prefilled={s: [r["prefilled"] for r in runs[s]] for s in SIDES},
               generated={s: [r["generated"] for r in runs[s]] for s in SIDES})


if __name__ == "__main__":
    main()
