"""Engine logs: readers (file, journald, Kubernetes), the signature catalogue and typed events.

Core, no pytest::

    from pytest_ml4.logs import reader_for_target, LogView, KvCacheSize
    reader = reader_for_target(target)             # or FileLogReader(path) / JournaldLogReader(unit, ssh_host=...)
    view = LogView(reader.since_last_boot(), reader.describe())
    view.first(KvCacheSize).tokens, view.failures()

The Kubernetes reader lives in ``pytest_ml4.logs.kubernetes`` (class ``KubernetesLogReader`` with a
``for_target(target, env)`` constructor), a :class:`LogReader` like the others.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_ml4.logs.events import (
    EVENT_TYPES,
    AvailableKvMemory,
    CudaOom,
    EngineArgsLogged,
    EngineFailure,
    GrammarKill,
    GrammarSchemaRefused,
    HealthCanaryFailure,
    KvCacheSize,
    KvMaxConcurrency,
    KvTransferFailure,
    LogEvent,
    LogView,
    NoKvMemory,
    ServerStart,
    SpecDecodeMetrics,
    StartupRefused,
    StatsLine,
    SymmMemUnsupported,
    parse_events,
    quote,
)
from pytest_ml4.logs.file import FileLogReader
from pytest_ml4.logs.journald import JournaldLogReader, LogReadError
from pytest_ml4.logs.reader import LogReader
from pytest_ml4.logs.records import LogRecord, records_from_text
from pytest_ml4.logs.signatures import Catalogue, Signature, load_catalogue
from pytest_ml4.target.model import Target

__all__ = [
    "EVENT_TYPES", "AvailableKvMemory", "Catalogue", "CudaOom", "EngineArgsLogged", "EngineFailure", "FileLogReader", "GrammarKill", "GrammarSchemaRefused",
    "HealthCanaryFailure", "JournaldLogReader", "KvCacheSize", "KvMaxConcurrency", "KvTransferFailure", "LogEvent",
    "LogReadError", "LogReader", "LogRecord", "LogView", "NoKvMemory", "ServerStart", "Signature",
    "SpecDecodeMetrics", "StartupRefused", "StatsLine", "SymmMemUnsupported", "load_catalogue", "parse_events",
    "quote", "reader_for_target", "records_from_text", "start_failure_summary",
]


def reader_for_target(target: Target, *, sim: Any = None, env: Mapping[str, str] | None = None) -> LogReader:
    """The reader for ``target``'s engine log: the simulator's log file under ``--sim``, else ``target.logs``."""
    if sim is not None:
        return FileLogReader(sim.log_file)
    env = os.environ if env is None else env
    logs = target.logs
    if logs.kind == "file":
        assert logs.path is not None
        return FileLogReader(target.resolve(logs.path))
    if logs.kind == "journald":
        assert logs.unit is not None
        host = env.get(logs.ssh_host_env) if logs.ssh_host_env else None
        return JournaldLogReader(logs.unit, ssh_host=host or None)
    try:
        from pytest_ml4.logs.kubernetes import KubernetesLogReader  # type: ignore[import-not-found]
    except ImportError as err:
        raise LogReadError(f"target {target.name} reads its logs from Kubernetes, but the Kubernetes log reader "
                           f"is not available: {err}") from None
    return KubernetesLogReader.for_target(target, env=env)


def start_failure_summary(log_file: str | Path, tail: int = 20) -> str:
    """Why an engine did not come up, from its log: the failure lines the catalogue knows, then the tail.

    For a start-up error message (e.g. the plugin's when the simulator refuses to start), so that the refusal or
    OOM line is quoted even when the traceback after it is long.
    """
    view = LogView(FileLogReader(log_file).since_last_boot(), str(log_file))
    failures = view.failures()
    head = (f"engine log failure lines:\n{quote(failures)}\n" if failures
            else "no known failure signature in the engine log\n")
    from pytest_ml4.report.redact import redact

    return redact(f"{head}last {tail} lines of {log_file}:\n{view.tail(tail)}")
