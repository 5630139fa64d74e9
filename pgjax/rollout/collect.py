"""Rollouts: tokenise prompts, sample K responses each, decode and score them.

Host-side glue around the jitted sampler: strings go in (prompts and the
task's fields), a ``Rollout`` of arrays comes out, plus the decoded completions
and per-row statistics for logging. The sampler always sees prompts left-padded
to ``max_prompt_tokens`` and N = ``max_new_tokens`` slots; the Rollout (what
scoring and the update compute on) drops the columns that are padding in every
row (``trim_padding``), rounded up to a quarter of each budget (at least 16
tokens), so a run compiles its scoring and update for at most 4 x 4 widths.
"""
from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from pgjax import core
from pgjax.checks import check_finite, check_types, require
from pgjax.models import hf
from pgjax.models.transformer import CausalLM
from pgjax.parallel.mesh import single_device_mesh
from pgjax.parallel.multihost import to_global, to_host
from pgjax.rollout.batch import Rollout
from pgjax.sample import Decoding, Samples, SamplingConfig, generate
from pgjax.tasks import NONFINITE_POLICIES, Conversation, batch_fields, call_reward, finite_rewards, reward_name


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig(Decoding):
    """K = ``samples_per_prompt`` responses to prompts of at most ``max_prompt_tokens`` tokens, drawn as
    the ``Decoding`` fields say (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``); and the
    practitioners' options:

    filter_equal_groups: drop (mask out) groups whose K rewards are all equal (DAPO's
      dynamic sampling, without resampling): they carry no group-relative signal.
    mask_truncated: responses that hit ``max_new_tokens`` without EOS do not count.
    overlong_buffer, overlong_penalty: DAPO's soft overlong punishment: a response
      longer than ``max_new_tokens - overlong_buffer`` loses up to ``overlong_penalty``,
      linearly over the buffer (0 = off).
    length_penalty: a response of L tokens loses ``length_penalty * L / max_new_tokens`` (a plain
      length cost, against a learned reward's preference for long answers; 0: off).
    nonfinite_rewards: what a NaN or infinite reward from a reward function does:
      ``"error"`` (default) stops with a ``RewardError`` naming the function and the row;
      ``"mask"`` leaves that sample's prompt group out of the update (a group baseline
      needs all K rewards; for ReMax the greedy reward counts too) and counts the
      non-finite rows in the step's ``nonfinite_rewards``.
    trim_padding: score and update on the rollout without its all-padding columns
      (``trim_padding``): the same loss and gradient (Dr. GRPO's constant length stays the
      budget), less arithmetic when the prompts are shorter than ``max_prompt_tokens`` or every
      response ends early; off: always the full ``max_prompt_tokens + max_new_tokens``.
    staleness: asynchronous rollouts: the batch of step t + s is sampled with the parameters
      step t starts from, while step t's update runs (0: sample, then update, on-policy; s >= 1:
      s batches in flight, each s updates old when used; a checkpoint holds them).
    compute_dtype: the sampler's compute dtype (``float32``, ``bfloat16``; empty: the model's),
      e.g. a bfloat16 sampler for a float32 learner. The update sees the sampler's own log-probs
      (``core.Batch.behaviour_logp``) and measures the mismatch every step.
    weight_dtype: the sampler's weights: empty (default), the learner's; ``bfloat16``, the learner's
      rounded to bfloat16 once per sampling call, every weight matmul (projections and the head) multiplying bfloat16
      inputs and weights and summing in the compute dtype (``ModelConfig.matmul_dtype``), while
      norms, attention and the KV cache stay in it. Half the weight bytes each decode step reads, and
      on a CPU with AVX-512 BF16 XLA's bfloat16 dot; the update measures the mismatch it costs, as for
      ``compute_dtype``.
    sampler_devices: 0 (default): the sampler runs on the learner's mesh; n >= 1: on the last n
      devices (a data-parallel sampler mesh, one process only), the learner on the others
      (``mesh`` describes those); the weights are copied to the sampler's devices before each
      sampling and the batch back to the learner's.
    max_turns, max_episode_tokens, max_observation_tokens: multi-turn episodes, where the task has
      an environment (``task.tools.names``, or a task's own ``environment``; ``pgjax.rollout.episodes``): at
      most ``max_turns`` replies of at most ``max_new_tokens`` each, ``max_episode_tokens`` tokens
      after the prompt in all (0: as many as the turns and observations can take,
      ``episode_budget``), each observation cut to ``max_observation_tokens``.
    """
    samples_per_prompt: int = 8
    max_prompt_tokens: int = 16
    filter_equal_groups: bool = False
    mask_truncated: bool = False
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    length_penalty: float = 0.0
    nonfinite_rewards: str = "error"
    trim_padding: bool = True
    staleness: int = 0
    compute_dtype: str = ""
    weight_dtype: str = ""
    sampler_devices: int = 0
    max_turns: int = 1
    max_episode_tokens: int = 0
    max_observation_tokens: int = 64

    PREFIX: ClassVar[str] = "rollout."

    def __post_init__(self):
        check_types(self, self.PREFIX)
        super().__post_init__()
        key = lambda name: self.PREFIX + name       # noqa: E731
        require(self.samples_per_prompt >= 1, key("samples_per_prompt"), self.samples_per_prompt, "an integer >= 1")
        require(self.max_prompt_tokens >= 1, key("max_prompt_tokens"), self.max_prompt_tokens, "an integer >= 1")
        require(0 <= self.overlong_buffer < self.max_new_tokens, key("overlong_buffer"), self.overlong_buffer,
                f"an integer in [0, max_new_tokens={self.max_new_tokens}) (0: off)")
        check_finite(self.overlong_penalty >= 0, key("overlong_penalty"), self.overlong_penalty, ">= 0")
        check_finite(self.length_penalty >= 0, key("length_penalty"), self.length_penalty, ">= 0 (0: off)")
        require(self.nonfinite_rewards in NONFINITE_POLICIES, key("nonfinite_rewards"), self.nonfinite_rewards,
                f"one of {', '.join(NONFINITE_POLICIES)}")
        require(self.staleness >= 0, key("staleness"), self.staleness, "an integer >= 0 (0: on-policy)")
        require(self.compute_dtype in ("", "float32", "bfloat16"), key("compute_dtype"), self.compute_dtype,
                "float32, bfloat16 or empty (the model's)")
        require(self.weight_dtype in ("", "bfloat16"), key("weight_dtype"), self.weight_dtype,
                "bfloat16 or empty (the learner's weights)")
        require(self.sampler_devices >= 0, key("sampler_devices"), self.sampler_devices,
                "an integer >= 0 (0: the learner's devices)")
        require(self.max_turns >= 1, key("max_turns"), self.max_turns, "an integer >= 1")
        require(self.max_episode_tokens >= 0, key("max_episode_tokens"), self.max_episode_tokens,
                "an integer >= 0 (0: the turns' own budget)")
        require(self.max_observation_tokens >= 1, key("max_observation_tokens"), self.max_observation_tokens,
                "an integer >= 1")

    def episode_budget(self) -> int:
        """An episode's tokens after its prompt, at most: ``max_episode_tokens``, or what ``max_turns``
        replies and the observations between them can take."""
        return self.max_episode_tokens or (self.max_turns * self.max_new_tokens
                                           + (self.max_turns - 1) * self.max_observation_tokens)


