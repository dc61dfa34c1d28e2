"""The deployment under test as one object: its target, its endpoint and the clients a check talks to it with.

The suites ask for this one bundle (the plugin's ``ml4`` fixture), as pytest-httpserver's tests ask for one
``httpserver``: a check reads ``ml4.target``, sends with ``ml4.http`` or ``ml4.openai``, and never assembles the
pieces itself. The clients are the session's (one connection pool for the run); what is costly or may be missing
(the token re-counter, the engine log) is built on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx
    import openai

    from pytest_ml4.client.endpoint import Endpoint
    from pytest_ml4.evidence.recount import TokenCounter
    from pytest_ml4.evidence.worker_engine import WorkerEngine
    from pytest_ml4.logs import LogReader
    from pytest_ml4.target.model import Target


@dataclass
class Deployment:
    """One deployment under test and its clients (the run's; closed by whoever made them)."""

    target: Target
    endpoint: Endpoint
    http: httpx.Client
    openai: openai.OpenAI
    run_dir: Path
    #: What real ``dynamo.vllm`` workers serve the run (``RealDynamoDeployment.info()``), else None.
    worker_engine: WorkerEngine | None = None
    _token_counter: Callable[[], TokenCounter] | None = field(default=None, repr=False)
    _logs: Callable[[], LogReader | None] = field(default=lambda: None, repr=False)
    #: Called with each client made here (the plugin records its exchanges for the report).
    _on_new_client: Callable[[Any], None] = field(default=lambda client: None, repr=False)

    @property
    def model(self) -> str:
        """The model name requests carry (the endpoint's served name)."""
        return self.endpoint.model

    def async_openai(self) -> openai.AsyncOpenAI:
        """A new async client: its connections belong to the event loop of the one check that makes it."""
        from pytest_ml4.client.endpoint import make_async_openai

        client = make_async_openai(self.endpoint)
        self._on_new_client(client)
        return client

    @cached_property
    def token_counter(self) -> TokenCounter:
        """The usage re-counter: the deployment's ``POST /tokenize`` where its stack has one, else local Tekken."""
        if self._token_counter is not None:
            return self._token_counter()
        from pytest_ml4.evidence.recount import counter_for

        return counter_for(self.target, self.endpoint)

    @cached_property
    def logs(self) -> LogReader | None:
        """The engine log where the run has one, else None (a live target with no log configured)."""
        return self._logs()
