"""The sandbox's child side (``pgjax.agents.sandbox``): a standard-library-only script the parent passes
to ``python -I -S -c`` with one JSON argument. Four stages, none of which runs any of the program
before every layer has taken hold:

1. ``monitor`` (the parent's child): sets the resource limits, joins a new session keyring, and enters
   a new user namespace, in which it holds no capability outside and maps its user to an unprivileged
   one (root to 65534), with new mount, network, IPC, UTS and PID namespaces: the host's file system is
   read-only (metadata included), the sandbox's directory a small tmpfs, no route leads anywhere,
   SysV objects and the host name are its own. It forks the namespace's init, waits for it until the
   wall-clock deadline and kills it there (which ends every process of the namespace);
2. ``init`` (PID 1 of the new PID namespace; no process outside it can be named from inside): ignores
   every signal, forks the program's process and reports how it ended;
3. ``program`` (PID 2): drops every capability (bounding set, ambient set, securebits that keep root
   from regaining them), asks for SIGKILL when init dies, sets no-new-privileges, restricts the file
   system, TCP and signals with Landlock, loads the parent's seccomp allowlist
   (``pgjax.agents.syscalls``), writes which layers took hold to the report pipe and closes it (the
   program can never write there), and replaces itself (``execv``) with a fresh interpreter running
   this script again, so nothing it imported (``ctypes``) is left;
4. ``boot``: in that confined interpreter it installs the audit hook (which names what it refuses, in
   the error the program sees) and runs ``main.py`` from the sandbox's directory as ``__main__``.

Every restriction holds across ``execv`` and for the rest of the process's life. The report pipe
carries JSON lines: ``{"layers": {...}}`` from the program's process (or from the monitor, when a
layer of its own failed), ``{"status": ...}`` from init, ``{"timed_out": true}`` from the monitor.
"""
import json
import os
import sys

REFUSED = 97          # exit status of the monitor or program when a required layer failed (the parent reads the report)
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWIPC = 0x10000000, 0x40000000, 0x00020000, 0x08000000
CLONE_NEWUTS, CLONE_NEWPID = 0x04000000, 0x20000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
UNPRIVILEGED = 65534  # the id root's user and group are mapped to inside the user namespace (nobody)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, AT_FDCWD, AT_RECURSIVE, SYS_MOUNT_SETATTR = 1, 2, -100, 0x8000, 442
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_GET_SECUREBITS, PR_SET_SECUREBITS, PR_CAP_AMBIENT = 1, 24, 27, 28, 47
PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 38, 22, 2
# securebits: root gets no capabilities at execve, nor keeps or regains them on id changes, locked
SECURE_NOROOT = 0x3 | 0xC | 0x30 | 0xC0
LINUX_CAPABILITY_VERSION_3, LAST_CAPABILITY = 0x20080522, 63
KEYCTL_JOIN_SESSION_KEYRING, SYS_KEYCTL = 1, {"x86_64": 250, "aarch64": 219}
SIGKILL = 9
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
# Landlock's file-system rights by ABI version (uapi/linux/landlock.h): ABI 1 has bits 0-12, ABI 2
# adds REFER, 3 TRUNCATE, 5 IOCTL_DEV; rights a rule on a single file may carry
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
FS_ALL = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
# what the audit hook refuses (stage 4): modules that reach processes, sockets or raw memory, and the
# events that start processes, send signals or open sockets
BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "socket", "_socket", "subprocess", "_posixsubprocess",
                             "multiprocessing", "_multiprocessing", "ssl", "_ssl", "pty", "asyncio"})
BLOCKED_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                            "os.kill", "os.killpg", "subprocess.Popen", "socket.__new__", "os.startfile"})
# events that change the file system at their path arguments (os.symlink's first is the link's target,
# which may be anything: opening through the link is checked at its real path)
WRITE_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
                "os.truncate": (0,), "os.utime": (0,), "os.mkfifo": (0,), "os.mknod": (0,), "os.rename": (0, 1),
                "os.link": (0, 1), "os.symlink": (1,)}
READ_EVENTS = frozenset({"os.listdir", "os.scandir", "os.chdir"})


def set_limits(config: dict) -> None:
    """CPU seconds (SIGXCPU at the soft limit, SIGKILL a second later), address space, the size of
    any file written, open files, and no core files."""
    import resource
    limits = {resource.RLIMIT_CPU: (config["cpu_seconds"], config["cpu_seconds"] + 1),
              resource.RLIMIT_AS: (config["memory_bytes"],) * 2, resource.RLIMIT_FSIZE: (config["file_bytes"],) * 2,
              resource.RLIMIT_NOFILE: (config["open_files"],) * 2, resource.RLIMIT_CORE: (0, 0)}
    for which, value in limits.items():
        resource.setrlimit(which, value)


