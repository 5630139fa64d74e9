"""The Python sandbox's security suite (pgjax.agents.sandbox): every attack the docs list is contained,
and what the policy sees is stated. Each attack runs twice: with the audit hook (the readable errors a
policy gets) and without it, the operating-system layers alone (Landlock, seccomp, the namespaces,
the rlimits), to show those hold by themselves. The containment is checked from outside the sandbox:
the file is not there, the server got no connection, the process is alive, the run ended in time."""
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from pgjax.agents import sandbox as sandbox_module
from pgjax.agents import syscalls
from pgjax.agents.sandbox import LAYERS, PythonSandbox, SandboxError, SandboxUnavailable, observation

QUICK = dict(cpu_seconds=1, wall_seconds=3.0)


def layers_here() -> dict:
    return PythonSandbox(allow_weaker=True).run("pass").layers


LAYERS_HERE = layers_here()
needs_layers = pytest.mark.skipif(not all(LAYERS_HERE.get(layer) for layer in LAYERS if layer != "signals"),
                                  reason=f"this machine lacks sandbox layers: {LAYERS_HERE}")
pytestmark = needs_layers


def unprivileged() -> dict | None:
    """How a root test process runs the programs as nobody (``user=65534``, through user namespaces of
    their own: the path a trainer that is not root takes): with an interpreter that user can reach,
    pgjax's own or the system's; None when this process is not root or no interpreter is reachable."""
    if os.geteuid() != 0:
        return None                     # the suite already runs the programs as a user that is not root
    for python in (sys.executable, "/usr/bin/python3"):
        real = os.path.realpath(python)
        if os.path.isfile(real) and sandbox_module.unsearchable_by(real, 65534, 65534) is None:
            return {"user": 65534, "python": python}
    return None


NOBODY = unprivileged()
as_nobody = pytest.mark.skipif(NOBODY is None, reason="not root, or no interpreter reachable by user 65534")
HOOK = pytest.mark.parametrize("hook, who", [(True, None), (False, None), pytest.param(True, "nobody", marks=as_nobody),
                                             pytest.param(False, "nobody", marks=as_nobody)],
                               ids=["hook", "os-layers-only", "hook-as-nobody", "os-layers-only-as-nobody"])


def run(code: str, hook: bool, who: str | None = None, **limits):
    identity = NOBODY if who == "nobody" else {}
    sandbox = PythonSandbox(audit_hook=hook, **identity, **{**QUICK, **limits})
    result = sandbox.run(code)
    return result, observation(result, sandbox)


def test_a_program_runs_and_the_policy_sees_its_output():
    result, seen = run("import json, math\nprint(json.dumps({'f': math.factorial(10)}))", hook=True)
    assert seen.ok and seen.text == '{"f": 3628800}' and result.returncode == 0 and not result.timed_out
    assert all(result.layers[layer] for layer in LAYERS if layer != "signals")
    _, seen = run("import threading\nt = threading.Thread(target=print, args=('from a thread',))\n"
                  "t.start(); t.join()", hook=True)
    assert seen.ok and seen.text == "from a thread"            # threads are not processes: allowed
    _, seen = run("x = 1", hook=True)
    assert seen.ok and seen.text == "(no output)"


STANDARD_LIBRARY = r"""
import json, math, re, decimal, fractions, itertools, collections, datetime, random, statistics, heapq, bisect
import functools, string, textwrap, unicodedata, csv, io, pathlib, glob, queue, hashlib, zlib, struct, array
import time, os, sys, tempfile, shutil, sqlite3, secrets, uuid, concurrent.futures, threading, signal, copy
import pickle, base64, operator, enum, dataclasses, typing, pprint, difflib, calendar, cmath, numbers, selectors
print(math.factorial(20), decimal.Decimal(1) / 8, fractions.Fraction(3, 9), statistics.mean([1, 2, 3]))
print(datetime.datetime.now().year > 2000, time.strftime("%Y", time.localtime()) > "2000", uuid.uuid4().version)
db = sqlite3.connect("x.db")
db.execute("create table t(a)")
db.execute("insert into t values (4)")
db.commit()
print(db.execute("select sum(a) from t").fetchone(), sqlite3.connect(":memory:").execute("select 1+1").fetchone())
with tempfile.TemporaryDirectory() as d:
    pathlib.Path(d, "f.txt").write_text("hello")
    shutil.copy(pathlib.Path(d, "f.txt"), pathlib.Path(d, "g.txt"))
    print(sorted(os.listdir(d)), len(glob.glob(d + "/*.txt")))
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    print(sum(pool.map(lambda x: x * x, range(100))))
signal.signal(signal.SIGALRM, lambda *a: print("alarm"))
signal.setitimer(signal.ITIMER_REAL, 0.05)
time.sleep(0.2)
print(hashlib.sha256(b"x").hexdigest()[:8], len(secrets.token_hex(8)), round(random.Random(0).random(), 4))
selector, (r, w) = selectors.DefaultSelector(), os.pipe()
selector.register(r, selectors.EVENT_READ)
os.write(w, b"x")
print(len(selector.select(0.1)), os.getcwd() == os.environ["HOME"])
sys.setrecursionlimit(5000)
def depth(n):
    return n if n == 0 else depth(n - 1)
print(depth(3000))
"""


