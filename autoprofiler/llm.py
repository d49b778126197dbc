"""A small, reusable chat client for any OpenAI-compatible endpoint (OpenAI, vLLM, SGLang, ...).

``ChatClient`` wraps the real ``openai`` client and adds what a long experiment needs and the SDK's
defaults do not give us control over:

- **retries** with exponential backoff and jitter on 429 (honouring ``Retry-After``), 5xx, timeouts and
  connection errors, up to ``max_retries`` retries (the SDK's own retries are switched off so that we
  own the backoff and the accounting);
- a **concurrency limit**: one ``threading.Semaphore`` per client bounds the requests in flight across
  every thread that shares the client (it is held only while a request is on the wire, never while
  backing off);
- a **response cache** keyed by ``(model, prompt hash, temperature, seed, max_tokens)``: an in-memory
  dict, optionally persisted as JSON lines under ``cache_dir`` so reruns cost nothing;
- **token accounting** from the response's ``usage``.

Accounting vocabulary (used by the rewriters and the reward table):

- a *call* is one logical ``chat()`` that was not answered from the cache (what "one LLM call per
  task" counts);
- an *attempt* is one HTTP request; a call that was retried after a 429 makes several attempts but is
  still one call. A cache hit is 0 calls and 0 attempts.

Example (against any server speaking the chat-completions API)::

    client = ChatClient(base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3-8B", api_key="none")
    reply = client.chat([{"role": "user", "content": "Say hi"}], temperature=0.0, seed=0)
    reply.text, reply.prompt_tokens, reply.completion_tokens, reply.cached

Configuration from the environment when the constructor leaves it out: ``AUTOPROFILER_LLM_BASE_URL``,
``AUTOPROFILER_LLM_MODEL``, ``OPENAI_API_KEY``. ``openai`` is imported lazily, so importing this module
works where the SDK is not installed (the GPU machine).
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autoprofiler.text import clip

logger = logging.getLogger(__name__)

_SHOWN = 200  # characters of a server's response or error kept in an LLMError
ENV_BASE_URL = "AUTOPROFILER_LLM_BASE_URL"
ENV_MODEL = "AUTOPROFILER_LLM_MODEL"
ENV_API_KEY = "OPENAI_API_KEY"

#: Kinds of ``LLMError``; the retryable ones are retried with backoff.
ERROR_KINDS = ("rate_limited", "server_error", "timeout", "connection", "bad_response", "client_error")
RETRYABLE_KINDS = frozenset({"rate_limited", "server_error", "timeout", "connection"})


class LLMError(RuntimeError):
    """A chat call that gave no usable answer.

    Attributes:
        kind: one of ``ERROR_KINDS``.
        attempts: HTTP requests made before giving up.
        status: the HTTP status of the last attempt, when there was one.
    """

    def __init__(self, kind: str, message: str, attempts: int = 0, status: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts
        self.status = status


@dataclass(frozen=True)
class ChatResponse:
    """One chat answer.

    Attributes:
        text: the assistant message's content.
        prompt_tokens / completion_tokens: from the response's ``usage`` (0 when the server sent none).
        cached: True when answered from the cache (then no request was made).
        attempts: HTTP requests this answer took (0 when cached, 1 without retries).
        model: the model the server says answered.
        finish_reason: ``"stop"``, ``"length"``, ... as the server sent it.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False
    attempts: int = 1
    model: str = ""
    finish_reason: str = ""


@dataclass
class ChatStats:
    """Running totals of one client (all threads): calls, attempts, cache hits, tokens, failures."""

    calls: int = 0
    attempts: int = 0
    cache_hits: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def prompt_hash(messages: list[dict]) -> str:
    """sha256 of the canonical JSON of the messages (the "prompt hash" of the cache key)."""
    blob = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def cache_key(model: str, messages: list[dict], temperature: float, seed: int | None, max_tokens) -> str:
    """The response-cache key: sha256 over (model, prompt hash, temperature, seed, max_tokens)."""
    parts = json.dumps([model, prompt_hash(messages), float(temperature), seed, max_tokens])
    return hashlib.sha256(parts.encode("utf-8")).hexdigest()


