"""The process groups the session owns: every process the project starts (simulator, LiteLLM, Dynamo frontend,
workers and gateway, real vLLM, aiperf) is started by :func:`popen` in a session of its own and registered here,
so one place can end them all, whatever interrupted the run.

* :func:`run` -- ``subprocess.run`` of a short command that runs to its end (not registered: see there).
* :func:`popen` -- ``subprocess.Popen`` in a new session (the child is the leader of its own process group, so a
  terminal's Ctrl-C does not reach it half-way through a drain) and registered.
* :func:`stop` -- end one group: ``first_signal`` to the group (or only the leader), wait ``grace_s`` for the
  leader, then SIGKILL whatever of the group is left (aiperf's ``system_controller`` outlives its parent's
  SIGINT). Forgets the group.
* :func:`end_all` -- :func:`stop` every group still registered (``since=mark()``: those registered after the
  mark); run at interpreter exit (``atexit``) and by the plugin's ``pytest_unconfigure`` for the groups its
  session started (a pytest run inside a test, ``pytester``, must not end the outer test's servers).
* :func:`kill_all_now` -- SIGKILL every owned group (the second signal, below).
* :func:`install_signal_handlers` -- in the main thread of a pytest process: the first SIGTERM or SIGINT
  becomes ``KeyboardInterrupt`` (pytest's interrupted path: exit 2, ``summary.json`` says ``interrupted``, the
  fixtures tear down); the second SIGKILLs every owned group at once and lets that teardown finish; a third
  raises ``KeyboardInterrupt`` again (the teardown is abandoned, ``atexit`` still runs).

A group is known by its leader's pid (``start_new_session``: pgid == pid). Linux keeps a pid number from being
reused while a group of that id has members, so signalling a registered group reaches only what we started.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

#: How long a group gets after its leader exited before what is left of it is killed.
LEFTOVER_GRACE_S = 2.0

_owned: dict[int, tuple[int, subprocess.Popen[Any]]] = {}   # pgid -> (registration number, leader)
_registered = 0
_lock = threading.Lock()
_signals_seen = 0
_previous_handlers: dict[int, Any] = {}
_installs = 0   # a pytest run inside a test (pytester) installs again: only the outermost restores


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **kwargs)`` in a session (and process group) of its own, owned by this session."""
    kwargs["start_new_session"] = True
    global _registered
    proc: subprocess.Popen[Any] = subprocess.Popen(argv, **kwargs)
    with _lock:
        _prune()
        _registered += 1
        _owned[proc.pid] = (_registered, proc)
    return proc


def run(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(argv, **kwargs)`` for a short command that runs to its end (git, journalctl, systemctl,
    systemd-cat, aiperf's Kubernetes submit). It stays in the session's own process group, unlike :func:`popen`:
    the terminal's Ctrl-C reaches it as it reaches pytest, and ``systemctl`` keeps the terminal it may ask a
    password on. Here so that every process the project starts is started in this module."""
    return subprocess.run(argv, **kwargs)  # noqa: PLW1510 - callers pass check= themselves


def mark() -> int:
    """A point in the registration order: ``end_all(since=mark())`` ends only the groups started after it."""
    with _lock:
        return _registered


def owned_pgids() -> list[int]:
    """The groups registered and still having members."""
    with _lock:
        _prune()
        return sorted(_owned)


def group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` exists (zombies of reaped leaders do not count)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop(proc: subprocess.Popen[Any] | None, grace_s: float = 10.0, *, first_signal: int = signal.SIGTERM,
         leader_only: bool = False, on_leader_gone: Callable[[int], object] | None = None) -> None:
    """End ``proc``'s group: ``first_signal`` (to the whole group, or the leader alone with ``leader_only``),
    up to ``grace_s`` for the leader to exit, SIGTERM then SIGKILL for anything left in the group.
    ``on_leader_gone(pgid)`` runs once the leader is gone and before that (a caller that records what was left)."""
    if proc is None:
        return
    pgid = proc.pid
    try:
        if proc.poll() is None:
            send_signal(proc, first_signal, leader_only)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _killpg(pgid, signal.SIGKILL)
                proc.wait(timeout=10)
        if on_leader_gone is not None:
            on_leader_gone(pgid)
        _end_leftovers(pgid)
    finally:
        with _lock:
            _owned.pop(pgid, None)


def end_all(grace_s: float = 5.0, since: int = 0) -> list[int]:
    """Stop every owned group registered after ``since`` (SIGTERM, SIGKILL after ``grace_s``); returns the
    pgids that were still alive."""
    with _lock:
        _prune()
        procs = [proc for number, proc in _owned.values() if number > since]
    alive = [p.pid for p in procs]
    for proc in procs:  # all signalled first, so the groups drain in parallel
        _killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        stop(proc, max(0.0, deadline - time.monotonic()))
    return alive


def kill_all_now() -> None:
    """SIGKILL every owned group (the second Ctrl-C: the user does not want to wait for drains)."""
    with _lock:
        pgids = list(_owned)
    for pgid in pgids:
        _killpg(pgid, signal.SIGKILL)


def install_signal_handlers() -> None:
    """SIGTERM and SIGINT handling of a pytest process (main thread only; nests). See the module doc."""
    global _installs
    if threading.current_thread() is not threading.main_thread():
        return
    _installs += 1
    if _installs > 1:
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # ignored on purpose (a background job of a shell, nohup): stays ignored
        _previous_handlers[sig] = signal.signal(sig, _on_signal)


def uninstall_signal_handlers() -> None:
    """Put back the handlers :func:`install_signal_handlers` replaced."""
    global _signals_seen, _installs
    if threading.current_thread() is not threading.main_thread() or _installs == 0:
        return
    _installs -= 1
    if _installs:
        return
    for sig, previous in _previous_handlers.items():
        signal.signal(sig, previous)
    _previous_handlers.clear()
    _signals_seen = 0


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _signals_seen
    _signals_seen += 1
    if _signals_seen == 2:
        kill_all_now()  # and no exception: the teardown under way finishes and writes summary.json
        return
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def send_signal(proc: subprocess.Popen[Any], sig: int, leader_only: bool) -> None:
    """``sig`` to ``proc``'s whole group, or to the leader alone (a no-op once it has exited)."""
    if leader_only:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
    else:
        _killpg(proc.pid, sig)


def _end_leftovers(pgid: int) -> None:
    """The leader is gone; its group may not be (children in the same group)."""
    if not group_alive(pgid):
        return
    _killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    _killpg(pgid, signal.SIGKILL)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _prune() -> None:
    """Forget groups with no member left (caller holds the lock); reaps finished leaders on the way."""
    for pgid, (_number, proc) in list(_owned.items()):
        if proc.poll() is not None and not group_alive(pgid):
            del _owned[pgid]


atexit.register(end_all)
