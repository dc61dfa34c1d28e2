"""How ``--dist loadfile`` hands the project's tests to xdist workers: by file, except the kill matrix's runs.

``--dist loadfile`` keeps a module on one worker, which the modules starting one heavy process for all their tests
(real vLLM, a real ``dynamo.vllm`` worker) rely on. ``tests/test_kill_matrix.py`` is the opposite case: each of
its tests is one independent pytest subprocess with its own deployment (no module state beyond a cache of the
collected node ids), and together they are CI's largest file, so on one worker they were the critical path while
the other worker idled. Its tests are scheduled one by one instead.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadFileScheduling

#: Test files whose tests share nothing but a cache: each test is its own work unit.
PER_TEST_FILES = ("tests/test_kill_matrix.py",)


def scope_of(nodeid: str) -> str:
    """The work unit of a node id: its file, or the node itself in :data:`PER_TEST_FILES`."""
    file = nodeid.split("::", 1)[0]
    return nodeid if file in PER_TEST_FILES else file


class KillRunsApart(LoadFileScheduling):
    """``loadfile`` with the kill matrix's runs as work units of their own."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def make_scheduler(config: Any, log: Any) -> KillRunsApart | None:
    """The scheduler for ``--dist loadfile`` (None: xdist's own for any other mode)."""
    return KillRunsApart(config, log) if config.getoption("dist") == "loadfile" else None
