"""pytest glue for the perf concern: ``--perf-*`` options (``ml4`` group, with ini twins), the sweep fixtures and the
progress display. The core is :mod:`pytest_ml4.perf`.

Progress lines go through pytest's terminal reporter (quiet with ``-q``). Under pytest-xdist a worker cannot write
to the controller's terminal, so workers append to ``<run dir>/perf/progress.log`` and the controller tails that file
onto its terminal; the file also stays in the run folder as a record.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.perf.baseline import Baseline, BaselineError, parse_compare_fail
from pytest_ml4.perf.evaluate import (
    SweepOutputs,
    SweepVerdict,
    evaluate_sweep,
    write_interrupted_sweep,
    write_sweep_outputs,
)
from pytest_ml4.perf.kube import KubeLoad
from pytest_ml4.perf.sweep import (
    Client,
    PointResult,
    SweepInterrupted,
    SweepSettings,
    cached,
    run_sweep,
    settings_from_target,
)
from pytest_ml4.perf.workloads import (
    WorkloadRunner,
    decode_engine_urls,
    prompt_engine_urls,
)
from pytest_ml4.plugin.option_group import group as ml4_group
from pytest_ml4.plugin.option_group import opt
from pytest_ml4.plugin.record import recording
from pytest_ml4.runtime.installed import ToolMissing
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.baselines import (
    BaselineRefused,
    deployment_provenance,
    package_target,
    record_command,
    recording_path,
    usable_on,
)
from pytest_ml4.target.model import Target

PROGRESS_FILE = "perf/progress.log"


# ------------------------------------------------------------------------------------------------- options
def pytest_addoption(parser: pytest.Parser) -> None:
    group = ml4_group(parser)
    group.addoption("--perf-concurrencies", dest="ml4_perf_concurrencies", default=None, metavar="N,N,...",
                    help="concurrency points of the perf sweep (default: the target's perf.concurrencies) "
                         "(ini: ml4_perf_concurrencies)")
    group.addoption("--perf-duration", dest="ml4_perf_duration", type=float, default=None, metavar="S",
                    help="seconds per sweep point (default: the target's perf.duration_s) (ini: ml4_perf_duration)")
    group.addoption("--perf-osl", dest="ml4_perf_osl", type=int, default=None, metavar="N",
                    help="fixed output length (min_tokens = max tokens = N) (ini: ml4_perf_osl)")
    group.addoption("--perf-isl", dest="ml4_perf_isl", type=int, default=None, metavar="N",
                    help="synthetic prompt length (ini: ml4_perf_isl)")
    group.addoption("--perf-grace", dest="ml4_perf_grace", type=float, default=None, metavar="S",
                    help="aiperf grace period per point (default: sized from the expected p99 request latency)")
    group.addoption("--perf-short", dest="ml4_perf_short", action="store_true", default=None,
                    help="the short CI profile: ISL 128, OSL 256, 6 s per point, concurrencies 1, 4, cap, 2x cap "
                         "(explicit --perf-* values win) (ini: ml4_perf_short)")
    group.addoption("--perf-baseline", dest="ml4_perf_baseline", default=None, metavar="PATH",
                    help="stored baseline to compare against (default: the target's perf.baseline) "
                         "(ini: ml4_perf_baseline)")
    group.addoption("--perf-compare-fail", dest="ml4_perf_compare_fail", action="append", default=[],
                    metavar="FIGURE:N%",
                    help="fail when FIGURE regresses more than N%% against the baseline, e.g. itl_p50_ms:10%%; "
                         "repeatable or comma-separated (ini: ml4_perf_compare_fail)")
    group.addoption("--perf-extra-input", dest="ml4_perf_extra_input", action="append", default=[],
                    metavar="KEY:VALUE",
                    help="extra request field for the suite's aiperf runs (aiperf --extra-inputs); ignore_eos is "
                         "refused with the reason (seed 000)")
    group.addoption("--perf-save", dest="ml4_perf_save", default=None, metavar="PATH",
                    help="write this run's sweep as a baseline file")
    group.addoption("--perf-kube", dest="ml4_perf_kube", type=int, default=None, metavar="N",
                    help="run the goodput, capacity and sessions workloads as aiperf's Kubernetes JobSet with N "
                         "worker pods (aiperf kube generate --no-operator; submitted through --ml4-kube-host or "
                         "the kubeconfig; under --sim a fake API runs it as a local N-worker aiperf)")
    group.addoption("--perf-kube-namespace", dest="ml4_perf_kube_namespace", default=None, metavar="NS",
                    help="namespace of the --perf-kube JobSet (default: the target's control namespace)")
    group.addoption("--perf-kube-secret", dest="ml4_perf_kube_secret", default=None, metavar="SECRET/KEY",
                    help="Secret and key holding the endpoint's API key for the --perf-kube pods (the key itself "
                         "never goes into the manifests)")
    group.addoption("--perf-probe-share", dest="ml4_perf_probe_share", default=None, metavar="F",
                    help="functional probes sent beside every load phase, as a share of the phase's requests "
                         "(default: pytest_ml4/data/prompts/probes.yaml, 0.05; 0 turns them off) "
                         "(ini: ml4_perf_probe_share)")
    group.addoption("--ml4-soak", dest="ml4_soak", default=None, metavar="DURATION",
                    help="keep the functional probes going beside the chat workload at its production rate for "
                         "DURATION (30s, 15m, 2h) and report their violations over time, with a plot (nightly runs; "
                         "test_answers_stay_correct_over_the_soak) (ini: ml4_soak)")
    parser.addini("ml4_soak", "soak duration of the probes beside a production-rate load (30s, 15m, 2h)", default=None)
    parser.addini("ml4_perf_probe_share", "functional probes beside the load, share of its requests", default=None)
    parser.addini("ml4_perf_concurrencies", "perf sweep concurrencies, comma-separated", default=None)
    parser.addini("ml4_perf_duration", "seconds per perf sweep point", default=None)
    parser.addini("ml4_perf_osl", "perf sweep fixed output length", default=None)
    parser.addini("ml4_perf_isl", "perf sweep prompt length", default=None)
    parser.addini("ml4_perf_short", "use the short CI perf profile", type="bool", default=False)
    parser.addini("ml4_perf_baseline", "perf baseline file", default=None)
    parser.addini("ml4_perf_compare_fail", "FIGURE:N% regression limits, comma-separated", default=None)


def _concurrencies(raw: Any) -> list[int] | None:
    if raw is None:
        return None
    try:
        values = [int(x) for x in str(raw).replace(" ", "").split(",") if x]
    except ValueError:
        raise pytest.UsageError(f"--perf-concurrencies: expected N,N,... got {raw!r}") from None
    if not values or min(values) < 1:
        raise pytest.UsageError(f"--perf-concurrencies: expected positive integers, got {raw!r}")
    return values


def perf_settings(config: pytest.Config, target: Target) -> SweepSettings:
    def num(name: str, ini: str, kind: type) -> Any:
        v = opt(config, name, ini)
        return None if v is None else kind(v)

    return settings_from_target(
        target,
        concurrencies=_concurrencies(opt(config, "ml4_perf_concurrencies", "ml4_perf_concurrencies")),
        duration_s=num("ml4_perf_duration", "ml4_perf_duration", float),
        osl=num("ml4_perf_osl", "ml4_perf_osl", int),
        isl=num("ml4_perf_isl", "ml4_perf_isl", int),
        grace_s=config.getoption("ml4_perf_grace"),
        short=bool(opt(config, "ml4_perf_short", "ml4_perf_short")))


# ------------------------------------------------------------------------------------------------- progress
def _run_dir(config: pytest.Config) -> Path:
    from pytest_ml4.plugin.state import get_state

    return get_state(config).ensure_run_dir()


def progress_writer(config: pytest.Config, file: str = PROGRESS_FILE) -> Callable[[str], None]:
    """Where progress lines of a long step go (the sweep's; the restart suite's with its own ``file``): the
    progress file always, the terminal when this process owns it."""
    path = _run_dir(config) / file
    path.parent.mkdir(parents=True, exist_ok=True)
    is_worker = hasattr(config, "workerinput")
    reporter = None if is_worker else config.pluginmanager.get_plugin("terminalreporter")
    quiet = config.get_verbosity() < 0
    capman = config.pluginmanager.get_plugin("capturemanager")

    def write(line: str) -> None:
        with path.open("a") as fh:
            fh.write(line + "\n")
        if reporter is not None and not quiet:
            # fd-level capture is active inside fixtures and tests; the terminal must bypass it.
            with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
                reporter.ensure_newline()
                reporter.write_line(line)

    return write


class _Tail:
    """Controller side under xdist: copy new lines of the progress file onto the terminal."""

    def __init__(self, path: Path, reporter: Any, interval_s: float = 1.0) -> None:
        self.path, self.reporter, self.interval_s = path, reporter, interval_s
        self.offset = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ml4-perf-progress", daemon=True)

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            self.flush()

    def flush(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open() as fh:
            fh.seek(self.offset)
            chunk = fh.read()
            self.offset = fh.tell()
        for line in chunk.splitlines():
            self.reporter.ensure_newline()
            self.reporter.write_line(line)


_TAIL_KEY = pytest.StashKey[_Tail]()


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    from pytest_ml4.plugin.state import get_state

    state = get_state(config)
    xdist = bool(getattr(config.option, "numprocesses", None)) and config.pluginmanager.hasplugin("xdist")
    if hasattr(config, "workerinput") or not xdist or state.target is None or config.get_verbosity() < 0:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    tail = _Tail(_run_dir(config) / PROGRESS_FILE, reporter)
    path = tail.path
    tail.offset = path.stat().st_size if path.is_file() else 0
    config.stash[_TAIL_KEY] = tail
    tail.thread.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    tail = session.config.stash.get(_TAIL_KEY, None)
    if tail is not None:
        tail.stop_event.set()
        tail.thread.join(timeout=5)
        tail.flush()


# ------------------------------------------------------------------------------------------------- fixtures
@dataclass
class SweepOutcome:
    """What the perf suite's tests assert on."""

    settings: SweepSettings
    points: list[PointResult]
    verdict: SweepVerdict
    outputs: SweepOutputs
    baseline: Baseline | None
    secrets: list[str] = field(default_factory=list, repr=False)
    #: Why no baseline judges this sweep ("" when one does).
    baseline_missing: str = ""
    #: ``--ml4-record-baselines``: the baseline this sweep wrote (it compares with none).
    recorded: Path | None = None