def test_the_standard_library_works_under_the_allowlist():
    """What programs commonly use (files, sqlite, threads, timers, signals to itself, selectors, deep
    recursion) runs: the allowlist is not so tight that honest programs fail."""
    result, seen = run(STANDARD_LIBRARY, hook=True, cpu_seconds=5, wall_seconds=10.0)
    assert seen.ok, seen.text
    assert seen.text.splitlines() == ["2432902008176640000 0.125 1/3 2", "True True 4", "(4,) (2,)",
                                      "['f.txt', 'g.txt'] 2", "328350", "alarm", "2d711642 16 0.8444", "1 True", "0"]


def test_an_error_shows_the_programs_own_traceback_only():
    _, seen = run("def f():\n    return 1 / 0\nprint('before')\nf()", hook=True)
    assert not seen.ok and seen.text.startswith("before\nerror (exit status 1):\nTraceback")
    assert 'File "main.py", line 4' in seen.text and 'File "main.py", line 2, in f' in seen.text
    assert seen.text.endswith("ZeroDivisionError: division by zero") and "<string>" not in seen.text
    _, seen = run("exit(3)", hook=True)
    assert seen.text == "error: exit status 3" and not seen.ok


@HOOK
@pytest.mark.parametrize("code", [
    "open(TARGET, 'w').write('x')",
    "import os\nos.close(os.open(TARGET, os.O_CREAT | os.O_WRONLY))",
    "import os\nos.symlink(os.path.dirname(TARGET), 'link')\nopen(os.path.join('link', os.path.basename(TARGET)), 'w')",
    "open('inside', 'w').close()\nimport os\nos.rename('inside', TARGET)",
    "import os\nos.chdir('/')\nopen(TARGET.lstrip('/'), 'w')",
    "import shutil\nshutil.copy('main.py', TARGET)",
], ids=["open", "os.open", "symlink", "rename", "chdir", "shutil"])
def test_writes_outside_the_directory_are_refused(tmp_path, code, hook, who):
    target = tmp_path / "escaped"
    _, seen = run(f"TARGET = {str(target)!r}\n{code}", hook, who)
    assert not target.exists() and not seen.ok
    assert ("sandbox: " in seen.text) if hook else ("PermissionError" in seen.text or "OSError" in seen.text)


@HOOK
@pytest.mark.parametrize("path", ["/etc/passwd", "/proc/{ppid}/environ", "{repo}/pyproject.toml", "/root"])
def test_reads_outside_the_directory_and_the_interpreter_are_refused(path, hook, who):
    path = path.format(ppid=os.getpid(), repo=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    reader = "import os\nprint(os.listdir(P))" if path == "/root" else "print(open(P).read()[:20])"
    _, seen = run(f"P = {path!r}\n{reader}", hook, who)
    assert not seen.ok and "PermissionError" in seen.text
    assert ("sandbox: reading" in seen.text) if hook else ("Permission denied" in seen.text)


@HOOK
def test_the_parents_environment_is_not_visible(monkeypatch, hook, who):
    monkeypatch.setenv("PGJAX_SANDBOX_SECRET", "hunter2")
    _, seen = run("import os\nprint(sorted(os.environ))", hook, who)
    assert seen.ok and seen.text == "['HOME', 'LANG', 'PATH', 'TMPDIR']"
    _, seen = run(f"print(open('/proc/{os.getpid()}/environ').read())", hook, who)     # the parent's, from /proc
    assert not seen.ok and "hunter2" not in seen.text and "PermissionError" in seen.text


@pytest.fixture()
def listeners():
    """A TCP server and a UDP socket on the loopback device, outside the sandbox."""
    tcp, udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    udp.bind(("127.0.0.1", 0))
    tcp.settimeout(0.3)
    udp.settimeout(0.3)
    yield tcp, udp
    tcp.close()
    udp.close()


@HOOK
def test_the_network_is_unreachable(listeners, hook, who):
    tcp, udp = listeners
    code = (f"import socket\ns = socket.create_connection(('127.0.0.1', {tcp.getsockname()[1]}), timeout=2)\n"
            f"print('connected')")
    _, seen = run(code, hook, who)
    assert not seen.ok and "connected" not in seen.text.splitlines()
    assert "sandbox: importing socket is not allowed" in seen.text if hook else "Error" in seen.text
    with pytest.raises(socket.timeout):
        tcp.accept()
    code = (f"import socket\nu = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"u.sendto(b'leak', ('127.0.0.1', {udp.getsockname()[1]}))\nprint('sent')")
    _, seen = run(code, hook, who)
    with pytest.raises(socket.timeout):
        udp.recvfrom(16)
    assert not seen.ok and "sent" not in seen.text.splitlines()


@HOOK
@pytest.mark.parametrize("code, refused", [
    ("import os\nwhile True:\n    os.fork()", "os.fork"),
    ("import subprocess\nprint(subprocess.run(['echo', 'es' + 'caped'], capture_output=True).stdout)",
     "importing subprocess"),
    ("import os\nprint(os.system('echo es' + 'caped'))", "os.system"),
    ("import os\nos.execv('/bin/sh', ['sh', '-c', 'echo es' + 'caped'])", "os.exec"),
    ("import multiprocessing\np = multiprocessing.Process(target=print)\np.start()", "importing multiprocessing"),
], ids=["fork-bomb", "subprocess", "system", "exec", "multiprocessing"])
def test_no_process_can_be_started(code, refused, hook, who):
    start = time.monotonic()
    _, seen = run(code, hook, who)
    assert time.monotonic() - start < 2.5 and "escaped" not in seen.text
    assert f"sandbox: {refused}" in seen.text if hook else "escaped" not in seen.text


@HOOK
def test_signals_to_processes_outside_are_refused(hook, who):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _, seen = run(f"import os, signal\nos.kill({victim.pid}, signal.SIGKILL)\nprint('killed')", hook, who)
        time.sleep(0.2)
        assert victim.poll() is None and not seen.ok
        assert "PermissionError" in seen.text if hook else "ProcessLookupError" in seen.text   # not in its namespace
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.slow
@HOOK
def test_an_infinite_loop_stops_at_the_cpu_limit_and_a_sleep_at_the_wall_limit(hook, who):
    start = time.monotonic()
    result, seen = run("while True:\n    pass", hook, who, wall_seconds=20.0)      # CPU time, even on a busy machine
    assert 0.9 < time.monotonic() - start < 19 and not result.timed_out
    assert seen.text == "error: stopped after 1 s of CPU time (the limit)"
    start = time.monotonic()
    result, seen = run("import time\nprint('waiting', flush=True)\ntime.sleep(60)", hook, who)
    assert result.timed_out and time.monotonic() - start < 4
    assert seen.text == "waiting\nerror: stopped after 3 s (the time limit)" and not seen.ok


@HOOK
@pytest.mark.parametrize("code", ["while True:\n    print('y' * 10000)", "print('z' * 10**8)",
                                  "import sys\nwhile True:\n    sys.stderr.write('e' * 10000)"])
def test_huge_output_is_cut_and_stops_the_program(code, hook, who):
    start = time.monotonic()
    result, seen = run(code, hook, who)
    assert result.output_exceeded and time.monotonic() - start < 2.5
    assert len(result.stdout) <= 2049 and len(result.stderr) <= 2049          # kept, not accumulated
    assert "error: stopped after printing more than 1048576 bytes" in seen.text and len(seen.text) < 5000


@HOOK
def test_memory_files_and_the_disk_are_bounded(hook, who):
    _, seen = run("x = bytearray(2**33)", hook, who)
    assert seen.text.endswith("MemoryError")
    _, seen = run("open('big', 'wb').write(b'0' * (20 << 20))", hook, who, file_bytes=8 << 20)
    assert "File too large" in seen.text
    _, seen = run("for i in range(10):\n    open(f'part{i}', 'wb').write(b'0' * (4 << 20))", hook, who)
    assert "No space left on device" in seen.text                   # 16 MiB of tmpfs in all


def test_calls_share_nothing_and_leave_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))          # where each call's directory is made
    sandbox = PythonSandbox(**QUICK)
    assert sandbox("open('note', 'w').write('first call')\nprint('wrote')").text == "wrote"
    seen = sandbox("import os\nprint(os.listdir('.'))")
    assert seen.text == "['main.py']"
    assert os.listdir(tmp_path) == []


