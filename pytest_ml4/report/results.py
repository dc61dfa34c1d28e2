"""Writing into the Allure results folder: a redacting file logger and broken results for crashed workers.

* :class:`RedactingFileLogger` replaces allure-python's ``AllureFileLogger``: every result, container and
  attachment passes through the run's :class:`~pytest_ml4.report.redact.Redactor` before it touches disk, so a
  secret in an exception message, a captured log or an attachment cannot reach the report.
* A not-judged check (allure-pytest writes it as a skip) gets Allure's status ``broken``
  (:func:`not_judged_as_broken`, category "Not judged"): never drawn as a skip or a pass.
* :func:`write_crash_result` records a test whose xdist worker died as **broken** (allure-python writes nothing
  for it, allure-framework/allure-python#825; tooling.md §2), so the report is not greener than pytest's verdict.
"""

from __future__ import annotations

import json
import os
import uuid as _uuid
from pathlib import Path
from typing import Any

from allure_commons import hookimpl
from allure_commons.logger import AllureFileLogger
from allure_commons.model2 import Label, Status, StatusDetails, TestResult
from allure_commons.utils import md5, now

from pytest_ml4.checks.verdict import NOT_JUDGED_PREFIX
from pytest_ml4.report.redact import Redactor, redact

# Attachments with these suffixes are text and get scrubbed; others (png, ...) are copied as they are.
_TEXT_SUFFIXES = {".txt", ".json", ".jsonl", ".csv", ".log", ".yaml", ".yml", ".xml", ".html", ".sse", ".uri",
                  ".md", ".prom", ".properties"}


class RedactingFileLogger(AllureFileLogger):
    """``AllureFileLogger`` that redacts results, containers and text attachments with ``redactor``."""

    def __init__(self, report_dir: str | Path, clean: bool = False, redactor: Redactor | None = None) -> None:
        super().__init__(report_dir, clean)
        self._redact = redactor or redact

    @property
    def report_dir(self) -> Path:
        return self._report_dir

    def _report_item(self, item: Any) -> None:
        # Same as the parent, but the serialised dict is redacted first (messages, traces, parameters, names).
        from attr import asdict

        data = self._redact(not_judged_as_broken(asdict(item, filter=lambda _, v: v or v is False)))
        filename = item.file_pattern.format(prefix=_uuid.uuid4())
        tmp = self._report_dir / f"{filename}.tmp"
        tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, self._report_dir / filename)

    @hookimpl  # overrides must be marked again: pluggy reads the marker off the subclass's function
    def report_attached_file(self, source: Any, file_name: str) -> None:
        src = Path(source)
        if src.suffix.lower() in _TEXT_SUFFIXES or Path(file_name).suffix.lower() in _TEXT_SUFFIXES:
            self.report_attached_data(src.read_bytes(), file_name)
        else:
            super().report_attached_file(source, file_name)

    @hookimpl
    def report_attached_data(self, body: Any, file_name: str) -> None:
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if Path(file_name).suffix.lower() != ".png":
            data = self._redact(data)
        super().report_attached_data(data, file_name)


#: Allure's status for a not-judged check. Allure 2's overview ring is passed / (passed + failed + broken): a
#: skip, and also "unknown", left it at 100 % over a run with a not-judged gate (rendered with ml4-report generate
#: --render); "broken" takes it below, and the "Not judged" category names it.
NOT_JUDGED_STATUS = "broken"


def not_judged_as_broken(data: dict[str, Any]) -> dict[str, Any]:
    """A result allure-pytest wrote as skipped whose message says ``not judged: `` gets :data:`NOT_JUDGED_STATUS`."""
    message = str((data.get("statusDetails") or {}).get("message") or "").removeprefix("Skipped: ")
    if data.get("status") == "skipped" and message.startswith(NOT_JUDGED_PREFIX):
        data["status"] = NOT_JUDGED_STATUS
    return data


def write_crash_result(alluredir: Path, nodeid: str, message: str, labels: dict[str, str] | None = None,
                       title: str | None = None, duration_s: float = 0.0) -> Path:
    """Write a broken Allure result for a test whose worker process crashed; returns the file written."""
    alluredir.mkdir(parents=True, exist_ok=True)
    path_part, _, name = nodeid.rpartition("::")
    module = path_part.split("::")[0].removesuffix(".py").replace("/", ".")
    full_name = f"{module}#{name.split('[')[0]}"
    stop = now()
    result = TestResult(
        uuid=str(_uuid.uuid4()), name=title or name, fullName=full_name, historyId=md5(nodeid),
        testCaseId=md5(full_name), status=Status.BROKEN, start=stop - int(duration_s * 1000), stop=stop,
        statusDetails=StatusDetails(message=message, trace=message),
    )
    labels = {"suite": module.rsplit(".", 1)[-1], **(labels or {})}
    result.labels.append(Label(name="tag", value="worker-crash"))
    for key, value in labels.items():
        result.labels.append(Label(name=key, value=value))
    logger = RedactingFileLogger(alluredir)
    before = set(alluredir.glob("*-result.json"))
    logger.report_result(result)
    return next(iter(set(alluredir.glob("*-result.json")) - before))
