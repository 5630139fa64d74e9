"""Training progress on stderr, drawn by tqdm.

On a terminal: a live bar with the step's reward (a reward model's: its loss), sampled (its pairwise)
accuracy and the last evaluation.
Anywhere else (a log file, CI, a pipe): one plain line every ``every`` seconds and at the last
step (``every=0``: every step), never carriage returns.
"""
from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    """``update(record)`` after each RL step ``record["step"]`` of ``total``; ``close()`` at the end."""

    def __init__(self, total: int, start: int, every: float, enabled: bool, stream=None):
        self.total, self.start, self.every, self.enabled = total, start, every, enabled
        self.stream = sys.stderr if stream is None else stream
        self.started = self.last_line = time.perf_counter()
        self.eval_accuracy = None
        live = enabled and self.stream.isatty()
        self.bar = tqdm(total=total, initial=start, file=self.stream, unit="step", dynamic_ncols=True) if live else None

    def _postfix(self, record: dict) -> str:
        self.eval_accuracy = record.get("eval_accuracy", self.eval_accuracy)
        evaluation = "" if self.eval_accuracy is None else f" eval {self.eval_accuracy:.3f}"
        first = f"reward {record['reward']:.3f}" if "reward" in record else f"loss {record['loss']:.3f}"
        return f"{first} acc {record['accuracy']:.2f}{evaluation}"

    def update(self, record: dict) -> None:
        if not self.enabled:
            return
        postfix = self._postfix(record)
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(1)
            return
        now, step = time.perf_counter(), record["step"]
        if now - self.last_line >= self.every or step == self.total:
            self.last_line = now
            line = tqdm.format_meter(step - self.start, self.total - self.start, now - self.started, ncols=0,
                                     unit="step", postfix=postfix)
            print(line.strip(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