def test_a_missing_layer_is_an_error_before_any_code_runs(monkeypatch, tmp_path):
    """A machine that cannot set up a layer (here: no seccomp filter, as without libseccomp) gets a
    SandboxUnavailable naming it and why; allow_weaker=True runs without it."""
    monkeypatch.setattr(syscalls, "filter_program", lambda: "no libseccomp here")
    marker = tmp_path / "ran"
    with pytest.raises(SandboxUnavailable, match=r"cannot set up the sandbox's syscalls \(no libseccomp here\)"):
        PythonSandbox(**QUICK).run(f"open({str(marker)!r}, 'w')")
    assert not marker.exists()
    result = PythonSandbox(allow_weaker=True, **QUICK).run("print('ran')")
    assert result.stdout == b"ran\n" and result.layers["syscalls"] is False


def test_a_task_with_the_python_tool_on_a_machine_without_a_layer_is_a_configuration_error(monkeypatch, tmp_path):
    """task.tools.names=python tries the sandbox once when the task is built: a missing layer is a
    ConfigError naming it before anything is written, not an error in every episode."""
    from helpers import tiny_experiment

    from pgjax.config import ConfigError, TaskSection
    from pgjax.train.context import task_context
    monkeypatch.setattr(syscalls, "filter_program", lambda: "no libseccomp here")
    exp = tiny_experiment(tmp_path, task=TaskSection(name="helpers:SumWithCalculator", tools="python"))
    with pytest.raises(ConfigError, match=r"task.tools.names=python: this machine cannot set up the sandbox's syscalls "
                                          r"\(no libseccomp here\)"):
        task_context(exp)
    assert not os.path.exists(exp.run_dir)


