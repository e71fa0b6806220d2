"""The scripted OpenAI-compatible test model server: routes, auth, rules, usage, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from prefect_harbor.testing.model_server import Latency, ModelScript, ScriptedModelServer, ScriptError, main

SCRIPTS = Path(__file__).resolve().parent.parent / "examples" / "model-scripts"
SCRIPT = {
    "model": "toy",
    "rules": [
        {"match": {"turn": 0, "contains": "hello"}, "reply": {"content": "hi there"}},
        {"match": {"turn": 1, "last_contains": ["ok", "go"]}, "reply": {"json": {"step": 2}}},
        {"match": {"contains": "tool please"}, "reply": {"content": "calling", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}},
        {"match": {"contains": "break"}, "reply": {"status": 503, "content": "scripted outage"}},
    ],
}


def call(url: str, body: dict | None = None, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def chat(*contents: str, roles: tuple[str, ...] | None = None, **extra) -> dict:
    roles = roles or tuple("user" if i % 2 == 0 else "assistant" for i in range(len(contents)))
    return {"model": "toy", "messages": [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)], **extra}


def test_replies_follow_the_rules_by_turn_and_substring():
    with ScriptedModelServer(SCRIPT) as server:
        url = f"{server.base_url}/chat/completions"
        status, body = call(url, chat("hello world"))
        assert status == 200
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "hi there"}
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
        status, body = call(url, chat("hello", "hi there", "ok, go"))
        assert json.loads(body["choices"][0]["message"]["content"]) == {"step": 2}
        status, body = call(url, chat("tool please", "x", "y", "z", "w"))
        call_ = body["choices"][0]["message"]["tool_calls"][0]
        assert call_["type"] == "function" and call_["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
        assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_replies_are_deterministic():
    with ScriptedModelServer(SCRIPT) as server:
        first = call(f"{server.base_url}/chat/completions", chat("hello"))
        second = call(f"{server.base_url}/chat/completions", chat("hello"))
    assert first == second


def test_unmatched_conversation_without_default_is_a_400_naming_the_turn():
    with ScriptedModelServer(SCRIPT) as server:
        status, body = call(f"{server.base_url}/chat/completions", chat("nothing", "a", "b"))
    assert status == 400 and "turn 1" in body["error"]["message"] and body["error"]["code"] == "no_scripted_reply"


def test_default_reply_and_scripted_error_status():
    with ScriptedModelServer({**SCRIPT, "default": {"content": "fallback"}}) as server:
        _, body = call(f"{server.base_url}/chat/completions", chat("nothing"))
        assert body["choices"][0]["message"]["content"] == "fallback"
        status, body = call(f"{server.base_url}/chat/completions", chat("break"))
        assert status == 503 and body["error"]["message"] == "scripted outage"


def test_a_configured_key_is_required_and_requests_are_recorded_without_it():
    with ScriptedModelServer(SCRIPT, api_key="s3cret") as server:
        url = f"{server.base_url}/chat/completions"
        assert call(url, chat("hello"))[0] == 401
        status, body = call(url, chat("hello"), key="wrong")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert call(f"{server.base_url}/models", key="wrong")[0] == 401
        assert call(url, chat("hello"), key="s3cret")[0] == 200
        status, models = call(f"{server.base_url}/models", key="s3cret")
        assert status == 200 and [m["id"] for m in models["data"]] == ["toy"]
        recorded = server.requests
    assert [(r.method, r.status, r.authorized) for r in recorded] == [
        ("POST", 401, False), ("POST", 401, False), ("GET", 401, False), ("POST", 200, True), ("GET", 200, True),
    ]  # fmt: skip
    assert recorded[3].body["messages"][0]["content"] == "hello"
    assert "s3cret" not in repr(recorded)


def test_streaming_unknown_routes_and_bad_bodies_are_refused():
    with ScriptedModelServer(SCRIPT) as server:
        assert call(f"{server.base_url}/chat/completions", chat("hello", stream=True))[0] == 400
        assert call(f"{server.base_url}/completions", chat("hello"))[0] == 404
        request = urllib.request.Request(f"{server.base_url}/chat/completions", data=b"not json", method="POST")
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=10)
        assert error.value.code == 400
    assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ([], "is a JSON object"),
        ({"rules": [{"match": {}}]}, r"rules\[0\]: each rule is an object with a 'reply'"),
        ({"rules": [{"match": {"when": 1}, "reply": {}}]}, r"rules\[0\].match: unknown conditions \['when'\]"),
        ({"rules": [{"reply": {"content": "a", "json": 1}}]}, "not both"),
        ({"rules": [{"reply": {"tool_calls": [{"arguments": {}}]}}]}, "needs a 'name'"),
        ({"rule": []}, r"unknown model-script keys \['rule'\]"),
    ],
)
def test_malformed_scripts_are_refused_with_the_place(script, message):
    with pytest.raises(ScriptError, match=message):
        ModelScript.load(script)


def test_shipped_model_scripts_load():
    scripts = sorted(SCRIPTS.glob("*.json"))
    assert scripts
    for path in scripts:
        assert ModelScript.load(path).rules


# The server moved to prefect_harbor.testing (issue 18); the old module path stays an alias.
@pytest.mark.parametrize("module", ["prefect_harbor.testing.model_server", "prefect_harbor.model_server"], ids=["testing", "old-path-alias"])
def test_command_line_prints_the_base_url_and_serves(tmp_path, module):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {**os.environ, "DEMO_KEY": "demo-key"}
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--script", str(script), "--api-key-env", "DEMO_KEY"],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        assert call(f"{base_url}/chat/completions", chat("hello"), key="demo-key")[0] == 200
        assert call(f"{base_url}/chat/completions", chat("hello"))[0] == 401
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0


def test_the_old_module_path_is_the_same_server():
    import prefect_harbor.model_server as old

    assert old.ScriptedModelServer is ScriptedModelServer and old.main is main


def test_command_line_refuses_an_unset_key_variable(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_KEY_VAR"}
    completed = subprocess.run(
        [sys.executable, "-m", "prefect_harbor.testing.model_server", "--script", str(script), "--api-key-env", "NO_SUCH_KEY_VAR"],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert completed.returncode == 2 and "NO_SUCH_KEY_VAR" in completed.stderr


def test_latency_is_a_fixed_delay_plus_a_jitter_fixed_by_seed_and_conversation():
    request, other = chat("hello"), chat("hello", "hi there", "ok")
    assert Latency(1.5).delay(request) == 1.5
    jittered = Latency(1.0, jitter=0.5, seed=7)
    delays = {jittered.delay(chat(f"row {n}")) for n in range(50)}
    assert all(1.0 <= d < 1.5 for d in delays) and len(delays) == 50
    assert jittered.delay(request) == Latency(1.0, jitter=0.5, seed=7).delay(request)
    assert jittered.delay(request) != jittered.delay(other)
    assert jittered.delay(request) != Latency(1.0, jitter=0.5, seed=8).delay(request)
    for bad in ({"seconds": -1.0}, {"jitter": -0.1}, {"seconds": float("nan")}):
        with pytest.raises(ValueError, match="finite seconds"):
            Latency(**bad)


def test_completions_wait_their_latency_in_their_own_thread():
    """Four completions inside their delay at the same time: a barrier of four only opens
    if the server holds them all at once (a serial server would break it)."""
    barrier = threading.Barrier(4, timeout=30)

    class Together(Latency):
        def delay(self, request: dict) -> float:
            barrier.wait()
            return 0.0

    with ScriptedModelServer(SCRIPT, latency=Together()) as server:
        results: list[int] = []
        callers = [threading.Thread(target=lambda: results.append(call(f"{server.base_url}/chat/completions", chat("hello"))[0])) for _ in range(4)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(timeout=60)
    assert results == [200] * 4 and not barrier.broken


def test_the_server_waits_the_latency_and_stopping_ends_the_wait():
    waits: list[float] = []
    entered = threading.Event()

    with ScriptedModelServer(SCRIPT, latency=Latency(3600.0, jitter=1.0, seed=1)) as server:
        stopping = server._stopping
        original_wait = stopping.wait

        def wait(timeout: float | None = None) -> bool:
            waits.append(timeout)
            entered.set()
            return original_wait(timeout)

        stopping.wait = wait
        results: list[int] = []
        caller = threading.Thread(target=lambda: results.append(call(f"{server.base_url}/chat/completions", chat("hello"))[0]))
        caller.start()
        assert entered.wait(30)
        assert call(f"{server.base_url}/models")[0] == 200, "a waiting completion holds up nobody"
    caller.join(timeout=30)
    assert results == [200]
    assert waits == [Latency(3600.0, jitter=1.0, seed=1).delay(chat("hello"))]


def test_command_line_refuses_a_negative_latency(tmp_path, capsys):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    with pytest.raises(SystemExit) as exit_:
        main(["--script", str(script), "--latency", "-1"])
    assert exit_.value.code == 2 and "finite seconds" in capsys.readouterr().err
