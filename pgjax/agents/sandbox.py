"""A Python tool for agents: the model's program runs in a confined child process.

Under RL the policy is the adversary: whatever a program does is something training can find, so
the sandbox is built to hold against programs written to break it (the threat model, each guarantee
as tested and what none covers: docs/agents.md "The Python sandbox").

``PythonSandbox()(code)`` writes ``code`` to ``main.py`` in a fresh temporary directory and runs it
with the interpreter pgjax runs on (or ``python``; as user ``user`` when pgjax runs as root),
isolated (``-I -S``: no site-packages, no ``PYTHON*`` variables), in a new session, with an empty
environment but ``PATH``, ``HOME``, ``TMPDIR`` and ``LANG``, and nothing on standard input.
``pgjax.agents.confine`` confines the child before any of the program runs:

- ``limits``: CPU seconds, address space, file size, open files (rlimits, the process's own);
- ``keyring``: a new, empty session keyring;
- ``network``, ``pids``, ``ipc``, ``uts``: new namespaces, in a new user namespace: no route anywhere,
  no process outside can be named (the program is PID 1 of its own), SysV objects and the host name
  its own;
- ``readonly``: every mount of the host read-only (no file, mode, owner, time or attribute changes);
- ``disk``: the directory is a tmpfs of ``disk_bytes``;
- ``userns`` and ``privileges``: a new user namespace, in which root is mapped to an unprivileged id,
  and no capability in any namespace;
- ``filesystem``: Landlock: read only the interpreter's installation and the system's libraries,
  execute only the interpreter and its loader, write only the temporary directory;
- ``tcp`` and ``signals``: Landlock refuses TCP bind / connect (ABI 4) and signals to processes outside
  the sandbox (ABI 6);
- ``syscalls``: a seccomp allowlist (``pgjax.agents.syscalls``);
- an audit hook in the child that refuses the same with readable errors (not a guarantee: a program
  that rewrites the standard library can get past it; the layers above are what hold).

The supervisor is bounded: the monitor kills the program at ``wall_seconds``, and the parent kills the
monitor (and so the program) a moment later whatever the program did with its descriptors, and after
more than ``MAX_OUTPUT_BYTES`` of output; the policy sees at most ``output_bytes`` of standard output
and of the error's last lines. Every ending (any exit status, any signal, any bytes) is a
``SandboxRun``, and ``observation`` turns it into a ``ToolResult``. The sandbox's own failures come
on a report pipe the program cannot write to: ``SandboxUnavailable`` when a layer is missing (by
default every layer is required, before any code runs, unless ``allow_weaker=True``),
``SandboxError`` when the sandbox itself breaks. The directory is removed after every call, so calls
share nothing.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import pwd
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any

from pgjax.agents import confine, syscalls
from pgjax.agents.tools import ToolResult

LAYERS = ("limits", "keyring", "userns", "network", "pids", "ipc", "uts", "readonly", "disk", "privileges",
          "no_new_privs", "filesystem", "tcp", "signals", "syscalls")
MAX_OUTPUT_BYTES = 1 << 20        # more output than this and the program is stopped
MONITOR_GRACE = 1.0               # seconds the monitor has past the deadline to report before it is killed
REPORT_BYTES = 1 << 16            # the most of the report pipe kept (its lines are a few hundred bytes)
CPU_SHARE = 0.5                   # the share of its CPU limit a program killed by SIGXCPU / SIGKILL used (at least)
                                  # for the limit to be why: the accounting read back can fall short of it
ENVIRONMENT_KEYS = ("PATH", "HOME", "TMPDIR", "LANG")


class SandboxUnavailable(RuntimeError):
    """The machine cannot set up an isolation layer the sandbox requires."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (its monitor ended without reporting): not anything the program did."""


@dataclasses.dataclass(frozen=True)
class SandboxRun:
    """What one program did: its output (bytes, as much as was kept), its exit status (negative: the
    signal that ended it), whether it was stopped at ``wall_seconds`` (``timed_out``) or for its output
    (``output_exceeded``), the layers that took hold, the wall-clock seconds of the call and the CPU
    seconds the program used."""

    stdout: bytes
    stderr: bytes
    returncode: int
    timed_out: bool
    output_exceeded: bool
    layers: dict
    seconds: float
    cpu_seconds: float = 0.0


SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/lib", "/lib64")
# what an interpreter reports of its own installation (for ``read_roots`` of another interpreter)
INSTALLATION = ("import json, os, sys, sysconfig; print(json.dumps([sys.base_prefix, sys.base_exec_prefix, "
                "sysconfig.get_paths()['stdlib'], sysconfig.get_paths()['platstdlib'], "
                "os.path.dirname(os.path.realpath(sys.executable))]))")


@functools.lru_cache(maxsize=8)
def read_roots(interpreter: str = "") -> list[str]:
    """What a sandboxed interpreter may read: its installation (``sys.base_prefix``, the standard
    library's real locations, the directory of its executable) and the system's shared libraries.
    ``interpreter``: another Python than pgjax's own ("": pgjax's), asked for its installation."""
    if interpreter and os.path.realpath(interpreter) != os.path.realpath(sys.executable):
        asked = subprocess.run([interpreter, "-I", "-S", "-c", INSTALLATION], capture_output=True, text=True,
                               timeout=30)
        if asked.returncode != 0:
            raise SandboxUnavailable(f"the sandbox's interpreter {interpreter} does not run: {asked.stderr.strip()}")
        paths = set(json.loads(asked.stdout))
    else:
        paths = {sys.base_prefix, sys.base_exec_prefix, sysconfig.get_paths()["stdlib"],
                 sysconfig.get_paths()["platstdlib"], os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(os.path.realpath(p) for p in paths | set(SYSTEM_LIBRARIES) if os.path.exists(p))


def elf_loader(executable: str) -> str | None:
    """The real path of the program interpreter (``PT_INTERP``, the dynamic loader the kernel runs
    first) an ELF ``executable`` names; None for a static or non-ELF file."""
    with open(executable, "rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF":
            return None
        wide, order = header[4] == 2, "<" if header[5] == 1 else ">"
        offset, entry_size, entries = (struct.unpack_from(order + "Q", header, 32)[0] if wide else
                                       struct.unpack_from(order + "I", header, 28)[0],
                                       *struct.unpack_from(order + "HH", header, 54 if wide else 42))
        for index in range(entries):
            file.seek(offset + index * entry_size)
            entry = file.read(entry_size)
            if struct.unpack_from(order + "I", entry, 0)[0] == 3:                       # PT_INTERP
                start, size = (struct.unpack_from(order + "QQQQ", entry, 8)[0::3] if wide else
                               struct.unpack_from(order + "IIII", entry, 4)[0::3])
                file.seek(start)
                return os.path.realpath(file.read(size).rstrip(b"\0").decode())
    return None


def unsearchable_by(path: str, uid: int, gid: int) -> str | None:
    """The first directory on the way to ``path`` (itself included, if a directory) that user ``uid``
    of group ``gid`` may not search, by its permission bits; None if the whole way is open."""
    parts = pathlib.Path(path).parts
    for depth in range(1, len(parts) + 1):
        directory = os.path.join(*parts[:depth])
        if not os.path.isdir(directory):
            break
        info = os.stat(directory)
        bit = (stat.S_IXUSR if info.st_uid == uid else stat.S_IXGRP if info.st_gid == gid else stat.S_IXOTH)
        if not info.st_mode & bit:
            return directory
    return None


def confine_source() -> str:
    """The child's script (``pgjax.agents.confine``), passed as ``-c``: the confined child reads no
    file of pgjax's."""
    return pathlib.Path(confine.__file__).read_text(encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class PythonSandbox:
    """The Python tool (module docstring). Limits: ``cpu_seconds`` of CPU (SIGXCPU, then SIGKILL a
    second later), ``wall_seconds`` of wall time, ``memory_bytes`` of address space, ``file_bytes`` per
    file written, ``disk_bytes`` in all (the tmpfs, which is memory), ``open_files`` descriptors;
    ``output_bytes``: what the policy sees of each stream.

    ``python``: the interpreter programs run on ("": the one pgjax runs on; another, say, with the
    packages the task's programs need); the program may read its installation. ``user``: a process
    running as root runs the programs as this user id instead (its group: the user's, else the same
    number), which then enters a user namespace of its own to set up the namespaces (a root
    container's trainer, say, with ``user=65534``, nobody); the interpreter must be reachable by it."""

    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 512 << 20
    file_bytes: int = 8 << 20
    disk_bytes: int = 16 << 20
    open_files: int = 64
    output_bytes: int = 2048
    allow_weaker: bool = False
    audit_hook: bool = True         # False only to test the OS layers alone
    python: str = ""
    user: int | None = None
    name: str = "python"
    description: str = "runs a Python 3 program (standard library only, no files outside its directory, " \
                       "no network) and returns what it prints"
    parameter: str = "code"

    def __post_init__(self):
        for field in ("cpu_seconds", "wall_seconds", "memory_bytes", "file_bytes", "disk_bytes", "open_files",
                      "output_bytes"):
            if not getattr(self, field) > 0:
                raise ValueError(f"PythonSandbox.{field} must be positive, got {getattr(self, field)!r}")
        if self.memory_bytes < 64 << 20:
            raise ValueError(f"PythonSandbox.memory_bytes must be at least 64 MiB (the interpreter's own "
                             f"address space), got {self.memory_bytes}")
        if self.python and not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)):
            raise ValueError(f"PythonSandbox.python must be an executable file, got {self.python!r}")
        if self.user is not None:
            if os.geteuid() != 0:
                raise ValueError(f"PythonSandbox(user={self.user}) switches user, which needs root; a process "
                                 f"that is not root runs the programs as itself")
            if not isinstance(self.user, int) or isinstance(self.user, bool) or self.user <= 0:
                raise ValueError(f"PythonSandbox.user must be a user id > 0 (not root), got {self.user!r}")
            closed = unsearchable_by(self.interpreter(), self.user, self.group())
            if closed:
                raise ValueError(f"PythonSandbox(user={self.user}) cannot reach the interpreter "
                                 f"{self.interpreter()}: {closed} is not searchable by that user; pass "
                                 f"python= an interpreter it can run (e.g. /usr/bin/python3)")
            self.parent_directory()

    def interpreter(self) -> str:
        """The real path of the interpreter programs run on."""
        return os.path.realpath(self.python or sys.executable)

    def parent_directory(self) -> str:
        """Where each call's directory is made: the temporary directory, or under ``user`` the first of
        it, /var/tmp and /dev/shm that the user can reach (ValueError if none)."""
        if self.user is None:
            return tempfile.gettempdir()
        candidates = dict.fromkeys((tempfile.gettempdir(), "/var/tmp", "/dev/shm"))
        for candidate in candidates:
            if os.path.isdir(candidate) and unsearchable_by(candidate, self.user, self.group()) is None:
                return candidate
        raise ValueError(f"PythonSandbox(user={self.user}): none of {', '.join(candidates)} is searchable by that "
                         f"user, so it could not reach its working directory; set TMPDIR to one it can")

    def group(self) -> int:
        """The group id programs run with under ``user``: the user's own group, else the same number."""
        if self.user is None:
            raise ValueError("PythonSandbox(user=None) runs programs as the caller: there is no user's group")
        try:
            return pwd.getpwuid(self.user).pw_gid
        except KeyError:
            return self.user

    def run(self, code: str) -> SandboxRun:
        """Run ``code`` confined. ``SandboxUnavailable`` if a required layer cannot be set up (nothing
        of the program runs), ``SandboxError`` if the sandbox itself fails; whatever the program does
        is in the ``SandboxRun``."""
        directory = tempfile.mkdtemp(prefix="pgjax-sandbox-", dir=self.parent_directory())
        try:
            # a lone surrogate is kept as the bytes it stands for: the program's own SyntaxError, not ours
            pathlib.Path(directory, "main.py").write_bytes(code.encode("utf-8", "surrogatepass"))
            return self._run_in(directory)
        finally:
            _remove(directory)

    def __call__(self, arguments: str) -> ToolResult:
        """The tool call: ``run`` the program and show the policy what it printed, or why it stopped."""
        if not isinstance(arguments, str):
            return ToolResult(f"error: the program must be text, got {type(arguments).__name__}", ok=False)
        return observation(self.run(arguments), self)

    def _run_in(self, directory: str) -> SandboxRun:
        report_read, report_write = os.pipe()
        source = confine_source()
        program_filter = syscalls.filter_program()
        start = time.monotonic()
        config: dict[str, Any]      # the monitor's settings, as JSON
        config = {"dir": directory, "cpu_seconds": self.cpu_seconds, "memory_bytes": self.memory_bytes,
                  "file_bytes": self.file_bytes, "disk_bytes": self.disk_bytes, "open_files": self.open_files,
                  "report_fd": report_write, "deadline": start + self.wall_seconds,
                  "read_roots": read_roots(self.python),
                  "exec_files": [path for path in (self.interpreter(), elf_loader(self.interpreter())) if path],
                  "read_files": ["/etc/ld.so.cache", "/dev/urandom"],
                  "write_files": ["/dev/null"], "audit": self.audit_hook, "source": source,
                  "syscalls": program_filter.hex() if isinstance(program_filter, bytes) else None,
                  "require": [] if self.allow_weaker else [layer for layer in LAYERS if layer != "signals"]}
        environment = {"PATH": "/usr/bin:/bin", "HOME": directory, "TMPDIR": directory, "LANG": "C.UTF-8"}
        identity: dict[str, Any] = {}      # Popen's user, group and extra_groups
        if self.user is not None:
            identity = {"user": self.user, "group": self.group(), "extra_groups": []}
            for path in (directory, os.path.join(directory, "main.py")):
                os.chown(path, self.user, self.group())
        try:
            child = subprocess.Popen([self.interpreter(), "-I", "-S", "-c", source, json.dumps(config)],
                                     cwd=directory, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, pass_fds=(report_write,), start_new_session=True,
                                     **identity)
        except BaseException:
            os.close(report_read)
            raise
        finally:
            os.close(report_write)
        with os.fdopen(report_read, "rb") as report:
            kept, stopped = _supervise(child, report, start + self.wall_seconds + MONITOR_GRACE, self.output_bytes)
        layers, status, monitor_stopped = _read_report(kept[report])
        missing = [layer for layer in config["require"] if not layers.get(layer)]
        if layers and missing:
            why = f" ({program_filter})" if "syscalls" in missing and isinstance(program_filter, str) else ""
            raise SandboxUnavailable(f"this machine cannot set up the sandbox's {', '.join(missing)}{why} "
                                     f"(layers: {layers}); PythonSandbox(allow_weaker=True) runs without them")
        if status is None and stopped is None and not monitor_stopped:
            raise SandboxError(f"the sandbox's monitor ended without a report (exit status {child.returncode}): "
                               + kept[child.stderr][-500:].decode("utf-8", "replace").strip())
        # no layers and stopped: the time ran out before the program started (a loaded machine), as any timeout
        status = status or {"returncode": -signal.SIGKILL, "cpu_seconds": 0.0}
        return SandboxRun(kept[child.stdout], kept[child.stderr], status["returncode"],
                          monitor_stopped or stopped == "time", stopped == "output", layers,
                          time.monotonic() - start, status["cpu_seconds"])


def _supervise(child: subprocess.Popen, report, deadline: float, keep: int) -> tuple[dict, str | None]:
    """Read the child's two pipes and the report pipe until all three close, whatever the program does
    with its descriptors: keep the first ``keep`` bytes of standard output, the last ``keep`` of
    standard error, the whole report (a few lines; capped). At ``deadline`` or after
    ``MAX_OUTPUT_BYTES`` of output, kill the monitor's process group (the program dies with its
    monitor) and stop reading ``MONITOR_GRACE`` later at most. Returns what was kept and why the
    parent stopped it (None, "time" or "output"); the child has been reaped."""
    if child.stdout is None or child.stderr is None:
        raise ValueError("_supervise reads a child started with stdout=PIPE and stderr=PIPE")
    kept = {child.stdout: b"", child.stderr: b"", report: b""}
    received, stopped, give_up = 0, None, math.inf
    with selectors.DefaultSelector() as selector:
        for stream in kept:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map() and time.monotonic() < give_up:
            if stopped is None and time.monotonic() >= deadline:
                stopped, give_up = "time", time.monotonic() + MONITOR_GRACE
                _kill_group(child)
            for key, _ in selector.select(timeout=max(min(deadline, give_up) - time.monotonic(), 0.01)):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                stream = key.fileobj
                if stream is report:
                    kept[report] = (kept[report] + data)[:REPORT_BYTES]
                    continue
                received += len(data)
                buffer = kept[stream] + data
                kept[stream] = buffer[:keep + 1] if stream is child.stdout else buffer[-(keep + 1):]
                if received > MAX_OUTPUT_BYTES and stopped is None:
                    stopped, give_up = "output", time.monotonic() + MONITOR_GRACE
                    _kill_group(child)
    try:
        child.wait(timeout=MONITOR_GRACE)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        child.wait()
    _kill_group(child)                       # anything left in its group (the program can start nothing)
    child.stdout.close()
    child.stderr.close()
    return kept, stopped


def _read_report(text: bytes) -> tuple[dict, dict | None, bool]:
    """The layers, the program's status (None: none came) and whether the monitor stopped it at the
    deadline, from the report pipe's JSON lines (``pgjax.agents.confine``: written by the monitor, by
    init and by the program's process before it became the program, which cannot write there)."""
    layers: dict[str, Any] = {}     # layer name -> whether it took hold
    status, timed_out = None, False
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            layers.update(entry.get("layers") or {})
            status = entry.get("status", status)
            timed_out = timed_out or bool(entry.get("timed_out"))
    return layers, status, timed_out


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(directory: str) -> None:
    """Remove the sandbox's directory, whatever permissions the program left on it."""
    for root, dirs, _ in os.walk(directory):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700)
    os.chmod(directory, 0o700)
    shutil.rmtree(directory, ignore_errors=True)


