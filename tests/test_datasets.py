"""Checks of a user's dataset at load time (pgjax.tasks.data): JSON Lines, chat-message records,
local parquet / arrow / csv / json files read by ``datasets``, and runs that train on them."""
import copy
import importlib.util
import json
import pickle
import socket

import numpy as np
import pytest
from helpers import save_tiny_checkpoint, tiny_experiment

import pgjax.tasks as R
from pgjax import config as config_lib
from pgjax.config import ConfigError, ModelSection, PromptSection, TaskSection
from pgjax.parallel.mesh import single_device_mesh
from pgjax.rollout.collect import PLAIN, RolloutConfig
from pgjax.tasks.tokenizer import char_tokenizer
from pgjax.train.trainer import train

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
    ('{"question": 3, "answer": "1"}',
     "field 'question': the prompt must be a string or a list of chat messages, got int"),
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


# ---------------------------------------------------------------- chat-message records

def _turn(role, content):
    return {"role": role, "content": content}


def _chat(*turns, answer=2) -> str:
    return json.dumps({"messages": [_turn(*t) for t in turns], "answer": answer})


def test_a_conversation_keeps_the_turns_up_to_the_last_user_message():
    turns = [_turn("system", "S"), _turn("user", "1+1?"), _turn("assistant", "2"),
             {"role": "user", "content": "and 2+2?", "name": "bob"}, _turn("assistant", "4")]
    conversation = R.Conversation(turns)
    assert conversation == "and 2+2?" and isinstance(conversation, str)
    assert conversation.messages == (_turn("system", "S"), _turn("user", "1+1?"), _turn("assistant", "2"),
                                      _turn("user", "and 2+2?"))       # the reply and other keys left out
    for twin in (copy.deepcopy(conversation), pickle.loads(pickle.dumps(conversation))):
        assert type(twin) is R.Conversation and twin == conversation and twin.messages == conversation.messages


ORDER = "(an optional system message, then user and assistant turns in turn)"


@pytest.mark.parametrize("messages, reason", [
    ([], "messages: the list of messages is empty"),
    (["hi"], "messages[0]: expected an object with 'role' and 'content', got str"),
    ([{"role": "user"}], "messages[0]: the message lacks 'content'"),
    ([{"content": "x"}], "messages[0]: the message lacks 'role'"),
    ([_turn("tool", "x")], "messages[0].role: 'tool' is not one of system, user, assistant"),
    ([_turn(None, "x")], "messages[0].role: None is not one of system, user, assistant"),
    ([_turn("user", "  ")], "messages[0].content: the message is empty"),
    ([_turn("user", 3)], "messages[0].content: must be a string, got int"),
    ([_turn("user", None)], "messages[0].content: must be a string, got NoneType"),
    ([_turn("user", "a"), _turn("system", "s")], "messages[1].role: a system message can only be the first"),
    ([_turn("system", "s"), _turn("system", "t")], "messages[1].role: a system message can only be the first"),
    ([_turn("user", "a"), _turn("user", "b")], f"messages[1].role: 'user' where 'assistant' is expected {ORDER}"),
    ([_turn("assistant", "a")], f"messages[0].role: 'assistant' where 'system' or 'user' is expected {ORDER}"),
    ([_turn("system", "s")], "messages: no user message"),
])
def test_a_bad_conversation_names_the_line_and_the_message(tmp_path, messages, reason):
    path = _write(tmp_path / "chat.jsonl", [_chat(("user", "1+1?")), "",
                                            json.dumps({"messages": messages, "answer": 2})])
    assert _error(path, prompt_field="messages") == f"{path}:3: {reason}"
    with pytest.raises(ValueError) as err:
        R.Conversation(messages)
    assert str(err.value) == reason


def test_a_prompt_field_of_another_type_is_neither_a_prompt_nor_a_conversation(tmp_path):
    path = _write(tmp_path / "chat.jsonl", [json.dumps({"messages": {"role": "user", "content": "x"}, "answer": 1})])
    assert _error(path, prompt_field="messages") == (f"{path}:1: field 'messages': the prompt must be a string or a "
                                                     "list of chat messages, got dict")


