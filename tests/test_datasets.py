"""Checks of a user's JSONL dataset at load time (pgjax.rewards.data)."""
import json

import pytest

import pgjax.rewards as R
from pgjax.rewards.tokenizer import char_tokenizer

GOOD = json.dumps({"question": "1+1?", "answer": "2"})


def _write(path, lines, text=None):
    path.write_text("\n".join(lines) + "\n" if text is None else text, encoding="utf-8")
    return path


def _error(path, **options) -> str:
    with pytest.raises(ValueError) as err:
        R.load_jsonl(path, **options)
    return str(err.value)


UNSCORABLE = "field 'answer': the answer cannot be scored (no final answer in {!r})"


@pytest.mark.parametrize("line, reason", [
    ('{"question": "   ", "answer": "1"}', "field 'question': the prompt is empty"),
    ('{"question": 3, "answer": "1"}', "field 'question': the prompt must be a string, got int"),
    ('{"question": "q", "answer": null}', "field 'answer': the answer is null"),
    ('{"question": "q", "answer": true}', "field 'answer': the answer must be a string or a number, got bool"),
    ('{"question": "q", "answer": [1]}', "field 'answer': the answer must be a string or a number, got list"),
    ('{"question": "q", "answer": {"a": 1}}', "field 'answer': the answer must be a string or a number, got dict"),
    ('{"question": "q", "answer": 1e999}', "field 'answer': the answer inf is not a finite number"),
    ('{"question": "q", "answer": NaN}', "field 'answer': the non-standard JSON constant NaN is not allowed"),
    ('{"question": "q", "answer": "1", "meta": {"x": [1, -Infinity]}}',
     "field 'meta': the non-standard JSON constant -Infinity is not allowed"),
    ("Infinity", "the non-standard JSON constant Infinity is not allowed"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"question": "q"}', "record lacks field(s) ['answer']; fields present: ['question']"),
    *[(json.dumps({"question": "q", "answer": a}), UNSCORABLE.format(a))
      for a in ["", "   ", "#### ", "\\boxed{", "The answer is \\boxed{}"]],
])
def test_bad_record_names_file_line_and_field(tmp_path, line, reason):
    path = _write(tmp_path / "data.jsonl", [GOOD, "", line, GOOD])  # a blank line 2: the bad record is line 3
    assert _error(path) == f"{path}:3: {reason}"


def test_missing_extra_field_and_failed_transform_name_the_line(tmp_path):
    path = _write(tmp_path / "data.jsonl", [GOOD, json.dumps({"question": "q", "answer": "no number", "id": 1})])
    assert _error(path, extra_fields=("id",)) == f"{path}:1: record lacks field(s) ['id']; fields present: " \
                                                 "['answer', 'question']"
    assert _error(path, answer_transform=R.extract_answer) == \
        f"{path}:2: no answer could be extracted from field 'answer': 'no number'"


@pytest.mark.parametrize("text, line, column", [
    (GOOD + '\n{"question": "q", "answer": "1"\n', 2, 32),  # cut short: err.colno said column 1 (of "line 2")
    (GOOD + '\r\n{"question": "q", "answer": "1"\r\n', 2, 32),
    (GOOD + '\n   {"question": x, "answer": "1"}\n', 2, 17),  # leading spaces count
    ('\ufeff{"question": x, "answer": "1"}\n', 1, 14),      # a BOM is not a column
    (GOOD + '\n{"question": "q", "answer": "1",}\n', 2, 33),
])
def test_invalid_json_column_is_within_the_line(tmp_path, text, line, column):
    path = _write(tmp_path / "data.jsonl", [], text=text)
    message = _error(path)
    assert message.startswith(f"{path}:{line}: invalid JSON (") and message.endswith(f" at column {column})")


def test_a_bom_on_the_first_line_is_allowed(tmp_path):
    path = _write(tmp_path / "data.jsonl", [], text="\ufeff" + GOOD + "\r\n" + GOOD + "\r\n")
    assert R.load_jsonl(path) == [{"prompt": "1+1?", "answer": "2"}] * 2


def test_numbers_stay_numbers(tmp_path):
    path = _write(tmp_path / "data.jsonl", [json.dumps({"question": "q", "answer": 72}),
                                            json.dumps({"question": "r", "answer": 2.5}),
                                            json.dumps({"question": "s", "answer": "-3"})])
    answers = [r["answer"] for r in R.load_jsonl(path)]
    assert answers == [72, 2.5, "-3"] and [type(a) for a in answers] == [int, float, str]
    task = R.JsonlMathTask(str(path))
    assert [e["answer"] for e in task.examples()] == [72, 2.5, "-3"]
    assert R.math_reward(["q", "r"], ["\\boxed{72}", "so 2.5"], answer=[72, 2.5]).tolist() == [1.0, 1.0]