def pad_id(tokenizer) -> int:
    """The tokenizer's pad id, or its EOS id for tokenizers without one (Llama 3); padding is masked anyway."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How a task's prompt (the user's message, or a ``Conversation`` of chat messages) becomes the
    text the model continues. With ``chat`` the tokenizer's chat template renders an optional
    ``system_prompt`` turn, the user turn (a conversation: its own messages, after ``system_prompt``
    unless it opens with a system message of its own) and the opening of the assistant's turn
    (``add_generation_prompt``); without, the prompt is the text, and a conversation can only be a
    single user message (its text). Rewards always see the task's own prompt and the decoded
    assistant text, never the template."""
    chat: bool = False
    system_prompt: str = ""
    template: str = "{prompt}"      # how the prompt's text is written (a conversation: its last user turn's)
    tools: str = ""                 # JSON list of tool schemas the chat template describes (agents.JsonCalls)

    def render(self, tokenizer, prompts: list[str]) -> list[str]:
        """The model's input text for each prompt; ValueError for a conversation of more than one
        message without a chat template."""
        return [self._text(tokenizer, p) for p in prompts]

    @property
    def special_tokens(self) -> bool:
        """Whether the tokenizer adds its own special tokens to the rendered text: for plain text yes
        (a ``<bos>`` where the tokenizer puts one, as Llama's and Gemma's do: without it Gemma 3 270M
        repeats its prompt instead of continuing it), after a chat template no (the template writes
        them itself)."""
        return not self.chat

    def token_ids(self, tokenizer, prompts: list[str]) -> list[list[int]]:
        """The token ids the model reads for each prompt: ``render``'s text, tokenized with the
        tokenizer's special tokens where ``special_tokens`` says."""
        return tokenizer(self.render(tokenizer, prompts), add_special_tokens=self.special_tokens)["input_ids"]

    def turns(self, prompt: str) -> list[dict]:
        """The messages ``prompt`` renders as: ``system_prompt`` first (with a chat template, unless the
        conversation opens with a system message of its own), the conversation's turns, the last user
        turn's text written as ``template`` says; ValueError for a conversation of more than one
        message without a chat template."""
        turns = list(prompt.messages) if isinstance(prompt, Conversation) else [{"role": "user", "content": prompt}]
        turns[-1] = {"role": "user", "content": self.template.replace("{prompt}", str(turns[-1]["content"]))}
        if not self.chat:
            if len(turns) > 1:
                raise ValueError(f"a conversation of {len(turns)} messages needs a chat template, but the prompts are "
                                 "plain text (task.prompt.chat_template='none', or the tokenizer has no template); "
                                 "only a single user message can be given as plain text")
            return turns
        if self.system_prompt and turns[0]["role"] != "system":
            turns.insert(0, {"role": "system", "content": self.system_prompt})
        return turns

    def render_turns(self, tokenizer, turns: list[dict]) -> str:
        """The text the model continues after ``turns``: through the chat template, with the opening of
        the assistant's turn; as plain text, the contents one after another."""
        if not self.chat:
            return "".join(str(turn["content"]) for turn in turns)
        return tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False, **self._tools())

    def _tools(self) -> dict:
        return {"tools": json.loads(self.tools)} if self.tools else {}

    def exchange(self, tokenizer, prompt: str, reply: str) -> str:
        """The prompt and the assistant's ``reply`` as one text, what a reward model reads: through the
        chat template the conversation with the reply as the assistant's turn, closed as the template
        closes a turn; as plain text the prompt's rendering, then the reply. Tokenize it with the
        tokenizer's special tokens where ``special_tokens`` says."""
        turns = self.turns(prompt)
        if not self.chat:
            return self.render_turns(tokenizer, turns) + reply
        return tokenizer.apply_chat_template([*turns, {"role": "assistant", "content": reply}], tokenize=False,
                                             **self._tools())

    def continuation(self, tokenizer, turns: list[dict], reply: str, reply_end: str, observations: list[dict]) -> str:
        """What follows a multi-turn episode's reply in the model's input, up to where its next reply
        starts: ``turns`` are the episode's messages before the reply (``render_turns`` of them is in
        the model's input already), ``reply`` the reply's text and ``reply_end`` the text of the token
        that ended it if that token is not part of ``reply`` (an end-of-turn token, ``""`` otherwise),
        ``observations`` the environment's messages. Through the chat template: the template's
        rendering of the conversation with the reply and the observations, after the reply (its end
        of turn, the observations in their roles, the opening of the next assistant turn). As plain
        text: the observations' contents. ValueError if the template does not render the reply as
        written (it rewrites or strips it), since the model's input would then not be a prefix of it."""
        if not self.chat:
            return "".join(str(message["content"]) for message in observations)
        before = self.render_turns(tokenizer, turns) + reply
        after = tokenizer.apply_chat_template([*turns, {"role": "assistant", "content": reply}, *observations],
                                              add_generation_prompt=True, tokenize=False, **self._tools())
        if not after.startswith(before):
            raise ValueError("the chat template does not render an assistant reply as written after its generation "
                             f"prompt, so the episode cannot continue from it (reply {reply[:60]!r})")
        rest = after[len(before):]
        return rest[len(reply_end):] if reply_end and rest.startswith(reply_end) else rest

    def _text(self, tokenizer, prompt: str) -> str:
        return self.render_turns(tokenizer, self.turns(prompt))


