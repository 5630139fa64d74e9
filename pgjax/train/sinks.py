"""Where a run's metric records and logged completions go: logging sinks behind one interface,
reading them back, and the curves drawn from the records.

  metrics.jsonl           ``MetricsFile``: one JSON line per RL step (and the step-0 evaluation);
                          non-finite numbers as null
  completions.jsonl       a second ``MetricsFile``: one JSON line per logged completion
                          (``pgjax.train.completions``)
  events.out.tfevents.*   ``TensorBoard``: the same numbers (``tensorboard --logdir runs/``), and each
                          step's completions as a markdown table (the Text tab, tag ``completions``)
  wandb/, wandb_run_id    ``WandB``: the same numbers and a ``completions`` table per logged step in a
                          Weights & Biases run (optional package)
  curves.png              ``plot``: reward / accuracy / length / KL / entropy curves, drawn at the end
  (yours)                 a sink of your own (``logging.sinks``, by import path): whatever it writes

A ``Sink`` takes each step's record (``log``: a dict with an int ``step``, numbers, None) together
with the completion rows logged at that step, in one call (W&B then writes them in one history row,
never merged from two), and is closed once (``close``). Each opens for a new run or a
resumed one: a resume starts after ``start_step``, and what a killed run wrote after that checkpoint
is dropped (the JSONL files cut, TensorBoard events purged, W&B continuing the same run, which
ignores re-logged steps). ``read_records`` and ``read_completions`` read the JSONL files back,
leaving out a torn last line.

The sinks opened as ``factory(directory, since)`` (``since``: the step a resume starts after, None
for a new run) are looked up by name in one registry, ``SINKS`` (``open_sink``: TensorBoard, which
``logging.tensorboard`` switches on), or by import path (``logging.sinks``: a ``Sink`` subclass of the
user's, or a factory of one). A user's sink is a ``GuardedSink``: it gets copies of the records,
after the run's own sinks, and an exception it raises is reported on stderr and leaves it out for
the rest of the run; it never stops the run nor touches another sink's records.
"""
from __future__ import annotations

import html
import json
import math
import os
import pathlib
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pgjax import markdown
from pgjax.checks import ConfigError
from pgjax.errors import described_value, located_error, raised_text
from pgjax.plugins import is_import_path, resolve

MACHINES_FILE = "machines.jsonl"     # the machine of each sitting of a run (pgjax.train.run_dir)
CURVES = (("reward", "reward"), ("accuracy", "sampled accuracy"), ("eval_accuracy", "greedy eval accuracy"),
          ("length_correct", "length (correct)"), ("length_incorrect", "length (incorrect)"),
          ("entropy", "entropy"), ("kl_ref", "KL to reference"), ("clip_fraction", "clip fraction"))


class Sink:
    """One destination of a run's metric records."""

    def log(self, record: dict, completions: Sequence[dict] = ()) -> None:
        """Write one record, ``{"step": int, key: number or None, ...}`` (numbers may be non-finite),
        and the completions logged at its step (``pgjax.train.completions``: dicts of that ``step``;
        a sink may leave them out)."""
        raise NotImplementedError

    def close(self, failed: bool = False) -> None:
        """Flush and release what the sink holds; ``failed``: the run ended with an error."""


