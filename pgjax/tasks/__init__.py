"""Rewards and tasks with verifiable answers (host-side Python: strings in, NumPy float32 out).

The reward interface: ``fn(prompts, completions, **fields) -> np.ndarray``
float32 of shape ``[len(completions)]``. ``completions`` are the decoded
responses with EOS (and padding) already stripped; ``fields`` are per-example
columns aligned with the batch (``target=[...]``, ``numbers=[...]``,
``answer=[...]``; ``batch_fields(examples, repeat=K)`` builds them for the
group layout of docs/design.md). Each reward takes the fields it needs by name and
ignores the others, so ``combine`` can pass one set of fields to all terms.

Rule for a reward that cannot be computed: a malformed completion, an
unparsable answer, a division by zero, or any exception while scoring one
row gives that row 0.0. Rewards are never NaN or infinite, and scoring never
raises because of what a model wrote. Mismatched lengths of prompts,
completions and fields (ValueError) or a missing field (TypeError) are the
caller's bugs and do raise. A reward *function* (a verifier, your ``task.reward.function``) that raises, does not
return in time (``with_timeout``) or returns anything but one number per completion is a ``RewardError``
naming it (``call_reward``, the one way training calls one).

Correctness rewards are 1.0 / 0.0, so a task's accuracy is the fraction of
rows whose reward is 1.

Tasks (``examples(n, seed)`` -> dicts with ``prompt``, the demonstration
``answer`` and the reward's fields; deterministic from the seed):
- ``ArithmeticTask``: ``"37+45="`` -> ``"82"``;
- ``ScratchpadArithmeticTask``: ``"37+45="`` -> ``"...:82"`` (free-length working, then the answer after
  the last ``':'``);
- ``MixedArithmeticTask``: 1-, 2-, ..., n-digit sums in equal shares, tagged with their ``difficulty``;
- ``CountdownTask``: ``"3 5 7>22:"`` -> ``"3*5+7"`` (each number once, + - * /);
- ``JsonlMathTask``: a user's GSM8K / MATH style dataset file (JSON Lines, or parquet, arrow, csv,
  json through ``datasets``; ``reader_format``), plain prompts or chat messages (``Conversation``),
  ``math_reward``;
- ``WordMathTask``: English arithmetic for a chat model (``"What is 23 + 48? ..."`` and word problems),
  answered in ``\\boxed{}``, 1..n-digit operands tagged with their ``difficulty``.
``JsonlMathTask`` and ``WordMathTask`` use the model's tokenizer (``tokenizer()`` is None); the
others have character-level tokenizers (``char_tokenizer``);
save one beside a checkpoint with ``tok.save_pretrained(dir)`` and read it
back with ``pgjax.models.hf.load_tokenizer(dir)``. ``make_task(name, options, **fields)`` builds a task
of the registry ``TASKS`` or a user's own by import path (``registry``), with its own ``options``.

Math answers (``math_answers``): ``extract_answer``, the one answer extractor of ``jsonl_math`` and
``word_math`` (last non-blank ``\\boxed{}``, else ``####``, else the last number; options
``answer_from`` and ``number_only``) and ``answers_equal`` (numeric, then
symbolic with sympy). Percent rule: ``50\\%`` equals ``50``, not ``0.5``.
"""
from pgjax.plugins import import_object
from pgjax.tasks.arithmetic import (
    ArithmeticTask,
    MixedArithmeticTask,
    ScratchpadArithmeticTask,
    arithmetic_reward,
    is_arithmetic_answer,
    is_scratchpad_answer,
    scratchpad_reward,
    trailing_scratch_reward,
)
from pgjax.tasks.base import (
    NONFINITE_POLICIES,
    RewardError,
    RewardFn,
    Task,
    WeightedSum,
    as_rewards,
    batch_fields,
    call_reward,
    call_within,
    check_columns,
    combine,
    described_value,
    error_text,
    finite_rewards,
    format_reward,
    located_error,
    per_example,
    raised_at,
    raised_text,
    reward_name,
    with_timeout,
)
from pgjax.tasks.countdown import CountdownTask, countdown_reward, evaluate_expression, is_countdown_solution
from pgjax.tasks.data import FILE_FORMATS, Conversation, JsonlMathTask, load_jsonl, reader_format
from pgjax.tasks.math_answers import (
    answers_equal,
    extract_answer,
    math_reward,
    normalize_answer,
    parse_number,
    reference_answer,
)
from pgjax.tasks.registry import (
    TASKS,
    accepted_options,
    make_task,
    option_defaults,
    reward_function,
    task_factory,
)
from pgjax.tasks.tokenizer import EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, char_tokenizer
from pgjax.tasks.word_math import (
    WordMathTask,
    boxed_answer_reward,
    is_word_math_answer,
    word_math_format_reward,
    word_math_reward,
)

__all__ = [
    "TASKS", "accepted_options", "option_defaults", "ArithmeticTask", "Conversation", "CountdownTask", "EOS_ID",
    "FILE_FORMATS",
    "JsonlMathTask", "MixedArithmeticTask", "PAD_ID",
    "NONFINITE_POLICIES", "RewardError", "RewardFn", "SPECIAL_TOKENS",
    "ScratchpadArithmeticTask", "Task", "UNK_ID", "WeightedSum", "answers_equal", "arithmetic_reward",
    "as_rewards", "batch_fields", "call_reward", "char_tokenizer", "check_columns", "combine", "countdown_reward",
    "described_value", "error_text", "evaluate_expression", "extract_answer", "finite_rewards", "format_reward",
    "import_object", "is_arithmetic_answer", "is_countdown_solution",
    "is_scratchpad_answer", "load_jsonl", "located_error", "make_task", "math_reward", "normalize_answer",
    "parse_number", "per_example", "raised_at", "raised_text", "reader_format", "reference_answer", "reward_function",
    "reward_name",
    "scratchpad_reward", "task_factory", "trailing_scratch_reward", "WordMathTask", "boxed_answer_reward",
    "is_word_math_answer", "call_within", "with_timeout", "word_math_format_reward", "word_math_reward",
]
