"""One run per output directory (RunLock); Ctrl-C and SIGTERM stop a run only at safe points (InterruptGuard)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from mezo_rl.errors import UserError
from mezo_rl.training.runguard import LOCK_FILE, InterruptGuard, RunLock, RunLockedError

HOLD = textwrap.dedent("""
    import sys, time
    from mezo_rl.training.runguard import RunLock
    with RunLock(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(60)
""")


def test_a_second_process_is_refused_and_the_lock_is_released_on_exit(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=rf"'{out}' is in use by another mezo-rl run \(pid {holder.pid}\)") as err:
            RunLock(out).acquire()
        assert isinstance(err.value, UserError)
    finally:
        holder.kill()  # killed without cleanup: the kernel drops the flock with the process
        holder.wait()
    with RunLock(out):  # the stale file does not block the next run
        assert (out / LOCK_FILE).read_text() == str(os.getpid())
    assert not (out / LOCK_FILE).exists()


def test_the_lock_is_exclusive_within_one_process_too(tmp_path):
    first = RunLock(tmp_path).acquire()
    with pytest.raises(RunLockedError):
        RunLock(tmp_path).acquire()  # flock locks are per open file description
    first.release()
    RunLock(tmp_path).acquire().release()


def test_a_refused_lock_leaves_no_directory_behind(tmp_path):
    holder = RunLock(tmp_path / "run").acquire()
    holder.release()
    assert not (tmp_path / "run").exists()  # created by the lock, empty: removed on release
    (tmp_path / "kept").mkdir()
    with RunLock(tmp_path / "kept"):
        pass
    assert (tmp_path / "kept").is_dir()  # it existed before: kept


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_stop_interruptible_blocks_at_once_and_are_held_elsewhere(sig):
    before = signal.getsignal(sig)
    with InterruptGuard() as guard:
        with pytest.raises(KeyboardInterrupt, match=signal.Signals(sig).name):
            with guard.interruptible():  # e.g. the loss closure: stopped at once
                os.kill(os.getpid(), sig)  # the handler runs at the next bytecode boundary
                pytest.fail("the signal did not interrupt")
        os.kill(os.getpid(), sig)  # outside: e.g. in the middle of an update or a file write
        done = "went on"
        with pytest.raises(KeyboardInterrupt):
            guard.check()  # raised at the next safe point
        assert done == "went on" and guard.signal_name == signal.Signals(sig).name
        guard.check()  # raised once
        os.kill(os.getpid(), sig)
        with pytest.raises(KeyboardInterrupt):
            with guard.interruptible():  # a held signal stops the next interruptible block at its start
                pytest.fail("entered")
        with guard.interruptible(), guard.deferred():
            os.kill(os.getpid(), sig)  # a file write inside an evaluation: held
            done = "written"
        with pytest.raises(KeyboardInterrupt):
            guard.check()
    assert signal.getsignal(sig) is before