def report(config: dict, **fields) -> None:
    """One JSON line to the parent's report pipe (shorter than PIPE_BUF, so written whole)."""
    os.write(config["report_fd"], (json.dumps(fields) + "\n").encode())


def new_session_keyring(libc) -> bool:
    """Join a new, empty session keyring: the trainer's keys are not this process's to read."""
    import platform
    number = SYS_KEYCTL.get(platform.machine())
    return number is not None and libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


def enter_namespaces(libc, config: dict) -> dict:
    """A new user namespace with new mount, network, IPC, UTS and PID namespaces (``map_ids``; root
    drops its supplementary groups first). Where a user namespace is refused, root enters the others
    without one (its capabilities are then dropped by ``drop_capabilities`` alone). Returns which
    took hold."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        os.setgroups([])
    own_users = libc.unshare(CLONE_NEWUSER | NAMESPACES) == 0
    if own_users:
        map_ids(uid, gid)
    entered = own_users or (uid == 0 and libc.unshare(NAMESPACES) == 0)
    layers = {"userns": own_users, **dict.fromkeys(("network", "pids", "ipc", "uts"), entered)}
    layers.update(mount_filesystems(libc, config) if entered else {"readonly": False, "disk": False})
    if entered:
        libc.sethostname(b"sandbox", 7)
    return layers


def map_ids(uid: int, gid: int) -> None:
    """In a user namespace just entered, map user ``uid`` and group ``gid`` (the only mapping an
    unprivileged process may write, after refusing ``setgroups``) to themselves, or root's to
    ``UNPRIVILEGED``: inside, no id is 0, so the program gets no capability when it starts. Unmapped,
    the kernel would refuse to create a file the process owns (EOVERFLOW)."""
    with open("/proc/self/setgroups", "w") as file:
        file.write("deny")
    for name, own in (("uid_map", uid), ("gid_map", gid)):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(f"{own or UNPRIVILEGED} {own} 1")


def mount_filesystems(libc, config: dict) -> dict:
    """In the new mount namespace: every mount read-only and without set-user-id (the host's file
    system: no file, mode, owner, time or attribute outside can change), then the sandbox's directory a
    tmpfs of ``config["disk_bytes"]`` (no devices, set-user-id or executables; everything the program
    writes counts against it, and it vanishes with the namespace), ``main.py`` copied into it and the
    process moved into it. Returns which took hold."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                    ("userns_fd", ctypes.c_uint64)]

    directory = config["dir"]
    with open(os.path.join(directory, "main.py"), "rb") as file:
        program = file.read()
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return {"readonly": False, "disk": False}
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    readonly = libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr),
                            ctypes.c_size_t(ctypes.sizeof(attr))) == 0
    mounted = libc.mount(b"tmpfs", directory.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                         f"size={config['disk_bytes']},mode=0700".encode()) == 0
    if mounted:
        os.chdir(directory)
        with open(os.path.join(directory, "main.py"), "wb") as copy:
            copy.write(program)
    return {"readonly": readonly, "disk": mounted}