class ResponseCache:
    """Thread-safe response cache: a dict, optionally mirrored to ``<directory>/responses.jsonl``.

    Each JSON line is ``{"key": ..., "response": {ChatResponse fields}}``; later lines win. A corrupt
    line (a run killed mid-write) is skipped with a warning rather than poisoning the cache.
    """

    FILE_NAME = "responses.jsonl"

    def __init__(self, directory: str | os.PathLike | None = None):
        self._lock = threading.Lock()
        self._data: dict[str, ChatResponse] = {}
        self.path = Path(directory) / self.FILE_NAME if directory is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                self._load()

    def _load(self) -> None:
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                self._data[row["key"]] = ChatResponse(**row["response"])
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("skipping corrupt cache line %s:%d (%s)", self.path, number, exc)

    def get(self, key: str) -> ChatResponse | None:
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, response: ChatResponse) -> None:
        with self._lock:
            self._data[key] = response
            if self.path is not None:
                row = {"key": key, "response": asdict(response)}
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


def _retry_after_seconds(headers) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, ``Retry-After`` (seconds or HTTP date)."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass
class ChatClient:
    """Chat completions against an OpenAI-compatible endpoint, with retries, a limit and a cache.

    Parameters:
        base_url / model / api_key: the endpoint; each falls back to its environment variable
            (``AUTOPROFILER_LLM_BASE_URL``, ``AUTOPROFILER_LLM_MODEL``, ``OPENAI_API_KEY``). A missing
            model is an error; a missing key becomes ``"none"`` (local servers ignore it); a missing
            base URL means the SDK's default (api.openai.com).
        timeout_s: per-attempt timeout.
        max_retries: retries after the first attempt (so at most ``max_retries + 1`` attempts).
        backoff_base_s / backoff_max_s: the n-th retry waits ``min(max, base * 2**n)``, jittered to
            between half and all of that; a ``Retry-After`` header replaces the computed wait (capped
            at ``backoff_max_s``).
        max_concurrency: requests in flight at once across all threads using this client.
        cache: True (in memory), False (off) or a directory (in memory + JSON lines on disk). Only
            reproducible requests are cached: ``temperature == 0`` or an explicit ``seed``.
        max_tokens: default completion limit per request (None: the server's).
        extra_body: extra JSON fields sent with every request (e.g. vLLM's ``top_k``).

    Raises (from ``chat``): ``LLMError`` when no usable answer came after the retries.
    """

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 300.0
    max_retries: int = 4
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    max_concurrency: int = 8
    cache: bool | str | os.PathLike = True
    max_tokens: int | None = None
    extra_body: dict | None = None
    stats: ChatStats = field(default_factory=ChatStats, init=False)

    def __post_init__(self):
        self.base_url = self.base_url or os.environ.get(ENV_BASE_URL) or None
        self.model = self.model or os.environ.get(ENV_MODEL) or None
        self.api_key = self.api_key or os.environ.get(ENV_API_KEY) or "none"
        if not self.model:
            raise ValueError(f"ChatClient needs a model: pass model=... or set {ENV_MODEL}; got none")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries!r}")
        if self.cache is False or self.cache is None:
            self._cache = None
        elif self.cache is True:
            self._cache = ResponseCache()
        else:
            self._cache = ResponseCache(self.cache)
        self._semaphore = threading.BoundedSemaphore(self.max_concurrency)
        self._stats_lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._key_locks_lock = threading.Lock()
        self._client = None
        self._client_lock = threading.Lock()
        self._rng = random.Random()

    # -- public -------------------------------------------------------------------------------
    def chat(
        self,
        messages: list[dict],
        temperature: float = 0.0,
        seed: int | None = None,
        max_tokens: int | None = None,
    ) -> ChatResponse:
        """Send one chat request (retrying as configured) or answer it from the cache.

        Parameters:
            messages: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
            temperature, seed: sampling settings, sent as given (``seed`` omitted when None).
            max_tokens: completion limit for this request (default: the client's).

        Returns: a ``ChatResponse``; ``cached=True`` means no request was made.

        Raises: ``LLMError`` (``kind`` in ``ERROR_KINDS``) when there is no usable answer.

        Example::

            reply = client.chat([{"role": "user", "content": "2+2?"}], temperature=0.0, seed=1)
        """
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
        max_tokens = max_tokens if max_tokens is not None else self.max_tokens
        cacheable = self._cache is not None and (float(temperature) == 0.0 or seed is not None)
        if not cacheable:
            return self._request(messages, temperature, seed, max_tokens)
        key = cache_key(self.model, messages, temperature, seed, max_tokens)
        # One lock per key: identical concurrent requests go out once and the rest read the cache.
        with self._key_lock(key):
            hit = self._cache.get(key)
            if hit is not None:
                with self._stats_lock:
                    self.stats.cache_hits += 1
                return ChatResponse(**{**asdict(hit), "cached": True, "attempts": 0})
            response = self._request(messages, temperature, seed, max_tokens)
            self._cache.put(key, response)
            return response

    def close(self) -> None:
        """Close the underlying HTTP client (idempotent)."""
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- internals ----------------------------------------------------------------------------
    def _key_lock(self, key: str) -> threading.Lock:
        with self._key_locks_lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def _sdk(self):
        with self._client_lock:
            if self._client is None:
                import openai  # lazy: the GPU machine has no openai

                self._client = openai.OpenAI(
                    base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0
                )
            return self._client

    def _backoff(self, retry: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.backoff_max_s)
        full = min(self.backoff_max_s, self.backoff_base_s * (2**retry))
        return full / 2 + self._rng.uniform(0, full / 2)

    def _request(self, messages, temperature, seed, max_tokens) -> ChatResponse:
        with self._stats_lock:
            self.stats.calls += 1
        attempts = 0
        while True:
            attempts += 1
            with self._stats_lock:
                self.stats.attempts += 1
            try:
                with self._semaphore:
                    response = self._attempt(messages, temperature, seed, max_tokens)
            except LLMError as exc:
                exc.attempts = attempts
                retry = attempts - 1
                if exc.kind not in RETRYABLE_KINDS or retry >= self.max_retries:
                    with self._stats_lock:
                        self.stats.failures += 1
                    if exc.kind in RETRYABLE_KINDS:
                        exc.args = (f"{exc.args[0]} (gave up after {attempts} attempts)",)
                    raise
                delay = self._backoff(retry, getattr(exc, "retry_after", None))
                logger.warning(
                    "LLM attempt %d failed (%s: %s); retrying in %.2fs", attempts, exc.kind, exc, delay
                )
                time.sleep(delay)
                continue
            with self._stats_lock:
                self.stats.prompt_tokens += response.prompt_tokens
                self.stats.completion_tokens += response.completion_tokens
            return ChatResponse(**{**asdict(response), "attempts": attempts})

    def _attempt(self, messages, temperature, seed, max_tokens) -> ChatResponse:
        import openai

        kwargs = {"model": self.model, "messages": messages, "temperature": float(temperature)}
        if seed is not None:
            kwargs["seed"] = int(seed)
        if max_tokens is not None:
            kwargs["max_tokens"] = int(max_tokens)
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        try:
            completion = self._sdk().chat.completions.create(**kwargs)
        except openai.APITimeoutError as exc:
            raise LLMError("timeout", f"no answer within {self.timeout_s}s from {self.base_url}") from exc
        except openai.APIConnectionError as exc:
            raise LLMError("connection", f"cannot reach {self.base_url}: {exc}") from exc
        except openai.APIStatusError as exc:
            status = exc.status_code
            if status == 429:
                error = LLMError("rate_limited", f"429 rate limited by {self.base_url}", status=status)
                error.retry_after = _retry_after_seconds(exc.response.headers)
                raise error from exc
            kind = "server_error" if status >= 500 else "client_error"
            error = LLMError(
                kind, f"HTTP {status} from {self.base_url}: {clip(exc.message, _SHOWN)}", status=status
            )
            if kind == "server_error":
                error.retry_after = _retry_after_seconds(exc.response.headers)
            raise error from exc
        except (openai.APIResponseValidationError, ValueError) as exc:
            raise LLMError(
                "bad_response", f"unreadable response from {self.base_url}: {clip(exc, _SHOWN)}"
            ) from exc
        return _parse_completion(completion, self.base_url)


def _parse_completion(completion, base_url) -> ChatResponse:
    """The first choice's text and the usage of an SDK completion object; LLMError if either is unusable."""
    if isinstance(completion, str | bytes):
        # The SDK hands back the raw body when it could not decode JSON from a 200 response.
        raise LLMError("bad_response", f"response from {base_url} is not JSON: {clip(completion, _SHOWN)!r}")
    choices = getattr(completion, "choices", None)
    if not choices:
        raise LLMError("bad_response", f"response from {base_url} has no choices: {clip(completion, _SHOWN)}")
    message = getattr(choices[0], "message", None)
    text = getattr(message, "content", None)
    if not isinstance(text, str):
        raise LLMError(
            "bad_response", f"first choice from {base_url} has no text content: {clip(choices[0], _SHOWN)}"
        )
    usage = getattr(completion, "usage", None)
    if usage is None:
        logger.warning("response from %s carries no usage; counting 0 tokens", base_url)
    return ChatResponse(
        text=text,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        model=str(getattr(completion, "model", "") or ""),
        finish_reason=str(getattr(choices[0], "finish_reason", "") or ""),
    )
