"""LLMRewriter: one chat call per task to any OpenAI-compatible endpoint, answer -> ``ModelNew`` source.

The prompt is built from template files in ``prompts/`` (``system.txt``, ``user.txt`` and one
``target_<target>.txt`` per implementation target) with ``string.Template`` placeholders
(``$task_source``, ``$gpu_name``, ``$profile``, ``$target_instructions``; ``$$`` is a literal dollar).

Example::

    rewriter = LLMRewriter(base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3-8B", target="triton")
    rewrite = rewriter.rewrite(task, profile.restrict(["speed_of_light"]))
    rewrite.source, rewrite.error, rewrite.llm_calls, rewrite.prompt_tokens

Accounting: ``llm_calls`` is 1 for every rewrite that went to the endpoint (answered or failed after
its retries), 0 for a cache hit; ``attempts`` counts the HTTP requests behind it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import string
from pathlib import Path

from autoprofiler.llm import ChatClient, LLMError
from autoprofiler.rewriters.base import ExtractionError, Rewrite, extract_code

logger = logging.getLogger(__name__)

PROMPTS_DIR = Path(__file__).parent / "prompts"
TARGETS = ("cuda", "triton")
NO_PROFILE_TEXT = "No profile was collected."
ENV_GPU_NAME = "AUTOPROFILER_GPU_NAME"
DEFAULT_GPU_NAME = "NVIDIA H200"


def load_templates(prompts_dir: str | os.PathLike = PROMPTS_DIR, target: str = "cuda") -> dict[str, str]:
    """The prompt templates for ``target``: ``{"system": ..., "user": ..., "target": ...}``.

    Raises ``ValueError`` for an unknown target and ``FileNotFoundError`` naming the missing file.
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    directory = Path(prompts_dir)
    names = {"system": "system.txt", "user": "user.txt", "target": f"target_{target}.txt"}
    templates = {}
    for key, name in names.items():
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"prompt template {name!r} not found in {directory}")
        templates[key] = path.read_text(encoding="utf-8")
    return templates


def default_gpu_name() -> str:
    """The GPU named in prompts: ``$AUTOPROFILER_GPU_NAME``, else the local CUDA device, else the H200.

    Deliberately not taken from the profile: a blind rewrite and a profiled one must see the same GPU
    name, so that only the profile differs between them.
    """
    name = os.environ.get(ENV_GPU_NAME)
    if name:
        return name
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a broken torch install must not stop prompt building
        logger.debug("no CUDA device name available", exc_info=True)
    return DEFAULT_GPU_NAME


def render_shown_profile(profile) -> str:
    """The profile text of the prompt: ``render_profile(profile)``, or ``NO_PROFILE_TEXT`` for None."""
    if profile is None:
        return NO_PROFILE_TEXT
    from autoprofiler.profiling.profile import render_profile  # lazy: profiling pulls in more

    return render_profile(profile)


class LLMRewriter:
    """Rewrite a task with one chat call.

    Parameters:
        client: a ``ChatClient`` to share (its concurrency limit and cache then cover every user);
            when None one is built from ``base_url``, ``model``, ``api_key`` and ``client_options``.
        target: ``"cuda"`` (inline CUDA via ``load_inline``) or ``"triton"``.
        temperature, seed: sampling settings sent with the call (the seed also keys the cache).
        gpu_name: the GPU named in the prompt (default: ``default_gpu_name()``).
        prompts_dir: where the templates live (default: the package's ``prompts/``).
        max_tokens: completion limit per call (None: the client's default).

    ``identity`` = ``"openai:<model>:<target>:t<temperature>:p<8 hex of the templates>"``: it changes
    when the model, target, temperature or prompt text changes, so cached rewards never mix prompts.
    """

    def __init__(
        self,
        client: ChatClient | None = None,
        *,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        target: str = "cuda",
        temperature: float = 0.0,
        seed: int | None = 0,
        gpu_name: str | None = None,
        prompts_dir: str | os.PathLike = PROMPTS_DIR,
        max_tokens: int | None = None,
        **client_options,
    ):
        self.client = client or ChatClient(base_url=base_url, model=model, api_key=api_key, **client_options)
        self.target = target
        self.temperature = float(temperature)
        self.seed = seed
        self.gpu_name = gpu_name or default_gpu_name()
        self.max_tokens = max_tokens
        self.templates = load_templates(prompts_dir, target)
        digest = hashlib.sha256(
            "\0".join(self.templates[k] for k in sorted(self.templates)).encode()
        ).hexdigest()
        self.prompt_version = digest[:8]
        self.identity = f"openai:{self.client.model}:{target}:t{self.temperature:g}:p{self.prompt_version}"

    def build_messages(self, task, profile) -> list[dict]:
        """The chat messages for ``task`` with ``profile`` (already restricted; None = blind)."""
        user = string.Template(self.templates["user"]).substitute(
            task_source=task.source.strip("\n"),
            gpu_name=self.gpu_name,
            profile=render_shown_profile(profile),
            target_instructions=self.templates["target"].strip("\n"),
        )
        return [
            {"role": "system", "content": self.templates["system"].strip("\n")},
            {"role": "user", "content": user},
        ]

    def rewrite(self, task, profile) -> Rewrite:
        """One call; a failed call or an answer without ``ModelNew`` code gives ``Rewrite.error``.

        Example::

            rewrite = rewriter.rewrite(task, None)   # blind: the prompt says no profile was collected
        """
        messages = self.build_messages(task, profile)
        try:
            reply = self.client.chat(
                messages, temperature=self.temperature, seed=self.seed, max_tokens=self.max_tokens
            )
        except LLMError as exc:
            logger.warning("rewrite of %s: LLM call failed: %s", task.id, exc)
            return Rewrite(source=None, llm_calls=1, error=f"llm {exc.kind}: {exc}", attempts=exc.attempts)
        calls = 0 if reply.cached else 1
        common = dict(
            llm_calls=calls,
            prompt_tokens=0 if reply.cached else reply.prompt_tokens,
            completion_tokens=0 if reply.cached else reply.completion_tokens,
            raw=reply.text,
            attempts=reply.attempts,
        )
        try:
            source = extract_code(reply.text)
        except ExtractionError as exc:
            suffix = " (answer cut off at max_tokens)" if reply.finish_reason == "length" else ""
            return Rewrite(source=None, error=f"{exc}{suffix}", **common)
        return Rewrite(source=source, **common)
