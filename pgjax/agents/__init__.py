"""Agents: tools a policy calls and the environments it acts in (host-side Python).

- ``tools``: the tool interface (``Tool``, ``ToolResult``) and ``Calculator`` (exact arithmetic through
  ``pgjax.rewards.expressions``, never ``eval``);
- ``sandbox``: ``PythonSandbox``, the Python tool: the model's program in a confined child process
  (``confine`` is the child's side). What it guarantees: docs/agents.md.
"""
from pgjax.agents.sandbox import PythonSandbox, SandboxRun, SandboxUnavailable
from pgjax.agents.tools import Calculator, Tool, ToolResult, format_number

__all__ = ["Calculator", "PythonSandbox", "SandboxRun", "SandboxUnavailable", "Tool", "ToolResult", "format_number"]
