"""The training progress bar: one line on a terminal's stderr with steps/s and ETAs."""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar with rate and ETA on a terminal's stderr; silent elsewhere."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self._last = 0.0
        self._shown = False

    def update(self, text: str, done: int, total: int, elapsed: float,
               run_left: float | None = None) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.1 and done < total):
            return
        self._last = now
        width = 24
        filled = int(width * done / max(total, 1))
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else 0.0
        tail = f" {rate:.1f} steps/s ETA {_clock(eta)}"
        if run_left is not None:
            tail += f" (run {_clock(run_left + eta)})"
        sys.stderr.write(f"\r{text} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
                         f"{tail}\x1b[K")
        sys.stderr.flush()
        self._shown = True

    def clear(self) -> None:
        if self.enabled and self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
        self._shown = False

    def finish(self) -> None:
        """End the line where it stands (an interrupt), so the next message starts clean."""
        if self.enabled and self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self._shown = False


def _clock(seconds: float) -> str:
    s = int(round(max(seconds, 0.0)))
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"