def drop_capabilities(libc) -> bool:
    """Give up every capability for good: lock the securebits that keep root from regaining them at
    ``execve`` or on an id change, empty the bounding and ambient sets, then the effective, permitted
    and inheritable ones. True if none is left (``capget``)."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc.prctl(PR_SET_SECUREBITS, SECURE_NOROOT, 0, 0, 0)
    for capability in range(LAST_CAPABILITY + 1):
        libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = Header(LINUX_CAPABILITY_VERSION_3, 0), (Data * 2)()
    if libc.capset(ctypes.byref(header), data) != 0 or libc.capget(ctypes.byref(header), data) != 0:
        return False
    root = os.geteuid() == 0 and not libc.prctl(PR_GET_SECUREBITS, 0, 0, 0, 0) & 0x1      # SECURE_NOROOT
    return not root and not any(getattr(d, f) for d in data for f in ("effective", "permitted", "inheritable"))


def landlock(libc, config: dict) -> dict:
    """Restrict the file system to reading ``config["read_roots"]`` and files ``config["read_files"]``,
    executing only ``config["exec_files"]`` (the interpreter and its ELF loader: no other program can
    replace the process), reading and writing ``config["write_files"]`` and everything in the sandbox's
    directory (a tmpfs mounted without execution); from ABI 4 on, refuse every TCP bind and connect;
    from ABI 6 on, scope abstract UNIX sockets and signals to this process. Returns which parts took
    hold."""
    import ctypes

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                    ("scoped", ctypes.c_uint64)]

    class PathBeneathAttr(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return {"filesystem": False, "tcp": False, "signals": False}
    handled = FS_ALL.get(abi, (1 << 16) - 1)
    attr = RulesetAttr(handled, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                       SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return {"filesystem": False, "tcp": False, "signals": False}
    file_rights = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | (FS_TRUNCATE if abi >= 3 else 0) | (
        FS_IOCTL_DEV if abi >= 5 else 0)
    rules = ([(path, FS_READ_FILE | FS_READ_DIR) for path in config["read_roots"]]
             + [(path, FS_READ_FILE | FS_EXECUTE) for path in config["exec_files"]]
             + [(path, FS_READ_FILE) for path in config["read_files"]]
             + [(path, file_rights & ~FS_EXECUTE) for path in config["write_files"]] + [(config["dir"], handled)])
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue                                    # a root this machine does not have
        rights = rights & (file_rights if not os.path.isdir(path) else handled)
        rule = PathBeneathAttr(rights & handled, fd)
        added = libc.syscall(LANDLOCK_ADD_RULE, ruleset, ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
        os.close(fd)
        if added != 0:
            return {"filesystem": False, "tcp": False, "signals": False}
    if libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
        return {"filesystem": False, "tcp": False, "signals": False}
    return {"filesystem": True, "tcp": abi >= 4, "signals": abi >= 6}


def install_filter(libc, program: bytes | None) -> bool:
    """Load ``program``, the seccomp filter the parent built (``pgjax.agents.syscalls``), as classic BPF
    (needs no-new-privileges, set before). False if there is none or the kernel refuses it."""
    import ctypes
    if not program:
        return False

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    instructions = ctypes.create_string_buffer(program, len(program))
    fprog = Program(len(program) // 8, ctypes.cast(instructions, ctypes.c_void_p))
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


def monitor(config: dict) -> None:
    """Stage 1 (module docstring): limits, keyring and namespaces, then the PID namespace's init
    (``init``), waited for until ``config["deadline"]`` (``time.monotonic``, shared by every process)
    and killed there, which ends every process of the namespace."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    set_limits(config)
    layers = {"limits": True, "keyring": new_session_keyring(libc), **enter_namespaces(libc, config)}
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)          # after the namespaces: a change of credentials clears it
    missing = [name for name in config["require"] if name in layers and not layers[name]]
    if missing:
        report(config, layers=layers)
        sys.stderr.write(f"sandbox: could not set up {', '.join(missing)}\n")
        os._exit(REFUSED)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        init(libc, config, layers)
    quiet_standard_streams()
    if not wait_until(pid, config["deadline"]):
        report(config, timed_out=True)
    os._exit(0)


def quiet_standard_streams() -> None:
    """Point this process's standard streams at /dev/null: the parent's pipes close when the
    program's copies do."""
    quiet = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(quiet, stream)
    os.close(quiet)


def wait_until(pid: int, deadline: float) -> bool:
    """Wait for child ``pid`` until ``deadline``, killing it there (not yet reaped, the pid is still the
    child's). True if it ended by itself."""
    import select
    import time
    with select.epoll() as waiting:
        child = os.pidfd_open(pid)
        waiting.register(child, select.EPOLLIN)
        ended = bool(waiting.poll(max(deadline - time.monotonic(), 0)))
        if not ended:
            os.kill(pid, SIGKILL)
        os.waitpid(pid, 0)
        os.close(child)
    return ended


def set_signal_dispositions(ignore: bool) -> None:
    """Ignore every signal that can be ignored but SIGCHLD (``ignore``), or give each its default."""
    import signal
    for number in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}:
        try:
            signal.signal(number, signal.SIG_IGN if ignore else signal.SIG_DFL)
        except (OSError, ValueError):
            pass                                             # a signal the C library keeps for itself


def init(libc, config: dict, layers: dict) -> None:
    """PID 1 of the new PID namespace: starts the program's process (``program``) and reports how it
    ended, its exit status (negative: the signal) and CPU seconds. The program cannot reach it: it
    ignores every signal it can, and its report pipe is its own. As PID 1 it would make the program
    immune to its own signals; as PID 2 the program ends as any process does. Never returns."""
    try:
        libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        set_signal_dispositions(ignore=True)
        pid = os.fork()
        if pid == 0:
            program(libc, config, layers)
        quiet_standard_streams()
        _, status, usage = os.wait4(pid, 0)
        report(config, status={"returncode": os.waitstatus_to_exitcode(status),
                               "cpu_seconds": usage.ru_utime + usage.ru_stime})
    finally:
        os._exit(0)


