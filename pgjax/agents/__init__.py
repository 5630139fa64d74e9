"""Agents: tools a policy calls and the environments it acts in (host-side Python).

- ``tools``: the tool interface (``Tool``, ``ToolResult``) and ``Calculator`` (exact arithmetic through
  ``pgjax.tasks.expressions``, never ``eval``); ``TOOLS``, the built-in tools by name (``task.tools.names``,
  which also takes a tool of your own by import path);
- ``sandbox``: ``PythonSandbox``, the Python tool: the model's program in a confined child process
  (``confine`` is the child's side). What it guarantees: docs/agents.md;
- ``environment``: the environment interface (``reset`` / ``step`` -> ``Step``), the two tool-call
  conventions (``TaggedCalls``, ``JsonCalls``) and ``ToolEnvironment``.

Multi-turn rollouts of a policy in these environments: ``pgjax.rollout.episodes``.
"""
from pgjax.agents.environment import (
    CallFormat,
    Environment,
    JsonCalls,
    Step,
    TaggedCalls,
    ToolCall,
    ToolEnvironment,
    call_format_for,
)
from pgjax.agents.sandbox import PythonSandbox, SandboxError, SandboxRun, SandboxUnavailable
from pgjax.agents.tools import Calculator, Tool, ToolResult, format_number

# the built-in tools by the names task.tools.names takes (beside the import path of a tool of the user's):
# each a class called with no arguments
TOOLS = {"calculator": Calculator, "python": PythonSandbox}

__all__ = ["Calculator", "CallFormat", "Environment", "JsonCalls", "PythonSandbox", "SandboxError", "SandboxRun",
           "SandboxUnavailable", "Step", "TOOLS", "TaggedCalls", "Tool", "ToolCall", "ToolEnvironment", "ToolResult",
           "call_format_for", "format_number"]
