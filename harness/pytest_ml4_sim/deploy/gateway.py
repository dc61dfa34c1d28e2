"""A faulty HTTP gateway in front of the real Dynamo frontend: the deployment's ingress / API gateway.

In a Kubernetes deployment the client does not reach ``dynamo.frontend`` directly: an ingress or API gateway
routes to it, and that layer is where several real defects live (a catch-all route, a gateway that answers
``/v1/models`` from its own route table, request "repair" plugins that drop what the backend would refuse). The
checks of the real frontend's own answers (unknown model, model list, invalid tool/reasoning fields,
``tool_choice: none``) can only be made to fail there: no worker-side fault reaches a request the frontend
refuses before any worker sees it. It is also where a deployment loses the routing evidence (``nvext``,
``x-dynamo-*`` headers: fault ``dynamo_evidence_stripped``), so the checks that read it must say "not judged".

This is a real reverse proxy (aiohttp): every request is forwarded to the frontend, answers are streamed back
chunk by chunk (SSE passes through unchanged); it alters only what a fault below says. :class:`DynamoDeployment
<pytest_ml4_sim.deploy.dynamo.DynamoDeployment>` starts it only when one of :data:`GATEWAY_FAULTS` is requested, so a
healthy run never goes through it. The fault names are the ones :mod:`pytest_ml4_sim.sim.server` acts on for the
vLLM stack: one name, one defect, whatever layer of the stack has it.

Run: ``python -m pytest_ml4_sim.deploy.gateway --upstream http://127.0.0.1:8000 --port 9000 --served-model ml4
--fault any_model``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from pytest_ml4_sim.sim.faults import ActiveFaults

#: The test of an over-long prompt sends about 7 MB for a 1M-token context: passed on to the frontend whole.
MAX_BODY_BYTES = 1024 * 1024 * 1024
#: The efforts an OpenAI-schema gateway knows (OpenAI's ``reasoning_effort`` enum); it drops any other value.
GATEWAY_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})
#: Not forwarded (RFC 9110 §7.6.1 connection-specific fields, plus what aiohttp recomputes).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length", "content-encoding"})
CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"

ChatRewrite = Callable[[dict[str, Any], str], None]
ModelsRewrite = Callable[[dict[str, Any], str], None]


def serve_any_model(body: dict[str, Any], served: str) -> None:
    """A catch-all route: whatever model the client names goes to the one served."""
    body["model"] = served


def repair_invalid(body: dict[str, Any], served: str) -> None:
    """A "repair" plugin (drop_params style): fields the frontend would refuse are dropped or defaulted."""
    if body.get("tools") == []:
        del body["tools"]
    names = {(t.get("function") or {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    choice = body.get("tool_choice")
    if choice is not None and not names:
        del body["tool_choice"]
    elif isinstance(choice, dict) and (choice.get("function") or {}).get("name") not in names:
        body["tool_choice"] = "auto"
    if "reasoning_effort" in body and body["reasoning_effort"] not in GATEWAY_EFFORTS:
        del body["reasoning_effort"]


def drop_tool_choice_none(body: dict[str, Any], served: str) -> None:
    """``tool_choice: none`` dropped as if it were the default: with tools present the frontend then uses auto."""
    if body.get("tool_choice") == "none":
        del body["tool_choice"]


def drop_parallel_tool_calls(body: dict[str, Any], served: str) -> None:
    """``parallel_tool_calls`` dropped (a gateway passing only the fields it knows): the frontend keeps every call."""
    body.pop("parallel_tool_calls", None)


def unlist_models(body: dict[str, Any], served: str) -> None:
    """``/v1/models`` answered from a route table that lacks the served name."""
    body["data"] = [card for card in body.get("data") or [] if card.get("id") != served]


def drop_nvext(answer: dict[str, Any]) -> None:
    """The answer without ``nvext`` (worker ids, timing): what a frontend with ``DYN_DISABLE_FRONTEND_NVEXT=1``
    (a documented hardening) or a response-filtering gateway sends."""
    answer.pop("nvext", None)


#: What an ingress behind single sign-on (a captive portal, an auth proxy set to answer 200) serves a probe that
#: carries no session: its sign-in page, whatever the service behind it is doing.
SIGN_IN_PAGE = ("<!DOCTYPE html><html><head><title>Sign in</title></head><body><form method=\"post\" "
                "action=\"/oauth2/start\"><button type=\"submit\">Sign in with SSO</button></form></body></html>")
HEALTH_PATH = "/health"


def dynamo_header(name: str) -> bool:
    """``x-dynamo-*`` request headers (session id, worker pins): an ingress that passes only standard headers."""
    return name.lower().startswith("x-dynamo-")


@dataclass(frozen=True)
class GatewayFault:
    """What one fault changes: the chat request body before forwarding, the ``/v1/models`` answer, the request
    headers it drops, or each JSON object of a chat answer (the whole body, or every SSE event)."""

    chat: ChatRewrite | None = None
    models: ModelsRewrite | None = None
    drops_header: Callable[[str], bool] | None = None
    answer: Callable[[dict[str, Any]], None] | None = None
    #: The page the gateway itself answers ``GET /health`` with, never asking the frontend (None: forwarded).
    health_page: str | None = None


#: The faults the gateway acts on (names from :mod:`pytest_ml4_sim.sim.faults`). No prompt-trimming fault: the real
#: frontend's over-long-prompt answer is owned by the token budget the workers register, and a worker without one
#: (``token_budget_missing``, recorded real behaviour) is the honest kill; a trimming gateway would be reported
#: under that check's "no token budget" deviation, a cause it does not have.
GATEWAY_FAULTS: Mapping[str, GatewayFault] = {
    "any_model": GatewayFault(chat=serve_any_model),
    "model_unlisted": GatewayFault(models=unlist_models),
    "accepts_invalid": GatewayFault(chat=repair_invalid),
    "tool_choice_none_ignored": GatewayFault(chat=drop_tool_choice_none),
    "parallel_tool_calls_ignored": GatewayFault(chat=drop_parallel_tool_calls),
    "dynamo_evidence_stripped": GatewayFault(drops_header=dynamo_header, answer=drop_nvext),
    "health_login_page": GatewayFault(health_page=SIGN_IN_PAGE),
}


def _gateway_specs(specs: Any) -> list[Any]:
    """The requested fault specs the gateway acts on."""
    return [s for s in ActiveFaults(specs).specs if s.name in GATEWAY_FAULTS]


def gateway_faults(specs: Any) -> list[str]:
    """The requested faults the gateway acts on, as ``NAME[=VALUE]`` strings (empty: no gateway needed)."""
    return [str(s) for s in _gateway_specs(specs)]


class Gateway:
    """The proxy: ``upstream`` is the frontend's root URL, ``served`` the target's served model name."""

    def __init__(self, upstream: str, served: str, faults: Any) -> None:
        self.upstream, self.served = upstream.rstrip("/"), served
        self.faults = [GATEWAY_FAULTS[s.name] for s in _gateway_specs(faults)]
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, app: web.Application) -> None:
        # No total timeout: a long stream is the frontend's to end. No proxy from the environment: loopback only.
        # Decompressed here (content-encoding and content-length are not passed on), so a rewrite sees JSON.
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def _close(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    def rewrite_request(self, path: str, raw: bytes) -> bytes:
        rewrites = [f.chat for f in self.faults if f.chat is not None]
        if path != CHAT_PATH or not rewrites:
            return raw
        try:
            body = json.loads(raw)
        except ValueError:
            return raw          # not JSON: the frontend answers it
        if not isinstance(body, dict):
            return raw
        for rewrite in rewrites:
            rewrite(body, self.served)
        return json.dumps(body).encode()

    def forwarded_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        drops = [f.drops_header for f in self.faults if f.drops_header is not None]
        return {k: v for k, v in headers.items()
                if k.lower() not in HOP_BY_HOP and not any(drop(k) for drop in drops)}

    def rewrite_answer(self, raw: bytes) -> bytes:
        """One JSON answer (a whole body, or an SSE ``data:`` line) with the answer rewrites applied; anything
        else (``[DONE]``, blank lines, a non-JSON body) passes unchanged."""
        rewrites = [f.answer for f in self.faults if f.answer is not None]
        prefix = b"data: " if raw.startswith(b"data: ") else b""
        payload = raw[len(prefix):]
        end = payload[len(payload.rstrip()):]
        try:
            obj = json.loads(payload)
        except ValueError:
            return raw
        if not isinstance(obj, dict):
            return raw
        for rewrite in rewrites:
            rewrite(obj)
        return prefix + json.dumps(obj).encode() + end

    def rewrite_models(self, raw: bytes) -> bytes:
        body = json.loads(raw)
        for f in self.faults:
            if f.models is not None:
                f.models(body, self.served)
        return json.dumps(body).encode()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        page = next((f.health_page for f in self.faults if f.health_page is not None), None)
        if page is not None and request.path == HEALTH_PATH:
            return web.Response(status=200, text=page, content_type="text/html")
        raw = self.rewrite_request(request.path, await request.read())
        headers = self.forwarded_headers(request.headers)
        url = self.upstream + request.path_qs
        try:
            upstream = await self.session.request(request.method, url, data=raw, headers=headers)
        except aiohttp.ClientError as err:
            return web.json_response({"message": f"gateway: upstream {url} unreachable: {err}",
                                      "type": "Bad Gateway", "code": 502}, status=502)
        async with upstream:
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            if request.path == MODELS_PATH and upstream.status == 200 and any(f.models for f in self.faults):
                return web.Response(status=200, body=self.rewrite_models(await upstream.read()), headers=out)
            rewrites_answer = request.path == CHAT_PATH and any(f.answer for f in self.faults)
            if rewrites_answer and "text/event-stream" not in upstream.headers.get("content-type", ""):
                body = self.rewrite_answer(await upstream.read())
                return web.Response(status=upstream.status, reason=upstream.reason, body=body, headers=out)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=out)
            await response.prepare(request)
            if rewrites_answer:
                # Line by line: an SSE event is one `data:` line, and a chunk boundary may fall inside it.
                async for line in upstream.content:
                    await response.write(self.rewrite_answer(line))
            else:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            await response.write_eof()
            return response


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--upstream", required=True, help="the frontend's root URL")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model", required=True)
    parser.add_argument("--fault", action="append", default=[], help="NAME[=VALUE], repeatable")
    args = parser.parse_args(argv)
    gateway = Gateway(args.upstream, args.served_model, args.fault)
    web.run_app(gateway.app(), host="127.0.0.1", port=args.port, print=None, handle_signals=True,
                shutdown_timeout=2.0)


if __name__ == "__main__":
    main()
