"""A small deterministic OpenAI-compatible model server, for tests and demos.

It stands in for a real model only because none can run where this project is
developed and tested: the agents, the trials and the sandboxes around it stay real.
It listens on 127.0.0.1 (port 0 picks a free port) and serves

* ``POST /v1/chat/completions`` -- non-streaming chat completions (what litellm sends
  for terminus-2 and for mini-swe-agent), with scripted replies, optional tool calls
  and ``usage`` token counts;
* ``GET /v1/models`` -- the one scripted model.

When an API key is configured, every request must carry ``Authorization: Bearer
<key>``; anything else gets an OpenAI-style 401. Requests are recorded
(:attr:`ScriptedModelServer.requests`) for tests to inspect.

Script format (a JSON file, or the same structure as a dict)::

    {
      "model": "scripted",                 # the id /v1/models lists (default "scripted")
      "rules": [                           # checked in order; the first match replies
        {
          "match": {                       # every given condition must hold; {} matches all
            "turn": 0,                     # assistant messages already in the conversation
            "contains": "words.txt",       # substring (or list of substrings, all required)
                                           #   of the whole conversation's text
            "last_contains": "returncode", # substring(s) of the last message's text
            "model": "my-model"            # the request's model, exactly
          },
          "reply": {
            "content": "text",             # the assistant message's text, or
            "json": {"any": "value"},      #   a value sent as its JSON text
            "tool_calls": [                # optional tool calls (finish_reason "tool_calls")
              {"name": "bash", "arguments": {"command": "ls"}}   # arguments: object or string
            ],
            "status": 200                  # optional: an HTTP error status instead (with "content"
                                           #   as the error message), to script failures
          }
        }
      ],
      "default": {"content": "..."}        # optional reply when no rule matches; without it an
                                           #   unmatched request gets HTTP 400 naming the turn
    }

The conversation's text is every message's content (text parts of list contents,
and tool calls' arguments) joined by newlines. Replies are deterministic: the same
conversation always gets the same reply, ids included. ``usage`` counts
whitespace-separated words: ``prompt_tokens`` of the conversation, ``completion_tokens``
of the reply.

Latency (:class:`Latency`): a real model takes seconds per completion, and a sweep's
cost at that shape (many agents waiting at once) is what benchmarks need to see. Every
chat completion that reaches the script can wait ``seconds`` plus a jitter drawn from
``[0, jitter)``. The jitter is a function of the seed and the request's conversation, not of
arrival order, so the same conversation always waits the same time however many agents
call at once. Requests are served on a thread each, so one waiting completion never holds
up another.

Run it for a demo: ``python -m prefect_harbor.testing.model_server --script FILE [--port 0]
[--api-key-env VAR] [--latency S [--jitter S] [--seed N]]`` prints the base URL
(``http://127.0.0.1:PORT/v1``) and serves until interrupted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "scripted"


class ScriptError(ValueError):
    """The model script is malformed; the message says where."""


@dataclass(frozen=True)
class Latency:
    """How long each chat completion waits before its reply: ``seconds`` plus a jitter.

    The jitter is uniform in ``[0, jitter)`` and keyed on ``seed`` and the request's
    conversation, not drawn from a shared generator: concurrent agents reach the server in
    an order that changes from run to run, and a generator's draws would follow that order.
    """

    seconds: float = 0.0
    jitter: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.seconds) and math.isfinite(self.jitter)) or self.seconds < 0 or self.jitter < 0:
            raise ValueError(f"latency and jitter are finite seconds >= 0, got {self.seconds!r} and {self.jitter!r}")

    def delay(self, request: dict[str, Any]) -> float:
        """Seconds to wait before answering ``request`` (the same request, the same delay)."""
        if not self.jitter:
            return self.seconds
        key = json.dumps([self.seed, request.get("messages")], sort_keys=True, default=str).encode()
        fraction = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
        return self.seconds + self.jitter * fraction


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received (the bearer key itself is not kept)."""

    method: str
    path: str
    authorized: bool
    body: dict[str, Any] | None
    status: int


@dataclass
class _Rule:
    match: dict[str, Any]
    reply: dict[str, Any]


