"""ChatClient against the scripted loopback server, through the real openai client."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("openai")  # the GPU machine has no openai: these tests then skip

from openai_server import OpenAIServer, malformed, no_usage, ok, rate_limited, server_error, slow

from autoprofiler.llm import ChatClient, LLMError, ResponseCache, _retry_after_seconds, cache_key

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hello to me"}]


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


def make_client(server, **kw) -> ChatClient:
    options = dict(model="test-model", api_key="k", timeout_s=2.0, max_retries=2, backoff_base_s=0.01)
    options.update(kw)
    return ChatClient(base_url=server.base_url, **options)


def test_answer_usage_and_request_shape(server):
    """A plain answer: text, usage from the response, and the request carries model/temperature/seed."""
    server.script(ok("hello there you"))
    reply = make_client(server).chat(MESSAGES, temperature=0.0, seed=7, max_tokens=64)
    assert (reply.text, reply.prompt_tokens, reply.completion_tokens) == ("hello there you", 6, 3)
    assert (reply.cached, reply.attempts, reply.model, reply.finish_reason) == (
        False,
        1,
        "test-model",
        "stop",
    )
    body = server.requests[0].body
    assert server.requests[0].path == "/v1/chat/completions"
    assert (body["model"], body["temperature"], body["seed"], body["max_tokens"]) == (
        "test-model",
        0.0,
        7,
        64,
    )
    assert body["messages"] == MESSAGES
    assert server.requests[0].headers["authorization"] == "Bearer k"


def test_429_is_retried_after_retry_after(server):
    """429 with Retry-After 0.3 s: the client waits that long, retries, and counts one call, two attempts."""
    server.script(rate_limited(retry_after=0.3), ok("fine"))
    client = make_client(server, backoff_base_s=0.001)
    reply = client.chat(MESSAGES)
    assert reply.text == "fine" and reply.attempts == 2
    gap = server.requests[1].arrived - server.requests[0].arrived
    assert 0.28 <= gap < 1.5, gap
    assert (client.stats.calls, client.stats.attempts, client.stats.failures) == (1, 2, 0)


def test_500_gives_up_after_max_retries(server):
    """500 on every attempt: max_retries + 1 requests, then LLMError(server_error) naming the attempts."""
    server.default = server_error(500)
    client = make_client(server, max_retries=2)
    with pytest.raises(LLMError, match="HTTP 500.*gave up after 3 attempts") as info:
        client.chat(MESSAGES)
    assert (info.value.kind, info.value.attempts, info.value.status) == ("server_error", 3, 500)
    assert len(server.requests) == 3
    assert (client.stats.calls, client.stats.attempts, client.stats.failures) == (1, 3, 1)


def test_500_then_success_backs_off_exponentially(server):
    """Two 503s then an answer: the waits grow (base 0.05: 0.025-0.05 s, then 0.05-0.1 s)."""
    server.script(server_error(503), server_error(503), ok("ok now"))
    reply = make_client(server, backoff_base_s=0.05).chat(MESSAGES)
    assert reply.text == "ok now" and reply.attempts == 3
    t = [r.arrived for r in server.requests]
    assert t[1] - t[0] >= 0.025 and t[2] - t[1] >= 0.05


def test_client_error_is_not_retried(server):
    """400 is the caller's fault: no retry."""
    server.script(server_error(400))
    with pytest.raises(LLMError) as info:
        make_client(server).chat(MESSAGES)
    assert info.value.kind == "client_error" and len(server.requests) == 1


def test_slow_answer_times_out_then_gives_up(server):
    """An answer slower than the timeout is retried, then LLMError(timeout)."""
    server.default = slow(1.5)
    client = make_client(server, timeout_s=0.3, max_retries=1)
    start = time.monotonic()
    with pytest.raises(LLMError, match="no answer within 0.3s") as info:
        client.chat(MESSAGES)
    assert info.value.kind == "timeout" and info.value.attempts == 2
    assert time.monotonic() - start < 1.5


def test_malformed_json_is_bad_response(server):
    """A 200 whose body is not JSON: LLMError(bad_response) at once (no retry)."""
    server.script(malformed())
    with pytest.raises(LLMError) as info:
        make_client(server).chat(MESSAGES)
    assert info.value.kind == "bad_response" and len(server.requests) == 1


def test_missing_usage_counts_zero_tokens(server):
    """A server that sends no usage: the answer still comes, with 0 tokens."""
    server.script(no_usage("a b"))
    reply = make_client(server).chat(MESSAGES)
    assert (reply.text, reply.prompt_tokens, reply.completion_tokens) == ("a b", 0, 0)


