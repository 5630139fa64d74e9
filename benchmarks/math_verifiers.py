"""Final-answer verifiers side by side: pgjax's ``math_answers`` against ``math-verify`` (the verifier
TRL's accuracy reward and open-r1 use), on the same answer pairs, each at its defaults, in one process.

The pairs (``benchmarks/data/math_answer_pairs.jsonl``) are GSM8K / MATH-style final answers: a
reference as a dataset holds it, an answer a model gives, and whether the two are equal as a grader
reads them (numbers in their written forms, units, percent and dollar signs, thousands separators,
LaTeX fractions and roots, expressions, unordered sets and lists of solutions, ordered pairs, one
hostile power tower). Each verifier sees the completion ``The answer is \\boxed{ANSWER}.`` and the
reference, as a training reward does:

- pgjax: ``answers_equal(extract_answer(completion), reference_answer(reference))`` (what
  ``math_reward`` does for one row);
- math-verify: ``verify(parse("$REFERENCE$"), parse(completion))``, its own extraction and its
  default timeout.

A verifier is right on a pair when it says equal exactly where the label does. Time per pair: the
median over ``--repeats`` calls after one untimed call (imports and caches warm), and the pairs'
median and maximum of those. ``--json PATH`` saves the table, each pair's verdicts and times, and the
provenance. math-verify is a peer installed by hand (``pip install math-verify==0.9.0``), not a
dependency of pgjax.

    python benchmarks/math_verifiers.py --json benchmarks/results/math_verifiers.json
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

from readme_tables import save_table

from pgjax import markdown
from pgjax.tasks.math_answers import answers_equal, extract_answer, reference_answer

PAIRS = pathlib.Path(__file__).parent / "data" / "math_answer_pairs.jsonl"


def completion(answer: str) -> str:
    """The completion a model would write for ``answer``."""
    return f"The answer is \\boxed{{{answer}}}."


def pgjax_verdict(reference: str, answer: str) -> bool:
    return answers_equal(extract_answer(completion(answer)), reference_answer(reference))


def math_verify_verdict(reference: str, answer: str) -> bool:
    from math_verify import parse, verify
    return bool(verify(parse(f"${reference}$"), parse(completion(answer))))


def timed(verdict, pair: dict, repeats: int) -> tuple[bool, float]:
    """``verdict`` on ``pair``, and the median seconds of ``repeats`` calls after one untimed call."""
    result = verdict(pair["reference"], pair["answer"])
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        verdict(pair["reference"], pair["answer"])
        seconds.append(time.perf_counter() - start)
    return result, statistics.median(seconds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="save the results here")
    args = parser.parse_args(argv)
    pairs = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    sides = {"pgjax math_answers": pgjax_verdict, "math-verify 0.9.0": math_verify_verdict}
    results, rows = {}, []
    for name, verdict in sides.items():
        runs = [timed(verdict, pair, args.repeats) for pair in pairs]
        right = [said == pair["equal"] for (said, _), pair in zip(runs, pairs, strict=True)]
        seconds = [s for _, s in runs]
        results[name] = {"verdicts": [said for said, _ in runs], "seconds": seconds, "right": sum(right)}
        rows.append([name, f"{sum(right)} of {len(pairs)}", f"{1e3 * statistics.median(seconds):.3f}",
                     f"{1e3 * max(seconds):.1f}"])
        print(markdown.row(rows[-1]), flush=True)
    missed = {name: [f"{p['reference']} / {p['answer']}" for p, said in zip(pairs, r["verdicts"], strict=True)
                     if said != p["equal"]] for name, r in results.items()}
    table = markdown.table(["verifier", "pairs right", "median ms per pair", "slowest pair (ms)"], rows, "lrrr")
    save_table(args.json, sys.argv[1:], table.splitlines(), results=results, missed=missed, pairs=len(pairs))
    for name, wrong in missed.items():
        print(f"{name} wrong on: {'; '.join(wrong) or 'none'}")


if __name__ == "__main__":
    main()
