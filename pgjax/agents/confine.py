"""The sandbox's child side (``pgjax.agents.sandbox``): a standard-library-only script the parent passes
to ``python -I -S -c`` with one JSON argument. It runs twice in the same process:

1. ``confine``: with the interpreter fresh and single-threaded, it sets the resource limits, enters a
   new network namespace and a new mount namespace whose sandbox directory is a small tmpfs, sets
   no-new-privileges, restricts the file system, TCP and signals with
   Landlock and forbids new processes with a seccomp filter; it writes which of these took hold to the
   parent's report pipe and, if any the parent requires did not, exits with ``REFUSED`` before any
   code of the caller's runs. Then it replaces itself (``execv``) with a fresh interpreter running
   this script again, so nothing it imported (``ctypes``) is left for the caller's code;
2. ``boot``: in that confined interpreter it installs the audit hook (which names what it refuses, in
   the error the program sees) and runs ``main.py`` from the sandbox's directory as ``__main__``.

Every restriction of stage 1 holds across ``execv`` and for the rest of the process's life.
"""
import json
import os
import sys

REFUSED = 97          # exit status: a required isolation layer could not be set up
CLONE_NEWUSER, CLONE_NEWNET, CLONE_THREAD = 0x10000000, 0x40000000, 0x00010000
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
# Landlock's file-system rights by ABI version (uapi/linux/landlock.h): ABI 1 has bits 0-12, ABI 2
# adds REFER, 3 TRUNCATE, 5 IOCTL_DEV; rights a rule on a single file may carry
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
FS_ALL = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
# seccomp: per machine, the audit architecture, the syscalls refused with EPERM (fork, vfork, ptrace,
# unshare, setns, mount, bpf, perf_event_open, io_uring_setup), clone and clone3 (clone3's flags lie
# in memory a filter cannot read, so it is refused with ENOSYS and the C library falls back to clone,
# whose flags it can: a thread, CLONE_THREAD, is allowed, anything else refused)
SECCOMP = {"x86_64": (0xC000003E, (57, 58, 101, 272, 308, 165, 321, 298, 425), 56, 435),
           "aarch64": (0xC00000B7, (117, 97, 268, 40, 280, 241, 425), 220, 435)}
RET_ALLOW, RET_ERRNO, EPERM, ENOSYS = 0x7FFF0000, 0x00050000, 1, 38
# what the audit hook refuses (stage 2): modules that reach processes, sockets or raw memory, and the
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


def enter_namespaces(libc, config: dict) -> dict:
    """A new network namespace, which holds only a loopback device that is down (no route anywhere,
    TCP or UDP), and a new mount namespace in which the sandbox's directory becomes a tmpfs of
    ``config["disk_bytes"]`` (no devices, set-user-id or executables): everything the program writes
    counts against it, and it vanishes with the process. ``main.py`` is copied into it, and the process
    moves into it. A process that is not root enters a new user namespace first, which permits both,
    and maps its own user and group into it (``map_own_ids``). Returns which took hold."""
    uid, gid = os.geteuid(), os.getegid()
    user = 0 if uid == 0 else CLONE_NEWUSER
    if libc.unshare(user | CLONE_NEWNET | CLONE_NEWNS) != 0:
        entered = libc.unshare(user | CLONE_NEWNET) == 0
        if entered and user:
            map_own_ids(uid, gid)
        return {"network": entered, "disk": False}
    if user:
        map_own_ids(uid, gid)
    directory = config["dir"]
    with open(os.path.join(directory, "main.py"), "rb") as file:
        program = file.read()
    mounted = (libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
               and libc.mount(b"tmpfs", directory.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                              f"size={config['disk_bytes']},mode=0700".encode()) == 0)
    if mounted:
        os.chdir(directory)
        with open(os.path.join(directory, "main.py"), "wb") as file:
            file.write(program)
    return {"network": True, "disk": mounted}


