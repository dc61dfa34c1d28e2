"""The one baseline store (:mod:`pytest_ml4.target.baselines`): every stored file of each kind loads through its kind's
reader, an older layout or another kind is refused with one line naming the file, what a save option writes reads
back, and the direction table covers every figure a gate may compare. Files only, no server (well under a second)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_ml4.accuracy.gate import CategoryScore
from pytest_ml4.accuracy.gate import load_baseline as load_accuracy
from pytest_ml4.accuracy.gate import save_baseline as save_accuracy
from pytest_ml4.checks.reasoning import ShareBaseline, save_share_baseline
from pytest_ml4.perf.baseline import Baseline, parse_compare_fail, save_baseline
from pytest_ml4.perf.figures import PointFigures
from pytest_ml4.report.cli import main
from pytest_ml4.report.summary import (
    CheckRecord,
    build_summary,
    runs_in,
    stored_runs,
    write_summary,
)
from pytest_ml4.target.baselines import (
    BASELINE_FILES,
    DIRECTION,
    FORMAT,
    BaselineRefused,
    baselines_dir,
    default_baseline,
)
from pytest_ml4.target.model import load_target

#: Each kind's reader and what a loaded baseline must hold (how many figures it read).
READERS: dict[str, tuple[Callable[[Path], Any], Callable[[Any], int]]] = {
    "perf": (Baseline.load, lambda b: sum(len(p) for p in b.points.values())),
    "accuracy": (load_accuracy, lambda b: len(b.scores)),
    "reasoning-share": (ShareBaseline.load, lambda b: len(b.shares)),
}
PROV = {"kind": "simulator", "deployment": "rtxpro6000-tp8", "command": "pytest --sim"}


def _kind_of(path: Path) -> str:
    # The perf file's name is the bare target; the others carry their kind as a prefix.
    return next((k for k in BASELINE_FILES if k != "perf" and path.name.startswith(k + "-")), "perf")


def test_every_stored_baseline_loads_through_its_kinds_reader() -> None:
    paths = sorted(baselines_dir().glob("*.json"))
    seen = set()
    for path in paths:
        kind = _kind_of(path)
        read, count = READERS[kind]
        base = read(path)
        assert count(base) > 0, f"{path}: no figures read"
        assert json.loads(path.read_text())["format"] == FORMAT
        seen.add(kind)
    assert seen == set(BASELINE_FILES), f"a stored baseline of each kind: {sorted(seen)}"
    # The defaults the plugins use are the stored files (perf: the target file's perf.baseline names it).
    assert default_baseline("accuracy", "gb300-agg").is_file()
    assert default_baseline("reasoning-share", "vr200-disagg").is_file()
    rtx = load_target("rtxpro6000-tp8")
    assert rtx.resolve(str(rtx.perf.baseline)) == default_baseline("perf", "rtxpro6000-tp8")


#: Each kind's layout before the one format (what a platform team may still hold).
OLD_LAYOUTS: dict[str, dict[str, Any]] = {
    "perf": {"name": "t", "provenance": PROV, "conditions": {"osl": 4096}, "tolerances": {"tok_s_user": 0.1},
             "points": [{"concurrency": 1, "tok_s_user": 90.0}]},
    "accuracy": {"schema": 1, "target": "t", "provenance": PROV, "conditions": {"size": 200},
                 "categories": {"irrelevance": {"n": 200, "passed": 120}}},
    "reasoning-share": {"target": "t", "provenance": PROV, "conditions": {"max_tokens": 8192}, "tolerance": 0.1,
                        "shares": {"a prompt": 0.7}},
}


@pytest.mark.parametrize("kind", list(OLD_LAYOUTS))
def test_an_old_layout_is_refused_with_one_line_naming_the_file(kind: str, tmp_path: Path) -> None:
    old = tmp_path / f"old-{kind}.json"
    old.write_text(json.dumps(OLD_LAYOUTS[kind]))
    read, _ = READERS[kind]
    with pytest.raises(BaselineRefused) as err:
        read(old)
    assert str(err.value) == (f"{kind} baseline {old} is in an older layout (no \"format\": \"{FORMAT}\"): record "
                              "it again with this version's save option")


@pytest.mark.parametrize("kind", list(OLD_LAYOUTS))
def test_a_baseline_of_another_kind_is_refused(kind: str, tmp_path: Path) -> None:
    other = next(k for k in BASELINE_FILES if k != kind)
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"format": FORMAT, "kind": other, "target": "t", "provenance": PROV,
                                "conditions": {}, "tolerances": {}, "figures": {"x": 1}}))
    with pytest.raises(BaselineRefused) as err:
        READERS[kind][0](path)
    assert str(err.value) == f"baseline {path} is a {other!r} baseline, not a {kind!r} one"


def test_what_the_save_options_write_reads_back(tmp_path: Path) -> None:
    point = PointFigures(concurrency=4, requests=16, errors=0, error_rate_pct=0.0, out_tok_s=198.6, tok_s_user=59.6,
                         tok_s_user_p50=59.0, ttft_p50_s=0.63, ttft_p99_s=1.78, itl_p50_ms=17.1, itl_p99_ms=18.6,
                         decode_conc_avg=3.4, decode_conc_p50=4.0, decode_conc_max=4.0, reasoning_share=0.64,
                         osl_min=4096, osl_max=4096, osl_std=0.0, duration_s=300.0)
    perf = Baseline.load(save_baseline(tmp_path / "perf.json", "t", [point], {"osl": 4096},
                                       {"tok_s_user": 0.1}, PROV))
    assert perf.points[4]["itl_p50_ms"] == 17.1 and perf.tolerances == {"tok_s_user": 0.1}
    assert perf.provenance.simulated and perf.conditions == {"osl": 4096}
    save_accuracy(tmp_path / "acc.json", {"irrelevance": CategoryScore("irrelevance", 200, 120)}, "t",
                  {"size": 200}, PROV)
    acc = load_accuracy(tmp_path / "acc.json")
    assert acc.scores["irrelevance"].passed == 120 and acc.conditions == {"size": 200}
    share = ShareBaseline.load(save_share_baseline(tmp_path / "share.json", [{"prompt": "p", "share": 0.7}],
                                                   {"max_tokens": 8192}, PROV, 0.1))
    assert share.shares == {"p": 0.7} and share.tolerance == 0.1
    assert {json.loads((tmp_path / f).read_text())["kind"] for f in ("perf.json", "acc.json", "share.json")} == \
        set(BASELINE_FILES)


def test_every_figure_a_gate_may_compare_has_a_direction(tmp_path: Path) -> None:
    stored = Baseline.load(default_baseline("perf", "rtxpro6000-tp8"))
    assert set(stored.tolerances) <= set(DIRECTION)
    assert set(parse_compare_fail(",".join(f"{f}:5%" for f in DIRECTION))) == set(DIRECTION)
    # A tolerance on a figure with no better direction could never fail: the file is refused instead.
    odd = json.loads(default_baseline("perf", "rtxpro6000-tp8").read_text())
    odd["tolerances"]["requests"] = 0.1
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(odd))
    with pytest.raises(BaselineRefused, match=r"^perf baseline .*odd.json: tolerances for figures with no better "
                                              r"direction: requests \(known: "):
        Baseline.load(path)


def _runs(root: Path, *runs: tuple[str, float, str]) -> None:
    for name, started, target in runs:
        run = root / name
        run.mkdir(parents=True)
        write_summary(run, build_summary(run_dir=run, target=target, simulated=True, faults=(), versions={},
                                         checks=[CheckRecord("x::y", "y", "s")], started=started,
                                         finished=started + 1, exit_status=0))


def test_compare_and_history_list_the_same_runs(tmp_path: Path) -> None:
    _runs(tmp_path, ("b-late", 3.0, "t1"), ("a-early", 1.0, "t1"), ("c-other", 2.0, "t2"))
    (tmp_path / "d-old-schema").mkdir()
    (tmp_path / "d-old-schema" / "summary.json").write_text(json.dumps({"schema": 0, "tests": {"total": 1}}))
    assert [p.name for p in runs_in(tmp_path, "t1", with_results=True)] == ["a-early", "b-late"]
    assert [d["run_id"] for d in stored_runs(tmp_path)] == ["a-early", "c-other", "b-late"]


def test_report_compare_refuses_an_old_baseline_with_one_line(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    _runs(tmp_path / "runs", ("a", 1.0, "rtxpro6000-tp8"), ("b", 2.0, "rtxpro6000-tp8"))
    old = tmp_path / "old.json"
    old.write_text(json.dumps(OLD_LAYOUTS["perf"]))
    assert main(["compare", "--runs", str(tmp_path / "runs"), "--baseline", str(old)]) == 2
    assert capsys.readouterr().err == (f"ml4-report compare: perf baseline {old} is in an older layout (no "
                                       f"\"format\": \"{FORMAT}\"): record it again with this version's save option\n")
    # Control: the stored perf baseline is accepted (the runs have no perf figures: nothing regresses).
    assert main(["compare", "--runs", str(tmp_path / "runs"), "--png", str(tmp_path / "t.png")]) == 0
