"""No secret leaves a run: a whole simulated smoke run (plus checks that handle the key on purpose and fail) under
pytest-xdist, then its Allure results, JUnit XML, run summary and console output are scanned for the API key
(whole or in pieces), bearer tokens and other credential shapes."""

from __future__ import annotations

import json
import secrets
import shutil
import textwrap
from pathlib import Path

import pytest

from pytest_ml4.report.redact import Redactor
from pytest_ml4.report.scan import scan_paths

REPO = Path(__file__).resolve().parent.parent

BAIT = textwrap.dedent('''
    """Checks that handle the API key the way careless suite code would, and fail."""
    import json, logging, os
    import allure
    import pytest

    pytestmark = pytest.mark.smoke

    def test_request_headers_everywhere(http_client):
        """The model list answers with a teapot."""
        resp = http_client.get("/models")
        headers = dict(resp.request.headers)
        logging.getLogger("ml4.bait").warning("request headers %s", headers)
        print("request headers:", headers)
        allure.attach(json.dumps(headers), "request headers", allure.attachment_type.JSON)
        allure.attach(resp.text, "response", allure.attachment_type.JSON)
        assert resp.status_code == 418, f"HTTP {resp.status_code} with {headers['authorization']}"

    def test_key_in_assertion_diff(openai_client, record_property):
        """The client uses the expected key."""
        record_property("client_key", openai_client.api_key)
        assert openai_client.api_key == "sk-expected-but-different-0000"

    def test_teapot_through_the_bundle(ml4):
        """The bundle's model list answers with a teapot."""
        assert ml4.http.get("/models").status_code == 418

    def test_key_in_exception(ml4_endpoint):
        """The endpoint object is usable."""
        raise RuntimeError(f"endpoint {ml4_endpoint!r} rejected {os.environ['LLM_API_KEY']}")
''')


def test_simulated_run_leaks_no_secret(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-ml4-scan-" + secrets.token_hex(16)
    monkeypatch.setenv("LLM_API_KEY", key)
    shutil.copy(REPO / "suites" / "test_smoke.py", pytester.path / "test_smoke.py")
    pytester.makepyfile(test_bait=BAIT)
    reports, junit = pytester.path / "reports", pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        "--target", "rtxpro6000-tp8", "--sim", "-m", "smoke", "-n", "2", "--ml4-reports", str(reports),
        f"--junitxml={junit}", "-o", "junit_logging=all", "--log-level=DEBUG", "-rA", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 3, "the bait checks must have run and failed"
    (run_dir,) = [p for p in reports.iterdir() if p.is_dir()]
    alluredir = run_dir / "allure-results"
    assert len(list(alluredir.glob("*-result.json"))) >= 10, "a whole smoke run was reported"

    results = {r["name"]: r for r in (json.loads(p.read_text()) for p in alluredir.glob("*-result.json"))}
    teapot = results["The model list answers with a teapot"]
    names = [a["name"] for a in teapot["attachments"]]
    assert "HTTP 1: GET /v1/models -> 200" in names, "a failing check carries its HTTP exchanges"
    bundled = [a["name"] for a in results["The bundle's model list answers with a teapot"]["attachments"]]
    assert "HTTP 1: GET /v1/models -> 200" in bundled, "a check using the ml4 bundle is recorded too"

    console = result.stdout.str() + result.stderr.str()
    everything = console + junit.read_text() + "".join(p.read_text() for p in alluredir.glob("*attachment*"))
    # The key really passed through the outputs (and was masked), so a clean scan means something.
    assert "Bearer ***" in everything and "'authorization': 'Bearer ***'" in everything

    red = Redactor([key])
    leaks = scan_paths([alluredir, junit, run_dir / "summary.json"], red)
    leaks += [f"console: {leak}" for leak in red.find_leaks(console)]
    assert not leaks, "secrets leaked:\n" + "\n".join(map(str, leaks))
