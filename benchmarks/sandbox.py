"""What a call of the Python tool costs, against the sandbox of an earlier revision (``--before``).

    python benchmarks/sandbox.py --calls 100 --episodes 25 --rounds 4 \\
        --json benchmarks/results/sandbox_cost.json

Matched work, in one run. Before: ``pgjax.agents.PythonSandbox`` of ``--before`` (default ab20955,
the parent of a72a14e: one child process with rlimits, network and mount namespaces, Landlock and a
seccomp filter against new processes), checked out with ``git worktree add --detach`` into a
temporary directory (removed at the end). After: the working tree's (a monitor, an init and the
program in new user, PID, IPC, UTS, mount and network namespaces, the host's mounts read-only, a
libseccomp allowlist). Both at ``PythonSandbox()``'s defaults (their values are recorded and
compared). Each side runs in a child process of this interpreter that imports ``pgjax`` only from
its own tree (the tree first on ``sys.path``; the child checks that every ``pgjax`` module it loaded
lies in that tree), so the two sides' modules never mix; the whole package comes from the side's
tree (``ToolEnvironment`` included, whose own cost is microseconds beside a call's).

Each round runs both sides, one after the other, in a fresh child each (A B, then B A, ...); in
each child ``--warmup`` calls and one episode come first and are left out. Timed, per child:

- ``--calls`` calls ``PythonSandbox()("print(1)")`` (the tool call: a temporary directory, the
  confined interpreter, its output as a ``ToolResult``; each checked to be ``1``, ok), their wall
  seconds and CPU seconds (``getrusage``: the child's own, which supervises the call, plus its
  reaped descendants', the sandbox's processes);
- ``--episodes`` episodes of a ``ToolEnvironment([PythonSandbox()], answer_reward)`` (``TaggedCalls``):
  ``reset`` on one example, then three scripted replies, two of them calling the python tool with a
  small program and a final answer that calls none; the wall seconds of reset and the three steps
  (the observations and the reward checked to be the same on both sides).

Reported: per side, the median of the per-call and per-episode times pooled over the rounds, with a
bootstrap 95% interval, and after / before of the medians with its interval (``stats``); the layers
each side's ``SandboxRun.layers`` says took hold; the load average at the start and the end.
"""
import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import SPEED_VARIABLES, record  # noqa: E402
from readme_tables import save_table  # noqa: E402

BEFORE = "ab20955"
CALL = "print(1)"
EXAMPLE = {"prompt": "What is the sum of the integers from 0 to 19?", "answer": "190"}
REPLIES = ("Let me add the first ten.\n<python>print(sum(range(10)))</python>",
           "Now the next ten.\n<python>print(sum(range(10, 20)))</python>",
           "45 + 145 = 190, so the answer is 190.")
OBSERVATIONS = ("<result>45</result>", "<result>145</result>")      # what the two calls must answer
SIDES = ("before", "after")
MARK = "SANDBOX-BENCHMARK "            # the child's result line on its standard output


def answer_reward(example: dict, reply: str) -> float:
    return float(example["answer"] in reply)


