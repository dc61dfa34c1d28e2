"""vLLM 0.33 log-record formatting shared by the simulator's boot, server and stats lines.

Format (vllm/logger.py, 0.33; reference vllm.md §9.1):
``(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s``
with the date format ``%m-%d %H:%M:%S``.  uvicorn's own lines use ``INFO:     message`` (§9.7).
"""

from __future__ import annotations

import time


def vllm_line(process: str, pid: int, level: str, fileinfo: str, lineno: int, message: str,
              when: float | None = None) -> str:
    """One vLLM-format log line (no trailing newline)."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(time.time() if when is None else when))
    return f"({process} pid={pid}) {level} {stamp} [{fileinfo}:{lineno}] {message}"


def uvicorn_line(message: str, level: str = "INFO") -> str:
    """A uvicorn line: the level prefix ``INFO:`` padded to 9 characters, then the message."""
    return f"{(level + ':').ljust(9)} {message}"


def gib(nbytes: float) -> str:
    """vLLM's ``format_gib``: GiB rounded to 2 decimals, printed with Python's float repr."""
    return f"{round(nbytes / (1 << 30), 2)}"


def thousands(n: int) -> str:
    """Token counts in KV-cache lines are printed with ``,`` separators (vllm.md §9.2)."""
    return f"{n:,}"