@pytest.fixture(scope="session")
def ml4_perf_settings(pytestconfig: pytest.Config, ml4_target: Target) -> SweepSettings:
    return perf_settings(pytestconfig, ml4_target)


@dataclass(frozen=True)
class PerfBaselineChoice:
    """The perf baseline that may judge this run, or None and why (``missing``: the baseline check's not-judged
    reason)."""

    baseline: Baseline | None
    missing: str = ""


@pytest.fixture(scope="session")
def ml4_perf_baseline_choice(pytestconfig: pytest.Config, ml4_target: Target,
                             ml4_endpoint: Endpoint) -> PerfBaselineChoice:
    """``--perf-baseline`` or the target's ``perf.baseline``. A baseline without provenance is refused with one
    line; one the simulator made, on a live run: refused when the option named it, else no baseline (the target's
    file judges simulator runs, a live deployment needs its own recording)."""
    if recording(pytestconfig):   # this run sets the baseline: nothing to compare with
        return PerfBaselineChoice(None, "recording this deployment's baseline (--ml4-record-baselines)")
    return choose_perf_baseline(opt(pytestconfig, "ml4_perf_baseline", "ml4_perf_baseline"), ml4_target,
                                live=not ml4_endpoint.simulated)


@pytest.fixture(scope="session")
def ml4_perf_baseline(ml4_perf_baseline_choice: PerfBaselineChoice) -> Baseline | None:
    return ml4_perf_baseline_choice.baseline