@dataclass
class ModelScript:
    """A parsed model script: ordered rules and an optional default reply."""

    model: str = DEFAULT_MODEL
    rules: list[_Rule] = field(default_factory=list)
    default: dict[str, Any] | None = None

    @classmethod
    def load(cls, source: ModelScript | dict | str | Path) -> ModelScript:
        if isinstance(source, ModelScript):
            return source
        if isinstance(source, str | Path):
            try:
                source = json.loads(Path(source).read_text())
            except (OSError, json.JSONDecodeError) as error:
                raise ScriptError(f"cannot read the model script {source}: {error}") from error
        if not isinstance(source, dict):
            raise ScriptError("a model script is a JSON object with 'rules' (and optionally 'model', 'default')")
        unknown = set(source) - {"model", "rules", "default", "description"}
        if unknown:
            raise ScriptError(f"unknown model-script keys {sorted(unknown)}; allowed: model, rules, default, description")
        rules = []
        for index, rule in enumerate(source.get("rules", [])):
            if not isinstance(rule, dict) or not isinstance(rule.get("reply"), dict):
                raise ScriptError(f"rules[{index}]: each rule is an object with a 'reply' object (and an optional 'match')")
            match = rule.get("match") or {}
            bad = set(match) - {"turn", "contains", "last_contains", "model"}
            if bad:
                raise ScriptError(f"rules[{index}].match: unknown conditions {sorted(bad)}")
            _check_reply(rule["reply"], f"rules[{index}].reply")
            rules.append(_Rule(match=match, reply=rule["reply"]))
        default = source.get("default")
        if default is not None:
            _check_reply(default, "default")
        return cls(model=str(source.get("model") or DEFAULT_MODEL), rules=rules, default=default)

    def reply_for(self, request: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
        """The scripted reply to a chat request (None when nothing matches) and the turn."""
        messages = request.get("messages") or []
        turn = sum(1 for message in messages if isinstance(message, dict) and message.get("role") == "assistant")
        conversation = "\n".join(_message_text(m) for m in messages)
        last = _message_text(messages[-1]) if messages else ""
        for rule in self.rules:
            if _matches(rule.match, turn=turn, conversation=conversation, last=last, model=request.get("model")):
                return rule.reply, turn
        return self.default, turn


def _check_reply(reply: dict[str, Any], where: str) -> None:
    unknown = set(reply) - {"content", "json", "tool_calls", "status"}
    if unknown:
        raise ScriptError(f"{where}: unknown keys {sorted(unknown)}; allowed: content, json, tool_calls, status")
    if "content" in reply and "json" in reply:
        raise ScriptError(f"{where}: give 'content' or 'json', not both")
    for index, call in enumerate(reply.get("tool_calls") or []):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ScriptError(f"{where}.tool_calls[{index}]: each tool call needs a 'name' (and 'arguments')")


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _matches(match: dict[str, Any], *, turn: int, conversation: str, last: str, model: Any) -> bool:
    if "turn" in match and match["turn"] != turn:
        return False
    if "model" in match and match["model"] != model:
        return False
    if not all(needle in conversation for needle in _as_list(match.get("contains", []))):
        return False
    return all(needle in last for needle in _as_list(match.get("last_contains", [])))


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return str(message)
    content = message.get("content")
    if isinstance(content, list):
        parts = [part.get("text", "") if isinstance(part, dict) else str(part) for part in content]
        text = "\n".join(p for p in parts if p)
    else:
        text = "" if content is None else str(content)
    calls = [str((call.get("function") or {}).get("arguments", "")) for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    return "\n".join([text, *calls]) if calls else text


def _words(text: str) -> int:
    return len(text.split())


def completion_body(request: dict[str, Any], reply: dict[str, Any], turn: int) -> dict[str, Any]:
    """The chat-completion response for a scripted reply (deterministic, ids included)."""
    digest = hashlib.sha256(json.dumps([request.get("messages"), turn], sort_keys=True, default=str).encode()).hexdigest()
    content = json.dumps(reply["json"]) if "json" in reply else reply.get("content")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    calls: list[dict[str, Any]] = []
    for index, call in enumerate(reply.get("tool_calls") or []):
        arguments = call.get("arguments", {})
        calls.append(
            {
                "id": f"call_{digest[:12]}_{index}",
                "type": "function",
                "function": {"name": call["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
            }
        )
    if calls:
        message["tool_calls"] = calls
    prompt_tokens = sum(_words(_message_text(m)) for m in request.get("messages") or [])
    completion_tokens = _words(content or "") + sum(_words(c["function"]["arguments"]) for c in calls)
    return {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        "created": 1_700_000_000 + turn,
        "model": request.get("model") or DEFAULT_MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop", "logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }


def _error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class ScriptedModelServer:
    """The scripted server, in a background thread: use it as a context manager.

    ``with ScriptedModelServer(script, api_key="k") as server: server.base_url``

    ``latency`` delays every chat completion that reaches the script (a float is that many
    seconds, no jitter); the wait ends early when the server stops.
    """

    def __init__(
        self,
        script: ModelScript | dict | str | Path,
        *,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        latency: Latency | float | None = None,
    ):
        self.script = ModelScript.load(script)
        self.api_key = api_key or None
        self.latency = latency if isinstance(latency, Latency) else Latency(seconds=float(latency or 0.0))
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._requests: list[RecordedRequest] = []
        self._httpd = _Server((host, port), _handler_for(self))
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, in order."""
        with self._lock:
            return list(self._requests)

    @property
    def completions(self) -> list[RecordedRequest]:
        """The authorized chat-completion requests that got a scripted reply."""
        return [r for r in self.requests if r.path.endswith("/chat/completions") and r.status == 200]

    def start(self) -> ScriptedModelServer:
        if self._thread is None:
            # A short poll interval: stop() waits for the serving loop's next poll.
            self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="scripted-model-server", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # completions still waiting out their latency answer now
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def authorized(self, header: str | None) -> bool:
        if self.api_key is None:
            return True
        return header == f"Bearer {self.api_key}"

    def answer(self, method: str, path: str, authorization: str | None, raw: bytes) -> tuple[int, dict[str, Any]]:
        """Status and JSON body for one request; records it."""
        authorized = self.authorized(authorization)
        body: dict[str, Any] | None = None
        route = path.split("?", 1)[0].rstrip("/")
        if method == "POST":
            try:
                parsed = json.loads(raw or b"{}")
                body = parsed if isinstance(parsed, dict) else None
            except json.JSONDecodeError:
                body = None
        status, response = self._route(method, route, authorized, body, raw)
        self._record(RecordedRequest(method=method, path=route, authorized=authorized, body=body, status=status))
        return status, response

    def _route(self, method: str, route: str, authorized: bool, body: dict[str, Any] | None, raw: bytes) -> tuple[int, dict[str, Any]]:
        known = {("GET", "/v1/models"), ("GET", "/models"), ("POST", "/v1/chat/completions"), ("POST", "/chat/completions")}
        if (method, route) not in known:
            return 404, _error(f"no route {method} {route}: this scripted server serves POST /v1/chat/completions and GET /v1/models", "invalid_request_error", "not_found")
        if not authorized:
            return 401, _error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        if method == "GET":
            return 200, {"object": "list", "data": [{"id": self.script.model, "object": "model", "created": 1_700_000_000, "owned_by": "prefect-harbor"}]}
        if body is None:
            return 400, _error(f"the request body is not a JSON object: {raw[:200]!r}", "invalid_request_error")
        if body.get("stream"):
            return 400, _error("streaming is not supported by the scripted model server; send stream=false", "invalid_request_error")
        reply, turn = self.script.reply_for(body)
        self._stopping.wait(self.latency.delay(body))  # in this request's own thread
        if reply is None:
            return 400, _error(f"no scripted reply matches turn {turn} of this conversation (and the script has no default)", "invalid_request_error", "no_scripted_reply")
        if reply.get("status", 200) != 200:
            return int(reply["status"]), _error(str(reply.get("content") or "scripted failure"), "server_error")
        return 200, completion_body(body, reply, turn)


class _Server(ThreadingHTTPServer):
    """A thread per connection, none of them keeping the process alive.

    ``request_queue_size`` is the listen backlog: socketserver's default of 5 makes the
    kernel drop connections when dozens of agents connect at once, and their clients
    retry a second later: latency the script never asked for.
    """

    daemon_threads = True
    request_queue_size = 128


def _handler_for(server: ScriptedModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, payload = server.answer(method, self.path, self.headers.get("Authorization"), raw)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read .requests
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefect_harbor.testing.model_server", description="Serve a scripted OpenAI-compatible model on 127.0.0.1.")
    parser.add_argument("--script", required=True, help="the model script (JSON; format in this module's docstring)")
    parser.add_argument("--port", type=int, default=0, help="the port (0: a free one)")
    parser.add_argument("--api-key-env", metavar="VAR", help="require the API key held in this environment variable")
    parser.add_argument("--latency", type=float, default=0.0, metavar="S", help="seconds each chat completion waits (default 0)")
    parser.add_argument("--jitter", type=float, default=0.0, metavar="S", help="plus up to this many seconds, fixed per conversation")
    parser.add_argument("--seed", type=int, default=0, help="the jitter's seed")
    args = parser.parse_args(argv)
    try:
        latency = Latency(seconds=args.latency, jitter=args.jitter, seed=args.seed)
    except ValueError as error:
        parser.error(str(error))
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            parser.error(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty")
    try:
        server = ScriptedModelServer(args.script, api_key=api_key, port=args.port, latency=latency)
    except ScriptError as error:
        parser.error(str(error))
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with server:
        print(server.base_url, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