def _numbers(record: dict) -> dict[str, float]:
    """The record's finite numbers (booleans as 0 / 1) but its step, as floats."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}


def _record_lines(path: pathlib.Path) -> tuple[list[tuple[int, dict]], int]:
    """(end offset, record) of every complete line of a JSONL file, and the size of a torn last line
    (one without its newline, or not JSON: a write cut short) to drop; a bad line before the last is a
    ValueError naming it."""
    data = path.read_bytes() if path.exists() else b""
    lines, offset, torn = [], 0, 0
    chunks = data.split(b"\n")
    for number, chunk in enumerate(chunks, start=1):
        end = offset + len(chunk) + 1
        last = number >= len(chunks) - 1
        if chunk.strip():
            try:
                record = json.loads(chunk)
                if end > len(data):          # no newline after it: cut short, whatever it parses to
                    raise ValueError("no newline")
                lines.append((end, record))
            except ValueError:
                if not last:
                    raise ValueError(f"{path}:{number}: not a JSON record: {chunk[:80]!r}") from None
                torn = len(data) - offset
        offset = end
    return lines, torn


def _read(path: pathlib.Path) -> list[dict]:
    """The records of a JSONL file (none if it is missing; a torn last line, from a run killed while
    writing it, is left out)."""
    return [record for _, record in _record_lines(path)[0]]


def read_records(directory) -> list[dict]:
    """The metric records of the run in ``directory`` (metrics.jsonl, see ``_read``)."""
    return _read(pathlib.Path(directory) / "metrics.jsonl")


def read_machines(directory) -> list[dict]:
    """The machine of each sitting of the run in ``directory`` (machines.jsonl, written by
    ``pgjax.train.run_dir``; see ``_read``): one dict per sitting with the step it started from."""
    return _read(pathlib.Path(directory) / MACHINES_FILE)


def read_completions(directory) -> list[dict]:
    """The logged completions of the run in ``directory`` (completions.jsonl, see ``_read``), one dict
    per row in step order (``pgjax.train.completions``)."""
    return _read(pathlib.Path(directory) / "completions.jsonl")


class MetricsFile(Sink):
    """A JSONL file of step records (metrics.jsonl; completions.jsonl too, whose rows ``log`` writes
    one by one): one JSON line per record, non-finite numbers as null. A new run
    (``start_step`` None) starts it empty (leftovers of a run that never checkpointed are not its);
    a resumed one cuts it after its last line at or before ``start_step`` (and a torn last line,
    saying so on stderr); a bad line before the last is a ConfigError."""

    def __init__(self, path: pathlib.Path, start_step: int | None = None):
        self.path = path
        if start_step is None:
            path.write_text("")
        else:
            self._cut(start_step)

    def _cut(self, start_step: int) -> None:
        """Truncate the file after its last record at or before ``start_step`` (the lines after it are
        redone); a torn last line is dropped with a message."""
        try:
            lines, torn = _record_lines(self.path)
        except ValueError as error:
            raise ConfigError(f"--resume: {error}; repair or remove that line") from None
        if torn:
            print(f"{self.path}: dropped a torn last line ({torn} bytes, a write cut short)", file=sys.stderr)
        keep = 0
        for end, record in lines:
            if record.get("step", 0) > start_step:
                break
            keep = end
        if self.path.exists():
            os.truncate(self.path, keep)

    def log(self, record: dict, completions: Sequence[dict] = ()) -> None:
        record = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")


class TensorBoard(Sink):
    """TensorBoard event files in ``directory`` (tensorboardX), a scalar per number of each record;
    the events of a resumed run after ``start_step`` are discarded (a new run: all of them)."""

    def __init__(self, directory: pathlib.Path, start_step: int | None = None):
        from tensorboardX import SummaryWriter
        self.writer = SummaryWriter(str(directory), purge_step=0 if start_step is None else start_step + 1)

    def log(self, record: dict, completions: Sequence[dict] = ()) -> None:
        for key, value in _numbers(record).items():
            self.writer.add_scalar(key, value, record["step"])
        if completions:
            self.writer.add_text("completions", markdown_table(completions), record["step"])
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class WandB(Sink):
    """A Weights & Biases run named after ``directory``, with ``config`` (the resolved experiment), in
    ``project``. Its id is kept in ``wandb_run_id``, so a resumed run continues it (W&B ignores
    re-logged steps at or below the last one it has). A failing ``wandb.init`` (no login, no
    network, a bad project) is a ConfigError."""

    def __init__(self, directory: pathlib.Path, project: str, config: dict, resume: bool):
        import wandb
        id_file = directory / "wandb_run_id"
        run_id = id_file.read_text().strip() if resume and id_file.exists() else uuid.uuid4().hex[:16]
        try:
            self.run = wandb.init(project=project, name=directory.name, id=run_id, dir=str(directory),
                                  config=config, resume="allow" if resume else "never")
        except Exception as error:      # no login, no network, a bad project: the user's setting
            raise ConfigError(f"logging.wandb: wandb.init failed ({error}); log in, or set "
                              "WANDB_MODE=offline, or logging.wandb=false") from None
        id_file.write_text(run_id)

    def log(self, record: dict, completions: Sequence[dict] = ()) -> None:
        """The record's numbers and its step's completions as a ``completions`` table, in one
        ``run.log`` (one history row)."""
        row: dict[str, Any] = _numbers(record)
        if completions:
            import wandb
            columns = table_columns(completions)
            row["completions"] = wandb.Table(columns=columns,
                                             data=[[r.get(c) for c in columns] for r in completions])
        self.run.log(row, step=record["step"])

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


# the sinks opened as factory(directory, since) by name (logging.tensorboard opens "tensorboard"); a user's
# sink (logging.sinks) is named by its import path instead and looked up the same way (open_sink)
SINKS: dict[str, Callable[[pathlib.Path, int | None], Sink]] = {"tensorboard": TensorBoard}


def sink_factory(name: str) -> Callable[[pathlib.Path, int | None], Sink]:
    """The factory of the sink ``name``: one of ``SINKS``, or the ``Sink`` subclass or factory at the
    import path ``name`` (``logging.sinks``); ConfigError naming ``logging.sinks`` for a path that does
    not import, a class that is not a ``Sink``, or something that cannot be called."""
    try:
        factory = resolve("logging.sinks", name, SINKS, "sink (a pgjax.train.sinks.Sink subclass or factory)")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if isinstance(factory, type) and not issubclass(factory, Sink):
        raise ConfigError(f"logging.sinks={name!r} is the class {factory.__qualname__}, not a subclass of "
                          "pgjax.train.sinks.Sink")
    if not callable(factory):
        raise ConfigError(f"logging.sinks={name!r} is {described_value(factory)}: a Sink subclass or a factory "
                          "(directory, since) -> Sink is expected")
    return factory


def open_sink(name: str, directory: pathlib.Path, since: int | None) -> Sink:
    """The sink ``name`` (``sink_factory``) opened as ``factory(directory, since)``; a user's (by import
    path) as a ``GuardedSink``, whose opening failing (any exception) or giving something without a
    ``log`` is a ConfigError naming ``logging.sinks`` and where in the user's code."""
    factory = sink_factory(name)
    if not is_import_path(name):
        return factory(directory, since)
    try:
        sink = factory(directory, since)
    except Exception as error:          # the user's code
        raise ConfigError(f"logging.sinks={name!r}: opening it as factory(directory, since) raised "
                          f"{located_error(error)}") from None
    if not callable(getattr(sink, "log", None)):
        raise ConfigError(f"logging.sinks={name!r} gave {described_value(sink)}, which has no log(record, "
                          "completions): not a pgjax.train.sinks.Sink")
    return GuardedSink(sink, name)


