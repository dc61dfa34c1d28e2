"""The reasoning share: measured on natural answers at a length that does not
cut the reasoning, judged only against a baseline recorded on the same deployment under the same conditions.

Core rules first (no endpoint); then the reasoning suite against the simulator started directly and reached with
``--endpoint`` (a live run to the plugin: the simulator's own baseline must not judge it), whose model reasons
longer than the old 256-token cap (fault ``reasoning_len``), not at all, or through a disabled parser.
"""

from __future__ import annotations

import json
import secrets
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.checks.reasoning import (
    ShareBaseline,
    ShareBaselineChoice,
    assert_share_within_baseline,
    cut_inside_reasoning,
    share_baseline_drift,
)
from pytest_ml4.checks.verdict import NotJudged
from pytest_ml4.target.baselines import (
    BaselineRefused,
    baselines_dir,
    default_baseline,
    pick_baseline,
    provenance_of,
)
from pytest_ml4.target.model import load_target

REPO = Path(__file__).resolve().parent.parent
TARGET = "rtxpro6000-tp8"
SIM_BASELINE = default_baseline("reasoning-share", TARGET)
BASELINE = ShareBaseline.load(SIM_BASELINE)
PROMPTS = list(BASELINE.shares)
CONDITIONS = dict(BASELINE.conditions)
FAST = {"sim": {"ttft_s": 0.005, "itl_ms": 0.2}}
RECORD = "pytest --target rtxpro6000-tp8 -m reasoning -k share_of_output --ml4-record-baselines"


def _rows(*shares: float) -> list[dict[str, object]]:
    return [{"prompt": p, "share": s} for p, s in zip(PROMPTS, shares)]


# ------------------------------------------------------------------------------------------------ core rules
def test_share_within_tolerance_passes() -> None:
    base = [BASELINE.shares[p] for p in PROMPTS]
    assert share_baseline_drift(_rows(base[0] + 0.05, base[1] - 0.05), BASELINE, CONDITIONS, "b.json") == []


def test_share_moved_past_tolerance_fails_naming_the_prompt() -> None:
    base = BASELINE.shares[PROMPTS[0]]
    problems = share_baseline_drift(_rows(base + 0.2, BASELINE.shares[PROMPTS[1]]), BASELINE, CONDITIONS, "b.json")
    assert len(problems) == 1
    assert f"reasoning share {base + 0.2:.1%}, baseline {base:.1%} (tolerance 10%, b.json)" in problems[0]


def test_unknown_prompt_fails() -> None:
    unknown = share_baseline_drift([{"prompt": "new prompt", "share": 0.5}], BASELINE, CONDITIONS, "b.json")
    assert "no baseline share for prompt 'new prompt'" in unknown[0]


@pytest.mark.parametrize("field, value", [("max_tokens", 256), ("min_tokens", 256), ("reasoning_effort", "high"),
                                          ("prompts", ["another prompt"])])
def test_other_conditions_are_refused_with_one_line(field: str, value: object) -> None:
    with pytest.raises(BaselineRefused) as err:
        share_baseline_drift(_rows(0.5, 0.5), BASELINE, {**CONDITIONS, field: value}, "b.json")
    line = str(err.value)
    assert "\n" not in line and line.startswith("reasoning share not compared with b.json: measured under other "
                                                f"conditions (baseline vs this run: {field} ")


