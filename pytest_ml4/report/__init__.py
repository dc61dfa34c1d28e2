"""Release sign-off reporting: Allure metadata and labels, secret redaction, run summaries, nightly comparison.

Modules: :mod:`.redact` (``redact()`` before attaching anything), :mod:`.environment` (environment.properties,
executor.json), :mod:`.categories`, :mod:`.labels`, :mod:`.results` (redacting Allure writer, crashed-worker
results), :mod:`.summary` (``summary.json``), :mod:`.history`, :mod:`.compare`, :mod:`.html` (Allure 2 HTML and
headless Chromium), :mod:`.scan` (leak scanner), :mod:`.cli` (``ml4-report``). The pytest glue is
:mod:`pytest_ml4.plugin.report`.
"""

from pytest_ml4.report.redact import (
    Redactor,
    redact,
    register_secret,
    register_secret_env,
)

__all__ = ["Redactor", "redact", "register_secret", "register_secret_env"]