class GuardedSink(Sink):
    """A user's sink (``logging.sinks``) whose failures stay its own: it gets copies of each record and
    completion row (nothing it changes reaches another sink), and the first exception its ``log`` or
    ``close`` raises is reported on stderr (where in the user's code) and leaves it out for the rest of
    the run, closed with ``failed=True``; the run and its other sinks go on."""

    def __init__(self, sink, name: str):
        self.sink, self.name = sink, name

    def log(self, record: dict, completions: Sequence[dict] = ()) -> None:
        if self.sink is None:
            return
        try:
            self.sink.log(dict(record), [dict(row) for row in completions])
        except Exception as error:          # the user's code: reported, never the run's end
            self._drop(f"log raised {raised_text(error)} at step {record.get('step')}")

    def close(self, failed: bool = False) -> None:
        if self.sink is None:
            return
        sink, self.sink = self.sink, None
        try:
            close = getattr(sink, "close", None)
            if close is not None:
                close(failed)
        except Exception as error:
            print(f"logging.sinks={self.name}: close raised {raised_text(error)}", file=sys.stderr)

    def _drop(self, what: str) -> None:
        """Report ``what`` went wrong, close the sink (failed) and leave it out from now on."""
        print(f"logging.sinks={self.name}: {what}; this sink is left out for the rest of the run (the run and "
              "its other records go on)", file=sys.stderr)
        self.close(failed=True)


def table_columns(rows: Sequence[dict]) -> list[str]:
    """The columns of a table of completion rows: every key of the rows (in their order) but ``step``."""
    return [key for key in dict.fromkeys(k for row in rows for k in row) if key != "step"]


def _cell(value) -> str:
    """A markdown table cell showing ``value`` as is: numbers to 4 significant digits, None empty;
    text with HTML and markdown's inline marks escaped and line breaks as ``<br>`` (``markdown.cell``
    escapes ``|``)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if not isinstance(value, str):
        return str(value)
    text = html.escape(value, quote=False)
    for mark in "\\`*_[]":
        text = text.replace(mark, "\\" + mark)
    return text.replace("\r\n", "\n").replace("\n", "<br>")


def markdown_table(rows: Sequence[dict]) -> str:
    """The completion rows of one step as a markdown table (``table_columns``), as TensorBoard's Text
    tab renders it."""
    columns = table_columns(rows)
    return markdown.table(columns, [[_cell(row.get(c)) for c in columns] for row in rows], align="l" * len(columns))


def plot(records: list[dict], path, title: str) -> None:
    """One PNG with a panel per curve of ``CURVES`` that the run logged."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(k, label) for k, label in CURVES if any(r.get(k) is not None for r in records)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.8), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        ax.plot(*zip(*points, strict=True), marker="." if len(points) < 30 else None)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