def test_a_conversation_of_several_messages_needs_a_chat_template(tmp_path):
    path = _write(tmp_path / "chat.jsonl", [_chat(("user", "1+1?")), _chat(("system", "be brief"), ("user", "2+2?")),
                                            _chat(("user", "3+3?"), ("assistant", "6"))])
    plain = lambda prompts: PLAIN.render(None, prompts)      # noqa: E731 (task.prompt.chat_template=none)
    with pytest.raises(ValueError) as err:
        R.JsonlMathTask(str(path), prompt_field="messages").fit_prompts(char_tokenizer(ALPHABET), 8, plain)
    assert str(err.value) == (f"{path}:2: field 'messages': a conversation of 2 messages needs a chat template, but "
                              "the prompts are plain text (task.prompt.chat_template='none', or the tokenizer has no "
                              "template); only a single user message can be given as plain text")
    task = R.JsonlMathTask(str(path), prompt_field="messages", skip_invalid=True)
    task.fit_prompts(char_tokenizer(ALPHABET), 8, plain)
    assert [e["prompt"] for e in task.examples()] == ["1+1?", "3+3?"]       # a final reply is not the prompt
    assert task.summary() == f"{path}: 2 records, 1 skipped (line 2: {str(err.value).split(':2: ', 1)[1]})"


# ---------------------------------------------------------------- extra fields for a reward

def test_extra_fields_are_columns_a_reward_reads(tmp_path):
    path = _write(tmp_path / "data.jsonl", [json.dumps({"question": "1+1?", "answer": 2, "level": 1, "tags": ["a"]}),
                                            json.dumps({"question": "2+2?", "answer": 4, "level": 3, "tags": []})])
    task = R.make_task("jsonl_math", path=str(path), extra_fields="level, tags")
    assert task == R.JsonlMathTask(str(path), extra_fields=("level", "tags"))
    examples = task.examples()
    assert R.batch_fields(examples, repeat=2) == {"answer": [2, 2, 4, 4], "level": [1, 1, 3, 3],
                                                  "tags": [["a"], ["a"], [], []]}
    with pytest.raises(ValueError, match=r"extra_fields \['answer'\]: an example's own keys"):
        R.load_jsonl(path, extra_fields="answer")


# ---------------------------------------------------------------- files read by datasets

def _table(columns: dict):
    pa = pytest.importorskip("pyarrow")
    return pa.table(columns)


def _parquet(path, columns: dict):
    import pyarrow.parquet as pq
    pq.write_table(_table(columns), path)
    return path


PLAIN_COLUMNS = {"question": ["1+1?", "2+2?", "3+3?"], "answer": [2, 4, 6], "level": [1, 2, 3]}
PLAIN_RECORDS = [{"prompt": "1+1?", "answer": 2, "level": 1}, {"prompt": "2+2?", "answer": 4, "level": 2},
                 {"prompt": "3+3?", "answer": 6, "level": 3}]


def _arrow(path, columns, stream: bool):
    import pyarrow as pa
    table = _table(columns)
    with pa.OSFile(str(path), "wb") as sink, (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink,
                                                                                                 table.schema) as out:
        out.write_table(table)
    return path


@pytest.mark.parametrize("name, write, options", [
    ("data.parquet", lambda p: _parquet(p, PLAIN_COLUMNS), {}),
    ("data.arrow", lambda p: _arrow(p, PLAIN_COLUMNS, stream=True), {}),       # as datasets saves it
    ("data.feather", lambda p: _arrow(p, PLAIN_COLUMNS, stream=False), {"file_format": "arrow"}),
    ("data.csv", lambda p: p.write_text("question,answer,level\n1+1?,2,1\n2+2?,4,2\n3+3?,6,3\n"), {}),
    ("data.json", lambda p: p.write_text(json.dumps([{"question": q, "answer": a, "level": n} for q, a, n in
                                                      zip(*PLAIN_COLUMNS.values(), strict=True)])),
     {"file_format": "json"}),
])
def test_a_local_table_loads_like_json_lines(tmp_path, name, write, options):
    pytest.importorskip("datasets")
    path = tmp_path / name
    write(path)
    assert R.load_jsonl(path, extra_fields="level", **options) == PLAIN_RECORDS