def choose_perf_baseline(option: str | None, target: Target, *, live: bool) -> PerfBaselineChoice:
    record = record_command("perf", target)
    if option:
        given = Path(str(option))
        # A path the user typed is relative to the working directory; the target's is relative to the repository.
        return PerfBaselineChoice(load_perf_baseline(given if given.is_absolute() or given.exists()
                                                     else target.resolve(str(option)), live=live))
    # The target's perf.baseline, else what --ml4-record-baselines wrote into the team's baselines/ (a bundled
    # target names its own file or has none).
    path = target.resolve(target.perf.baseline) if target.perf.baseline else recording_path("perf", target)
    if not target.perf.baseline and (package_target(target) or not path.is_file()):
        return PerfBaselineChoice(None, f"no stored baseline for this target (perf.baseline) and none given with "
                                        f"--perf-baseline; record one with: {record}")
    baseline = load_perf_baseline(path, live=False)   # unreadable or without provenance: refused, one line
    if usable_on(baseline.provenance, path, live=live, explicit=False):
        return PerfBaselineChoice(baseline)
    return PerfBaselineChoice(None, f"the target's perf.baseline {path} was made by the simulator, not recorded on "
                                    f"this deployment; record one with: {record}")


def load_perf_baseline(path: Path, live: bool) -> Baseline:
    """The baseline file, refused with one line (UsageError) when unreadable, without provenance, or made by the
    simulator for a live run."""
    try:
        baseline = Baseline.load(path)
        usable_on(baseline.provenance, path, live=live, explicit=True)
    except BaselineRefused as err:
        raise pytest.UsageError(f"--perf-baseline: {err}") from None
    return baseline


