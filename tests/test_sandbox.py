"""The Python sandbox's security suite (pgjax.agents.sandbox): every attack the docs list is contained,
and what the policy sees is stated. Each attack runs twice: with the audit hook (the readable errors a
policy gets) and without it, the operating-system layers alone (Landlock, seccomp, the namespaces,
the rlimits), to show those hold by themselves. The containment is checked from outside the sandbox:
the file is not there, the server got no connection, the process is alive, the run ended in time."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from pgjax.agents import sandbox as sandbox_module
from pgjax.agents.confine import seccomp_program
from pgjax.agents.sandbox import LAYERS, PythonSandbox, SandboxUnavailable, observation

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
        assert victim.poll() is None and not seen.ok and "PermissionError" in seen.text
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


def test_calls_share_nothing_and_leave_nothing():
    sandbox = PythonSandbox(**QUICK)
    before = set(os.listdir(tempfile.gettempdir()))
    assert sandbox("open('note', 'w').write('first call')\nprint('wrote')").text == "wrote"
    seen = sandbox("import os\nprint(os.listdir('.'))")
    assert seen.text == "['main.py']"
    assert not {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("pgjax-sandbox")}


def test_a_missing_layer_is_an_error_before_any_code_runs(monkeypatch, tmp_path):
    """A machine that cannot set up a layer (seccomp's table without this machine's architecture) gets
    a SandboxUnavailable naming it; allow_weaker=True runs without it."""
    source = sandbox_module.confine_source().replace('SECCOMP = {"x86_64"', 'SECCOMP = {"no-such-machine"')
    source = source.replace('"aarch64": (0xC00000B7', '"no-such-machine-2": (0xC00000B7')
    monkeypatch.setattr(sandbox_module, "confine_source", lambda: source)
    marker = tmp_path / "ran"
    with pytest.raises(SandboxUnavailable, match="cannot set up the sandbox's processes"):
        PythonSandbox(**QUICK).run(f"open({str(marker)!r}, 'w')")
    assert not marker.exists()
    result = PythonSandbox(allow_weaker=True, **QUICK).run("print('ran')")
    assert result.stdout == b"ran\n" and result.layers["processes"] is False


def test_the_seccomp_programs_jumps_land_on_their_returns():
    """Every jump of the filter lands inside the program on a return; the three returns end it."""
    for machine in ("x86_64", "aarch64"):
        program = seccomp_program(machine)
        assert [k for code, _, _, k in program[-3:]] == [0x7FFF0000, 0x00050001, 0x00050026]
        for index, (code, jt, jf, _) in enumerate(program):
            if code in (0x15, 0x35, 0x45):                          # jeq, jge, jset
                assert all(program[index + 1 + offset][0] == 0x06 or offset == 0 for offset in (jt, jf))
    assert seccomp_program("sparc") is None


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