def test_the_allowlist_leaves_out_every_call_that_reaches_outside():
    """The calls the issue's attacks used, and their relatives, are not on the allowlist (so they fail
    with EPERM whatever the audit hook sees), every allowed name is one libseccomp knows, and the
    filter builds here."""
    import pyseccomp
    refused = {"fork", "vfork", "clone3", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open",
               "pidfd_getfd", "pidfd_send_signal", "socket", "socketpair", "shmget", "shmat", "msgget", "semget",
               "mq_open", "keyctl", "add_key", "request_key", "syslog", "sethostname", "setdomainname",
               "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "reboot", "init_module",
               "finit_module", "mount", "umount2", "fsopen", "fsmount", "fsconfig", "fspick", "move_mount",
               "open_tree", "mount_setattr", "pivot_root", "chroot", "mknod", "mknodat", "memfd_create",
               "setxattr", "lsetxattr", "fsetxattr", "removexattr", "unshare", "setns", "bpf", "perf_event_open",
               "io_uring_setup", "userfaultfd", "setuid", "setresuid", "setgid", "capset", "setsid", "setpgid",
               "prlimit64", "setpriority", "sched_setaffinity", "sched_setscheduler", "personality",
               "name_to_handle_at", "open_by_handle_at", "swapon", "acct", "quotactl", "kexec_load", "iopl"}
    assert not refused & set(syscalls.ALLOWED)           # the last three: allowed on the caller only (rules)
    for name in syscalls.ALLOWED:
        assert any(pyseccomp.resolve_syscall(arch, name) >= 0 for arch in (pyseccomp.Arch.X86_64,
                                                                                pyseccomp.Arch.AARCH64)), name
    program = syscalls.filter_program()
    assert isinstance(program, bytes) and len(program) % 8 == 0 and 0 < len(program) // 8 < 4096


@pytest.mark.parametrize("field, value", [("cpu_seconds", 0), ("wall_seconds", -1.0), ("memory_bytes", 1 << 20),
                                          ("output_bytes", 0)])
def test_bad_limits_are_errors(field, value):
    with pytest.raises(ValueError, match=f"PythonSandbox.{field}"):
        PythonSandbox(**{field: value})


def test_a_signal_ending_the_program_is_named():
    _, seen = run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", hook=False)
    assert seen.text.startswith("error: killed by SIGSEGV") and not seen.ok


@as_nobody
def test_a_root_process_runs_the_programs_as_the_user_it_names_with_every_layer():
    """``user=65534`` from root: the program runs as nobody, which sets up the namespaces in a user
    namespace of its own (the path any process that is not root takes), and every layer holds."""
    sandbox = PythonSandbox(**NOBODY, **QUICK)
    result = sandbox.run("import os\nopen('mine', 'w').write('x')\nprint(os.geteuid(), os.getegid(), "
                         "os.stat('mine').st_uid, sorted(os.listdir('.')))")
    assert result.stdout.decode() == "65534 65534 65534 ['main.py', 'mine']\n", result.stderr
    assert all(result.layers[layer] for layer in LAYERS)
    assert sandbox.parent_directory() in ("/var/tmp", "/dev/shm", tempfile.gettempdir())


def test_the_interpreter_and_the_user_are_checked_when_the_sandbox_is_built(tmp_path):
    with pytest.raises(ValueError, match="PythonSandbox.python must be an executable file"):
        PythonSandbox(python=str(tmp_path / "no-python"))
    if os.geteuid() != 0:
        with pytest.raises(ValueError, match="needs root"):
            PythonSandbox(user=65534)
        return
    for bad in (0, -3, True, "nobody"):
        with pytest.raises(ValueError, match="PythonSandbox.user must be a user id > 0"):
            PythonSandbox(user=bad)
    closed = tmp_path / "closed"
    (closed / "bin").mkdir(parents=True)
    interpreter = closed / "bin" / "python3"
    shutil.copy("/bin/true", interpreter)                  # checked by its path only: it never runs here
    closed.chmod(0o700)
    with pytest.raises(ValueError, match=f"cannot reach the interpreter {interpreter}: .* is not searchable"):
        PythonSandbox(user=65534, python=str(interpreter))
    # the permission bits of the user's class: the owner's here, others' for nobody above
    uid, gid = os.getuid(), os.getgid()
    assert sandbox_module.unsearchable_by(str(interpreter), uid, gid) is None
    closed.chmod(0o670)
    assert sandbox_module.unsearchable_by(str(interpreter), uid, gid) == str(closed)
    closed.chmod(0o700)


def test_another_interpreter_reads_its_own_installation():
    here = sandbox_module.read_roots()
    assert os.path.dirname(os.path.realpath(sys.executable)) in here and "/usr/lib" in here
    if os.path.isfile("/usr/bin/python3"):
        system = sandbox_module.read_roots("/usr/bin/python3")
        assert os.path.dirname(os.path.realpath("/usr/bin/python3")) in system
        result = PythonSandbox(python="/usr/bin/python3", **QUICK).run("import sys\nprint(sys.executable)")
        assert result.stdout.decode().strip() == os.path.realpath("/usr/bin/python3")


def test_the_loader_of_an_executable_is_read_from_its_program_headers():
    """``elf_loader`` against ``readelf -l``'s "Requesting program interpreter" where binutils exist."""
    loader = sandbox_module.elf_loader(os.path.realpath(sys.executable))
    assert loader is None or os.path.isfile(loader)
    assert sandbox_module.elf_loader(__file__) is None
    if shutil.which("readelf"):
        listed = subprocess.run(["readelf", "-l", os.path.realpath(sys.executable)], capture_output=True, text=True)
        named = [line.split(":", 1)[1].strip(" ]") for line in listed.stdout.splitlines()
                 if "program interpreter" in line]
        assert [loader] == [os.path.realpath(n) for n in named]


# --- hostile programs: each class of attack, run by the OS layers alone (the audit hook refuses ctypes,
# which most of them use), as root and as nobody; checked from outside the sandbox ---