@pytest.fixture(scope="session")
def ml4_perf_compare_fail(pytestconfig: pytest.Config) -> dict[str, float]:
    raw = pytestconfig.getoption("ml4_perf_compare_fail") or opt(pytestconfig, "ml4_perf_compare_fail",
                                                                  "ml4_perf_compare_fail")
    try:
        return parse_compare_fail(raw)
    except BaselineError as err:
        raise pytest.UsageError(str(err)) from None


def parse_extra_inputs(items: list[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition(":")
        if not sep or not key.strip():
            raise pytest.UsageError(f"--perf-extra-input: expected KEY:VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(raw)
    return out


@pytest.fixture(scope="session")
def ml4_perf_extra_inputs(pytestconfig: pytest.Config) -> dict[str, Any]:
    return parse_extra_inputs(pytestconfig.getoption("ml4_perf_extra_input") or [])


def probe_share(config: pytest.Config) -> float:
    """``--perf-probe-share`` (ini ``ml4_perf_probe_share``), else the data file's; one line naming the option when
    it is not a number in [0, 1)."""
    from pytest_ml4.perf.probes import probe_settings

    raw = opt(config, "ml4_perf_probe_share", "ml4_perf_probe_share")
    if raw is None:
        return probe_settings()[0]
    try:
        share = float(raw)
    except ValueError:
        share = -1.0
    if not 0.0 <= share < 1.0:
        raise pytest.UsageError(f"--perf-probe-share: expected a share of the load's requests in [0, 1) (0 turns "
                                f"the probes off), got {raw!r}")
    return share


def soak_duration(config: pytest.Config) -> float | None:
    """``--ml4-soak`` in seconds (ini ``ml4_soak``), None when not asked; one line naming the option when bad."""
    from pytest_ml4.perf.soak import parse_duration

    raw = opt(config, "ml4_soak", "ml4_soak")
    if raw is None:
        return None
    try:
        return parse_duration(raw)
    except ValueError as err:
        raise pytest.UsageError(f"--ml4-soak: {err}") from None


def pytest_configure(config: pytest.Config) -> None:
    soak_duration(config)   # a bad --ml4-soak stops the run before anything starts


@pytest.fixture(scope="session")
def ml4_perf_probes(pytestconfig: pytest.Config, ml4_target: Target, ml4_endpoint: Endpoint) -> Iterator[Any]:
    """The functional probes beside every load phase (:mod:`pytest_ml4.perf.probes`); None with a share of 0."""
    from pytest_ml4.evidence.recount import counter_for
    from pytest_ml4.perf.probes import Prober, probe_cycle, probe_settings

    share = probe_share(pytestconfig)
    if share == 0:
        yield None
        return
    counter = counter_for(ml4_target, ml4_endpoint)
    counter.count("warm up")   # the local tokenizer loads in seconds: not inside the first probe under load
    _, settle_s, stop_grace_s = probe_settings()
    prober = Prober(ml4_endpoint, probe_cycle(ml4_target, ml4_endpoint.model, counter), share,
                    settle_s=settle_s, stop_grace_s=stop_grace_s)
    yield prober
    prober.close()


@pytest.fixture(scope="session")
def ml4_perf_client(ml4_endpoint: Endpoint, ml4_perf_probes: Any) -> Client:
    return Client(model=ml4_endpoint.model, base_url=ml4_endpoint.base_url,
                  metrics_url=ml4_endpoint.effective_metrics_url, api_key=ml4_endpoint.api_key or None,
                  engine_metrics_urls=decode_engine_urls(dict(ml4_endpoint.worker_metrics_urls)),
                  probes=ml4_perf_probes)


@pytest.fixture(scope="session")
def ml4_perf_progress(pytestconfig: pytest.Config) -> Callable[[str], None]:
    return progress_writer(pytestconfig)


def _kube_secret(raw: str | None) -> tuple[str, str] | None:
    if raw is None:
        return None
    name, sep, key = raw.partition("/")
    if not sep or not name or not key:
        raise pytest.UsageError(f"--perf-kube-secret: expected SECRET/KEY, got {raw!r}")
    return name, key


@pytest.fixture(scope="session")
def ml4_perf_kube(pytestconfig: pytest.Config, ml4_target: Target, ml4_endpoint: Endpoint,
                  ml4_run_dir: Path) -> Iterator[KubeLoad | None]:
    """``--perf-kube N``: where the workloads' JobSets go. Under ``--sim`` the fake Kubernetes API runs each JobSet
    as one local aiperf with N workers against the simulator (the pods' run, on this host)."""
    pods = pytestconfig.getoption("ml4_perf_kube")
    if pods is None:
        yield None
        return
    if pods < 1:
        raise pytest.UsageError(f"--perf-kube: N must be at least 1, got {pods}")
    secret = _kube_secret(pytestconfig.getoption("ml4_perf_kube_secret"))
    if ml4_endpoint.api_key and secret is None and not ml4_endpoint.simulated:
        raise pytest.UsageError(f"--perf-kube: target {ml4_target.name} needs an API key; name the Secret holding "
                                f"it with --perf-kube-secret SECRET/KEY")
    from pytest_ml4.control.k8s_api import KubeConfigError, api_client, target_namespace

    namespace = pytestconfig.getoption("ml4_perf_kube_namespace")
    if ml4_endpoint.simulated:
        from pytest_ml4.plugin.embedded import fake_kube_api

        load = KubeLoad(None, namespace or "ml4-perf", pods, secret or ("ml4-sim", "api-key"))
        with fake_kube_api() as fake:
            fake.jobset_runner = lambda jobset, _maps: _local_pods(load, ml4_run_dir, ml4_endpoint.api_key)
            load.api = api_client(fake.url)
            yield load
        return
    try:
        namespace = namespace or target_namespace(ml4_target)
    except KubeConfigError as err:
        raise pytest.UsageError(f"--perf-kube: {err}; or give --perf-kube-namespace") from None
    yield KubeLoad(api_client(pytestconfig.getoption("ml4_kube_host")), namespace, pods, secret)


def _local_pods(load: KubeLoad, run_dir: Path, api_key: str | None) -> Path:
    """The JobSet's pods under ``--sim``: its run as one local aiperf with one worker per pod."""
    from pytest_ml4.perf.runner import run_aiperf

    assert load.current is not None
    spec = replace(load.current, extra_args=(*load.current.extra_args, "--workers-max", str(load.pods)))
    folder = run_dir / "perf" / "kube-pods" / f"run-{len(list((run_dir / 'perf').glob('kube-pods/run-*')))}"
    result = run_aiperf(spec, folder, api_key=api_key)
    if result.export is None:
        raise RuntimeError(result.describe())
    return folder


@pytest.fixture(scope="session")
def ml4_perf_workloads(ml4_target: Target, ml4_endpoint: Endpoint, ml4_run_dir: Path, ml4_perf_settings: SweepSettings,
                       ml4_perf_client: Client, ml4_perf_progress: Callable[[str], None],
                       ml4_perf_kube: KubeLoad | None) -> WorkloadRunner:
    """The goodput, capacity and sessions runs (Poisson arrivals), shared by the checks through the run folder."""
    engines = (prompt_engine_urls(dict(ml4_endpoint.worker_metrics_urls)) if stack_for(ml4_target).routes_workers
               else (ml4_endpoint.effective_metrics_url,))
    return WorkloadRunner(ml4_target, ml4_perf_client, ml4_run_dir / "perf" / "workloads", ml4_perf_settings.short,
                          ml4_perf_progress, tuple(engines), ml4_perf_kube)


@pytest.fixture(scope="session")
def ml4_perf_sweep(pytestconfig: pytest.Config, ml4_target: Target, ml4_endpoint: Endpoint, ml4_run_dir: Path,
                   ml4_perf_settings: SweepSettings, ml4_perf_baseline: Baseline | None,
                   ml4_perf_baseline_choice: PerfBaselineChoice, ml4_perf_compare_fail: dict[str, float], ml4_perf_client: Client,
                   ml4_perf_progress: Callable[[str], None],
                   ml4_perf_extra_inputs: dict[str, Any]) -> Iterator[SweepOutcome]:
    """Run the target's sweep once per run folder (xdist workers share it), judge it, write plots and summary."""
    from pytest_ml4.perf.methodology import (
        WHY_NOT_IGNORE_EOS,
        extra_inputs_ask_ignore_eos,
    )

    if extra_inputs_ask_ignore_eos(ml4_perf_extra_inputs):
        pytest.fail(f"--perf-extra-input asks for ignore_eos; the sweep refuses it: {WHY_NOT_IGNORE_EOS}")
    settings = replace(ml4_perf_settings, extra_inputs=tuple(sorted(ml4_perf_extra_inputs.items())))
    root = ml4_run_dir / "perf" / f"sweep-{settings.key}"
    try:
        points = cached(root / "points.json",
                        lambda: run_sweep(ml4_target, ml4_perf_client, settings, root, baseline=ml4_perf_baseline,
                                          write=ml4_perf_progress))
    except SweepInterrupted as stop:
        # Ctrl-C: the run folder keeps the finished points (summary.json reads them) and every export so far.
        write_interrupted_sweep(ml4_run_dir, ml4_target, settings, stop.points, bool(ml4_endpoint.simulated),
                                stop.concurrency)
        raise
    except ToolMissing as err:
        pytest.exit(f"ml4: {err}", returncode=pytest.ExitCode.USAGE_ERROR)
    verdict = evaluate_sweep(ml4_target, settings, points, ml4_perf_baseline, ml4_perf_compare_fail)
    outputs = write_sweep_outputs(ml4_run_dir, ml4_target, settings, points, verdict, ml4_perf_baseline,
                                  bool(ml4_endpoint.simulated), out_dir=root)
    save = pytestconfig.getoption("ml4_perf_save")
    recorded = None
    if recording(pytestconfig):
        recorded = save = save or recording_path("perf", ml4_target)
    if save:
        from pytest_ml4.perf.baseline import save_baseline
        from pytest_ml4.perf.evaluate import figures_of

        save_baseline(save, ml4_target.name, figures_of(points), settings.conditions(),
                      ml4_perf_baseline.tolerances if ml4_perf_baseline else {"tok_s_user": 0.1, "itl_p50_ms": 0.1},
                      {**deployment_provenance(ml4_target, ml4_endpoint.model, sys.argv,
                                               bool(ml4_endpoint.simulated), ml4_endpoint.base_url),
                       "source": f"pytest-ml4 perf sweep, run folder {ml4_run_dir.name}"})
    yield SweepOutcome(settings=settings, points=points, verdict=verdict, outputs=outputs,
                       baseline=ml4_perf_baseline, secrets=[ml4_endpoint.api_key] if ml4_endpoint.api_key else [],
                       baseline_missing=ml4_perf_baseline_choice.missing, recorded=recorded)