def cpu_seconds() -> tuple[float, float]:
    """This process's CPU seconds and its reaped descendants'."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def side(tree: str, calls: int, episodes: int, warmup: int) -> dict:
    """One side in this process (a child of ``main``): ``pgjax`` imported from ``tree`` only, then the
    warm-up and the timed calls and episodes (module docstring)."""
    tree = os.path.realpath(tree)
    sys.path.insert(0, tree)
    from pgjax.agents import PythonSandbox, TaggedCalls, ToolEnvironment
    strays = {name: module.__file__ for name, module in sys.modules.items()
              if name.split(".")[0] == "pgjax" and getattr(module, "__file__", None)
              and not os.path.realpath(module.__file__).startswith(os.path.join(tree, "pgjax") + os.sep)}
    if strays:
        raise RuntimeError(f"pgjax modules loaded from outside {tree}: {strays}")
    sandbox = PythonSandbox()
    layers = sandbox.run(CALL).layers
    defaults = {k: v for k, v in dataclasses.asdict(sandbox).items() if k not in ("description",)}

    def call():
        result = sandbox(CALL)
        if (result.text, result.ok) != ("1", True):
            raise AssertionError(f"PythonSandbox()({CALL!r}) gave {result!r}")

    def episode():
        environment = ToolEnvironment([PythonSandbox()], answer_reward, TaggedCalls())
        start = time.perf_counter()
        environment.reset(EXAMPLE)
        steps = [environment.step(reply) for reply in REPLIES]
        seconds = time.perf_counter() - start
        seen = tuple(step.observation[0]["content"] for step in steps[:2])
        if seen != OBSERVATIONS or steps[2].observation is not None or (steps[2].reward, steps[2].done) != (1.0, True):
            raise AssertionError(f"the scripted episode went otherwise: {steps!r}")
        return seconds

    for _ in range(warmup):
        call()
    episode()
    wall, cpu, own, descendants = [], [], [], []
    for _ in range(calls):
        (own0, children0), start = cpu_seconds(), time.perf_counter()
        call()
        seconds, (own1, children1) = time.perf_counter() - start, cpu_seconds()
        wall.append(seconds)
        own.append(own1 - own0)
        descendants.append(children1 - children0)
        cpu.append(own[-1] + descendants[-1])
    episode_seconds = [episode() for _ in range(episodes)]
    return {"tree": tree, "pgjax": os.path.realpath(sys.modules["pgjax"].__file__), "layers": layers,
            "defaults": defaults, "call_seconds": wall, "call_cpu_seconds": cpu, "call_cpu_own": own,
            "call_cpu_descendants": descendants, "episode_seconds": episode_seconds,
            "threads": {"usable_cores": len(os.sched_getaffinity(0))},
            "environment": {k: os.environ[k] for k in (*SPEED_VARIABLES, "PYTHONPATH", "TMPDIR") if k in os.environ}}


def run_side(tree: str, args) -> dict:
    """``side`` in a child process of this interpreter; its result line."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--side-tree", tree, "--calls", str(args.calls),
                           "--episodes", str(args.episodes), "--warmup", str(args.warmup)],
                          capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode or not lines:
        raise RuntimeError(f"the side in {tree} failed (exit status {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len(MARK):])


def git(*arguments: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True, text=True,
                          check=True).stdout.strip()


@contextlib.contextmanager
def checked_out(revision: str):
    """``revision``'s tree in a temporary ``git worktree`` (detached; removed afterwards): (path, commit)."""
    commit = git("rev-parse", "--verify", f"{revision}^{{commit}}")
    directory = tempfile.mkdtemp(prefix="pgjax-sandbox-before-")
    try:
        git("worktree", "add", "--detach", "--quiet", directory, commit)
        yield directory, commit
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", directory], capture_output=True,
                       check=False)
        shutil.rmtree(directory, ignore_errors=True)