def signal_name(number: int) -> str:
    """``SIGSEGV``; ``SIGRTMIN+3`` for a real-time signal; ``signal 77`` for a number no signal has."""
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN < number < signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return f"signal {number}"


def observation(run: SandboxRun, sandbox: PythonSandbox) -> ToolResult:
    """What the policy sees of ``run``: its standard output (cut at ``output_bytes``, the cut marked),
    then, if it failed, the last ``output_bytes`` of its error output (the traceback's end) or why it was
    stopped. ``ok``: it exited with status 0 within its limits; any other ending, whatever the exit
    status or signal, is ``ok=False``."""
    keep = sandbox.output_bytes
    out = run.stdout[:keep].decode("utf-8", errors="replace")
    truncated = len(run.stdout) > keep or run.output_exceeded
    if truncated:
        out += f"\n[output cut at {keep} bytes]"
    error = run.stderr[-keep:].decode("utf-8", errors="replace").strip()
    signalled = -run.returncode if run.returncode < 0 else None
    if run.timed_out:
        reason = f"error: stopped after {sandbox.wall_seconds:g} s (the time limit)"
    elif run.output_exceeded:
        reason = f"error: stopped after printing more than {MAX_OUTPUT_BYTES} bytes"
    elif signalled in (signal.SIGXCPU, signal.SIGKILL) and run.cpu_seconds >= CPU_SHARE * sandbox.cpu_seconds:
        reason = f"error: stopped after {sandbox.cpu_seconds} s of CPU time (the limit)"
    elif signalled is not None:
        reason = f"error: killed by {signal_name(signalled)}" + (f"\n{error}" if error else "")
    elif run.returncode != 0:
        reason = f"error (exit status {run.returncode}):\n{error}" if error else f"error: exit status {run.returncode}"
    else:
        reason = ""
    text = "\n".join(part for part in (out.rstrip("\n"), reason) if part) or "(no output)"
    return ToolResult(text, ok=not reason, truncated=truncated)
