"""Rewriters: (task, shown profile) -> candidate source defining ``ModelNew``.

``LLMRewriter`` asks any OpenAI-compatible endpoint once per task; ``RuleRewriter`` applies profile-guided
torch-level rewrites with no LLM. Both return a ``Rewrite`` and never raise for a bad answer.

    >>> from autoprofiler.rewriters import RuleRewriter
    >>> RuleRewriter().identity
    'rule-v2'
    >>> make_rewriter("rule", default_action="keep").identity
    'rule-v2[default_action=keep]'
"""

from autoprofiler.rewriters.base import NO_CODE_ERROR, ExtractionError, Rewrite, Rewriter, extract_code
from autoprofiler.rewriters.llm import LLMRewriter
from autoprofiler.rewriters.rule import ACTIONS, RULES, RuleRewriter

#: Rewriter kinds by name (CLI ``--rewriter``, workflow configs).
REWRITERS = {"rule": RuleRewriter, "openai": LLMRewriter}


def make_rewriter(kind: str, **options):
    """A rewriter by name: ``"rule"`` -> ``RuleRewriter(**options)``, ``"openai"`` -> ``LLMRewriter(...)``.

    Raises ``ValueError`` naming the known kinds for any other name.
    """
    if kind not in REWRITERS:
        raise ValueError(f"rewriter must be one of {sorted(REWRITERS)}, got {kind!r}")
    return REWRITERS[kind](**options)


__all__ = [
    "REWRITERS",
    "ACTIONS",
    "NO_CODE_ERROR",
    "RULES",
    "ExtractionError",
    "LLMRewriter",
    "Rewrite",
    "Rewriter",
    "RuleRewriter",
    "extract_code",
    "make_rewriter",
]
