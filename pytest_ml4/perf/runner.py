"""Run ``aiperf profile`` as a subprocess and judge the run from its JSON export (aiperf.md §3-§5, §9).

* The seed's flags (seed 000 "Measurement procedure"): ``--endpoint-type chat --streaming --tokenizer builtin
  --use-server-token-count --extra-inputs min_tokens:N --prompt-input-tokens-mean --prompt-output-tokens-mean
  --concurrency --benchmark-duration --ui none``, one unique ``--output-artifact-dir`` per run.
* Offline: ``TIKTOKEN_CACHE_DIR`` seeded by the install step, the Hugging Face offline variables,
  ``--no-gpu-telemetry``, and an explicit ``--server-metrics URL`` (auto-discovery appends ``/metrics`` to
  ``--url``, the wrong path for vLLM and Dynamo) or ``--no-server-metrics``.
* CPU busy-loop workaround: ``--request-rate 1000 --arrival-pattern constant`` beside ``--concurrency`` (§4.1).
* Grace period no shorter than the expected p99 request latency (§4.2): requests still running after it are
  silently dropped; the runner also reads ``cancelled=N`` from aiperf's log and reports it.
* The API key never goes on argv (visible in ``ps``): aiperf reads a YAML config (``-f``) whose
  ``endpoint.api_key`` is ``${ML4_AIPERF_API_KEY}``, substituted from the child's environment by aiperf itself;
  the key is not written to disk and aiperf redacts it in every export. The YAML mirrors the run so the CLI flags
  (which override it) and the file agree.
* Pass/fail comes from ``profile_export_aiperf.json`` (``is_complete``, ``was_cancelled``, missing keys), never
  from the exit code alone (a run with 21 % errors exits 0; a cancelled one too). Error rates are gated by
  :mod:`pytest_ml4.perf.gates`.
* On timeout aiperf gets SIGINT first (it writes a partial summary) and SIGKILL later (§5).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from pytest_ml4.checks.codes import fail, fails_with
from pytest_ml4.datafile import load_jsonl
from pytest_ml4.perf.export import LOG_FILE, SUMMARY_FILE, ExportError, ProfileExport
from pytest_ml4.runtime import installed as tools
from pytest_ml4.runtime import processes

#: Environment variable the child aiperf reads the API key from (through the YAML ``${...}`` substitution).
API_KEY_ENV = "ML4_AIPERF_API_KEY"
#: Keys the gates read; a run whose summary lacks one cannot be judged (aiperf omits metrics it cannot compute).
REQUIRED_KEYS = ("request_count", "request_error_rate", "output_token_throughput", "output_token_throughput_per_user",
                 "time_to_first_token", "inter_token_latency", "output_sequence_length", "effective_decode_concurrency")
#: Startup to first request is 5.6-6.7 s on 2 cores, exit ~1.5 s after the last response (aiperf.md §7).
STARTUP_ALLOWANCE_S = 60.0
SIGINT_WAIT_S = 20.0
DEFAULT_GRACE_S = 30.0  # aiperf's own default (§4.2)

_PHASE_STARTED = re.compile(r"Phase (\w+) \((\w+)\) started")
_PHASE_SENT = re.compile(r"Phase (\w+) \((\w+)\) sending complete \| sent=(\d+), completed=(\d+), in_flight=(\d+)")
_PHASE_DONE = re.compile(r"Phase (\w+) \((\w+)\) complete \| completed=(\d+), cancelled=(\d+), errors=(\d+)")


class AiperfError(RuntimeError):
    """aiperf could not be started (not installed, bad arguments)."""


@dataclass(frozen=True)
class AiperfSpec:
    """One aiperf run. Holds no secret: the API key is passed to :func:`run_aiperf` separately."""

    model: str
    url: str                                  # the OpenAI base URL, ``http://host:port/v1``
    concurrency: int
    isl: int | None = 512
    osl: int | None = 4096
    duration_s: float | None = 300.0
    request_count: int | None = None
    grace_s: float | None = None              # None: DEFAULT_GRACE_S
    min_tokens: int | None = None             # --extra-inputs min_tokens:N (fixed OSL); None: no min_tokens
    extra_inputs: Mapping[str, Any] = field(default_factory=dict)
    trace_file: Path | None = None            # mooncake_trace replay instead of synthetic prompts
    warmup_requests: int = 0
    warmup_concurrency: int | None = None
    server_metrics_url: str | None = None     # ``http://host:port/metrics``; None: --no-server-metrics
    #: The engines' own /metrics besides ``server_metrics_url`` (Dynamo workers: the frontend has no vllm:* gauge);
    #: scraped too, with aiperf's per-scrape export so their gauges can be summed (figures.engine_running).
    engine_metrics_urls: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    rate_workaround: bool = True              # --request-rate 1000 --arrival-pattern constant (§4.1)
    # None: aiperf draws fresh prompts each run. A fixed seed repeats the same prompts in every run, and the
    # engine's prefix cache then serves later points' prefills from cache (TTFT far too low).
    random_seed: int | None = None
    request_timeout_s: float | None = None
    extra_args: Sequence[str] = ()
    aiperf_env: Mapping[str, str] = field(default_factory=dict)  # AIPERF_* switches (no secrets)
    # Open loop (goodput, capacity): requests arrive at this mean rate, Poisson; concurrency is then only a safety
    # cap on requests in flight, set far above what the rate needs so it never shapes the arrivals.
    request_rate: float | None = None
    goodput: str | None = None                # aiperf --goodput "tag:threshold ..." (display units)
    turns: int = 1                            # multi-turn conversations of exactly this many turns
    conversations: int | None = None          # --conversation-num (with turns > 1)
    system_prompt_tokens: int = 0             # --shared-system-prompt-length: one system prompt for every session

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.request_rate is not None and self.request_rate <= 0:
            raise ValueError("request_rate must be > 0")
        if self.turns > 1 and not self.conversations:
            raise ValueError("multi-turn runs need conversations (--conversation-num)")
        if self.duration_s is None and self.request_count is None and self.trace_file is None:
            raise ValueError("give a stop condition: duration_s, request_count or trace_file")
        if "ignore_eos" in self.extra_inputs and self.min_tokens is not None:
            raise ValueError("min_tokens and ignore_eos together: fixed-OSL runs use min_tokens only (seed 000)")

    @property
    def effective_request_count(self) -> int | None:
        """The request count; a trace replay sends each row once (dynamo.md §7: ``--num-requests <rows>``)."""
        if self.request_count is not None or self.trace_file is None or self.duration_s is not None:
            return self.request_count
        return trace_rows(self.trace_file)

    @property
    def grace_period_s(self) -> float:
        return DEFAULT_GRACE_S if self.grace_s is None else self.grace_s

    @property
    def all_extra_inputs(self) -> dict[str, Any]:
        out = dict(self.extra_inputs)
        if self.min_tokens is not None:
            out["min_tokens"] = self.min_tokens
        return out

    @property
    def uses_ignore_eos(self) -> bool:
        return bool(self.all_extra_inputs.get("ignore_eos"))


class TraceRow(BaseModel):
    """One request of a mooncake trace (aiperf's own input format, aiperf.md §4.4, handed to aiperf as it is).

    Only what this code reads is checked: ``timestamp`` (ms; the first row's decides the fixed schedule, the short
    profile scales it) and ``output_length`` (the short profile caps it). The other keys (``input_length``,
    ``hash_ids``, aiperf's optional ones) are aiperf's to judge and pass through untouched."""

    model_config = ConfigDict(extra="allow", frozen=True)

    timestamp: int | float | None = Field(default=None, ge=0)
    output_length: int = Field(ge=0)

    def wire(self) -> dict[str, Any]:
        """The row as aiperf reads it: every key it had, none added."""
        return self.model_dump(exclude_unset=True)


def load_trace(path: Path) -> list[TraceRow]:
    """A mooncake trace's rows; a row that is not JSON or breaks :class:`TraceRow` is a
    :class:`~pytest_ml4.datafile.DataFileError` naming the file, the line and the field."""
    return load_jsonl(path, TraceRow)


def trace_rows(path: Path) -> int:
    """Rows of a mooncake trace (one request each)."""
    return len(load_trace(path))


def trace_has_timestamps(path: Path) -> bool:
    """Whether the first row has a ``timestamp`` (then aiperf replays on a fixed schedule)."""
    rows = load_trace(path)
    return bool(rows) and rows[0].timestamp is not None


def expected_p99_latency_s(osl: int, tok_s_user: float, ttft_s: float, concurrency: int = 1,
                           max_num_seqs: int | None = None) -> float:
    """A p99 request latency estimate for sizing the grace period.

    A request decodes ``osl`` tokens at ``tok_s_user``; past ``max_num_seqs`` the engine queues it behind up to
    ``ceil(concurrency / max_num_seqs) - 1`` other full requests (seed 000: "Beyond c32 the extra requests only
    queue").
    """
    one = ttft_s + osl / max(tok_s_user, 1e-6)
    waves = 1 if not max_num_seqs else -(-concurrency // max_num_seqs)
    return one * waves


def build_argv(spec: AiperfSpec, out_dir: Path, config_file: Path | None = None,
               executable: Path | None = None) -> list[str]:
    """The aiperf command line for ``spec`` (no secret in it)."""
    exe = str(executable or tools.aiperf_executable())
    argv = [exe, "profile"]
    if config_file is not None:
        argv += ["-f", str(config_file)]
    argv += ["--model", spec.model, "--url", spec.url, "--endpoint-type", "chat", "--streaming",
             "--tokenizer", "builtin", "--use-server-token-count"]
    if spec.trace_file is not None:
        argv += ["--input-file", str(spec.trace_file), "--custom-dataset-type", "mooncake_trace",
                 "--prompt-input-tokens-block-size", "512"]
    else:
        if spec.isl is not None:
            argv += ["--prompt-input-tokens-mean", str(spec.isl)]
        if spec.osl is not None:
            argv += ["--prompt-output-tokens-mean", str(spec.osl)]
    for key, value in spec.all_extra_inputs.items():
        argv += ["--extra-inputs", f"{key}:{_flag_value(value)}"]
    argv += ["--concurrency", str(spec.concurrency)]
    if spec.request_rate is not None:
        argv += ["--request-rate", _num(spec.request_rate), "--arrival-pattern", "poisson"]
    elif spec.rate_workaround and spec.trace_file is None:
        argv += ["--request-rate", "1000", "--arrival-pattern", "constant"]
    argv += session_args(spec)
    if spec.goodput:
        argv += ["--goodput", spec.goodput]
    if spec.duration_s is not None:
        argv += ["--benchmark-duration", _num(spec.duration_s), "--benchmark-grace-period", _num(spec.grace_period_s)]
    if spec.effective_request_count is not None:
        argv += ["--request-count", str(spec.effective_request_count)]
    if spec.warmup_requests:
        argv += ["--warmup-request-count", str(spec.warmup_requests)]
        if spec.warmup_concurrency:
            argv += ["--warmup-concurrency", str(spec.warmup_concurrency)]
    if spec.random_seed is not None:
        argv += ["--random-seed", str(spec.random_seed)]
    if spec.request_timeout_s is not None:
        argv += ["--request-timeout-seconds", _num(spec.request_timeout_s)]
    for name, value in spec.headers.items():
        argv += ["--header", f"{name}:{value}"]
    argv += ["--output-artifact-dir", str(out_dir), "--ui", "none", "--no-gpu-telemetry"]
    argv += server_metrics_args(spec)
    argv += list(spec.extra_args)
    return argv


def server_metrics_args(spec: AiperfSpec) -> list[str]:
    """``--server-metrics`` with the endpoint and every engine, and the per-scrape jsonl: the saturation figure is read
    from it over the profiling phase alone (aiperf's own statistics of a series span the warm-up too)."""
    if not spec.server_metrics_url:
        return ["--no-server-metrics"]
    engines = [u for u in spec.engine_metrics_urls if u != spec.server_metrics_url]
    return ["--server-metrics", spec.server_metrics_url, *engines, "--server-metrics-formats", "json", "csv", "jsonl"]


def session_args(spec: AiperfSpec) -> list[str]:
    """aiperf's multi-turn and shared-prefix flags (aiperf.md §4.7); empty for single-turn runs."""
    out: list[str] = []
    if spec.turns > 1:
        out += ["--conversation-turn-mean", str(spec.turns), "--conversation-turn-stddev", "0",
                "--conversation-num", str(spec.conversations)]
    if spec.system_prompt_tokens:
        out += ["--shared-system-prompt-length", str(spec.system_prompt_tokens)]
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _flag_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def config_yaml(spec: AiperfSpec) -> str:
    """The base config aiperf reads with ``-f``; only there can the key be a ``${ENV}`` reference."""
    bench: dict[str, Any] = {
        "model": spec.model,
        "endpoint": {"url": spec.url, "type": "chat", "streaming": True, "api_key": "${" + API_KEY_ENV + "}"},
        "profiling": {"type": "concurrency", "concurrency": spec.concurrency},
    }
    if spec.trace_file is not None:
        bench["dataset"] = {"type": "file", "path": str(spec.trace_file), "format": "mooncake_trace"}
        if trace_has_timestamps(spec.trace_file):
            # What the CLI does on its own for a timestamped first row (aiperf.md §4.4); the YAML must say it.
            bench["profiling"]["type"] = "fixed_schedule"
    else:
        bench["dataset"] = {"type": "synthetic", "isl": {"mean": spec.isl or 512}, "osl": {"mean": spec.osl or 256}}
    if spec.duration_s is not None:
        bench["profiling"]["duration"] = spec.duration_s
    elif spec.effective_request_count is not None:
        bench["profiling"]["requests"] = spec.effective_request_count
    return yaml.safe_dump({"schemaVersion": "2.0", "benchmark": bench}, sort_keys=False)


def child_env(api_key: str | None, base: Mapping[str, str] | None = None,
              extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The aiperf process environment: offline, tokenizer cache, key in one variable (never on argv)."""
    env = dict(os.environ if base is None else base)
    for name in ("OPENAI_API_KEY", API_KEY_ENV):
        env.pop(name, None)  # an ambient key must never be sent to an endpoint configured without one
    env.update({
        "TIKTOKEN_CACHE_DIR": str(tools.tiktoken_cache_dir()),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    if api_key:
        env[API_KEY_ENV] = api_key
    return env


@dataclass
class PhaseState:
    """What aiperf's console said so far (parsed live for the progress display)."""

    phase: str | None = None
    started_at: float | None = None
    sent: int | None = None
    completed: int | None = None
    cancelled: int | None = None
    errors: int | None = None
    lines: int = 0

    def feed(self, line: str, now: float) -> None:
        self.lines += 1
        if m := _PHASE_STARTED.search(line):
            self.phase, self.started_at = m.group(1), now
            self.sent = self.completed = self.cancelled = self.errors = None
        elif m := _PHASE_SENT.search(line):
            self.sent, self.completed = int(m.group(3)), int(m.group(4))
        elif m := _PHASE_DONE.search(line):
            self.completed, self.cancelled, self.errors = int(m.group(3)), int(m.group(4)), int(m.group(5))


@dataclass
class RunResult:
    """Outcome of one aiperf run."""

    spec: AiperfSpec
    out_dir: Path
    argv: list[str]
    returncode: int | None
    wall_s: float
    export: ProfileExport | None
    problems: list[str]
    profiling_cancelled: int | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def log_path(self) -> Path:
        return self.out_dir / LOG_FILE

    @property
    def console_path(self) -> Path:
        return self.out_dir / "aiperf-console.log"

    @fails_with("perf.run_unusable", "an aiperf run is not usable: no export, cancelled, or requests dropped")
    def require(self) -> ProfileExport:
        if self.export is None or self.problems:
            fail("perf.run_unusable", self.describe())
        return self.export

    def describe(self) -> str:
        head = f"aiperf c={self.spec.concurrency} -> {self.out_dir}: "
        return head + ("ok" if self.ok else "; ".join(self.problems))


def judge(export: ProfileExport | None, returncode: int | None, required: Sequence[str] = REQUIRED_KEYS,
          profiling_cancelled: int | None = None) -> list[str]:
    """Problems that make a run unusable (empty when it can be gated). The exit code is context only."""
    if export is None:
        why = f"no {SUMMARY_FILE} written (exit code {returncode}): all requests failed or aiperf did not start"
        if profiling_cancelled:
            why += f"; {profiling_cancelled} request(s) were still running after the grace period and were dropped"
        return [why]
    problems = []
    if export.schema_version != "1.4":
        problems.append(f"export schema_version {export.schema_version!r}, this reader knows '1.4'")
    if export.was_cancelled:
        problems.append(f"run was cancelled: {export.incomplete_reason or 'no reason given'}")
    if export.is_complete is not True:
        problems.append(f"run is not complete (is_complete={export.is_complete})")
    missing = export.missing(required)
    if missing:
        problems.append(f"summary lacks {', '.join(missing)} (aiperf omits metrics it could not compute)")
    if profiling_cancelled:
        problems.append(f"{profiling_cancelled} request(s) were still running after the grace period and were "
                        f"dropped silently (aiperf.md §4.2): raise the grace period")
    return problems


Tick = Callable[[float, PhaseState], None]


def run_aiperf(spec: AiperfSpec, out_dir: str | Path, *, api_key: str | None = None,
               required: Sequence[str] = REQUIRED_KEYS, timeout_s: float | None = None,
               on_tick: Tick | None = None, tick_s: float = 2.0, executable: Path | None = None,
               env: Mapping[str, str] | None = None, state: PhaseState | None = None) -> RunResult:
    """Run aiperf once into ``out_dir`` (must not exist yet, or be empty) and judge it. ``state``: where its
    console's phases are followed (the functional probes beside the load watch it), a fresh one by default."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise AiperfError(f"artifact dir {out} is not empty: every run needs its own")
    out.mkdir(parents=True, exist_ok=True)
    cfg = None
    if api_key:
        cfg = out / "aiperf-config.yaml"
        cfg.write_text(config_yaml(spec))
    argv = build_argv(spec, out, cfg, executable)
    limit = timeout_s if timeout_s is not None else _default_timeout(spec)
    state = state if state is not None else PhaseState()
    console = out / "aiperf-console.log"
    t0 = time.monotonic()
    timed_out = False
    with console.open("w") as con:
        try:
            proc = processes.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=child_env(api_key, env, spec.aiperf_env), bufsize=1)
        except OSError as err:
            raise AiperfError(f"cannot start aiperf ({argv[0]}): {err}") from None
        reader = threading.Thread(target=_pump, args=(proc, con, state), daemon=True)
        reader.start()
        try:
            while proc.poll() is None:
                elapsed = time.monotonic() - t0
                if elapsed > limit:
                    timed_out = True
                    _stop(proc)
                    break
                if on_tick is not None:
                    on_tick(elapsed, state)
                proc.wait(timeout=None) if tick_s <= 0 else _sleep_or_exit(proc, tick_s)
        except KeyboardInterrupt:
            # Ctrl-C reaches pytest, not aiperf (its own session): stop it as a timeout does, so it writes its
            # partial export and does not outlive the run, and its console is complete before the file closes.
            _stop(proc)
            reader.join(timeout=10)
            raise
        reader.join(timeout=10)
    wall = time.monotonic() - t0
    export = _load_export(out)
    problems = judge(export, proc.returncode, required, state.cancelled if state.phase == "profiling" else None)
    if timed_out:
        problems.insert(0, f"aiperf ran past its {limit:.0f} s limit and was interrupted")
    return RunResult(spec=spec, out_dir=out, argv=argv, returncode=proc.returncode, wall_s=wall, export=export,
                     problems=problems, profiling_cancelled=state.cancelled, timed_out=timed_out)


def _default_timeout(spec: AiperfSpec) -> float:
    if spec.duration_s is not None:
        return STARTUP_ALLOWANCE_S + spec.duration_s + spec.grace_period_s + 30.0
    return STARTUP_ALLOWANCE_S + 3600.0


def _sleep_or_exit(proc: subprocess.Popen[str], seconds: float) -> None:
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


def _pump(proc: subprocess.Popen[str], sink: Any, state: PhaseState) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        sink.write(line)
        state.feed(line, time.monotonic())


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGINT first (aiperf then writes a partial summary), SIGKILL for the whole group later; what is left of
    the group once aiperf exited (its ``system_controller``) is ended too."""
    processes.stop(proc, SIGINT_WAIT_S, first_signal=signal.SIGINT, leader_only=True)


def _load_export(out: Path) -> ProfileExport | None:
    try:
        return ProfileExport.load(out / SUMMARY_FILE)
    except ExportError:
        return None


def redact(text: str, secrets: Sequence[str | None]) -> str:
    """``text`` with every non-empty secret replaced (for logs attached to reports)."""
    for s in secrets:
        if s:
            text = text.replace(s, "<redacted>")
    return text


def failure_log(result: RunResult, secrets: Sequence[str | None] = (), tail_lines: int = 200) -> str:
    """aiperf's own log (or its console output) tail, redacted, for attaching to a failed test."""
    for p in (result.log_path, result.console_path):
        if p.is_file():
            lines = p.read_text(errors="replace").splitlines()[-tail_lines:]
            return redact("\n".join(lines), secrets)
    return "(aiperf wrote no log)"
