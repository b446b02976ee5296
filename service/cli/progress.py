"""Progress of a long command, on a terminal only.

One status line on standard error, rewritten in place: the count so far, the rate, and where the
total is known the share done and the time left. When standard error is not a terminal (a log, a
pipe, cron's mail) it prints nothing: the command's own last line says what was done. Updates are
drawn at most a few times a second, so a caller may report every row.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import TextIO

REDRAW_EVERY = 0.25  # seconds between redraws of the line


class Progress:
    """`update(done)` as work goes; `clear()` before printing anything else to the same terminal,
    and at the end (a `with` block does that). `allowed=False` keeps it off, e.g. while the command
    writes its data to the same terminal."""

    def __init__(
        self,
        what: str,
        *,
        unit: str = "rows",
        total: int | None = None,
        stream: TextIO | None = None,
        allowed: bool = True,
    ):
        self.what, self.unit, self.total = what, unit, total if total and total > 0 else None
        self.stream = stream if stream is not None else sys.stderr
        self.on = allowed and self.stream.isatty()
        self.started = time.monotonic()
        self.drawn_at = 0.0
        self.shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.clear()

    def update(self, done: int) -> None:
        if not self.on:
            return
        now = time.monotonic()
        if now - self.drawn_at < REDRAW_EVERY:
            return
        self.drawn_at = now
        self.stream.write(f"\r{self.line(done, now - self.started)}\x1b[K")
        self.stream.flush()
        self.shown = True

    def line(self, done: int, elapsed: float) -> str:
        rate = done / elapsed if elapsed > 0 else 0.0
        text = f"{self.what}: {done:,} {self.unit}, {rate:,.0f} {self.unit}/s"
        if self.total is not None:
            share = min(done / self.total, 1.0)
            left = (self.total - done) / rate if rate > 0 and done < self.total else 0.0
            text += f", {share:.0%} of ~{self.total:,}, ETA {_clock(left)}"
        return text

    def clear(self) -> None:
        """Erase the line, so that what is printed next starts on a clean one."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False
            self.drawn_at = 0.0


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class JobLog(logging.Handler):
    """For a job that reports its progress only in its log (the monthly reset: "N counters reset so
    far" at INFO, the count its last argument): on a terminal the count moves the progress line,
    and the job's warnings still print, each on a line of its own."""

    def __init__(self, progress: Progress):
        super().__init__(logging.INFO)
        self.progress = progress
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.levelno >= logging.WARNING:
            self.progress.clear()
            print(self.format(record), file=self.progress.stream, flush=True)
        elif record.levelno == logging.INFO and args and isinstance(args[-1], int):
            self.progress.update(args[-1])

    @contextlib.contextmanager
    def attached(self, name: str) -> Iterator[None]:
        """Route logger `name`'s records here alone while the block runs."""
        logger = logging.getLogger(name)
        saved = (logger.level, logger.propagate)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(self)
        try:
            yield
        finally:
            logger.removeHandler(self)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]
