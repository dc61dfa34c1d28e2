"""Prometheus ``/metrics`` scraper for vLLM (``vllm:*``) and Dynamo (``dynamo_*``) endpoints.

Parses the text exposition with ``prometheus_client.parser.text_string_to_metric_families`` (reference
``vllm.md`` §8 and ``vllm-0.33-transcripts/metrics.txt``) into a :class:`MetricsSnapshot` that answers the
questions suites ask: a gauge's value for some labels, a counter's sum over engines, a histogram quantile,
and what changed between two scrapes::

    before = scrape("http://127.0.0.1:8000/metrics")
    ... run requests ...
    after = scrape("http://127.0.0.1:8000/metrics")
    diff(before, after).sum(stack_for(target).engine_metric("generation_tokens"))

Sample names are the exposed ones (counters with ``_total``; histograms as ``_bucket``/``_sum``/``_count``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pytest_ml4.client.endpoint import quote_body
from pytest_ml4.client.urls import display_url
from pytest_ml4.stacks import token_counters


class MetricsError(RuntimeError):
    """The metrics endpoint could not be read or did not answer Prometheus text."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float

    def matches(self, labels: dict[str, str]) -> bool:
        return all(self.labels.get(k) == str(v) for k, v in labels.items())


@dataclass
class MetricsSnapshot:
    """All samples of one scrape, indexed by sample name; ``types`` maps family name -> Prometheus type."""

    by_name: dict[str, list[Sample]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    text: str = ""

    def names(self) -> list[str]:
        return sorted(self.by_name)

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def samples(self, name: str, **labels: str) -> list[Sample]:
        """Samples of one exposed name whose labels include ``labels`` (empty list when absent)."""
        return [s for s in self.by_name.get(name, []) if s.matches(labels)]

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the single sample matching ``labels``; None if absent; error if ambiguous."""
        found = self.samples(name, **labels)
        if not found:
            return None
        if len(found) > 1:
            sets = [s.labels for s in found[:4]]
            raise MetricsError(f"{name} with {labels} matches {len(found)} samples (e.g. {sets}); add labels")
        return found[0].value

    def sum(self, name: str, **labels: str) -> float:
        """Sum over all matching samples (e.g. a counter over engines); 0.0 when absent."""
        return float(sum(s.value for s in self.samples(name, **labels)))

    def label_values(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.by_name.get(name, []) if label in s.labels}

    def buckets(self, name: str, **labels: str) -> list[tuple[float, float]]:
        """Cumulative ``(le, count)`` pairs of a histogram, summed over series matching ``labels``."""
        acc: dict[float, float] = {}
        for s in self.samples(f"{name}_bucket", **labels):
            le = float(s.labels["le"])
            acc[le] = acc.get(le, 0.0) + s.value
        return sorted(acc.items())

    def histogram_quantile(self, name: str, q: float, **labels: str) -> float | None:
        """PromQL-style ``histogram_quantile`` (linear interpolation inside the bucket); None when empty."""
        return quantile_from_buckets(self.buckets(name, **labels), q)

    def histogram_mean(self, name: str, **labels: str) -> float | None:
        count = self.sum(f"{name}_count", **labels)
        return self.sum(f"{name}_sum", **labels) / count if count else None


def quantile_from_buckets(buckets: list[tuple[float, float]], q: float) -> float | None:
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                # Like Prometheus: a quantile in the +Inf bucket is the highest finite bound.
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return buckets[-1][0]


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a snapshot; :class:`MetricsError` quoting the text if it is not."""
    snap = MetricsSnapshot(text=text)
    try:
        for family in text_string_to_metric_families(text):
            snap.types[family.name] = family.type
            for s in family.samples:
                snap.by_name.setdefault(s.name, []).append(Sample(s.name, dict(s.labels), float(s.value)))
    except ValueError as err:
        raise MetricsError(f"not Prometheus text ({err}): {quote_body(text)}") from None
    return snap


def scrape(url: str, http: httpx.Client | None = None, timeout: float = 10.0) -> MetricsSnapshot:
    """GET ``url`` and parse it. ``http`` may be a client with auth (a gateway in front of /metrics)."""
    try:
        resp = http.get(url) if http is not None else httpx.get(url, timeout=timeout)
    except httpx.HTTPError as err:
        raise MetricsError(f"cannot scrape {display_url(url)}: {type(err).__name__}: {err}") from None
    if resp.status_code != 200:
        raise MetricsError(f"scraping {display_url(url)} gave HTTP {resp.status_code}: {quote_body(resp.text)}")
    return parse_metrics(resp.text)



def generated_tokens(url: str | None, timeout: float = 5.0, counter: str | None = None) -> float | None:
    """Output tokens the engine (or Dynamo frontend) at ``url`` has generated so far; None when there is no URL,
    it cannot be read, or it exposes no stack's counter (or not ``counter``, when one is named: the serving stack's
    ``token_counter``)."""
    if not url:
        return None
    try:
        snap = scrape(url, timeout=timeout)
    except MetricsError:
        return None
    names = (counter,) if counter else token_counters()
    return next((snap.sum(n) for n in names if n in snap), None)


_COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")


def diff(before: MetricsSnapshot, after: MetricsSnapshot, names: Iterable[str] | None = None) -> MetricsSnapshot:
    """Counter-like samples (``*_total``, histogram ``_count``/``_sum``/``_bucket``) as ``after - before``.

    Series that only exist in ``after`` count from zero. A negative difference means the counter was reset
    (an engine restart); the after value is then taken, as PromQL's ``increase`` does.
    """
    wanted = set(names) if names is not None else None
    out = MetricsSnapshot(types=dict(after.types))
    for name, samples in after.by_name.items():
        if wanted is not None and name not in wanted:
            continue
        if not name.endswith(_COUNTER_SUFFIXES):
            continue
        old = {_key(s.labels): s.value for s in before.by_name.get(name, [])}
        for s in samples:
            delta = s.value - old.get(_key(s.labels), 0.0)
            out.by_name.setdefault(name, []).append(Sample(name, s.labels, s.value if delta < 0 else delta))
    return out


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))
