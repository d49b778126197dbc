"""Learning a profiling tree: REWRITE/SPLIT proposals accepted by a paired test (the paper's loop).

- ``stats``: the acceptance test (``paired_test``, ``PairedTest``, ``METHODS``, ``sign_flip_p_value``);
- ``config``: the learner's settings (``LearnConfig``, ``ERROR_CONTROLS``: what ``confidence`` bounds);
- ``proposers``: what a proposer sees and answers (``LeafContext``, ``Candidate``) and the two
  proposers (``StatisticalProposer``, ``LLMProposer``);
- ``learner``: the loop (``Learner``), its decisions (``Decision``) and checkpoints.

Example (replay, no GPU, no LLM)::

    env = ReplayEnvironment.from_dir("datasets/h200_suite", rewriter=RuleRewriter())
    learner = Learner(env, train_tasks, StatisticalProposer(), LearnConfig(confidence=0.9), out_dir="runs/x")
    tree = learner.fit(load_tree("trees/seed.json"))
"""

from autoprofiler.learning.config import ERROR_CONTROLS, LearnConfig
from autoprofiler.learning.learner import Decision, Learner
from autoprofiler.learning.proposers import Candidate, LeafContext, LLMProposer, StatisticalProposer
from autoprofiler.learning.stats import PairedTest, paired_test, sign_flip_p_value

__all__ = [
    "ERROR_CONTROLS",
    "Candidate",
    "Decision",
    "LLMProposer",
    "LearnConfig",
    "Learner",
    "LeafContext",
    "PairedTest",
    "StatisticalProposer",
    "paired_test",
    "sign_flip_p_value",
]