def test_skip_invalid_leaves_out_counts_and_summarises(tmp_path):
    path = _write(tmp_path / "data.jsonl", [
        GOOD, '{"question": " ", "answer": "1"}', "{oops", json.dumps({"question": "q", "answer": "#### "}),
        json.dumps({"question": "2+2?", "answer": 4})])
    with pytest.raises(ValueError, match=f"^{path}:2: field 'question': the prompt is empty$"):
        R.JsonlMathTask(str(path)).examples(1)
    assert R.load_jsonl(path, skip_invalid=True) == [{"prompt": "1+1?", "answer": "2"},
                                                      {"prompt": "2+2?", "answer": 4}]
    task = R.make_task("jsonl_math", path=str(path), skip_invalid=True)
    assert task == R.JsonlMathTask(str(path), skip_invalid=True)
    assert [e["prompt"] for e in task.examples()] == ["1+1?", "2+2?"]
    assert task.skipped == [f"{path}:2: field 'question': the prompt is empty",
                            f"{path}:3: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
                            f"{path}:4: {UNSCORABLE.format('#### ')}"]
    assert task.summary() == (f"{path}: 2 records, 3 skipped (line 2: field 'question': the prompt is empty; "
                              "line 3: invalid JSON (Expecting property name enclosed in double quotes at column 2); "
                              "and 1 more)")
    clean = R.JsonlMathTask(str(_write(tmp_path / "clean.jsonl", [GOOD])), skip_invalid=True)
    assert clean.skipped == [] and clean.summary() is None


def test_a_file_without_a_valid_record_is_an_error(tmp_path):
    path = _write(tmp_path / "bad.jsonl", ['{"question": "", "answer": "1"}', "", '{"question": "q", "answer": null}'])
    assert _error(path, skip_invalid=True) == (
        f"dataset file {str(path)!r} holds no valid records: 2 skipped (line 1: field 'question': the prompt "
        "is empty; line 3: field 'answer': the answer is null)")
    empty = _write(tmp_path / "empty.jsonl", ["", "  "])
    assert _error(empty, skip_invalid=True) == f"dataset file {str(empty)!r} holds no records"


ALPHABET = "abcdefghijklmnopqrstuvwxyz +?0123456789"


def _prompts_file(tmp_path):
    return _write(tmp_path / "prompts.jsonl", [json.dumps({"question": "1+1?", "answer": "2"}),
                                               json.dumps({"question": "what is 12+30?", "answer": "42"}),
                                               json.dumps({"question": "2+2?", "answer": "4"}),
                                               json.dumps({"question": "", "answer": "4"})])


def test_fit_prompts_rejects_an_over_long_prompt(tmp_path):
    path = _write(tmp_path / "data.jsonl", [GOOD, json.dumps({"question": "what is 12+30?", "answer": "42"})])
    task = R.JsonlMathTask(str(path))
    with pytest.raises(ValueError) as err:
        task.fit_prompts(char_tokenizer(ALPHABET), 8)
    assert str(err.value) == f"{path}:2: field 'question': the prompt has 14 tokens; rollout.max_prompt_tokens=8"
    assert len(task.records) == 2 and task.skipped == []  # nothing dropped without skip_invalid
    task.fit_prompts(char_tokenizer(ALPHABET), 14)
    assert [e["prompt"] for e in task.examples()] == ["1+1?", "what is 12+30?"]
    with pytest.raises(ValueError) as err:  # a load error comes before any token count
        R.JsonlMathTask(str(_prompts_file(tmp_path))).fit_prompts(char_tokenizer(ALPHABET), 8)
    assert str(err.value) == f"{tmp_path / 'prompts.jsonl'}:4: field 'question': the prompt is empty"


def test_fit_prompts_with_skip_invalid_drops_the_prompt(tmp_path):
    path = _prompts_file(tmp_path)
    task = R.JsonlMathTask(str(path), skip_invalid=True)
    before = task.examples(6, seed=3)
    assert "what is 12+30?" in [e["prompt"] for e in before]
    task.fit_prompts(char_tokenizer(ALPHABET), 8)
    assert [r["prompt"] for r in task.records] == ["1+1?", "2+2?"]
    assert task.skipped == [f"{path}:2: field 'question': the prompt has 14 tokens; rollout.max_prompt_tokens=8",
                            f"{path}:4: field 'question': the prompt is empty"]
    drawn = task.examples(50, seed=3)
    assert {e["prompt"] for e in drawn} == {"1+1?", "2+2?"} and drawn == task.examples(50, seed=3)
    assert task.summary().startswith(f"{path}: 2 records, 2 skipped (line 2: field 'question': the prompt has 14")
    with pytest.raises(ValueError) as err:
        task.fit_prompts(char_tokenizer(ALPHABET), 3)
    assert str(err.value) == (f"dataset file {str(path)!r} holds no prompt of 1..3 tokens: 4 skipped "
                              "(line 1: field 'question': the prompt has 4 tokens; rollout.max_prompt_tokens=3; "
                              "line 2: field 'question': the prompt has 14 tokens; rollout.max_prompt_tokens=8; "
                              "and 2 more)")


class _ListTokenizer:
    """A stand-in tokenizer: one token per word, so a prompt of only '~' has none; records its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, texts, add_special_tokens=True):
        self.calls.append((texts, add_special_tokens))
        return {"input_ids": [[1] * len(t.replace("~", " ").split()) for t in texts]}


def test_fit_prompts_tokenises_in_one_batch_and_rejects_zero_tokens(tmp_path):
    path = _write(tmp_path / "data.jsonl", [GOOD, json.dumps({"question": "~", "answer": "1"})])
    tokenizer = _ListTokenizer()
    with pytest.raises(ValueError) as err:
        R.JsonlMathTask(str(path)).fit_prompts(tokenizer, 4)
    assert str(err.value) == f"{path}:2: field 'question': the prompt has 0 tokens; rollout.max_prompt_tokens=4"
    assert tokenizer.calls == [(["1+1?", "~"], False)]
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        R.JsonlMathTask(str(path)).fit_prompts(tokenizer, 0)