def test_the_share_verdict_judges_only_with_a_baseline_of_these_conditions() -> None:
    """What the suite's share check concludes from the plugin's choice of baseline: passed within tolerance (the
    control), failed past it, not judged without a baseline or with a default one of other conditions (naming the
    command that records one), refused when the refused or named baseline cannot judge this run."""
    base = [BASELINE.shares[p] for p in PROMPTS]
    chosen = ShareBaselineChoice(BASELINE, record="CMD")
    assert_share_within_baseline(_rows(*base), CONDITIONS, chosen)
    with pytest.raises(AssertionError, match="reasoning share moved from the baseline:\n"):
        assert_share_within_baseline(_rows(base[0] + 0.2, base[1]), CONDITIONS, chosen)
    with pytest.raises(NotJudged, match=r"^not judged: reasoning share 50.0%, 50.0%: none recorded here$"):
        assert_share_within_baseline(_rows(0.5, 0.5), CONDITIONS, ShareBaselineChoice(None, "none recorded here"))
    other = {**CONDITIONS, "max_tokens": 256}
    with pytest.raises(NotJudged, match=r"measured under other conditions .*; record one under these conditions "
                                        r"with: CMD$"):
        assert_share_within_baseline(_rows(*base), other, chosen)
    with pytest.raises(BaselineRefused, match="measured under other conditions"):
        assert_share_within_baseline(_rows(*base), other, ShareBaselineChoice(BASELINE, explicit=True))
    with pytest.raises(BaselineRefused, match="^made elsewhere$"):
        assert_share_within_baseline(_rows(*base), CONDITIONS, ShareBaselineChoice(None, refused="made elsewhere"))


def test_truncation_is_a_length_finish_without_content() -> None:
    assert cut_inside_reasoning("length", None) and cut_inside_reasoning("length", "  ")
    assert not cut_inside_reasoning("length", "579") and not cut_inside_reasoning("stop", "")


def test_every_stored_baseline_states_its_provenance_and_conditions() -> None:
    """Each file says whether the simulator made it or which deployment, model, image, date and
    command recorded it; the reasoning-share and perf ones say what they were measured under."""
    for path in sorted(baselines_dir().glob("*.json")):
        data = json.loads(path.read_text())
        prov = provenance_of(data, path)
        if prov.kind == "deployment":
            assert all(prov.fields.get(k) for k in ("deployment", "model", "image", "date", "command")), path
        else:
            assert prov.fields.get("command") or prov.fields.get("source"), f"{path}: how it was made"
        assert isinstance(data.get("conditions"), dict) and data["conditions"], f"{path}: no conditions"


def _load(path: Path) -> ShareBaseline:
    return ShareBaseline.load(path)


def test_a_simulator_baseline_never_judges_a_live_run(tmp_path: Path) -> None:
    absent = tmp_path / "none.json"
    base, why = pick_baseline(None, SIM_BASELINE, _load, live=True, record="CMD")
    assert base is None and "was made by the simulator" in why and why.endswith("record one with: CMD")
    base, why = pick_baseline(None, absent, _load, live=True, record="CMD")
    assert base is None and "absent" in why and why.endswith("record one with: CMD")
    with pytest.raises(BaselineRefused, match="made by the simulator and cannot judge a live deployment"):
        pick_baseline(SIM_BASELINE, absent, _load, live=True, record="CMD")
    # Control: the simulator's baseline judges a simulator run.
    assert pick_baseline(None, SIM_BASELINE, _load, live=False, record="CMD")[0] == BASELINE


def test_a_baseline_without_provenance_is_refused(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"conditions": CONDITIONS, "tolerance": 0.1, "shares": {}, "provenance": "simulator"}))
    with pytest.raises(BaselineRefused, match=r"old.json states no provenance"):
        ShareBaseline.load(old)


# --------------------------------------------------------------------------------- the suite against endpoints
def _junit(path: Path) -> dict[str, tuple[str, str]]:
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                out[case.get("name", "")] = (kind, (el.get("message") or "") + "\n" + (el.text or ""))
                break
        else:
            out[case.get("name", "")] = ("passed", "")
    return out