def middle(values) -> float:
    return sorted(values)[len(values) // 2]


def milliseconds(interval: dict) -> str:
    return f"{interval['median'] * 1e3:.1f} [{interval['low'] * 1e3:.1f}, {interval['high'] * 1e3:.1f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=BEFORE, help="the git revision whose sandbox is the before side")
    parser.add_argument("--calls", type=int, default=100, help="timed calls per side in each round")
    parser.add_argument("--episodes", type=int, default=25, help="timed episodes per side in each round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each side once a round (A B, then B A)")
    parser.add_argument("--warmup", type=int, default=3, help="calls (and one episode) left out of each child")
    parser.add_argument("--json", help="save the table and the per-call data here")
    parser.add_argument("--side-tree", help=argparse.SUPPRESS)       # what the children run: one side
    args = parser.parse_args(argv)
    if args.side_tree:
        print(MARK + json.dumps(side(args.side_tree, args.calls, args.episodes, args.warmup)), flush=True)
        return
    if min(args.calls, args.episodes, args.rounds) < 1 or args.warmup < 0:
        parser.error("--calls, --episodes and --rounds must be at least 1, --warmup at least 0")
    started, load = time.perf_counter(), os.getloadavg()[0]
    runs, children = {s: [] for s in SIDES}, {}
    with checked_out(args.before) as (before_tree, before_commit):
        trees = {"before": before_tree, "after": str(ROOT)}
        for r in range(args.rounds):
            for position, name in enumerate(SIDES if r % 2 == 0 else SIDES[::-1]):
                out = run_side(trees[name], args)
                out["round"], out["position"] = r + 1, position
                runs[name].append(out)
                children[f"{name}, round {r + 1}"] = {"threads": out.pop("threads"),
                                                      "environment": out.pop("environment")}
                print(f"round {r + 1}/{args.rounds}: {name}: {1e3 * middle(out['call_seconds']):.1f} ms a call, "
                      f"{1e3 * middle(out['episode_seconds']):.1f} ms an episode", file=sys.stderr, flush=True)
    load_end = os.getloadavg()[0]
    for name in SIDES:                              # one set of layers and defaults per side, whatever the round
        for key in ("layers", "defaults"):
            if any(run[key] != runs[name][0][key] for run in runs[name]):
                raise AssertionError(f"{name}: the {key} differ between rounds: {[run[key] for run in runs[name]]}")
    # imported here, not at the top: a side's child must import pgjax from its own tree only
    from pgjax import markdown
    from pgjax.evaluation.statistics import describe_ratio, median_interval, median_ratio
    pooled = {measure: {name: [x for run in runs[name] for x in run[measure]] for name in SIDES}
              for measure in ("call_seconds", "call_cpu_seconds", "episode_seconds")}
    ratios = {measure: median_ratio(values["after"], values["before"]) for measure, values in pooled.items()}
    layers = {name: runs[name][0]["layers"] for name in SIDES}
    defaults = {name: runs[name][0]["defaults"] for name in SIDES}
    differing = sorted(k for k in set(defaults["before"]) | set(defaults["after"])
                       if defaults["before"].get(k) != defaults["after"].get(k))
    held = {name: [layer for layer, ok in layers[name].items() if ok] for name in SIDES}
    same = "the same on both sides" if not differing else f"differing in {', '.join(differing)}"
    rows = (("one call `print(1)`, wall", "call_seconds"),
            ("one call `print(1)`, CPU (the caller's + the sandbox's processes')", "call_cpu_seconds"),
            ("3-turn episode (2 python calls, then the answer), wall", "episode_seconds"))
    table = [f"`PythonSandbox()` at its defaults ({same}). The lighter sandbox (the `--before` tree, recorded in "
             f"the results file): {len(held['before'])} layers ({', '.join(held['before'])}); this tree's: "
             f"{len(held['after'])} "
             f"layers ({', '.join(held['after'])}); as `SandboxRun.layers` reports them. {args.rounds} rounds, the "
             f"sides in alternating order (A B, B A), each in a fresh process of this interpreter that imports pgjax "
             f"from its own tree; {args.warmup} warm-up call(s) and one episode left out of each; {args.calls} calls "
             f"and {args.episodes} episodes a side a round ({args.calls * args.rounds} and "
             f"{args.episodes * args.rounds} per side in all); load average {load:.2f} at the start, {load_end:.2f} "
             f"at the end:", "",
             *markdown.table(["measure", "lighter sandbox, ms (median [95% interval])", "this tree's, ms",
                                             "this tree's / lighter"],
                             [[label, milliseconds(median_interval(pooled[measure]["before"])),
                               milliseconds(median_interval(pooled[measure]["after"])), describe_ratio(ratios[measure])]
                              for label, measure in rows]).splitlines()]
    print(f"total {time.perf_counter() - started:.0f} s", file=sys.stderr)
    save_table(args.json, argv if argv is not None else sys.argv[1:], table,
               provenance=record(children=children), before={"revision": args.before, "commit": before_commit},
               layers=layers, defaults=defaults, seconds=pooled, ratio=ratios, load_average=[load, load_end],
               rounds={name: [{k: v for k, v in run.items() if k not in ("layers", "defaults")} for run in runs[name]]
                       for name in SIDES})


if __name__ == "__main__":
    main()