def test_reading_a_table_opens_no_connection_and_leaves_no_cache(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    path = _parquet(tmp_path / "data.parquet", PLAIN_COLUMNS)
    attempts = []

    def refuse(sock, address):
        attempts.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    assert R.load_jsonl(path, extra_fields="level") == PLAIN_RECORDS and attempts == []
    assert not (tmp_path / "cache").exists()


def test_a_chat_parquet_file_gives_conversations(tmp_path):
    pytest.importorskip("datasets")
    path = _parquet(tmp_path / "chat.parquet", {
        "messages": [[_turn("system", "be brief"), _turn("user", "1+1?")],
                     [_turn("user", "2+2?"), _turn("assistant", "4")]],
        "answer": ["2", "#### 4"]})
    records = R.load_jsonl(path, prompt_field="messages")
    assert records == [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "#### 4"}]
    assert [r["prompt"].messages for r in records] == [(_turn("system", "be brief"), _turn("user", "1+1?")),
                                                       (_turn("user", "2+2?"),)]


@pytest.mark.parametrize("columns, options, reason", [
    ({"question": ["1+1?", "2+2?"], "answer": [2.0, float("nan")]}, {},
     "2: field 'answer': nan is not a finite number"),
    ({"question": ["1+1?", "2+2?"], "answer": [2, None]}, {}, "2: field 'answer': the answer is null"),
    ({"question": ["1+1?", "2+2?"], "answer": [2, 4], "score": [0.5, float("inf")]}, {"extra_fields": "score"},
     "2: field 'score': inf is not a finite number"),
    ({"question": [1, 2], "answer": [2, 4]}, {},
     "1: field 'question': the prompt must be a string or a list of chat messages, got int"),
    ({"question": ["1+1?", "2+2?"]}, {}, "1: record lacks field(s) ['answer']; fields present: ['question']"),
    ({"question": ["1+1?", " "], "answer": [2, 4]}, {}, "2: field 'question': the prompt is empty"),
    ({"messages": [[_turn("user", "1+1?")], [_turn("tool", "x")]], "answer": [2, 4]}, {"prompt_field": "messages"},
     "2: messages[0].role: 'tool' is not one of system, user, assistant"),
    ({"messages": [[_turn("user", "1+1?")], [_turn("user", "")]], "answer": [2, 4]}, {"prompt_field": "messages"},
     "2: messages[0].content: the message is empty"),
])
def test_a_bad_parquet_row_names_the_file_and_row(tmp_path, columns, options, reason):
    pytest.importorskip("datasets")
    path = _parquet(tmp_path / "data.parquet", columns)
    assert _error(path, **options) == f"{path}:{reason}"


def test_skip_invalid_leaves_bad_rows_out_and_counts_them(tmp_path):
    pytest.importorskip("datasets")
    path = _parquet(tmp_path / "data.parquet", {"question": ["1+1?", " ", "3+3?", "4+4?"],
                                                "answer": [2.0, 4.0, float("nan"), 8.0]})
    task = R.JsonlMathTask(str(path), skip_invalid=True)
    assert [e["prompt"] for e in task.examples()] == ["1+1?", "4+4?"]
    assert task.skipped == [f"{path}:2: field 'question': the prompt is empty",
                            f"{path}:3: field 'answer': nan is not a finite number"]
    assert task.summary() == (f"{path}: 2 records, 2 skipped (row 2: field 'question': the prompt is empty; "
                              "row 3: field 'answer': nan is not a finite number)")


def test_a_missing_unreadable_or_unknown_file_is_named(tmp_path):
    pytest.importorskip("datasets")
    with pytest.raises(FileNotFoundError, match="dataset file not found: '.*none.parquet'"):
        R.load_jsonl(tmp_path / "none.parquet")
    text = _write(tmp_path / "text.parquet", [GOOD])
    with pytest.raises(ValueError, match=f"^{text}: cannot be read as parquet: "):
        R.load_jsonl(text)
    assert R.load_jsonl(text, file_format="jsonl") == [{"prompt": "1+1?", "answer": "2"}]     # the override wins
    with pytest.raises(ValueError, match="file_format='xml' is unknown; valid: auto, jsonl, json, parquet, arrow, csv"):
        R.load_jsonl(text, file_format="xml")
    exp = tiny_experiment(
        tmp_path, task=TaskSection(name="jsonl_math", options={"path": str(text), "file_format": "xml"})
    )
    with pytest.raises(ConfigError, match="task.options.file_format='xml' is invalid: one of auto, jsonl"):
        config_lib.validate(exp, single_device_mesh())


