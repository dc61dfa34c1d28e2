"""Embedded vLLM 0.33 simulator: ``python -m pytest_ml4.sim`` (server) and :class:`SimServer` (Python handle)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_ml4.sim.server_proc import SimServer, SimServerError

__all__ = ["SimServer", "SimServerError"]


def __getattr__(name: str) -> Any:
    # Lazy so that importing a submodule (e.g. faults) does not pull in subprocess handling or aiohttp.
    if name in __all__:
        from pytest_ml4.sim import server_proc
        return getattr(server_proc, name)
    raise AttributeError(name)
