"""Environments a policy acts in over several turns, and the tool-calling one.

An environment is any object with

    reset(example: dict) -> list[dict]           # the episode's opening messages ({"role", "content"})
    step(reply: str) -> Step                      # the policy's reply to the turn -> what happens next

and, for a supervised warm start on worked episodes (``pgjax.train.sft``), optionally

    demonstration(example: dict) -> list[str]     # the replies of a worked episode, in order

One environment plays one episode (one row of a rollout; ``pgjax.rollout.episodes`` makes one per row
from a factory). ``Step.observation`` is the messages the environment answers with (rendered by the
chat template and appended to the model's input: the policy never trains on them) or None when it
has nothing to add; ``Step.reward`` the turn's reward (None: none), placed on the turn's last policy
token, as the paper's process rewards are; ``Step.done`` ends the episode. ``Step.info`` counts
what the turn did (``calls``, ``valid_calls``), summed over an episode, and may say whether the
episode's answer is ``correct`` (1.0 / 0.0: the accuracy the logs report).

``ToolEnvironment`` answers tool calls with their results and scores the first reply that calls no
tool as the final answer. How a call is written is a ``CallFormat``:

- ``TaggedCalls``, the plain-text convention, for models whose chat template has none (SmolLM2's) and
  for base models: ``<calculator>12*7</calculator>``, then the end of the turn; the result comes back
  as ``<result>84</result>``;
- ``JsonCalls``, the convention of templates that take tools (Qwen2.5's, Hermes'):
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>``, the tools
  described by the template itself, the result in a ``tool`` message.

``call_format_for(chat_template)`` picks one. A malformed call (an unclosed tag, bad JSON, an unknown
tool, a name or argument of the wrong type, a missing argument) is an error observation the policy
sees, never an exception. A tool that raises, or returns something other than a ``ToolResult``, is
the tool's error, not the policy's: ``step`` raises, and ``pgjax.rollout.episodes`` records the episode
as ended by an environment error.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from typing import Protocol

from pgjax.agents.tools import Tool, ToolResult


@dataclasses.dataclass(frozen=True)
class Step:
    """What the environment does after a reply (module docstring)."""

    observation: list[dict] | None = None
    reward: float | None = None
    done: bool = False
    info: dict = dataclasses.field(default_factory=dict)


class Environment(Protocol):
    def reset(self, example: dict) -> list[dict]: ...

    def step(self, reply: str) -> Step: ...


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call: the tool's ``name`` and its ``arguments`` as the text the tool reads."""

    name: str
    arguments: str


class CallFormat(Protocol):
    @property
    def observation_role(self) -> str: ...

    def tool_prompt(self, tools: Sequence[Tool]) -> str: ...

    def parse(self, reply: str, tools: Sequence[Tool]) -> tuple[list[ToolCall], list[str]]: ...

    def write(self, call: ToolCall, tool: Tool) -> str: ...

    def result(self, text: str) -> str: ...


@dataclasses.dataclass(frozen=True)
class TaggedCalls:
    """The plain-text convention: a call is ``<NAME>ARGUMENTS</NAME>`` for a tool named NAME, the
    result comes back as ``<result>TEXT</result>`` in a message of ``observation_role`` (``user``: a
    template without a tool role renders it). ``parse`` finds every call in the reply, in order; an
    opening tag of a tool without its closing tag is an error."""

    observation_role: str = "user"

    def tool_prompt(self, tools: Sequence[Tool]) -> str:
        lines = [f"- {tool.name}: {tool.description}. Call it as <{tool.name}>...</{tool.name}>" for tool in tools]
        return ("You can use tools. To call one, write the call and end your message; its result comes back as "
                "<result>...</result>. When you know the answer, reply with it and call no tool.\nTools:\n"
                + "\n".join(lines))

    def parse(self, reply: str, tools: Sequence[Tool]) -> tuple[list[ToolCall], list[str]]:
        names = "|".join(re.escape(tool.name) for tool in tools)
        calls = [ToolCall(m.group(1), m.group(2).strip())
                 for m in re.finditer(rf"<({names})>(.*?)</\1>", reply, re.S)]
        opened = re.findall(rf"<({names})>", reply)
        errors = [f"error: <{name}> is not closed with </{name}>" for name in dict.fromkeys(opened)
                  if opened.count(name) > sum(call.name == name for call in calls)]
        return calls, errors

    def write(self, call: ToolCall, tool: Tool) -> str:
        """The call as the policy writes it, which ``parse`` reads back."""
        return f"<{call.name}>{call.arguments}</{call.name}>"

    def result(self, text: str) -> str:
        return f"<result>{text}</result>"