OS_LAYERS = pytest.mark.parametrize("who", [None, pytest.param("nobody", marks=as_nobody)], ids=["root", "nobody"])
LIBC = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        "def call(name, result):\n    print(name, result, ctypes.get_errno())\n")


def hostile(code: str, who: str | None, **limits):
    """Run ``code`` with the OS layers alone; the run and the policy's observation."""
    return run(code, hook=False, who=who, **limits)


@OS_LAYERS
@pytest.mark.parametrize("code", [
    "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)",
    "import os, signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_IGN)\nos.close(1)\nos.close(2)\nwhile True:\n    time.sleep(1)",
    "import os, time\nnull = os.open('/dev/null', os.O_WRONLY)\nos.dup2(null, 1)\nos.dup2(null, 2)\ntime.sleep(60)",
], ids=["closes-its-output", "ignores-signals", "output-to-devnull"])
def test_the_wall_clock_limit_holds_whatever_the_program_does_with_its_descriptors(code, who):
    start = time.monotonic()
    result, seen = hostile(code, who, wall_seconds=1.0)
    assert time.monotonic() - start < 1.0 + sandbox_module.MONITOR_GRACE + 1.0
    assert result.timed_out and not seen.ok and seen.text == "error: stopped after 1 s (the time limit)"


@OS_LAYERS
@pytest.mark.parametrize("code, text", [
    ("exit(97)", "error: exit status 97"),                          # the monitor's own refusal code
    ("import os\nos._exit(255)", "error: exit status 255"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGRTMIN + 3)", "error: killed by SIGRTMIN+3"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGRTMAX)", "error: killed by SIGRTMAX"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)", "error: killed by SIGXCPU"),   # not the CPU limit
    ("import ctypes\nctypes.string_at(0)", "error: killed by SIGSEGV"),
    ("import os\nos.abort()", "error: killed by SIGABRT"),
    ("print('\ud800')", "SyntaxError"),                           # a lone surrogate in the code
    ("print('x')\x00", "null bytes"),
    ("import sys\nsys.stdout.buffer.write(bytes(range(256)) * 4)", "\ufffd"),
], ids=["exit-97", "exit-255", "realtime-signal", "sigrtmax", "sigxcpu", "segfault", "abort", "surrogate",
        "nul", "non-utf8-output"])
def test_every_ending_is_an_observation(code, text, who):
    result, seen = hostile(code, who)
    assert text in seen.text and isinstance(seen.text, str)
    assert seen.ok == (text == "\ufffd")


def test_the_tool_takes_only_text():
    seen = PythonSandbox(**QUICK)(["print(1)"])
    assert not seen.ok and seen.text == "error: the program must be text, got list"


@OS_LAYERS
def test_the_program_cannot_limit_renice_or_pin_the_trainer_or_another_call(who):
    """prlimit, setpriority (a process, its group, its user) and sched_setaffinity on every process the
    program could name; a concurrent call's limits stay its own; the trainer is unchanged."""
    import resource
    before = ([resource.getrlimit(r) for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NOFILE)],
              os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0))
    attack = ("import os, resource\nfor pid in [os.getppid(), 1, *range(2, 200), " + str(os.getpid()) + "]:\n"
              "    for action in (lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1)),\n"
              "                   lambda: os.setpriority(os.PRIO_PROCESS, pid, 19),\n"
              "                   lambda: os.sched_setaffinity(pid, {0})):\n"
              "        try:\n            action()\n            print('changed', pid)\n"
              "        except OSError:\n            pass\n"
              "for which in (os.PRIO_PGRP, os.PRIO_USER):\n    try:\n        os.setpriority(which, 0, 19)\n"
              "        print('reniced', which)\n    except OSError:\n        pass\n")
    victim = "import resource, time\ntime.sleep(1.0)\nprint(resource.getrlimit(resource.RLIMIT_CPU))"
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(hostile, victim, who, cpu_seconds=3, wall_seconds=5.0)
        time.sleep(0.3)
        _, seen = hostile(attack, who)
        _, victim_seen = waiting.result()
    assert seen.ok and seen.text == "(no output)"              # not even init's (1) or its own number (2)
    assert victim_seen.text == "(3, 4)"                                         # the concurrent call's own limits
    after = ([resource.getrlimit(r) for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NOFILE)],
             os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0))
    assert after == before


