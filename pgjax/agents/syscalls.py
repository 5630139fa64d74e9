"""The system calls a sandboxed Python program may make: an allowlist, compiled to a seccomp filter by
libseccomp (through ``pyseccomp``, its ctypes binding) for the machine it runs on.

Every call not named here fails with ``EPERM`` ("Operation not permitted"), whatever the audit hook
saw; ``clone3`` fails with ``ENOSYS``, so the C library falls back to ``clone``, whose flags a filter
can read (``clone3`` keeps them in memory a filter cannot). What the list holds is what CPython and
its standard library use to compute, read and write files, keep time, wait and run threads. What it
leaves out, on purpose: every way to start a process (``fork``, ``vfork``, a ``clone`` that is not a
thread), to reach another process (``ptrace``, ``process_vm_*``, ``kcmp``, ``pidfd_*``), to open a
socket of any family or SysV / POSIX IPC, the key-management calls (``keyctl``, ``add_key``,
``request_key``), ``syslog``, the host and clock setters (``sethostname``, ``settimeofday``,
``clock_settime``, ``adjtimex``), ``reboot``, modules, mounts old and new (``mount``, ``fsopen``,
``mount_setattr``, ...), ``mknod``, ``memfd_create`` (memory outside every limit), extended
attribute writes, namespaces (``unshare``, ``setns``), ``bpf``, ``perf_event_open``, ``io_uring``,
``userfaultfd``, changes of identity (``set*id``, ``capset``) and of session or process group
(``setsid``, ``setpgid``, which would take the program out of the group the parent kills).

Calls that act on a process by id are allowed on the caller only: ``prlimit64``,
``sched_setaffinity`` with pid 0, ``setpriority`` with ``PRIO_PROCESS`` and id 0 (a program may lower
its own priority, never another's, nor a user's or a group's).
"""
from __future__ import annotations

import functools
import tempfile

ALLOWED = (
    # files and directories (the host's are read-only and Landlock limits which paths open at all)
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
    "open", "openat", "openat2", "creat", "close", "close_range", "dup", "dup2", "dup3", "pipe", "pipe2", "lseek",
    "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2",
    "readlink", "readlinkat", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir",
    "unlink", "unlinkat", "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat", "chmod",
    "fchmod", "fchmodat", "chown", "fchown", "lchown", "fchownat", "utime", "utimes", "utimensat", "futimesat",
    "truncate", "ftruncate", "fallocate", "fsync", "fdatasync", "flock", "fcntl", "ioctl", "umask", "sendfile",
    "copy_file_range", "splice", "tee", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr",
    "flistxattr",
    # memory
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync",
    # waiting, time, signals (a signal reaches only this process's own: its PID namespace holds no other)
    "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "timerfd_create", "timerfd_settime", "timerfd_gettime",
    "signalfd", "signalfd4", "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "time",
    "alarm", "pause", "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending",
    "rt_sigtimedwait", "rt_sigsuspend", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "kill", "tgkill",
    "tkill", "restart_syscall",
    # threads and the interpreter's start (execve: Landlock lets only the interpreter run)
    "futex", "futex_waitv", "set_tid_address", "set_robust_list", "rseq", "arch_prctl", "prctl", "execve",
    "execveat", "sched_yield", "sched_getaffinity", "sched_getparam", "sched_getscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval", "getpriority",
    # who and where it is, its own limits and usage
    "getpid", "getppid", "gettid", "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid",
    "getgroups", "getpgrp", "getpgid", "getsid", "capget", "uname", "sysinfo", "getrandom", "getcpu",
    "getrlimit", "setrlimit", "getrusage", "times", "wait4", "waitid", "exit", "exit_group",
)
CLONE_THREAD = 0x00010000
# clone flags that make namespaces or share the parent's place (a thread carries none of them):
# NEWNS CLONE_NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET, NEWTIME, PARENT
CLONE_REFUSED = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
                 | 0x00000080 | 0x00008000)
EPERM, ENOSYS = 1, 38
PRIO_PROCESS = 0


def rules(seccomp) -> list[tuple]:
    """(action, name, argument conditions) of the filter, in ``seccomp``'s (``pyseccomp``'s) terms."""
    allow, arg = seccomp.ALLOW, seccomp.Arg
    own = [(allow, "prlimit64", arg(0, seccomp.EQ, 0)), (allow, "sched_setaffinity", arg(0, seccomp.EQ, 0)),
           (allow, "setpriority", arg(0, seccomp.EQ, PRIO_PROCESS), arg(1, seccomp.EQ, 0))]
    thread = (allow, "clone", arg(0, seccomp.MASKED_EQ, CLONE_THREAD | CLONE_REFUSED, CLONE_THREAD))
    return [(allow, name) for name in ALLOWED] + own + [thread, (seccomp.ERRNO(ENOSYS), "clone3")]


@functools.lru_cache(maxsize=1)
def filter_program() -> bytes | str:
    """The allowlist as a classic-BPF seccomp program for this machine (``struct sock_filter`` array,
    as ``prctl(PR_SET_SECCOMP)`` loads it), or the reason it cannot be built here (a str: no
    libseccomp, not Linux). Calls of another architecture than the machine's (32-bit x86 on x86_64)
    kill the program."""
    try:
        import pyseccomp as seccomp
        program = seccomp.SyscallFilter(seccomp.ERRNO(EPERM))
        for action, name, *conditions in rules(seccomp):
            program.add_rule(action, name, *conditions)
        with tempfile.TemporaryFile() as file:
            program.export_bpf(file)
            file.seek(0)
            return file.read()
    except (ImportError, OSError, RuntimeError, AttributeError) as error:
        return f"the seccomp filter cannot be built on this machine ({type(error).__name__}: {error}); " \
               f"it needs libseccomp (Debian's libseccomp2) and the pyseccomp package"