PLAIN = PromptFormat()


def prompt_format_for(tokenizer, chat_template: str = "auto", system_prompt: str = "",
                      prompt_template: str = "{prompt}") -> PromptFormat:
    """The prompts through the tokenizer's chat template when ``chat_template`` is ``auto`` and it has
    one (after ``system_prompt``), else plain text (``none``), each prompt's text written as
    ``prompt_template`` says (its ``{prompt}`` replaced: e.g. ``"Question: {prompt}\nAnswer:"`` for
    a base model); ValueError for a system prompt without a template."""
    chat = chat_template == "auto" and getattr(tokenizer, "chat_template", None) is not None
    if system_prompt and not chat:
        why = "task.prompt.chat_template='none'" if chat_template == "none" else "the tokenizer has no chat template"
        raise ValueError(f"task.prompt.system_prompt is set but the prompts are plain text ({why})")
    return PromptFormat(chat=chat, system_prompt=system_prompt, template=prompt_template)


def stop_tokens(tokenizer, prompt_format: PromptFormat, checkpoints=(), stop_texts=()) -> tuple[tuple[int, ...], int]:
    """The tokens that end a response (with a chat template its end of turn, then the tokenizer's EOS,
    every ``eos_token_id`` of the ``checkpoints``' generation_config.json, and every token whose text
    holds one of ``stop_texts``: ``text_tokens``) and the one that ends a demonstration (the end of
    turn, else EOS)."""
    turn_end = hf.end_of_turn_ids(tokenizer) if prompt_format.chat else ()
    eos = [tokenizer.eos_token_id, *(i for d in checkpoints if d for i in hf.eos_token_ids(d, tokenizer))]
    return tuple(dict.fromkeys((*turn_end, *eos, *text_tokens(tokenizer, stop_texts)))), (turn_end or eos)[0]