def test_a_format_that_needs_datasets_names_the_extra_to_install(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "datasets" else find_spec(name, *args))
    path = _write(tmp_path / "data.parquet", [GOOD])
    message = f"reading {str(path)!r} as parquet needs the datasets package: pip install -e '.[data]'"
    with pytest.raises(ImportError) as err:
        R.load_jsonl(path)
    assert str(err.value) == message
    assert R.reader_format(tmp_path / "data.txt") == "jsonl"        # JSON Lines never needs it
    exp = tiny_experiment(tmp_path, task=TaskSection(name="jsonl_math", options={"path": str(path)}))
    with pytest.raises(ConfigError) as err:
        config_lib.validate(exp, single_device_mesh())
    assert str(err.value) == f"task.options.path={str(path)!r}: {message}"


# ---------------------------------------------------------------- training on a user's files

# a chat template whose text the test tokenizer spells out character by character
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}={{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}a={% endif %}")
SEEN = []       # what recording_reward was called with


def recording_reward(prompts, completions, **fields):
    """A custom reward (``task.reward.function=test_datasets:recording_reward``) that records its arguments."""
    SEEN.append({"prompts": list(prompts), **{name: list(column) for name, column in fields.items()}})
    return np.zeros(len(completions), np.float32)


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory):
    """A tiny Hugging Face checkpoint whose character tokenizer has ``TEMPLATE``."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("chat_checkpoint"), TEMPLATE)


def _train(tmp_path, checkpoint, prompt: PromptSection | None = None, **options):
    """One RL step (with its evaluation, checkpoint and export) of the tiny model on ``jsonl_math`` with
    ``options`` and ``prompt``, through ``recording_reward``; the run's metric records."""
    task = TaskSection(name="jsonl_math", options=options, prompt=prompt or PromptSection(),
                       reward="test_datasets:recording_reward")
    exp = tiny_experiment(tmp_path, steps=1, eval_every=1, model=ModelSection(path=str(checkpoint)), task=task,
                          rollout=RolloutConfig(samples_per_prompt=2, max_prompt_tokens=40, max_new_tokens=3))
    SEEN.clear()
    run = train(exp, progress=False)
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_chat_jsonl_file_trains(tmp_path, chat_checkpoint):
    lines = [_chat(("system", "add"), ("user", f"{a}+1="), ("assistant", f"{a + 1}"), ("user", "plus 1="),
                   *([("assistant", f"{a + 2}")] if a % 2 else []), answer=a + 2) for a in range(8)]
    path = _write(tmp_path / "chat.jsonl", lines)
    records = _train(tmp_path, chat_checkpoint, path=str(path), prompt_field="messages")
    assert [r["step"] for r in records if "step" in r][-1] == 1
    rows = [(prompt, answer) for call in SEEN for prompt, answer in zip(call["prompts"], call["answer"], strict=True)]
    assert len(rows) >= 4 * 2
    for prompt, answer in rows:     # the reward sees the last user turn, the conversation, the record's answer
        assert prompt == "plus 1=" and prompt.messages[0] == _turn("system", "add") and len(prompt.messages) == 4
        assert prompt.messages[1] == _turn("user", f"{answer - 2}+1=")
    with pytest.raises(ConfigError, match=f"^task: {path}:1: field 'messages': a conversation of 4 messages needs a "
                                          "chat template"):
        _train(tmp_path / "plain", chat_checkpoint, PromptSection(chat_template="none"), path=str(path),
               prompt_field="messages")


@pytest.mark.slow
def test_a_parquet_file_trains_and_its_extra_columns_reach_the_reward(tmp_path, chat_checkpoint):
    pytest.importorskip("datasets")
    path = _parquet(tmp_path / "data.parquet", {"question": [f"{a}+{a}=" for a in range(8)],
                                                "answer": [2 * a for a in range(8)], "level": list(range(8)),
                                                "unused": [float("nan")] * 8})
    records = _train(tmp_path, chat_checkpoint, path=str(path), extra_fields="level")
    assert [r["step"] for r in records if "step" in r][-1] == 1
    rows = [row for call in SEEN for row in zip(call["prompts"], call["answer"], call["level"], strict=True)]
    assert len(rows) >= 4 * 2 and all("unused" not in call for call in SEEN)
    for prompt, answer, level in rows:      # each row's columns stay with its prompt
        assert prompt == f"{level}+{level}=" and answer == 2 * level