def test_unreachable_server_is_connection_error():
    """Nothing listening: LLMError(connection) after the retries."""
    with OpenAIServer() as s:
        url = s.base_url
    client = ChatClient(base_url=url, model="m", api_key="k", timeout_s=1, max_retries=1, backoff_base_s=0.01)
    with pytest.raises(LLMError) as info:
        client.chat(MESSAGES)
    assert info.value.kind == "connection" and info.value.attempts == 2


def test_cache_answers_identical_requests_once(server, tmp_path):
    """Same (model, prompt, temperature, seed): one request; the hit is marked cached and persists on disk."""
    server.default = ok("cached answer")
    client = make_client(server, cache=tmp_path)
    first = client.chat(MESSAGES, temperature=0.0, seed=1)
    second = client.chat(MESSAGES, temperature=0.0, seed=1)
    assert len(server.requests) == 1
    assert (first.cached, second.cached, second.text, second.attempts) == (False, True, "cached answer", 0)
    client.chat(MESSAGES, temperature=0.0, seed=2)  # another seed is another key
    assert len(server.requests) == 2
    reopened = make_client(server, cache=tmp_path)
    assert reopened.chat(MESSAGES, temperature=0.0, seed=1).cached
    assert len(server.requests) == 2
    assert (client.stats.calls, client.stats.cache_hits) == (2, 1)


def test_unseeded_sampling_is_not_cached(server):
    """temperature > 0 without a seed is not reproducible: never answered from the cache."""
    server.default = ok("x")
    client = make_client(server)
    client.chat(MESSAGES, temperature=0.7)
    client.chat(MESSAGES, temperature=0.7)
    assert len(server.requests) == 2


def test_failures_are_not_cached(server):
    """A failed call leaves no cache entry: the next identical call goes to the server."""
    server.script(server_error(400), ok("second time"))
    client = make_client(server)
    with pytest.raises(LLMError):
        client.chat(MESSAGES)
    assert client.chat(MESSAGES).text == "second time"


def test_concurrency_limit_holds_across_threads(server):
    """8 threads, limit 3: the server never sees more than 3 requests at once (and does see 3)."""
    server.default = ok("slowish", delay_s=0.15)
    client = make_client(server, max_concurrency=3, cache=False)
    threads = [
        threading.Thread(target=client.chat, args=([{"role": "user", "content": f"q{i}"}],)) for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(server.requests) == 8
    assert server.max_in_flight == 3


def test_identical_concurrent_requests_go_out_once(server):
    """4 threads asking the same cacheable question: one request, three cache hits."""
    server.default = ok("shared", delay_s=0.1)
    client = make_client(server)
    replies = []
    threads = [threading.Thread(target=lambda: replies.append(client.chat(MESSAGES))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(server.requests) == 1
    assert sorted(r.cached for r in replies) == [False, True, True, True]


def test_model_is_required(monkeypatch):
    """No model anywhere: a ValueError naming the environment variable."""
    monkeypatch.delenv("AUTOPROFILER_LLM_MODEL", raising=False)
    with pytest.raises(ValueError, match="AUTOPROFILER_LLM_MODEL"):
        ChatClient(base_url="http://127.0.0.1:1/v1")


def test_environment_configuration(monkeypatch, server):
    """Base URL, model and key come from the environment when not passed."""
    monkeypatch.setenv("AUTOPROFILER_LLM_BASE_URL", server.base_url)
    monkeypatch.setenv("AUTOPROFILER_LLM_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    server.script(ok("from env"))
    assert ChatClient().chat(MESSAGES).text == "from env"
    assert server.requests[0].body["model"] == "env-model"
    assert server.requests[0].headers["authorization"] == "Bearer env-key"


def test_retry_after_parsing():
    """Retry-After in seconds, in ms, as an HTTP date in the past, or garbage."""
    assert _retry_after_seconds({"retry-after": "2"}) == 2.0
    assert _retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert _retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert _retry_after_seconds({"retry-after": "soon"}) is None
    assert _retry_after_seconds({}) is None


def test_cache_key_and_corrupt_cache_line(tmp_path):
    """The key depends on each part; a corrupt line in the cache file is skipped."""
    base = cache_key("m", MESSAGES, 0.0, 1, None)
    assert base != cache_key("m2", MESSAGES, 0.0, 1, None)
    assert base != cache_key("m", MESSAGES, 0.5, 1, None)
    assert base != cache_key("m", MESSAGES, 0.0, None, None)
    assert base != cache_key("m", MESSAGES[:1], 0.0, 1, None)
    (tmp_path / ResponseCache.FILE_NAME).write_text(
        '{"key": "a", "response": {"text": "t", "prompt_tokens": 1, '
        '"completion_tokens": 2}}\n{"key": "b", "resp\n'
    )
    cache = ResponseCache(tmp_path)
    assert len(cache) == 1 and cache.get("a").text == "t"