def text_tokens(tokenizer, texts) -> tuple[int, ...]:
    """Every token id whose decoded text holds one of ``texts`` (e.g. ``"\n"``: each token with a line
    break, so that a base model's answer ends with its line: a stop string at token granularity, the
    matching token the response's last); ValueError for an empty text or one no token holds."""
    if not texts:
        return ()
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    found = []
    for text in texts:
        if not text:
            raise ValueError("task.prompt.stop_text: an empty text would stop every response at its first token")
        ids = [i for i, piece in enumerate(pieces) if text in piece]
        if not ids:
            raise ValueError(f"task.prompt.stop_text: no token of the tokenizer holds {text!r}")
        found += ids
    return tuple(dict.fromkeys(found))


def encode_prompts(tokenizer, prompts: list[str], width: int, prompt_format: PromptFormat = PLAIN
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and mask [P, width] of the prompts as ``prompt_format`` reads them
    (``PromptFormat.token_ids``), left-padded with the tokenizer's pad id; too long raises."""
    return left_pad(tokenizer, prompt_format.token_ids(tokenizer, prompts), width)


def left_pad(tokenizer, ids: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Token sequences as ids and mask [P, width], left-padded with the tokenizer's pad id; a sequence
    longer than ``width`` or empty raises."""
    longest = max(map(len, ids))
    if longest > width or min(map(len, ids)) == 0:
        raise ValueError(f"prompts must have 1..{width} tokens (max_prompt_tokens); got up to {longest}")
    tokens = np.full((len(ids), width), pad_id(tokenizer), np.int32)
    mask = np.zeros((len(ids), width), np.int32)
    for row, seq in enumerate(ids):
        tokens[row, width - len(seq):], mask[row, width - len(seq):] = seq, 1
    return tokens, mask


def right_pad(tokenizer, ids: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Token sequences (each at most ``width`` long: the caller checks) as ids and mask [P, width],
    right-padded with the tokenizer's pad id."""
    tokens = np.full((len(ids), width), pad_id(tokenizer), np.int32)
    mask = np.zeros((len(ids), width), np.int32)
    for row, seq in enumerate(ids):
        tokens[row, :len(seq)], mask[row, :len(seq)] = seq, 1
    return tokens, mask


def decode_responses(tokenizer, response, lengths, eos_ids) -> list[str]:
    """Each response's text up to its length, without its final EOS token (any of ``eos_ids``)."""
    response, lengths = np.asarray(response), np.asarray(lengths)
    texts = []
    for row, n in zip(response, lengths, strict=True):
        ids = row[:n]
        texts.append(tokenizer.decode(ids[:-1] if n and ids[-1] in eos_ids else ids))
    return texts


def overlong_penalty(lengths, max_new_tokens: int, buffer: int, penalty: float) -> np.ndarray:
    """DAPO's soft overlong punishment: 0 up to L - buffer tokens, then -penalty * (excess / buffer)."""
    if buffer <= 0:
        return np.zeros(len(lengths), np.float32)
    excess = np.clip(np.asarray(lengths) - (max_new_tokens - buffer), 0, buffer)
    return (-penalty * excess / buffer).astype(np.float32)


def repeat_examples(examples: list[dict], k: int) -> tuple[list[str], dict]:
    """Prompts and the reward fields of ``examples``, each repeated K times (row p * K + k)."""
    return [e["prompt"] for e in examples for _ in range(k)], batch_fields(examples, repeat=k)


@dataclasses.dataclass(frozen=True)
class Scored:
    """Sampled responses, decoded and scored. ``samples``: the sampler's global arrays; ``response``
    [R, N], ``lengths``, ``truncated`` [R]: this process's rows on the host; ``completions``: their
    text; ``scores``: each scorer's rewards [R] (0 where non-finite); ``nonfinite`` [R]: the rows a
    scorer gave a NaN or infinite reward; ``prompts``, ``fields``: what the scorers were given."""
    samples: Samples
    response: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    completions: list[str]
    scores: dict[str, np.ndarray]
    nonfinite: np.ndarray
    prompts: list[str]
    fields: dict


def dispatch_samples(policy: CausalLM, tokenizer, examples: list[dict], prompt_width: int, key,
                     sampling: SamplingConfig, mesh: Mesh, prompt_format: PromptFormat = PLAIN) -> Samples:
    """The first half of ``sample_and_score``: encode ``examples``' prompts (rendered by
    ``prompt_format``, left-padded to ``prompt_width``) and start sampling ``sampling.n`` responses
    each (JAX dispatches the sampler and returns; nothing waits for it)."""
    tokens, mask = encode_prompts(tokenizer, [e["prompt"] for e in examples], prompt_width, prompt_format)
    return generate(policy, tokens, mask, key, sampling, mesh)


def sample_and_score(policy: CausalLM | None, tokenizer, examples: list[dict], prompt_width: int, key,
                     sampling: SamplingConfig, scorers: dict, mesh: Mesh, nonfinite: str = "error",
                     prompt_format: PromptFormat = PLAIN, samples: Samples | None = None) -> Scored:
    """The one path from prompts to rewards: sample ``sampling.n`` responses to each of ``examples``
    (``dispatch_samples``; or ``samples`` it already dispatched with these arguments), decode them (stop
    tokens stripped) and score them with every ``scorers[name](prompts, completions, **fields)``
    (``tasks.call_reward``: a scorer that raises or returns anything but one number per completion is
    a RewardError), each output checked by ``tasks.finite_rewards`` (``nonfinite``: ``"error"`` or
    ``"mask"``). Rollouts, greedy baselines and evaluation all go through here. ``examples`` are this
    process's rows."""
    if samples is None:
        if policy is None:
            raise ValueError("sample_and_score samples with the policy: policy=None needs the dispatched samples")
        samples = dispatch_samples(policy, tokenizer, examples, prompt_width, key, sampling, mesh, prompt_format)
    with jax.profiler.TraceAnnotation("pgjax/read_back"):      # waits for the sampler
        response, lengths, truncated = to_host((samples.response, samples.lengths, samples.truncated), mesh)
    with jax.profiler.TraceAnnotation("pgjax/decode_and_score"):
        completions = decode_responses(tokenizer, response, lengths, sampling.eos_ids)
        prompts, fields = repeat_examples(examples, sampling.n)
        scores, bad = {}, np.zeros(len(completions), bool)
        for name, fn in scorers.items():
            raw = call_reward(fn, prompts, completions, **fields)
            scores[name], rows = finite_rewards(raw, reward_name(fn), prompts, completions, nonfinite)
            bad |= rows
    return Scored(samples, response, lengths, truncated, completions, scores, bad, prompts, fields)


TRIM_UNIT = 16


def trim_padding(rollout: Rollout, lengths) -> Rollout:
    """``rollout`` without the columns that are padding in every row: the prompt's left padding
    beyond the longest prompt and the response slots after the longest response (``lengths`` [B],
    the sampler's), each kept width rounded up to a multiple of a quarter of its budget, and of at
    least ``TRIM_UNIT`` tokens (so at most 4 widths per side, and none below 32-token budgets, where
    another compiled shape would cost more than the columns). Positions count from each row's
    first real token and the cut columns are masked, so every log-prob, advantage and loss term
    is the same; ``budget`` keeps N for Dr. GRPO's constant length."""
    budget = rollout.mask.shape[1]
    prompt_width = rollout.tokens.shape[1] - budget
    longest_prompt = int(jnp.max(jnp.sum(rollout.attention_mask[:, :prompt_width], axis=1)))
    longest_response = int(jnp.max(lengths))
    return keep_columns(rollout, _round_up(longest_prompt, prompt_width), _round_up(longest_response, budget))


def _response_fields(batch: core.Batch) -> dict:
    """The ``[B, N]`` fields of a rollout's batch (the others are per row)."""
    return {name: x for name, x in vars(batch).items() if isinstance(x, jax.Array | np.ndarray) and x.ndim == 2}


def keep_columns(rollout: Rollout, prompt_columns: int, response_columns: int) -> Rollout:
    """``rollout`` keeping the last ``prompt_columns`` prompt and the first ``response_columns``
    response columns (its ``budget`` stays the full response budget)."""
    budget = rollout.mask.shape[1]
    prompt_width = rollout.tokens.shape[1] - budget
    columns = slice(prompt_width - prompt_columns, prompt_width + response_columns)
    batch = rollout.batch.replace(**{k: x[:, :response_columns] for k, x in _response_fields(rollout.batch).items()})
    return rollout.replace(tokens=rollout.tokens[:, columns], attention_mask=rollout.attention_mask[:, columns],
                           batch=batch, budget=rollout.budget or budget)


def pad_columns(rollout: Rollout, prompt_width: int, budget: int) -> Rollout:
    """The inverse of ``keep_columns``: ``rollout`` widened to the full ``prompt_width`` and response
    ``budget`` with masked padding (token 0, attention 0, 0 in every ``[B, N]`` field), so that
    ``keep_columns`` of the result with the original widths gives ``rollout`` back exactly."""
    response = rollout.mask.shape[1]
    prompt = rollout.tokens.shape[1] - response
    sides = ((0, 0), (prompt_width - prompt, budget - response))
    batch = rollout.batch.replace(**{k: jnp.pad(x, ((0, 0), (0, budget - response)))
                                     for k, x in _response_fields(rollout.batch).items()})
    return rollout.replace(tokens=jnp.pad(rollout.tokens, sides), attention_mask=jnp.pad(rollout.attention_mask, sides),
                           batch=batch)


def _round_up(n: int, width: int) -> int:
    """The smallest multiple of max(ceil(width / 4), TRIM_UNIT) that is >= max(n, 1), at most ``width``."""
    quarter = max(-(-width // 4), TRIM_UNIT)
    return min(width, -(-max(n, 1) // quarter) * quarter)


def collect(policy: CausalLM | None, tokenizer, examples: list[dict], reward_fn, correct_fn, key,
            config: RolloutConfig, greedy_baseline: bool = False, eos_ids=None, mesh: Mesh | None = None,
            prompt_format: PromptFormat = PLAIN, samples: Samples | None = None, mix=None) -> tuple[Rollout, dict]:
    """Sample, decode and score K responses per example; the Rollout and per-row statistics.
    ``samples``: the responses already dispatched (``dispatch_samples`` with ``config.sampling(eos_ids, pad, n=K)``).

    ``reward_fn`` gives the training reward, ``correct_fn`` the task's verifier
    (1 = correct), both ``fn(prompts, completions, **fields)``. With
    ``greedy_baseline`` (ReMax) one greedy response per prompt is scored too.
    ``eos_ids`` end a response (default: the tokenizer's EOS); ``prompt_format`` renders
    the prompts (a chat template, see ``PromptFormat``). A row with a non-finite
    reward raises ``RewardError``, or with ``config.nonfinite_rewards="mask"`` masks its
    prompt group (``stats["nonfinite"]`` marks the row). ``mix`` (a ``learned_reward.Mix`` with a reward
    model): the training reward adds its weighted scores, and the statistics its raw scores
    (``learned``) and per-row counts of its agreement with the verifier (``Mix.statistics``).
    ``config.length_penalty`` and the overlong penalty come off the reward last. A process reward
    model (``Mix.per_step``) gives per-token rewards instead (``Mix.token_rewards``: each step's on its
    last token), the rest of the reward on each response's last token: ``Batch.rewards`` [B, N], the
    paper's process rewards.

    On a ``mesh`` (default: one device) ``examples`` are this process's share of the
    step's prompts (``multihost.process_rows``): the Rollout is global (split over
    ``data`` x ``fsdp``), the statistics are this process's rows.
    """
    eos_ids = (tokenizer.eos_token_id,) if eos_ids is None else tuple(eos_ids)
    mesh = single_device_mesh() if mesh is None else mesh
    k, pad = config.samples_per_prompt, pad_id(tokenizer)
    learned = {} if mix is None or mix.reward_model is None or mix.per_step else {"learned": mix.reward_model}
    mixing = mix if learned else None           # a reward model's score joins each response's reward
    scored = sample_and_score(policy, tokenizer, examples, config.max_prompt_tokens, key,
                              config.sampling(eos_ids, pad, n=k), {"correct": correct_fn, "reward": reward_fn,
                                                                   **learned}, mesh,
                              config.nonfinite_rewards, prompt_format, samples)
    lengths, truncated = scored.lengths, scored.truncated
    sampled_learned = scored.scores.get("learned")
    rewards = _mixed(mixing, scored.scores["reward"], sampled_learned) + length_penalties(lengths, config)
    token_rewards = None
    if mix is not None and mix.per_step:                         # a process reward model: rewards per step
        token_rewards, sampled_learned = mix.token_rewards(tokenizer, scored.prompts, scored.completions,
                                                           scored.response, lengths, eos_ids)
        token_rewards[np.arange(len(rewards)), np.maximum(lengths - 1, 0)] += rewards     # the outcome's part
        rewards = token_rewards.sum(1)
    nonfinite = scored.nonfinite
    greedy_rewards = None
    if greedy_baseline:
        greedy = sample_and_score(policy, tokenizer, examples, config.max_prompt_tokens, key,
                                  config.sampling(eos_ids, pad, greedy=True), {"reward": reward_fn, **learned}, mesh,
                                  config.nonfinite_rewards, prompt_format)
        greedy_learned = greedy.scores.get("learned")
        greedy_rewards = np.repeat(_mixed(mixing, greedy.scores["reward"], greedy_learned, sampled_learned)
                                   + length_penalties(greedy.lengths, config), k)
        nonfinite = nonfinite | np.repeat(greedy.nonfinite, k)
    keep = ~np.repeat(nonfinite.reshape(-1, k).any(1), k)     # a group baseline needs all K rewards
    if config.mask_truncated:
        keep &= ~truncated
    if config.filter_equal_groups:
        groups = rewards.reshape(-1, k)
        keep &= np.repeat(groups.max(1) > groups.min(1), k)
    response_mask = (np.arange(scored.response.shape[1]) < lengths[:, None]).astype(np.float32)
    host = to_global({"mask": response_mask * keep[:, None], "greedy_rewards": greedy_rewards,
                      "rewards": rewards if token_rewards is None else token_rewards}, mesh)
    rollout = Rollout(tokens=scored.samples.tokens, attention_mask=scored.samples.attention_mask,
                      batch=core.Batch(logp=None, behaviour_logp=scored.samples.logprobs, group_size=k, **host))
    if config.trim_padding:
        rollout = trim_padding(rollout, scored.samples.lengths)
    stats = {"reward": rewards, "correct": scored.scores["correct"], "length": lengths, "truncated": truncated,
             "kept": keep, "nonfinite": nonfinite, "completions": scored.completions, "prompts": scored.prompts}
    if sampled_learned is not None:
        stats.update(mix.statistics(sampled_learned, scored.scores["correct"], k))
    return rollout, stats


def _mixed(mix, task_rewards, learned, reference=None):
    """The training reward before the length terms: ``task_rewards``, mixed with a learned reward's."""
    return task_rewards if mix is None else mix.combine(task_rewards, learned, reference)


def length_penalties(lengths, config: RolloutConfig) -> np.ndarray:
    """What a response's length takes off its reward [R]: DAPO's overlong punishment and the plain
    ``length_penalty * L / max_new_tokens``."""
    return (overlong_penalty(lengths, config.max_new_tokens, config.overlong_buffer, config.overlong_penalty)
            - np.float32(config.length_penalty) * np.asarray(lengths, np.float32) / config.max_new_tokens)