@dataclasses.dataclass(frozen=True)
class JsonCalls:
    """The convention of chat templates that take tools: ``<tool_call>{"name": ..., "arguments":
    {PARAMETER: ...}}</tool_call>``, the tools given to the template as JSON schemas
    (``schemas``), each result in a ``tool`` message. A call that is not JSON, names no known tool
    or lacks the tool's parameter is an error."""

    observation_role: str = "tool"

    def tool_prompt(self, tools: Sequence[Tool]) -> str:
        return ""                                   # the template describes the tools (``schemas``)

    @staticmethod
    def schemas(tools: Sequence[Tool]) -> list[dict]:
        """The tools as the JSON schemas chat templates take (``apply_chat_template(tools=...)``)."""
        return [{"type": "function", "function": {
            "name": tool.name, "description": tool.description,
            "parameters": {"type": "object", "properties": {tool.parameter: {"type": "string"}},
                           "required": [tool.parameter]}}} for tool in tools]

    def parse(self, reply: str, tools: Sequence[Tool]) -> tuple[list[ToolCall], list[str]]:
        by_name = {tool.name: tool for tool in tools}
        calls, errors = [], []
        for body in re.findall(r"<tool_call>(.*?)</tool_call>", reply, re.S):
            try:
                call = json.loads(body)
            except json.JSONDecodeError as error:
                errors.append(f"error: the tool call is not JSON ({error.msg})")
                continue
            name = call.get("name") if isinstance(call, dict) else None
            tool = by_name.get(name) if isinstance(name, str) else None
            arguments = call.get("arguments") if isinstance(call, dict) else None
            if tool is None:
                named = repr(name if isinstance(call, dict) else call)
                errors.append(f"error: no tool named {named if len(named) <= 60 else named[:57] + '...'}")
            elif not isinstance(arguments, dict) or not isinstance(arguments.get(tool.parameter), str):
                errors.append(f"error: {tool.name} takes {{\"{tool.parameter}\": \"...\"}}")
            else:
                calls.append(ToolCall(tool.name, arguments[tool.parameter]))
        if reply.count("<tool_call>") > reply.count("</tool_call>"):
            errors.append("error: <tool_call> is not closed with </tool_call>")
        return calls, errors

    def write(self, call: ToolCall, tool: Tool) -> str:
        """The call as the policy writes it, which ``parse`` reads back (the argument under ``tool``'s
        parameter)."""
        return "<tool_call>" + json.dumps({"name": call.name, "arguments": {tool.parameter: call.arguments}}) \
            + "</tool_call>"

    def result(self, text: str) -> str:
        return text


def call_format_for(chat_template: str | None) -> CallFormat:
    """``JsonCalls`` for a chat template that renders ``<tool_call>`` (it takes tools), else
    ``TaggedCalls`` (the plain-text convention), its results in ``user`` messages."""
    return JsonCalls() if chat_template and "<tool_call>" in chat_template else TaggedCalls()


class ToolEnvironment:
    """Tools in a loop: each reply's calls (``calls.parse``) run in order and their results, or the
    errors of malformed calls, come back in one observation message; the first reply that calls no
    tool is the final answer, scored by ``answer_reward(example, reply)``, and ends the episode. A
    malformed call's turn gets ``invalid_call_reward`` (None: no reward). The opening messages are a
    system message with the tool prompt (``calls.tool_prompt``; none for ``JsonCalls``, whose
    template describes the tools) and the example's prompt as the user's."""

    def __init__(self, tools: Sequence[Tool], answer_reward: Callable[[dict, str], float],
                 calls: CallFormat | None = None, invalid_call_reward: float | None = None):
        names = [tool.name for tool in tools]
        if not tools or len(set(names)) != len(names):
            raise ValueError(f"a ToolEnvironment needs tools with distinct names, got {names}")
        self.tools, self.answer_reward = tuple(tools), answer_reward
        self.calls = calls if calls is not None else TaggedCalls()
        self.invalid_call_reward = invalid_call_reward
        self.example: dict | None = None

    def reset(self, example: dict) -> list[dict]:
        self.example = example
        prompt = self.calls.tool_prompt(self.tools)
        return ([{"role": "system", "content": prompt}] if prompt else []) + [
            {"role": "user", "content": str(example["prompt"])}]

    def demonstration(self, example: dict) -> list[str]:
        """The replies of a worked episode of ``example`` (a warm start's demonstration): one writing
        its ``tool_calls`` (``{"name", "arguments"}`` each) in this environment's convention, then its
        ``answer``; the answer alone where it has no calls. ValueError for a call of a tool this
        environment lacks, or an example without an answer."""
        if not isinstance(example.get("answer"), str):
            raise ValueError("a demonstration needs the example's 'answer' (a string): the final reply")
        by_name = {tool.name: tool for tool in self.tools}
        written = []
        for call in example.get("tool_calls", []):
            name = call.get("name") if isinstance(call, dict) else None
            tool = by_name.get(name) if isinstance(name, str) else None
            if tool is None or not isinstance(call.get("arguments"), str):
                raise ValueError(f"the example's tool call {call!r} is not {{'name': one of {sorted(by_name)}, "
                                 "'arguments': text}")
            written.append(self.calls.write(ToolCall(call["name"], call["arguments"]), tool))
        return (["\n".join(written)] if written else []) + [example["answer"]]

    def step(self, reply: str) -> Step:
        if self.example is None:
            raise RuntimeError("ToolEnvironment.step before reset")
        calls, errors = self.calls.parse(reply, self.tools)
        if not calls and not errors:
            reward = float(self.answer_reward(self.example, reply))
            return Step(reward=reward, done=True, info={"calls": 0, "valid_calls": 0, "correct": reward})
        by_name = {tool.name: tool for tool in self.tools}
        results = [by_name[call.name](call.arguments) for call in calls]
        for call, result in zip(calls, results, strict=True):
            if not isinstance(result, ToolResult):
                raise TypeError(f"the tool {call.name!r} returned {type(result).__name__}, not a ToolResult")
        texts = [self.calls.result(result.text) for result in results] + errors
        valid = sum(result.ok for result in results)
        return Step(observation=[{"role": self.calls.observation_role, "content": "\n".join(texts)}],
                    reward=self.invalid_call_reward if errors else None,
                    info={"calls": len(calls) + len(errors), "valid_calls": valid})