def program(libc, config: dict, layers: dict) -> None:
    """Stage 3 (module docstring): the program's process drops its privileges and confines itself, then
    becomes the boot interpreter. Never returns."""
    try:
        set_signal_dispositions(ignore=False)               # init's are ignored, and execve keeps that
        layers["privileges"] = drop_capabilities(libc)
        libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)      # init's end is this process's
        layers["no_new_privs"] = libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
        layers.update(landlock(libc, config) if layers["no_new_privs"] else
                      {"filesystem": False, "tcp": False, "signals": False})
        program_filter = bytes.fromhex(config["syscalls"]) if config["syscalls"] else None
        layers["syscalls"] = layers["no_new_privs"] and install_filter(libc, program_filter)
        missing = [name for name in config["require"] if not layers.get(name)]
        report(config, layers=layers)
        os.close(config["report_fd"])
        if missing:
            sys.stderr.write(f"sandbox: could not set up {', '.join(missing)}\n")
            os._exit(REFUSED)
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", config["source"],
                                  json.dumps({**config, "stage": "boot", "source": None, "syscalls": None})])
    finally:
        os._exit(REFUSED)                                    # never back into the monitor's code


def audit_hook(config: dict):
    """The stage-4 hook: refuse ``BLOCKED_MODULES`` and ``BLOCKED_EVENTS``, writes outside the
    sandbox's directory and reads outside it and ``config["read_roots"]`` (and the read files), each
    with an error naming what was refused. A convenience and a second line: code that rewrites the
    standard library it relies on can get past it; the layers of stages 1 to 3 are the guarantee."""
    here = os.path.realpath(config["dir"])
    readable = [here] + [os.path.realpath(r) for r in config["read_roots"]]
    read_files = {os.path.realpath(f) for f in config["read_files"] + config["write_files"]}
    write_files = {os.path.realpath(f) for f in config["write_files"]}
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def allowed(path, roots, files) -> bool:
        if isinstance(path, int):
            return True                                         # an open file descriptor
        full = realpath(fsdecode(path))
        return full in files or any(full == root or full.startswith(root + sep) for root in roots)

    def check(path, writing: bool) -> None:
        if not allowed(path, [here], write_files) if writing else not allowed(path, readable, read_files):
            raise PermissionError(f"sandbox: {'writing' if writing else 'reading'} {path!r} is not allowed "
                                  "(outside the working directory)")

    def hook(event: str, args: tuple) -> None:
        if event == "import":
            if args[0].partition(".")[0] in BLOCKED_MODULES:
                raise ImportError(f"sandbox: importing {args[0]} is not allowed")
        elif event in BLOCKED_EVENTS:
            raise PermissionError(f"sandbox: {event} is not allowed")
        elif event == "open":
            path, _, flags = args
            if path is not None:
                check(path, writing=isinstance(flags, int) and bool(flags & write_flags))
        elif event in WRITE_EVENTS:
            for index in WRITE_EVENTS[event]:
                check(args[index], writing=True)
        elif event in READ_EVENTS and args and args[0] is not None:
            check(args[0], writing=False)
    return hook


def boot(config: dict) -> None:
    """Stage 4 (module docstring): the hook, then ``main.py`` as ``__main__`` (its bytes decoded as
    Python decodes a source file: bytes that are not UTF-8 are the program's SyntaxError); an uncaught
    exception's traceback leaves out this script's frames (the hook's among them), and exits with
    status 1."""
    import builtins
    import traceback
    with open(os.path.join(config["dir"], "main.py"), "rb") as file:
        source = file.read()
    if config["audit"]:
        sys.addaudithook(audit_hook(config))
    # -S leaves them out; programs use them
    builtins.exit = builtins.quit = sys.exit  # type: ignore[assignment]  # typeshed: site's Quitter objects
    sys.argv = ["main.py"]
    try:
        code = compile(source, "main.py", "exec")
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit:
        raise
    except BaseException as error:                          # the program's own error
        frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename != "<string>"]
        sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
                         + "".join(traceback.format_exception_only(type(error), error)))
        sys.exit(1)


if __name__ == "__main__":
    settings = json.loads(sys.argv[1])
    (boot if settings.get("stage") == "boot" else monitor)(settings)
