"""The simulator's ``/metrics``: vLLM 0.33's Prometheus series, driven by the engine loop.

The metric catalogue (names, types, HELP texts, label sets, histogram buckets) is read from the reference
exposition ``pytest_ml4/data/vllm/metrics-0.33.txt`` (vllm-0.33-transcripts), so the simulator exposes exactly the
families real 0.33 exposes.  Values come from real traffic.  Rendering goes through ``prometheus_client`` in
single-process mode, which also yields the ``*_created`` gauges and the python/process collectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from pytest_ml4.locations import data_file
from pytest_ml4.target.model import Target

REFERENCE_METRICS = data_file("vllm", "metrics-0.33.txt")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BASE_LABELS = ("model_name", "engine")
# Histograms whose buckets are vLLM's build_1_2_5_buckets(max_model_len) (the reference used 131072).
_TOKEN_HISTOGRAMS = {"vllm:request_prompt_tokens", "vllm:request_generation_tokens",
                     "vllm:request_max_num_generation_tokens", "vllm:request_params_max_tokens",
                     "vllm:request_prefill_kv_computed_tokens"}


@dataclass
class _Family:
    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    children: list[dict[str, str]]
    buckets: tuple[float, ...] = ()


#: The real vLLM 0.32 exposition (shared/reference/real-vllm-0.32-cpu-transcripts/get_metrics.txt): the source of
#: the families a version adds (``metrics_families_extra`` in pytest_ml4/data/vllm/versions.yaml).
EXTRA_METRICS = data_file("vllm", "metrics-0.32.txt")


def _catalogue(path: Path, only: tuple[str, ...] | None = None) -> list[_Family]:
    """The ``vllm:*`` families of ``path``, or (``only``) exactly the named families of any prefix."""
    fams: list[_Family] = []
    for fam in text_string_to_metric_families(path.read_text()):
        if fam.name.endswith("_created") or fam.name == "vllm:cache_config_info":
            continue
        if (fam.name not in only) if only is not None else not fam.name.startswith("vllm:"):
            continue
        labels: list[str] = []
        children: list[dict[str, str]] = []
        buckets: list[float] = []
        for s in fam.samples:
            extra = {k: v for k, v in s.labels.items() if k not in _BASE_LABELS and k != "le"}
            for k in s.labels:
                if k != "le" and k not in labels:
                    labels.append(k)
            if extra and extra not in children:
                children.append(extra)
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf":
                b = float(s.labels["le"])
                if b not in buckets:
                    buckets.append(b)
        fams.append(_Family(fam.name, fam.type, fam.documentation, tuple(labels), children, tuple(buckets)))
    return fams


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[int] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > max_value:
                return out
            out.append(v)
        exp += 1


@lru_cache(maxsize=4)
def _reference_cache_config(path: Path) -> tuple[str, tuple[tuple[str, str], ...]]:
    """HELP text and label set of ``vllm:cache_config_info`` in the reference exposition (parsed once per file)."""
    for fam in text_string_to_metric_families(path.read_text()):
        if fam.name == "vllm:cache_config_info":
            return fam.documentation, tuple(fam.samples[0].labels.items())
    raise ValueError(f"{path} has no vllm:cache_config_info")


def cache_config_labels(target: Target, num_gpu_blocks: int,
                        catalogue: Path = REFERENCE_METRICS) -> dict[str, str]:
    """``vllm:cache_config_info`` labels: 0.33's CacheConfig field set as in the reference (vllm.md §8), with
    the values the target decides; the rest keep the reference's (default) values."""
    labels = dict(_reference_cache_config(catalogue)[1])
    eng = target.engine
    labels.pop("engine", None)
    labels.update({"block_size": str(eng.block_size), "cache_dtype": eng.kv_cache_dtype,
                   "gpu_memory_utilization": str(eng.gpu_memory_utilization), "num_gpu_blocks": str(num_gpu_blocks),
                   "kv_offloading_size": str(eng.kv_offloading_size_gib) if eng.kv_offloading_size_gib else "None"})
    return labels


