"""Guards around a run: one run per output directory (a lock), and Ctrl-C / SIGTERM at safe points.

    >>> with RunLock("runs/x"):
    ...     trainer.train()      # a second process on runs/x gets RunLockedError

The lock is ``fcntl.flock`` on ``OUTPUT_DIR/.lock`` (the kernel releases it when the process dies,
however it dies; the file holds the owner's pid for the error message and is removed on release).

:class:`InterruptGuard` turns SIGINT and SIGTERM into ``KeyboardInterrupt``, raised at once inside
its ``interruptible()`` blocks (the trainer's loss closure and evaluations, where stopping loses
nothing: the optimizer restores the weights of a step whose closure raises) and otherwise deferred
to the next ``check()`` (between steps), never in the middle of a parameter update or a checkpoint write;
the trainer then raises :class:`TrainingInterrupted`, its checkpoint written.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import signal
import threading
from typing import Optional

from mezo_rl.errors import UserError

__all__ = ["LOCK_FILE", "InterruptGuard", "RunLock", "RunLockedError", "TrainingInterrupted"]

LOCK_FILE = ".lock"


class RunLockedError(UserError):
    """Another process is running in this output directory."""


class RunLock:
    """An exclusive, non-blocking lock on a run directory (``OUTPUT_DIR/.lock``).

    ``acquire()`` creates the directory if needed and raises :class:`RunLockedError` when another
    process holds the lock. ``release()`` (or leaving the ``with`` block) unlocks and removes the file.
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.dir = pathlib.Path(output_dir)
        self.path = self.dir / LOCK_FILE
        self._fd: int | None = None
        self._created = False

    def acquire(self) -> "RunLock":
        self._created = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.read(fd, 32).decode(errors="replace").strip()
                os.close(fd)
                self._remove_if_created()
                raise RunLockedError(f"output directory {str(self.dir)!r} is in use by another mezo-rl run"
                                     f"{f' (pid {owner})' if owner else ''}; wait for it to end or choose another "
                                     f"--output-dir") from None
            # the previous owner may have removed the file between our open and our lock: then the lock we
            # hold is on a file nobody else will open; start again on the current file
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # while still holding the lock (see acquire)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        self._remove_if_created()

    def _remove_if_created(self) -> None:
        """A directory this lock created and nothing else used is removed again (a refused run leaves no trace)."""
        if self._created:
            with contextlib.suppress(OSError):
                self.dir.rmdir()  # only if empty

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped :meth:`MeZOTrainer.train`; a checkpoint at ``step`` (the last completed
    step) was written to ``output_dir``, from which ``--resume`` continues bit-identically."""

    def __init__(self, step: int, steps: int, output_dir, signal_name: Optional[str] = None):
        super().__init__(f"interrupted at step {step} of {steps}")
        self.step, self.steps, self.output_dir, self.signal_name = step, steps, output_dir, signal_name


class InterruptGuard:
    """While active (``with guard:``, main thread only), SIGINT and SIGTERM raise ``KeyboardInterrupt``
    inside ``interruptible()`` blocks and are otherwise held until the next ``check()``.

    ``signal_name`` is the name of the signal that arrived (None if none did).
    """

    def __init__(self):
        self.signal_name: str | None = None
        self._pending = False
        self._depth = 0
        self._previous: dict = {}

    def _handle(self, signum, frame):
        self.signal_name = signal.Signals(signum).name
        if self._depth > 0:
            self._pending = False
            raise KeyboardInterrupt(self.signal_name)
        self._pending = True

    def __enter__(self) -> "InterruptGuard":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    @contextlib.contextmanager
    def interruptible(self):
        """A block that a signal may stop at once (a signal held before it starts stops it at the start)."""
        self.check()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    @contextlib.contextmanager
    def deferred(self):
        """A block that a signal never stops, even inside an ``interruptible()`` block (e.g. a file write)."""
        depth, self._depth = self._depth, 0
        try:
            yield
        finally:
            self._depth = depth

    def check(self) -> None:
        """Raise the held ``KeyboardInterrupt``, if a signal arrived outside an interruptible block."""
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt(self.signal_name)