def _run(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faults: tuple[str, ...],
         runs: list[list[str]]) -> list[dict[str, tuple[str, str]]]:
    """The reasoning suite against the simulator with ``faults``, reached as a live endpoint, once per args."""
    target = load_target(TARGET)
    monkeypatch.setenv(target.endpoint.api_key_env, "sk-share-" + secrets.token_urlsafe(12))
    results = []
    with SimServer(target, faults=faults, overrides=FAST, log_file=tmp_path / "sim.log") as sim:
        for i, args in enumerate(runs):
            junit = tmp_path / f"junit{i}.xml"
            res = pytester.runpytest_subprocess(
                str(REPO / "suites" / "test_reasoning.py"), "--target", TARGET, "--endpoint", sim.base_url,
                "--ml4-no-proxy", "--ml4-reports", str(tmp_path / "reports"), f"--junitxml={junit}",
                "-p", "no:randomly", *args, timeout=300)
            assert junit.is_file(), res.stdout.str()[-3000:]
            results.append(_junit(junit))
    return results


def test_a_model_reasoning_past_the_old_cap_passes_against_its_own_baseline(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1500 reasoning tokens, far past the old forced 256: the whole reasoning suite passes once a baseline is
    recorded on this deployment; before that the share is not judged (the simulator's file is not this
    deployment's), naming the command that records one."""
    saved = tmp_path / "share.json"
    first, second = _run(pytester, tmp_path, monkeypatch, ("reasoning_len=1500",),
                         [["-k", "share_of_output", f"--reasoning-share-save={saved}"],
                          ["-m", "reasoning", f"--reasoning-share-baseline={saved}"]])
    assert set(first) == {"test_reasoning_share_of_output_is_measured[nonstream]",
                          "test_reasoning_share_of_output_is_measured[stream]"}
    for kind, text in first.values():
        assert kind == "skipped" and "not judged: reasoning share" in text, text
        assert "was made by the simulator, not recorded on this deployment" in text and RECORD in text, text
    doc = json.loads(saved.read_text())
    assert doc["provenance"]["kind"] == "deployment" and doc["conditions"]["min_tokens"] is None
    assert all(s > 0.9 for s in doc["figures"].values()), doc["figures"]   # it did reason past the old cap
    # A plain skip is a check that does not apply to this target (e.g. the no-effort check on a stack whose other
    # checks already send no effort); a not-judged one is a skip whose reason says so, and fails here.
    bad = {name: r for name, r in second.items()
           if r[0] != "passed" and not (r[0] == "skipped" and "not judged: " not in r[1])}
    assert len(second) >= 20 and not bad, bad
    # The judged figure carries its conditions into summary.json.
    judged = [c for p in (tmp_path / "reports").glob("*/summary.json") for c in json.loads(p.read_text())["checks"]
              if c["nodeid"].endswith("::test_reasoning_share_of_output_is_measured[nonstream]")
              and c["outcome"] == "passed"]
    figure = judged[0]["figures"]["reasoning_share"]
    assert figure["conditions"] == doc["conditions"] and 0.9 < figure["value"] < 1


@pytest.mark.parametrize("faults, args, expect", [
    (("reasoning_len=9000",), [], ("skipped", "truncated: the answer hit max_tokens 8192 inside its reasoning")),
    (("reasoning_parser_off",), [], ("failure", "reasoning parser off")),
    (("reasoning_len=0",), [], ("failure", "no reasoning field although the model reasons by default")),
    ((), [f"--reasoning-share-baseline={SIM_BASELINE}"],
     ("failure", "was made by the simulator and cannot judge a live deployment")),
], ids=["cut_inside_reasoning", "parser_off", "no_reasoning", "simulator_baseline_named"])
def test_the_share_check_names_what_is_wrong(pytester: pytest.Pytester, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch, faults: tuple[str, ...],
                                             args: list[str], expect: tuple[str, str]) -> None:
    (result,) = _run(pytester, tmp_path, monkeypatch, faults, [["-k", "share_of_output and nonstream", *args]])
    (outcome,) = result.values()
    assert outcome[0] == expect[0] and expect[1] in outcome[0] + outcome[1], outcome
