"""A dead endpoint ends the gate: once a check finds the endpoint stalled or dead, no other request is sent.

Each request already ends in bounded time (:mod:`pytest_ml4.client.transport`), but one after another a dozen checks against a
stalled deployment would each wait their own deadline. :class:`EndpointHealth` is the run's breaker, fed by the guarded
transports (and, for requests made without them, by whoever sees the error): the first failure that says the
endpoint is gone *trips* it, and from then on

* a guarded client refuses to send (:class:`EndpointDown`, one line naming the first failure);
* whoever runs the checks reports the ones not yet started as not judged, naming the check that tripped it, the URL
  and what happened (the plugin does this; the tripping check keeps its own failure).

What trips it (:func:`endpoint_gone`): a deadline passed with nothing arriving (no connection, no response headers,
no progress in a stream: :attr:`pytest_ml4.client.transport.DeadlineExceeded.stalled`), or a refused connection after the
endpoint had answered. What does not: an answer that is wrong, an HTTP error, and the *overall* deadline of an
answer whose bytes kept arriving (slow but alive). A non-streamed answer sends nothing until it is done, so its
first-byte deadline is its overall one (generous: ten times the target's typical inter-token latency): passing it
with nothing arriving is a stall.

The state is one small file in the run folder (``.endpoint-breaker.json``, written once, atomically: the first trip
wins), so every process of the run (pytest-xdist workers) sees it. A deliberate outage (a restart check taking the
engine away) runs inside :meth:`EndpointHealth.paused`: nothing it sees trips the breaker. Works without pytest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from pytest_ml4.client.transport import DeadlineExceeded, EndpointMisbehaved
from pytest_ml4.client.urls import display_url

STORE_NAME = ".endpoint-breaker.json"
#: How much of the first failure a not-judged reason quotes (the whole line is the tripping check's failure).
WHAT_CHARS = 400


@dataclass(frozen=True)
class Trip:
    """The first failure that judged the endpoint gone: the check that met it, the URL, what happened."""

    check: str
    url: str
    state: str  # "stalled" | "dead"
    what: str

    def describe(self) -> str:
        what = self.what.removeprefix(f"{self.url}: ")  # the guard's lines start with the URL already
        what = what if len(what) <= WHAT_CHARS else what[:WHAT_CHARS] + " ..."
        return f"endpoint {self.url} judged {self.state} by {self.check}: {what}"

    def not_sent(self) -> str:
        """The reason of a check not sent (it applies; it can be judged once the endpoint answers again)."""
        return f"not sent: {self.describe()} (run the checks again once the endpoint answers)"


class EndpointDown(httpx.TransportError, EndpointMisbehaved):
    """A request the breaker did not send: the endpoint was already judged stalled or dead."""

    def __init__(self, trip: Trip) -> None:
        super().__init__(trip.not_sent())
        self.trip = trip


def _chain(err: BaseException) -> Iterator[BaseException]:
    """The error and what caused it (the openai SDK wraps httpx's errors)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def endpoint_gone(err: BaseException, answered: bool) -> str | None:
    """``"stalled"``, ``"dead"`` or None: whether this error says the endpoint (not one request) is gone."""
    for e in _chain(err):
        if isinstance(e, EndpointDown):
            return None  # already counted: the trip this refusal names
        if isinstance(e, DeadlineExceeded):
            return "stalled" if e.stalled else None
        if isinstance(e, (httpx.ConnectTimeout, httpx.ReadTimeout)):  # a client outside the guard
            return "stalled"
        if isinstance(e, httpx.ConnectError) and answered:
            return "dead"  # refused (or the name gone) after it had answered: not a typo in the URL
    return None


def _url_of(err: BaseException) -> str | None:
    for e in _chain(err):
        request = getattr(e, "_request", None)  # httpx.RequestError.request raises when none was attached
        if isinstance(request, httpx.Request):
            return display_url(str(request.url))
    return None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or "no detail"
    return text if isinstance(err, EndpointMisbehaved) else f"{type(err).__name__}: {text}"


class EndpointHealth:
    """The run's breaker (see the module doc). ``store``: the shared file (None keeps it in this process only)."""

    def __init__(self, store: Path | None = None, *, answered: bool = False) -> None:
        self.store = store
        #: Whether the endpoint has answered in this run (a refused connection before that is not a death).
        self.answered = answered
        #: The check now running in this process (named in a trip); set by whoever runs the checks.
        self.check = "a request"
        self._trip: Trip | None = None
        self._paused = 0
        self._refused: dict[str, int] = {}

    @classmethod
    def in_folder(cls, folder: Path, *, answered: bool = False) -> EndpointHealth:
        return cls(Path(folder) / STORE_NAME, answered=answered)

    # -- what the clients report
    def saw_answer(self) -> None:
        self.answered = True

    def observe(self, err: BaseException, url: str | None = None) -> Trip | None:
        """Record ``err`` if it says the endpoint is gone (first trip wins); the trip in force, if any."""
        state = None if self._paused else endpoint_gone(err, self.answered)
        if state is not None and self.trip() is None:
            self._record(Trip(self.check, url or _url_of(err) or "(URL not known)", state, _one_line(err)))
        return self.trip()

    def before_request(self, url: str) -> None:
        """Raise :class:`EndpointDown` instead of sending, once tripped (not during a deliberate outage)."""
        trip = None if self._paused else self.trip()
        if trip is not None:
            self._refused[self.check] = self._refused.get(self.check, 0) + 1
            raise EndpointDown(trip)

    # -- what the runner asks
    def trip(self) -> Trip | None:
        """The first failure that judged the endpoint gone, in this process or another sharing the store."""
        if self._trip is None and self.store is not None and self.store.is_file():
            try:
                self._trip = Trip(**json.loads(self.store.read_text(encoding="utf-8")))
            except (ValueError, TypeError):
                return None  # being written by another process: the next look sees it whole
        return self._trip

    def refused(self, check: str) -> int:
        """How many requests of ``check`` were not sent."""
        return self._refused.get(check, 0)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """A deliberate outage (a restart): what fails meanwhile trips nothing, nothing is refused."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def _record(self, trip: Trip) -> None:
        if self.store is None:
            self._trip = trip
            return
        self.store.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.store.with_name(f"{self.store.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(trip)), encoding="utf-8")
        try:
            os.link(tmp, self.store)  # atomic, and fails when another process tripped it first
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        self._trip = None
        self.trip()
