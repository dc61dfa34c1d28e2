"""pytest glue for the BFCL accuracy gate (``suites/test_accuracy.py``); the core is :mod:`pytest_ml4.accuracy`.

One session fixture runs the sample once (the synthetic-acceptance guard first: a refused deployment is not
measured), writes ``<run_dir>/accuracy-summary.json`` (read into ``summary.json``) and optionally a baseline.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_ml4.accuracy.bfcl import CategoryError, resolve_categories
from pytest_ml4.accuracy.gate import (
    AccuracyBaseline,
    CategoryScore,
    Drop,
    compare,
    failed_items,
    load_baseline,
    run_conditions,
    save_baseline,
    summarize,
)
from pytest_ml4.accuracy.score import ItemResult
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.logs import LogReader, LogReadError
from pytest_ml4.logs.events import LogView
from pytest_ml4.plugin.option_group import group as ml4_group
from pytest_ml4.plugin.option_group import opt
from pytest_ml4.plugin.record import recording
from pytest_ml4.plugin.state import simulator_answers
from pytest_ml4.target.baselines import (
    BaselineRefused,
    default_baseline,
    deployment_provenance,
    pick_baseline,
    record_command,
    recording_path,
)
from pytest_ml4.target.model import Target

SUMMARY_FILE = "accuracy-summary.json"
#: How a deployment's accuracy baseline is recorded (named by the gate when it cannot judge without one).


def pytest_addoption(parser: pytest.Parser) -> None:
    group = ml4_group(parser)
    add = group.addoption
    add("--accuracy-size", dest="ml4_accuracy_size", type=int, default=None, metavar="N",
        help="BFCL items per category (seeded sample; default: every item, the nightly run) "
             "(ini: ml4_accuracy_size)")
    add("--accuracy-categories", dest="ml4_accuracy_categories", default=None, metavar="A,B,...",
        help="BFCL categories to run (default: every single-turn one in pytest_ml4/data/accuracy/categories.yaml) "
             "(ini: ml4_accuracy_categories)")
    add("--accuracy-baseline", dest="ml4_accuracy_baseline", default=None, metavar="PATH",
        help="accuracy baseline to compare against (default: pytest_ml4/data/baselines/accuracy-<target>.json when "
             "it exists) (ini: ml4_accuracy_baseline)")
    add("--accuracy-save", dest="ml4_accuracy_save", default=None, metavar="PATH",
        help="write this run's per-category accuracy as a baseline file")
    add("--accuracy-tolerance", dest="ml4_accuracy_tolerance", type=float, default=None, metavar="X",
        help="accuracy points (0-1) a category may drop before a significant drop fails (default 0.05)")
    add("--accuracy-alpha", dest="ml4_accuracy_alpha", type=float, default=None, metavar="A",
        help="significance level of the one-sided two-proportion test (default 0.05)")
    add("--accuracy-concurrency", dest="ml4_accuracy_concurrency", type=int, default=None, metavar="N",
        help="requests in flight (default 16)")
    add("--accuracy-seed", dest="ml4_accuracy_seed", type=int, default=None, metavar="N",
        help="seed of the sample and of the requests (default 1234)")
    for name, text in (("size", "BFCL items per category"), ("categories", "BFCL categories, comma-separated"),
                       ("baseline", "accuracy baseline file"), ("tolerance", "accuracy drop tolerance"),
                       ("alpha", "significance level"), ("concurrency", "requests in flight"),
                       ("seed", "sample/request seed")):
        parser.addini(f"ml4_accuracy_{name}", text, default=None)


@dataclass(frozen=True)
class AccuracyOptions:
    categories: list[str]
    size: int | None
    baseline: Path | None          # named with --accuracy-baseline (default: the target's file, if usable)
    save: Path | None
    tolerance: float = 0.05
    alpha: float = 0.05
    concurrency: int = 16
    seed: int = 1234


def _num(config: pytest.Config, name: str, kind: type, default: Any, lo: float, hi: float | None = None) -> Any:
    raw = opt(config, f"ml4_accuracy_{name}", f"ml4_accuracy_{name}")
    if raw is None:
        return default
    try:
        v = kind(raw)
    except ValueError:
        raise pytest.UsageError(f"--accuracy-{name}: expected a number, got {raw!r}") from None
    if v < lo or (hi is not None and v >= hi):
        raise pytest.UsageError(f"--accuracy-{name}: {v} is out of range [{lo}, {hi if hi is not None else 'inf'})")
    return v


def options(config: pytest.Config, target_name: str | None) -> AccuracyOptions:
    """The accuracy options, checked (UsageError names the option)."""
    cats = opt(config, "ml4_accuracy_categories", "ml4_accuracy_categories")
    try:
        categories = resolve_categories([c.strip() for c in str(cats).split(",") if c.strip()] if cats else None)
    except CategoryError as e:
        raise pytest.UsageError(f"--accuracy-categories: {e}") from None
    base = opt(config, "ml4_accuracy_baseline", "ml4_accuracy_baseline")
    save = config.getoption("ml4_accuracy_save")
    return AccuracyOptions(categories, _num(config, "size", int, None, 1), Path(base) if base else None,
                           Path(save) if save else None, _num(config, "tolerance", float, 0.05, 0, 1),
                           _num(config, "alpha", float, 0.05, 1e-9, 1), _num(config, "concurrency", int, 16, 1),
                           _num(config, "seed", int, 1234, 0))


def pytest_configure(config: pytest.Config) -> None:
    # Bad values fail at start-up, before any endpoint is touched.
    options(config, None)


@dataclass
class AccuracyRun:
    options: AccuracyOptions
    refused: list[str] = field(default_factory=list)
    #: Why the running engine's speculative config was not judged ("" when its log showed it).
    engine_unread: str = ""
    results: list[ItemResult] = field(default_factory=list)
    scores: dict[str, CategoryScore] = field(default_factory=dict)
    baseline: AccuracyBaseline | None = None
    drops: list[Drop] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)
    conditions: dict[str, Any] = field(default_factory=dict)
    #: Why no baseline judges this run (not judged), or the one line refusing the baseline given.
    baseline_missing: str = ""
    baseline_refused: str = ""
    #: ``--ml4-record-baselines``: the baseline this run wrote (it compares with none).
    recorded: Path | None = None

    def summary(self) -> dict[str, Any]:
        o = self.options
        return {"schema": "ml4-accuracy-summary/1", "benchmark": "BFCL v4 (bfcl-eval)",
                "settings": {"size": o.size, "seed": o.seed, "tolerance": o.tolerance, "alpha": o.alpha,
                             "categories": o.categories},
                "conditions": self.conditions,
                "refused": self.refused,
                "engine_config_unread": self.engine_unread or None,
                "passed": not self.refused and not self.drops and self.baseline is not None,
                "not_judged": self.baseline_missing or None,
                "recorded": str(self.recorded) if self.recorded else None,
                "baseline_refused": self.baseline_refused or None,
                "drop_categories": [d.category for d in self.drops],
                "categories": {c: {**s.as_dict(), "total": self.totals.get(c)} for c, s in self.scores.items()},
                "baseline": None if self.baseline is None else {
                    "path": str(self.baseline.path), "provenance": self.baseline.provenance.as_dict(),
                    "conditions": self.baseline.conditions,
                    "categories": {c: s.as_dict() for c, s in self.baseline.scores.items()}},
                "drops": [d.describe() for d in self.drops],
                "failed_items": len(failed_items(self.results))}


def judge_against_baseline(run: AccuracyRun, target: Target, live: bool) -> None:
    """Pick the baseline that may judge this run (never the simulator's on a live deployment, never one of other
    conditions) and compare; otherwise say why not (``baseline_missing``) or refuse (``baseline_refused``)."""
    try:
        base, run.baseline_missing = pick_baseline(run.options.baseline, default_baseline("accuracy", target.name, target.root),
                                                   load_baseline, live=live,
                                                   record=record_command("accuracy", target),
                                                   other_conditions=lambda b: b.refusal(run.conditions))
    except BaselineRefused as err:
        run.baseline_refused = str(err)
        return
    run.baseline = base
    if base is not None:
        run.drops = compare(run.scores, base.scores, run.options.tolerance, run.options.alpha)


def run_accuracy(config: pytest.Config, target: Target, declared: Target, endpoint: Endpoint, http: Any,
                 run_dir: Path, progress: Any, logs: Callable[[], LogReader]) -> AccuracyRun:
    """Guard, sample, drive, score, compare; the summary file is written whatever the outcome."""
    from pytest_ml4.accuracy import bfcl
    from pytest_ml4.accuracy.data import load_dataset
    from pytest_ml4.accuracy.runner import RunSettings, run_items
    from pytest_ml4.accuracy.synthetic import engine_config_unread, synthetic_acceptance

    opts = options(config, target.name)
    run = AccuracyRun(opts)
    engine_log, unreadable = _engine_log(logs)
    run.refused = synthetic_acceptance(declared, [declared.resolve(m) for m in declared.manifests], engine_log)
    run.engine_unread = engine_config_unread(engine_log, unreadable)
    if not run.refused:
        api = bfcl.load(run_dir / "bfcl")
        ds = load_dataset(api, opts.categories, opts.size, opts.seed)
        run.totals = ds.totals
        settings = RunSettings(model=endpoint.model, concurrency=opts.concurrency, seed=opts.seed)
        run.results = run_items(http, api, ds, settings, progress)
        run.scores = summarize(run.results, opts.categories)
        run.conditions = run_conditions(api.version, opts.size, opts.seed)
        save = opts.save
        if recording(config):   # this run sets the baseline: nothing to compare with
            run.recorded = save = save or recording_path("accuracy", target)
        else:
            judge_against_baseline(run, target, live=not simulator_answers(config, endpoint))
        if save is not None:
            save_baseline(save, run.scores, target.name, run.conditions,
                          deployment_provenance(target, endpoint.model, sys.argv,
                                                bool(getattr(endpoint, "simulated", False)), endpoint.base_url))
    (run_dir / SUMMARY_FILE).write_text(json.dumps(run.summary(), indent=2) + "\n")
    return run


def _engine_log(logs: Callable[[], LogReader]) -> tuple[LogView | None, str]:
    """The engine's lines since its last boot, or None and why they could not be read (no reader for the target's
    log source, or the source refused)."""
    try:
        reader = logs()
        return LogView(reader.since_last_boot(), reader.describe()), ""
    except (LogReadError, OSError) as err:
        return None, str(err)


@pytest.fixture(scope="session")
def ml4_accuracy(pytestconfig: pytest.Config, ml4_target: Target, ml4_endpoint: Endpoint, http_client: Any,
                 ml4_run_dir: Path, request: pytest.FixtureRequest) -> AccuracyRun:
    from pytest_ml4.plugin.perf import progress_writer
    from pytest_ml4.plugin.state import get_state
    from pytest_ml4.runtime.installed import ToolMissing

    declared = get_state(pytestconfig).declared_target or ml4_target
    try:
        return run_accuracy(pytestconfig, ml4_target, declared, ml4_endpoint, http_client, ml4_run_dir,
                            progress_writer(pytestconfig), lambda: request.getfixturevalue("ml4_logs"))
    except ToolMissing as e:
        pytest.fail(str(e), pytrace=False)
