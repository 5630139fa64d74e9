"""Reading the Perfetto traces ``jax.profiler.trace(..., create_perfetto_trace=True)`` writes: the
events and thread names, the operations XLA's threads executed, and the union of intervals."""
import gzip
import json
import pathlib


def load(trace_file: pathlib.Path) -> tuple[list[dict], dict]:
    """The trace's events and {thread id: thread name}."""
    events = json.loads(gzip.open(trace_file).read())
    events = events["traceEvents"] if isinstance(events, dict) else events
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    return events, threads


def xla_spans(events: list[dict], threads: dict, not_work: tuple[str, ...]) -> list[dict]:
    """The complete events (spans) of XLA's threads, leaving out those whose name starts with one of
    ``not_work`` (markers, idle waits, executors wrapping the operations)."""
    return [e for e in events if e.get("ph") == "X" and threads.get(e["tid"], "").startswith("tf_XLA")
            and not e["name"].startswith(not_work)]


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` as sorted, disjoint (start, end) pairs."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