def map_own_ids(uid: int, gid: int) -> None:
    """In a user namespace just entered, map user ``uid`` and group ``gid`` to themselves (the only
    mapping an unprivileged process may write, after refusing ``setgroups``). Unmapped, the process's
    ids are the overflow id 65534 inside, and the kernel refuses to create a file it would own
    (EOVERFLOW): writing ``main.py`` into the tmpfs failed before this."""
    with open("/proc/self/setgroups", "w") as file:
        file.write("deny")
    for name, own in (("uid_map", uid), ("gid_map", gid)):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(f"{own} {own} 1")


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


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The classic-BPF filter of ``SECCOMP`` for ``machine`` as (code, jt, jf, k) instructions, or None
    for a machine it does not know. Jumps are forward offsets, resolved from labels here."""
    if machine not in SECCOMP:
        return None
    arch, refused, clone, clone3 = SECCOMP[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    program = [(ld, 4, None, None), (jeq, arch, None, "refuse"), (ld, 0, None, None)]   # arch, then nr
    if machine == "x86_64":
        program.append((jge, 0x40000000, "refuse", None))                              # the x32 ABI
    program += [(jeq, number, "refuse", None) for number in refused]
    program += [(jeq, clone3, "nosys", None), (jeq, clone, None, "allow"), (ld, 16, None, None),
                (jset, CLONE_THREAD, "allow", "refuse")]
    labels = {"allow": len(program), "refuse": len(program) + 1, "nosys": len(program) + 2}
    program += [(ret, RET_ALLOW, None, None), (ret, RET_ERRNO | EPERM, None, None),
                (ret, RET_ERRNO | ENOSYS, None, None)]

    def offset(index: int, target) -> int:
        return 0 if target is None else labels[target] - index - 1
    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, k, jt, jf) in enumerate(program)]


def install_seccomp(libc) -> bool:
    """Load ``seccomp_program`` for this machine (needs no-new-privileges, set before)."""
    import ctypes
    import platform
    program = seccomp_program(platform.machine())
    if program is None:
        return False

    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    instructions = (Instruction * len(program))(*[Instruction(*i) for i in program])
    prog = Program(len(program), instructions)
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0


def confine(config: dict) -> None:
    """Stage 1 (module docstring)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    set_limits(config)
    layers = {"limits": True, **enter_namespaces(libc, config),
              "no_new_privs": libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0}
    layers.update(landlock(libc, config) if layers["no_new_privs"] else
                  {"filesystem": False, "tcp": False, "signals": False})
    layers["processes"] = layers["no_new_privs"] and install_seccomp(libc)
    missing = [name for name in config["require"] if not layers.get(name)]
    os.write(config["report_fd"], json.dumps(layers).encode())
    os.close(config["report_fd"])
    if missing:
        sys.stderr.write(f"sandbox: could not set up {', '.join(missing)}\n")
        sys.exit(REFUSED)
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", config["source"],
                              json.dumps({**config, "stage": "boot", "source": None})])


def audit_hook(config: dict):
    """The stage-2 hook: refuse ``BLOCKED_MODULES`` and ``BLOCKED_EVENTS``, writes outside the
    sandbox's directory and reads outside it and ``config["read_roots"]`` (and the read files), each
    with an error naming what was refused. A convenience and a second line: code that rewrites the
    standard library it relies on can get past it; the stage-1 layers are the guarantee."""
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
    """Stage 2 (module docstring): the hook, then ``main.py`` as ``__main__``; an uncaught exception's
    traceback leaves out this script's frames (the hook's among them), and exits with status 1."""
    import builtins
    import traceback
    path = os.path.join(config["dir"], "main.py")
    with open(path, encoding="utf-8") as file:
        source = file.read()
    if config["audit"]:
        sys.addaudithook(audit_hook(config))
    builtins.exit = builtins.quit = sys.exit                 # -S leaves them out; programs use them
    sys.argv = ["main.py"]
    try:
        code = compile(source, "main.py", "exec")
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit:
        raise
    except BaseException as error:                          # noqa: BLE001 - the program's own error
        frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename != "<string>"]
        sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
                         + "".join(traceback.format_exception_only(type(error), error)))
        sys.exit(1)


if __name__ == "__main__":
    settings = json.loads(sys.argv[1])
    (boot if settings.get("stage") == "boot" else confine)(settings)