@OS_LAYERS
def test_unix_sockets_at_host_paths_cannot_be_connected(tmp_path, who):
    path = os.path.join(tempfile.gettempdir(), f"pgjax-test-{os.getpid()}-{who}.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen()
    server.settimeout(0.3)
    try:
        code = (f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\nprint('connected')\n")
        _, seen = hostile(code, who)
        assert not seen.ok and "PermissionError" in seen.text
        _, seen = hostile(LIBC + "call('socket', libc.socket(1, 1, 0))\ncall('socketpair', "
                          "libc.socketpair(1, 1, 0, (ctypes.c_int * 2)()))\ncall('vsock', libc.socket(40, 1, 0))", who)
        assert seen.text == "socket -1 1\nsocketpair -1 1\nvsock -1 1"           # EPERM, whatever the family
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()
        os.remove(path)


def session_keyring_keys() -> list[int] | None:
    """The ids of the keys in this process's session keyring, or None where keys are not supported."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buffer = (ctypes.c_int32 * 64)()
    size = libc.syscall(250, 11, -3, buffer, ctypes.sizeof(buffer)) if os.uname().machine == "x86_64" else -1
    return None if size < 0 else list(buffer[:size // 4])                   # KEYCTL_READ of KEY_SPEC_SESSION_KEYRING


@OS_LAYERS
def test_the_trainers_keyring_and_sysv_ipc_are_out_of_reach(who):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    secret = None
    if os.uname().machine == "x86_64":
        secret = libc.syscall(248, b"user", b"pgjax-test-secret", b"hunter2", 7, ctypes.c_int(-3))   # add_key
    keys = session_keyring_keys()
    try:
        read_it = (LIBC + "buf = ctypes.create_string_buffer(64)\n"
                   f"call('read', libc.syscall(250, 11, {secret if secret and secret > 0 else -3}, buf, 64))\n"
                   "call('join', libc.syscall(250, 1, None))\n"
                   "call('add', libc.syscall(248, b'user', b'planted', b'x', 1, ctypes.c_int(-3)))\n"
                   "call('shmget', libc.shmget(0x5eed, 4096, 0o1666))\ncall('msgget', libc.msgget(0x5eed, 0o1666))\n"
                   "call('semget', libc.semget(0x5eed, 1, 0o1666))\n")
        _, seen = hostile(read_it, who)
        assert seen.text == "read -1 1\njoin -1 1\nadd -1 1\nshmget -1 1\nmsgget -1 1\nsemget -1 1"
        assert session_keyring_keys() == keys                  # nothing planted in the trainer's keyring
        with open("/proc/sysvipc/shm") as table:
            assert "0x00005eed" not in table.read().lower() and "24301" not in table.read()
    finally:
        if secret and secret > 0:
            libc.syscall(250, 21, secret)                       # KEYCTL_INVALIDATE


@OS_LAYERS
def test_host_files_keep_their_metadata(who):
    """chmod (set-user-id), chown, utime and an extended attribute (a file capability, as root) on a
    file the trainer owns fail, and nothing about the file changes. Its metadata is readable (stat
    works), its contents are not."""
    folder = tempfile.mkdtemp(prefix="pgjax-test-host-")          # one nobody can search
    os.chmod(folder, 0o755)
    target = pathlib.Path(folder, "host-binary")
    target.write_bytes(b"\x7fELF")
    before = os.stat(target)
    code = (f"import os\nP = {str(target)!r}\nprint(os.stat(P).st_size)\n"
            "for name, action in [('chmod', lambda: os.chmod(P, 0o4777)), ('chown', lambda: os.chown(P, 0, 0)),\n"
            "                     ('utime', lambda: os.utime(P, (0, 0))),\n"
            "                     ('xattr', lambda: os.setxattr(P, 'user.planted', b'1')),\n"
            "                     ('capability', lambda: os.setxattr(P, 'security.capability', b'\\x01' * 20)),\n"
            "                     ('read', lambda: open(P, 'rb').read())]:\n"
            "    try:\n        action()\n        print(name, 'changed')\n"
            "    except OSError as error:\n        print(name, error.errno)\n")
    _, seen = hostile(code, who)
    lines = seen.text.splitlines()
    assert lines[0] == "4" and all(line.split()[1] != "changed" for line in lines[1:]) and len(lines) == 7, seen.text
    after = os.stat(target)
    assert (after.st_mode, after.st_uid, after.st_gid, after.st_mtime_ns) == \
        (before.st_mode, before.st_uid, before.st_gid, before.st_mtime_ns)
    assert os.listxattr(target) == []
    shutil.rmtree(folder)


@OS_LAYERS
def test_the_program_holds_no_capability_and_root_calls_fail(who):
    """capget says none; sethostname, syslog, turning nodev / noexec off on its own tmpfs, mknod of a
    device, setting the clock, reboot and memfd_create fail; the host's name is unchanged."""
    hostname = socket.gethostname()
    code = (LIBC + "caps = (ctypes.c_uint32 * 6)()\nheader = (ctypes.c_uint32 * 2)(0x20080522, 0)\n"
            "libc.capget(header, caps)\nprint('caps', list(caps))\n"
            "call('sethostname', libc.sethostname(b'pwned', 5))\n"
            "call('syslog', libc.klogctl(3, ctypes.create_string_buffer(4096), 4096))\n"
            "attr = (ctypes.c_uint64 * 4)(0, 4 | 8, 0, 0)\n"
            "call('mount_setattr', libc.syscall(442, -100, b'.', 0x8000, attr, 32))\n"
            "call('mknod', libc.mknod(b'kmsg', 0o020600, os.makedev(1, 11)))\n"
            "now = (ctypes.c_long * 2)()\nlibc.clock_gettime(0, now)\n"              # harmless if it got through:
            "call('clock_settime', libc.clock_settime(0, now))\n"                     # the clock set to now,
            "call('settimeofday', libc.settimeofday((ctypes.c_long * 2)(now[0], 0), None))\n"
            "call('reboot', libc.reboot(0x12345678))\ncall('memfd', libc.memfd_create(b'x', 0))\n"   # no such command
            "print(os.uname().nodename, os.geteuid())\n")
    _, seen = hostile(code, who)
    lines = seen.text.splitlines()
    assert lines[0] == "caps [0, 0, 0, 0, 0, 0]", seen.text
    assert all(line.endswith(" -1 1") for line in lines[1:-1]) and len(lines) == 10, seen.text
    assert lines[-1] == "sandbox 65534" and socket.gethostname() == hostname


# --- the fuzzer: random compositions of the attack classes; afterwards the trainer is intact ---

FUZZ_PROGRAMS = 200
ATTACKS = [      # each is safe for the machine even if it got through (no reboot, no clock jump), and visible if it did
    "import resource\nresource.prlimit({trainer}, resource.RLIMIT_CPU, (1, 1))",
    "import resource, os\nresource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (3, 3))",
    "import os\nos.setpriority(os.PRIO_USER, 0, 19)",
    "import os\nos.setpriority(os.PRIO_PROCESS, {trainer}, 19)",
    "import os\nos.sched_setaffinity({trainer}, {{0}})",
    "import os, signal\nos.kill({trainer}, signal.SIGSTOP)",
    "import os, signal\nos.kill(1, signal.SIGKILL)",
    "import os\nos.chmod({canary!r}, 0o4777)",
    "import os\nos.utime({canary!r}, (0, 0))",
    "import os\nos.setxattr({canary!r}, 'user.planted', b'1')",
    "import os\nos.chown({canary!r}, 65534, 65534)",
    "open({canary!r}, 'a').write('planted')",
    "import os\nos.rename({canary!r}, {canary!r} + '.moved')",
    "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({unix!r})",
    "import socket\nsocket.create_connection(('127.0.0.1', 1), timeout=0.2)",
    LIBC + "libc.syscall(248, b'user', b'planted', b'x', 1, ctypes.c_int(-3))",
    LIBC + "libc.shmget(0x5eed, 1 << 20, 0o1666)",
    LIBC + "libc.sethostname(b'pwned', 5)",
    LIBC + "libc.klogctl(3, ctypes.create_string_buffer(256), 256)",
    LIBC + "libc.syscall(442, -100, b'.', 0x8000, (ctypes.c_uint64 * 4)(0, 12, 0, 0), 32)",
    LIBC + "libc.mknod(b'node', 0o020600, os.makedev(1, 11))",
    LIBC + "t = (ctypes.c_long * 2)()\nlibc.clock_gettime(0, t)\nlibc.clock_settime(0, t)",
    LIBC + "libc.reboot(0x12345678)",
    LIBC + "libc.unshare(0x10000000)\nlibc.mount(b'none', b'/', None, 0x1020, None)",
    "import os\nos.memfd_create('x')",
    "import os\nos.fork()",
    "import os\nos.setsid()",
    "import ctypes\nctypes.CDLL(None).ptrace(16, {trainer}, 0, 0)",
    "x = bytearray(1 << 33)",
    "open('fill', 'wb').write(b'0' * (64 << 20))",
    "print('y' * (1 << 21))",
    "import os\nos.write(1, os.urandom(4096))",
]
ENDINGS = ["", "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(30)", "while True:\n    pass",
           "import time\ntime.sleep(30)", "import os, signal\nos.kill(os.getpid(), {signal})",
           "import os\nos._exit({status})", "raise SystemExit({status})",
           "import sys\nsys.stdout.buffer.write(bytes(range(256)))", "print('\\ud800')"]


def hostile_program(rng, trainer: int, canary: str, unix: str) -> str:
    """One to five attacks, each tried (its error caught, or not: then it ends the program), then an
    ending: nothing, a sleep with the output closed, a loop, a signal, an exit status, raw bytes."""
    parts = []
    for attack in rng.sample(ATTACKS, rng.randint(1, 5)):
        code = attack.format(trainer=trainer, canary=canary, unix=unix)
        if rng.random() < 0.8:
            code = "try:\n" + "".join(f"    {line}\n" for line in code.splitlines()) + \
                "except BaseException as error:\n    print(type(error).__name__)"
        parts.append(code)
    parts.append(rng.choice(ENDINGS).format(signal=rng.randint(1, 64), status=rng.randint(0, 255)))
    return "\n".join(parts)


def trainer_state(canary: str) -> dict:
    """What a program must not change: this process's limits, priority, CPUs and keyring, the canary
    file it owns (content, mode, owner, times, attributes), the host name and SysV memory."""
    import resource
    info = os.stat(canary)
    with open("/proc/sysvipc/shm") as shm:
        segments = shm.read()
    return {"limits": [resource.getrlimit(getattr(resource, name)) for name in dir(resource)
                       if name.startswith("RLIMIT_")],
            "priority": os.getpriority(os.PRIO_PROCESS, 0), "cpus": os.sched_getaffinity(0),
            "keyring": session_keyring_keys(), "canary": (pathlib.Path(canary).read_bytes(), info.st_mode, info.st_uid,
                                                         info.st_gid, info.st_mtime_ns, os.listxattr(canary)),
            "hostname": socket.gethostname(), "shm": segments}


@pytest.mark.slow
@pytest.mark.parametrize("who", [None, pytest.param("nobody", marks=as_nobody)], ids=["root", "nobody"])
def test_hostile_programs_leave_the_trainer_intact(who, monkeypatch):
    """``FUZZ_PROGRAMS`` random hostile programs (the seed is random each run, and in the failure
    message; PGJAX_FUZZ_SEED repeats one), four at a time: every one ends in an observation within its
    limits, and afterwards the trainer process is alive, with the same limits, priority, CPUs,
    keyring, files, host name and SysV memory, and no process or directory is left behind."""
    import concurrent.futures
    import random
    seed = int(os.environ.get("PGJAX_FUZZ_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    folder = tempfile.mkdtemp(prefix="pgjax-test-fuzz-")
    os.chmod(folder, 0o755)
    canary = os.path.join(folder, "canary")
    pathlib.Path(canary).write_text("the trainer's file")
    unix = os.path.join(folder, "service.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(unix)
    os.chmod(unix, 0o777)
    server.listen()
    server.setblocking(False)
    programs = [hostile_program(rng, os.getpid(), canary, unix) for _ in range(FUZZ_PROGRAMS)]
    calls = os.path.join(folder, "calls")                   # where the sandbox makes each call's directory
    os.mkdir(calls, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", calls)
    before = trainer_state(canary)
    sandbox = PythonSandbox(cpu_seconds=1, wall_seconds=1.0, **(NOBODY if who else {}), audit_hook=False)
    try:
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            seen = list(pool.map(sandbox, programs))
        assert all(isinstance(s.text, str) and isinstance(s.ok, bool) for s in seen), seed
        assert time.monotonic() - start < FUZZ_PROGRAMS * 2.5 / 4, seed                    # every call bounded
        with pytest.raises(BlockingIOError):
            server.accept()                                                            # nothing connected
        assert trainer_state(canary) == before, f"PGJAX_FUZZ_SEED={seed}"
        assert os.listdir(calls) == [], seed
        assert sandbox_processes(calls) == [], seed                                     # no process left
    finally:
        server.close()
        shutil.rmtree(folder)



def test_when_the_trainer_dies_the_program_dies_with_it(tmp_path):
    """A trainer killed (SIGKILL) during a call leaves no process of the sandbox behind: the monitor,
    init and the program each die at their parent's death."""
    trainer = subprocess.Popen([sys.executable, "-c", "from pgjax.agents import PythonSandbox\n"
                                "PythonSandbox(wall_seconds=60, cpu_seconds=60)('import time\\ntime.sleep(60)')"],
                               env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 20
    while not list(tmp_path.glob("pgjax-sandbox-*/main.py")) and time.monotonic() < deadline:
        time.sleep(0.05)
    directory = next(tmp_path.glob("pgjax-sandbox-*")).name
    time.sleep(0.5)                                             # the program is running
    running = [pid for pid in sandbox_processes(directory)]
    assert len(running) >= 3, running                           # monitor, init and program
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 5
    while sandbox_processes(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes(directory) == []


def sandbox_processes(directory: str) -> list[int]:
    """The processes whose command line names the sandbox directory ``directory``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if directory.encode() in cmdline.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback of a root trainer without user namespaces")
def test_without_user_namespaces_a_root_program_still_holds_no_capability(monkeypatch):
    """Where the kernel refuses a user namespace, root enters the other namespaces without one and the
    program drops every capability (bounding set, locked securebits): capget shows none, and root's
    powers fail; the missing layer is reported, so only allow_weaker=True runs it."""
    source = sandbox_module.confine_source().replace("libc.unshare(CLONE_NEWUSER | NAMESPACES) == 0", "False")
    monkeypatch.setattr(sandbox_module, "confine_source", lambda: source)
    code = (LIBC + "caps = (ctypes.c_uint32 * 6)()\nlibc.capget((ctypes.c_uint32 * 2)(0x20080522, 0), caps)\n"
            "print('caps', list(caps), os.geteuid())\ncall('sethostname', libc.sethostname(b'pwned', 5))\n")
    with pytest.raises(SandboxUnavailable, match="cannot set up the sandbox's userns"):
        PythonSandbox(audit_hook=False, **QUICK).run(code)
    result = PythonSandbox(allow_weaker=True, audit_hook=False, **QUICK).run(code)
    assert result.stdout.decode().splitlines() == ["caps [0, 0, 0, 0, 0, 0] 0", "sethostname -1 1"], result.stderr
    assert result.layers["privileges"] and result.layers["pids"] and result.layers["readonly"]
    assert not result.layers["userns"]


@pytest.mark.parametrize("stall, raised", [("import time; time.sleep(30)", None),
                                           ("os.write(2, b'monitor broke'); os._exit(3)", SandboxError)],
                         ids=["slow-start", "monitor-dies"])
def test_a_sandbox_that_does_not_report_is_a_timeout_or_its_own_error(monkeypatch, stall, raised):
    """A monitor too slow to report before the deadline (a loaded machine) is the call's timeout, an
    observation; a monitor that ends without a report, not stopped, is a SandboxError naming its exit
    status and error output, never an observation the policy would learn from."""
    source = sandbox_module.confine_source().replace("def monitor(config: dict) -> None:\n",
                                                     f"def monitor(config: dict) -> None:\n    {stall}\n")
    monkeypatch.setattr(sandbox_module, "confine_source", lambda: source)
    sandbox = PythonSandbox(cpu_seconds=1, wall_seconds=0.5)
    if raised:
        with pytest.raises(raised, match="ended without a report .exit status 3.: monitor broke"):
            sandbox("print(1)")
    else:
        seen = sandbox("print(1)")
        assert not seen.ok and seen.text == "error: stopped after 0.5 s (the time limit)"
