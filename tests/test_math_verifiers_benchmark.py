"""benchmarks/math_verifiers.py: the committed answer pairs, and its record's pgjax column, which the
code as it is now gives again (math-verify's column is a peer's, installed by hand)."""
import json
import pathlib

from helpers import load_benchmark

ROOT = pathlib.Path(__file__).parent.parent
RECORD = ROOT / "benchmarks" / "results" / "math_verifiers.json"


def test_the_pairs_are_labelled_final_answers():
    pairs = [json.loads(line) for line in (ROOT / "benchmarks" / "data" / "math_answer_pairs.jsonl").read_text()
             .splitlines()]
    assert len(pairs) == 46 and len({(p["reference"], p["answer"]) for p in pairs}) == 46
    assert all(set(p) == {"reference", "answer", "equal"} and isinstance(p["equal"], bool) for p in pairs)
    assert 0 < sum(p["equal"] for p in pairs) < 46


def test_the_records_pgjax_verdicts_are_the_codes_and_its_counts_add_up():
    bench = load_benchmark("math_verifiers")
    pairs = [json.loads(line) for line in bench.PAIRS.read_text().splitlines()]
    saved = json.loads(RECORD.read_text())
    ours = saved["results"]["pgjax math_answers"]
    assert ours["verdicts"] == [bench.pgjax_verdict(p["reference"], p["answer"]) for p in pairs]
    for name, side in saved["results"].items():
        right = sum(said == p["equal"] for said, p in zip(side["verdicts"], pairs, strict=True))
        assert side["right"] == right and f"| {name} | {right} of 46 |" in "\n".join(saved["table"])
        assert saved["missed"][name] == [f"{p['reference']} / {p['answer']}"
                                         for p, said in zip(pairs, side["verdicts"], strict=True) if said != p["equal"]]