class SimMetrics:
    """All ``vllm:*`` series of one simulated engine (engine label ``"0"``)."""

    def __init__(self, target: Target, model_name: str, num_gpu_blocks: int, engine: str = "0",
                 catalogue: Path = REFERENCE_METRICS, extra_families: tuple[str, ...] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        for c in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
            try:
                self.registry.register(c)
            except ValueError:
                pass
        self.base = {"model_name": model_name, "engine": engine}
        spec = target.engine.speculative
        self.num_spec = spec.num_speculative_tokens if spec else 0
        self._m: dict[str, Any] = {}
        for fam in _catalogue(catalogue):
            if fam.name.startswith("vllm:spec_decode") and not self.num_spec:
                continue
            self._m[fam.name] = self._make(fam, target)
        for fam in _catalogue(EXTRA_METRICS, extra_families) if extra_families else ():
            # Per-handler HTTP families start without children, as the instrumentator's do.
            children = [] if fam.name.startswith("http_") else fam.children
            self._m[fam.name] = self._make(_Family(fam.name, fam.kind, fam.help, fam.labels, children,
                                                   fam.buckets), target, bare=not fam.name.startswith("http_"))
        help_text, _ = _reference_cache_config(catalogue)
        labels = cache_config_labels(target, num_gpu_blocks, catalogue)
        info = Gauge("vllm:cache_config_info", help_text, labelnames=[*labels, "engine"], registry=self.registry)
        info.labels(**labels, engine=engine).set(1)
        self.gauge("vllm:engine_sleep_state", 1, sleep_state="awake")

    def _make(self, fam: _Family, target: Target, bare: bool = True) -> Any:
        name = fam.name
        kw: dict[str, Any] = {"labelnames": list(fam.labels), "registry": self.registry}
        if fam.kind == "counter":
            metric: Any = Counter(name, fam.help, **kw)
        elif fam.kind == "histogram":
            buckets = (build_1_2_5_buckets(target.engine.max_model_len) if name in _TOKEN_HISTOGRAMS
                       else list(fam.buckets))
            metric = Histogram(name, fam.help, buckets=buckets, **kw)
        elif fam.kind == "summary":
            metric = Summary(name, fam.help, **kw)
        else:
            metric = Gauge(name, fam.help, **kw)
        children = fam.children
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            children = [{"position": str(i)} for i in range(self.num_spec)]
        if not children and bare:
            metric.labels(**self._labels(fam, {}))
        for extra in children:
            metric.labels(**self._labels(fam, extra))
        return metric

    def _labels(self, fam: _Family, extra: dict[str, str]) -> dict[str, str]:
        return {k: (self.base[k] if k in self.base else extra.get(k, "")) for k in fam.labels}

    def _child(self, name: str, **extra: str) -> Any:
        m = self._m[name]
        if not m._labelnames:
            return m  # an unlabelled family is its own child
        return m.labels(**{k: self.base.get(k, extra.get(k, "")) for k in m._labelnames})

    # -- update helpers used by the engine loop
    def inc(self, name: str, amount: float = 1.0, **extra: str) -> None:
        if name in self._m and amount:
            self._child(name, **extra).inc(amount)

    def gauge(self, name: str, value: float, **extra: str) -> None:
        if name in self._m:
            self._child(name, **extra).set(value)

    def observe(self, name: str, value: float, **extra: str) -> None:
        if name in self._m:
            self._child(name, **extra).observe(value)

    def http_request(self, handler: str, method: str, status: int, size_in: int, size_out: int,
                     seconds: float) -> None:
        """The prometheus-fastapi-instrumentator series of one request (present from vLLM 0.32's table on)."""
        if "http_requests" not in self._m:
            return
        self.inc("http_requests", handler=handler, method=method, status=f"{status // 100}xx")
        self.observe("http_request_size_bytes", size_in, handler=handler)
        self.observe("http_response_size_bytes", size_out, handler=handler)
        self.observe("http_request_duration_highr_seconds", seconds)
        self.observe("http_request_duration_seconds", seconds, handler=handler, method=method)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    @property
    def names(self) -> list[str]:
        return list(self._m)
