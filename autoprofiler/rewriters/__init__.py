"""Rewriters: (task, shown profile) -> candidate source defining ``ModelNew``.

``LLMRewriter`` asks any OpenAI-compatible endpoint once per task; ``RuleRewriter`` applies profile-guided
torch-level rewrites with no LLM; ``PlaybookRewriter`` decides among 13 torch-level actions from rules per
metric group; ``ExperienceRewriter`` picks what worked best on the most similar training tasks. All
return a ``Rewrite`` and never raise for a bad answer; the last three are ``ActionRewriter``s (replayable).

    >>> from autoprofiler.rewriters import RuleRewriter
    >>> RuleRewriter().identity
    'rule-v2'
    >>> make_rewriter("rule", default_action="keep").identity
    'rule-v2[default_action=keep]'
    >>> make_rewriter("playbook", tolerance=1e-2).identity
    'playbook-v1[tolerance=0.01]'
"""

from autoprofiler.rewriters.base import (
    NO_CODE_ERROR,
    ActionRewriter,
    ExtractionError,
    Rewrite,
    Rewriter,
    extract_code,
)
from autoprofiler.rewriters.experience import ExperienceRewriter
from autoprofiler.rewriters.llm import LLMRewriter
from autoprofiler.rewriters.playbook import PlaybookRewriter
from autoprofiler.rewriters.rule import ACTIONS, RULES, RuleRewriter

#: Rewriter kinds by name (CLI ``--rewriter``, workflow configs): a class or a constructor taking options.
REWRITERS = {
    "rule": RuleRewriter,
    "openai": LLMRewriter,
    "playbook": PlaybookRewriter,
    "experience": ExperienceRewriter.from_recording,
}


def make_rewriter(kind: str, **options):
    """A rewriter by name: ``"rule"`` -> ``RuleRewriter(**options)``, ``"openai"`` -> ``LLMRewriter(...)``,
    ``"playbook"`` -> ``PlaybookRewriter(...)``, ``"experience"`` ->
    ``ExperienceRewriter.from_recording(...)``.

    Raises ``ValueError`` naming the known kinds for any other name.
    """
    if kind not in REWRITERS:
        raise ValueError(f"rewriter must be one of {sorted(REWRITERS)}, got {kind!r}")
    return REWRITERS[kind](**options)


__all__ = [
    "REWRITERS",
    "ACTIONS",
    "ActionRewriter",
    "ExperienceRewriter",
    "NO_CODE_ERROR",
    "RULES",
    "ExtractionError",
    "LLMRewriter",
    "PlaybookRewriter",
    "Rewrite",
    "Rewriter",
    "RuleRewriter",
    "extract_code",
    "make_rewriter",
]
