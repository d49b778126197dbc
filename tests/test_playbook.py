"""PlaybookRewriter and ExperienceRewriter: decisions per shown group, candidates, replay, reachability.

CPU: ``python -m pytest tests/test_playbook.py -m "not slow"`` (about a minute on 2 CPUs: the sandboxed
evaluator runs each non-compiling action on a few suite tasks at small size); the ``slow`` test runs the
four inductor-based actions through the evaluator (about 3 minutes: inductor builds C++ on a cold cache).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_script

from autoprofiler.profiling import GROUPS
from autoprofiler.profiling.profile import Profile
from autoprofiler.rewriters import ActionRewriter, ExperienceRewriter, PlaybookRewriter, make_rewriter
from autoprofiler.rewriters.actions import ACTIONS, RULE_ACTIONS, build_source
from autoprofiler.rewriters.attention import SDPA, substitute_attention
from autoprofiler.rewriters.evidence import (
    DRAM,
    DRAM_READ,
    DURATION,
    FADD,
    FFMA,
    FLOPS,
    FMA_PIPE,
    FMUL,
    INSTRUCTIONS,
    INTENSITY,
    KERNELS,
    L2_HIT,
    LAUNCH_SHARE,
    LOAD_BYTES_PER_SECTOR,
    SHARED_LOADS,
    SHARED_STORES,
    SM,
    TENSOR_SHARE,
    WARP_LATENCY,
    WAVES,
    stall,
)
from autoprofiler.rewriters.experience import Experience
from autoprofiler.rewriters.split import is_tuning_task, split_hashes
from autoprofiler.tasks import load_task_file

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "datasets" / "suite"
H200 = REPO / "datasets" / "h200_suite"
NCU_GROUPS = tuple(g for g, m in GROUPS.items() if m.source == "ncu")
TORCH_GROUPS = tuple(g for g, m in GROUPS.items() if m.source == "torch")
needs_h200 = pytest.mark.skipif(not (H200 / "profiles").is_dir(), reason="no H200 recording in datasets/")

POINTWISE = "void at::vectorized_elementwise_kernel<4, at::CUDAFunctor_add<float>>"
SOFTMAX = "void at::cunn_SoftMaxForward<4, float, float, float, at::SoftMaxForwardEpilogue>"
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128"
FP32_CONV = "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw"
HALF_CONV = "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc"
LAYOUT = "void cudnn::nchwToNhwcKernel<float, float, float, 0, 1, 2>"


def suite_task(rel: str):
    return load_task_file(SUITE / f"{rel}.py")


def kernels(*rows: tuple[str, float]) -> list[dict]:
    """Kernel rows from (name, microseconds)."""
    return [{"name": name, DURATION: us * 1e3} for name, us in rows]


def ncu(metrics: dict, rows: list[dict]) -> Profile:
    """A profile holding every ncu group: ``restrict`` shows the chosen ones."""
    total = sum(r[DURATION] for r in rows)
    return Profile("h", "ncu", frozenset(NCU_GROUPS), {KERNELS: len(rows), DURATION: total, **metrics}, rows)


def torch_profile(metrics: dict, rows: list[dict]) -> Profile:
    return Profile("h", "torch", frozenset(TORCH_GROUPS), dict(metrics), rows, device="cpu")


def op_rows(*rows: tuple[str, float]) -> list[dict]:
    return [{"name": name, "torch__self_time_us": us, "torch__count": 1.0} for name, us in rows]


# ------------------------------------------------------------------------------------------------
# Each group changes a decision: a profile, a set of groups without it, the action with and without
# ------------------------------------------------------------------------------------------------
# Every case: (group, base groups, profile, action shown base, action shown base + group). The comments
# say which rule makes the difference.
GROUP_CASES = [
    # one kernel at 70% SM: near a roof (lone_kernel_near_peak); the cache group alone concludes nothing
    (
        "root",
        ("cache",),
        ncu({SM: 70.0, DRAM: 65.0, L2_HIT: 70.0}, kernels((SOFTMAX, 300))),
        "torch_compile",
        "keep",
    ),
    # four 40 us kernels (not short) with 80% of the wall time outside them: launch-bound
    (
        "speed_of_light",
        ("root",),
        ncu({SM: 5.0, DRAM: 3.0, LAUNCH_SHARE: 0.8}, kernels(*[(POINTWISE, 40)] * 4)),
        "torch_compile",
        "cuda_graph",
    ),
    # one kernel at 70% DRAM with full sectors: at bandwidth (single_kernel_at_bandwidth)
    (
        "memory",
        ("cache",),
        ncu({DRAM: 70.0, LOAD_BYTES_PER_SECTOR: 32.0, L2_HIT: 70.0}, kernels((POINTWISE, 500))),
        "torch_compile",
        "keep",
    ),
    # three 5 us kernels hitting L2: fusion saves little DRAM, the launches are left (chain_in_l2)
    (
        "cache",
        ("flops",),
        ncu({INTENSITY: 0.5, L2_HIT: 90.0}, kernels(*[(POINTWISE, 5)] * 3)),
        "torch_compile",
        "cuda_graph",
    ),
    # a GEMM whose warps are issuing or ready 80% of the time: issue-bound (issue_bound)
    (
        "stalls",
        ("cache",),
        ncu(
            {WARP_LATENCY: 2.0, stall("selected"): 1.0, stall("not_selected"): 0.6, L2_HIT: 70.0},
            kernels((GEMM, 1000)),
        ),
        "torch_compile",
        "keep",
    ),
    # four kernels under a third of a wave each (underfilled_chain)
    (
        "occupancy",
        ("cache",),
        ncu({WAVES: 0.3, L2_HIT: 70.0}, kernels(*[(POINTWISE, 40)] * 4)),
        "torch_compile",
        "cuda_graph",
    ),
    # a GEMM at 70% of the FMA pipe: CUDA-core peak (fma_bound_library)
    (
        "compute_pipes",
        ("cache",),
        ncu({FMA_PIPE: 70.0, L2_HIT: 70.0}, kernels((GEMM, 1000))),
        "torch_compile",
        "keep",
    ),
    # tensor-core GEMM plus a 20% epilogue kernel (tensor_core_gemm_with_epilogue)
    (
        "tensor_cores",
        ("cache",),
        ncu({TENSOR_SHARE: 0.8, L2_HIT: 70.0}, kernels((GEMM, 800), (POINTWISE, 200))),
        "torch_compile",
        "compile_max_autotune",
    ),
    # launch-bound chain of streaming kernels: fuse them, then graph (launch_bound_pointwise_chain)
    (
        "instruction_mix",
        ("speed_of_light",),
        ncu(
            {LAUNCH_SHARE: 0.9, INSTRUCTIONS: 1e6, SHARED_LOADS: 0.0, SHARED_STORES: 0.0},
            kernels(*[(POINTWISE, 5)] * 3),
        ),
        "cuda_graph",
        "compile_cudagraphs",
    ),
    # one kernel at 300 FLOP/B (high_intensity_few_kernels)
    (
        "flops",
        ("cache",),
        ncu({INTENSITY: 300.0, L2_HIT: 70.0}, kernels((GEMM, 1000))),
        "torch_compile",
        "keep",
    ),
]


@pytest.mark.parametrize("group, base, profile, before, after", GROUP_CASES, ids=[c[0] for c in GROUP_CASES])
def test_each_ncu_group_changes_a_decision(group, base, profile, before, after):
    """Shown ``base``, the playbook picks ``before``; shown ``group`` too, ``after``."""
    rewriter = PlaybookRewriter()
    assert rewriter.decide(profile.restrict(base))[0] == before
    action, reason = rewriter.decide(profile.restrict((*base, group)))
    assert action == after, reason


def test_group_cases_cover_every_ncu_group():
    assert sorted(c[0] for c in GROUP_CASES) == sorted(NCU_GROUPS)


TORCH_CASES = [
    (
        "torch_root",
        ("torch_memory",),
        torch_profile({"torch__matmul_time_share": 0.9, "torch__elementwise_time_share": 0.05}, []),
        "torch_compile",
        "keep",
    ),
    (
        "torch_ops",
        ("torch_memory",),
        torch_profile({"torch__top_op_time_share": 0.95}, []),
        "torch_compile",
        "keep",
    ),
    (
        "torch_memory",
        ("torch_flops",),
        torch_profile(
            {"torch__copy_time_share": 0.2, "torch__arithmetic_intensity": 100.0},
            op_rows(("aten::conv2d", 50.0), ("aten::copy_", 20.0), ("aten::relu", 30.0)),
        ),
        "torch_compile",
        "channels_last",
    ),
    (
        "torch_flops",
        ("torch_ops",),
        torch_profile({"torch__arithmetic_intensity": 100.0, "torch__op_count": 2.0}, []),
        "torch_compile",
        "keep",
    ),
    (
        "torch_launch",
        ("torch_memory",),
        torch_profile({"torch__launch_overhead_share": 0.8}, []),
        "torch_compile",
        "cuda_graph",
    ),
]


@pytest.mark.parametrize("group, base, profile, before, after", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_each_torch_group_changes_a_decision(group, base, profile, before, after):
    rows = profile.kernels or op_rows(("aten::add", 10.0))
    profile = Profile(profile.task_hash, "torch", profile.groups, profile.metrics, rows, device="cpu")
    rewriter = PlaybookRewriter()
    assert rewriter.decide(profile.restrict(base))[0] == before
    assert rewriter.decide(profile.restrict((*base, group)))[0] == after


def test_torch_cases_cover_every_torch_group():
    assert sorted(c[0] for c in TORCH_CASES) == sorted(TORCH_GROUPS)


# ------------------------------------------------------------------------------------------------
# Tolerance gating, the fp32-convolution guard, attention
# ------------------------------------------------------------------------------------------------
def test_reduced_precision_only_where_the_tolerance_allows():
    """fp32 GEMM work: tf32/fp16/bf16 by tolerance tier; at the fp32 default 1e-4 none of them."""
    off_tensor_cores = ncu({TENSOR_SHARE: 0.0}, kernels((GEMM, 1000))).restrict(["tensor_cores"])
    assert PlaybookRewriter().decide(off_tensor_cores)[0] == "torch_compile"
    assert PlaybookRewriter(tolerance=1e-2).decide(off_tensor_cores)[0] == "tf32"
    fp32_math = {FLOPS: 1e9, FFMA: 4e8, FADD: 1e8, FMUL: 1e8}
    ridge = ncu({INTENSITY: 20.0, **fp32_math}, kernels((GEMM, 1000))).restrict(["flops"])
    assert PlaybookRewriter().decide(ridge)[0] == "torch_compile"
    assert PlaybookRewriter(tolerance=1e-2).decide(ridge)[0] == "autocast_fp16"
    assert PlaybookRewriter(tolerance=1e-1).decide(ridge)[0] == "autocast_bf16"
    compute_bound = ncu({INTENSITY: 300.0, **fp32_math}, kernels((GEMM, 1000))).restrict(["flops"])
    assert PlaybookRewriter().decide(compute_bound)[0] == "keep"
    assert PlaybookRewriter(tolerance=1e-2).decide(compute_bound)[0] == "tf32"
    assert PlaybookRewriter(tolerance=1e-2).identity == "playbook-v1[tolerance=0.01]"


def test_fp32_convolutions_veto_algorithm_changing_actions():
    """Layout transposes around an fp32 conv: channels_last is vetoed (TF32 re-rounding) and the default
    too (keep); allowed at a TF32 tolerance; a half-precision conv takes it at the default."""
    metrics = {DRAM_READ: 1e9, L2_HIT: 70.0}
    fp32 = ncu(metrics, kernels((LAYOUT, 60), (FP32_CONV, 800), (LAYOUT, 60))).restrict(["memory"])
    action, reason = PlaybookRewriter().decide(fp32)
    assert action == "keep" and "vetoed: conv_layout_transposes" in reason
    assert PlaybookRewriter(tolerance=1e-2).decide(fp32)[0] == "channels_last"
    half = ncu(metrics, kernels((LAYOUT, 60), (HALF_CONV, 800), (LAYOUT, 60))).restrict(["memory"])
    assert PlaybookRewriter().decide(half)[0] == "channels_last"
    assert PlaybookRewriter().decide(None)[0] == "torch_compile"  # blind: no kernel table, no guard


def test_explicit_attention_kernel_sequence_picks_sdpa():
    rows = kernels((GEMM, 300), (POINTWISE, 150), (SOFTMAX, 250), (GEMM, 300))
    for row in rows:
        row[DRAM] = 20.0 if "gemm" in row["name"] else 80.0
    attention = ncu({DRAM: 50.0}, rows)
    action, reason = PlaybookRewriter().decide(attention.restrict(["memory"]))
    assert action == "sdpa" and reason.startswith("materialized_attention:")
    assert PlaybookRewriter().decide(attention.restrict(["cache"]))[0] != "sdpa"


def test_rule_tables_in_the_docstring_match_the_rules():
    import re

    from autoprofiler.rewriters import playbook

    documented = re.findall(r"^(\w+)\s+(\w+)\s+\[", playbook.__doc__, re.MULTILINE)
    assert documented == [(r.name, r.action) for r in playbook.RULES]


def test_rule_tables_in_the_docs_match_the_rules():
    import re

    from autoprofiler.rewriters import playbook

    text = (REPO / "docs" / "rewriters.md").read_text()
    documented = re.findall(r"^(\w+)\s+(\w+)\s+\[", text, re.MULTILINE)
    assert documented == [(r.name, r.action) for r in playbook.RULES]


def test_protocol_identity_and_registration():
    rewriter = make_rewriter("playbook")
    assert isinstance(rewriter, ActionRewriter) and rewriter.identity == "playbook-v1"
    assert rewriter.actions_identity == "rule-v1" and rewriter.actions()[:5] == list(RULE_ACTIONS)
    assert len(rewriter.actions()) >= 12 and set(rewriter.actions()) == set(ACTIONS)
    assert rewriter.for_action("sdpa").identity == "rule-v1"
    with pytest.raises(ValueError, match="action must be one of"):
        rewriter.for_action("fp8")
    with pytest.raises(ValueError, match="tolerance: expected a number > 0"):
        PlaybookRewriter(tolerance=0)


# ------------------------------------------------------------------------------------------------
# Candidate sources
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("rel", ["l1/conv2d", "l2/attention_naive", "l3/transformer_block_bf16"])
def test_every_catalog_action_source_compiles(action, rel):
    source = build_source(suite_task(rel).source, action)
    compile(source, f"<{rel}:{action}>", "exec")
    assert "class ModelNew(nn.Module)" in source and f"action {action!r}" in source
    assert "class Model(" not in source


@needs_h200
def test_rule_v1_builders_reproduce_the_recorded_candidates():
    """The recording's action rows are keyed by rule-v1: its five builders must still write the same code."""
    from autoprofiler.tables import RewardTable
    from autoprofiler.tasks import content_hash, load_tasks

    tasks = {t.hash: t for t in load_tasks(SUITE).tasks}
    rows = [r for r in RewardTable(H200 / "rewards").rows() if r.kind == "action"]
    assert len(rows) >= 200
    for row in rows:
        assert content_hash(build_source(tasks[row.task_hash].source, row.action)) == row.candidate_hash


def test_sdpa_substitution_of_the_suite_attention_patterns():
    """The three explicit attentions of the suite are recognized (the causal one as is_causal)."""
    from autoprofiler.rewriters.actions import rename_model

    for rel, causal in [
        ("l2/attention_naive", False),
        ("l3/attention_block", False),
        ("l3/transformer_block_bf16", True),
    ]:
        new, count = substitute_attention(rename_model(suite_task(rel).source))
        assert count == 1 and SDPA in new and ("is_causal=True" in new) == causal
        assert "torch.softmax" not in new
    plain = build_source(suite_task("l2/matmul_bias_softmax").source, "sdpa")
    assert "no explicit attention pattern recognized" in plain and SDPA not in plain


@pytest.mark.parametrize(
    "body, replaced",
    [
        ("s = q @ k.transpose(-2, -1) / 8\n    return s.softmax(-1) @ v", True),
        ("return torch.matmul(F.softmax(q @ k.mT, dim=-1), v)", True),
        ("p = torch.softmax(q @ k.transpose(-1, -2) * 0.1, dim=-1)\n    return p @ v", True),
        # the scores are used twice: the materialization is needed
        ("s = q @ k.transpose(-2, -1)\n    return torch.softmax(s, dim=-1) @ v + s.sum()", False),
        # softmax over another dimension is not attention
        ("return torch.softmax(q @ k.transpose(-2, -1), dim=1) @ v", False),
        # not the last two dimensions
        ("return torch.softmax(q @ k.transpose(0, 1), dim=-1) @ v", False),
        # masked with a finite value
        ("s = (q @ k.mT).masked_fill(m, -1e4)\n    return torch.softmax(s, dim=-1) @ v", False),
        # assigned inside a branch: straight-line order is not known
        ("if q.shape[0]:\n        s = q @ k.mT\n    return torch.softmax(s, dim=-1) @ v", False),
    ],
)
def test_sdpa_substitution_accepts_only_the_exact_pattern(body, replaced):
    source = f"def f(q, k, v, m):\n    {body}\n"
    new, count = substitute_attention(source)
    assert (count == 1) == replaced and (new != source) == replaced
    compile(new, "<sdpa>", "exec")


def test_sdpa_general_mask_becomes_attn_mask():
    source = (
        "def f(q, k, v, m):\n    s = (q @ k.mT).masked_fill(m, float('-inf'))\n    return s.softmax(-1) @ v\n"
    )
    new, count = substitute_attention(source)
    assert count == 1 and "attn_mask=torch.logical_not(m)" in new and "is_causal" not in new


# ------------------------------------------------------------------------------------------------
# Candidates through the real evaluator (CPU, small sizes)
# ------------------------------------------------------------------------------------------------
# Non-compiling actions where they apply, and where they do not (sdpa without attention, autocast of a
# bf16 task, cudnn.benchmark without a conv: the plain forward). Reduced precision is evaluated at the
# loose tolerance it would be chosen for.
CPU_CASES = [
    ("l2/conv_bn_relu", "cudnn_benchmark", None),
    ("l1/relu", "cudnn_benchmark", None),
    ("l2/attention_naive", "sdpa", None),
    ("l3/attention_block", "sdpa", None),
    ("l3/transformer_block_bf16", "sdpa", None),
    ("l1/relu", "sdpa", None),
    ("l1/matmul_square", "autocast_fp16", 5e-2),
    ("l3/mlp_block", "autocast_bf16", 1e-1),
    ("l1/gelu_bf16", "autocast_fp16", None),
]


@pytest.fixture(scope="module")
def cpu_evaluator():
    from autoprofiler.evaluation import EvalConfig, Evaluator

    config = EvalConfig(device="cpu", task_size="small", correctness_trials=2, timing_trials=5, warmup=1)
    with Evaluator(config, spares=2) as evaluator:
        yield evaluator


@pytest.mark.parametrize("rel, action, tolerance", CPU_CASES)
def test_actions_pass_the_evaluator_on_cpu(cpu_evaluator, rel, action, tolerance):
    import dataclasses

    task = suite_task(rel)
    config = dataclasses.replace(cpu_evaluator.config, atol=tolerance, rtol=tolerance) if tolerance else None
    result = cpu_evaluator.evaluate(task, PlaybookRewriter().source_for(task, action), config=config)
    assert result.correct, f"{rel} {action}: {result.error_kind}: {result.error}"


#: The compiling actions, each on a task it applies to: inductor builds C++ in a cold cache for every
#: candidate (about 19 s each on 2 CPUs), so the four evaluate two at a time.
COMPILING_CASES = [
    ("l1/relu", "compile_max_autotune"),
    ("l1/relu", "compile_cudagraphs"),
    ("l1/relu", "compile_coordinate_descent"),
    ("l2/conv_bn_relu", "channels_last_compile"),
]


@pytest.mark.slow
def test_compiling_actions_pass_the_evaluator_on_cpu(cpu_evaluator):
    from concurrent.futures import ThreadPoolExecutor

    def evaluate(case):
        task = suite_task(case[0])
        return cpu_evaluator.evaluate(task, PlaybookRewriter().source_for(task, case[1]))

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(COMPILING_CASES, pool.map(evaluate, COMPILING_CASES), strict=True))
    failed = {case: f"{r.error_kind}: {r.error}" for case, r in results.items() if not r.correct}
    assert not failed, failed


# ------------------------------------------------------------------------------------------------
# Replay: the protocol round-trips through derive_configuration_rows
# ------------------------------------------------------------------------------------------------
@needs_h200
def test_playbook_replays_from_the_recording(tmp_path):
    """Configuration rows derive from the rule-v1 action rows where the playbook picks a recorded action;
    a choice of a new action is missing, named, never invented."""
    from autoprofiler.environments import ReplayEnvironment, derive_configuration_rows
    from autoprofiler.profiling import CONFIGURATIONS
    from autoprofiler.tables import RewardTable

    rewriter = PlaybookRewriter()
    env = ReplayEnvironment.from_dir(H200, rewriter=rewriter, source="ncu")
    tasks = [suite_task(rel) for rel in ("l1/transpose_copy", "l2/gemm_sigmoid_sum")]
    configs = {name: CONFIGURATIONS[name] for name in ("memory", "compute")}
    into = RewardTable(tmp_path / "rewards")
    result = derive_configuration_rows(env, tasks, configs, into)
    rows = {(r.task_hash, r.configuration): r for r in RewardTable(tmp_path / "rewards").rows()}
    transpose = rows[(tasks[0].hash, "cache+memory+speed_of_light")]
    assert transpose.rewriter == "playbook-v1" and transpose.action == "torch_compile" and transpose.correct
    assert [m["configuration"] for m in result["missing"]] == ["compute"]  # compile_max_autotune: no row yet
    assert "compile_max_autotune" in result["missing"][0]["error"]
    assert result["written"] == 3


@needs_h200
def test_experience_fits_on_the_tuning_split_and_replays(tmp_path):
    from autoprofiler.environments import ReplayEnvironment, derive_configuration_rows
    from autoprofiler.profiling import CONFIGURATIONS
    from autoprofiler.tables import RewardTable

    rewriter = make_rewriter("experience", recording=str(H200))
    assert rewriter.experience and all(is_tuning_task(e.task_hash) for e in rewriter.experience)
    assert set(rewriter.actions()) == set(RULE_ACTIONS)
    env = ReplayEnvironment.from_dir(H200, rewriter=rewriter, source="ncu")
    held_out = [suite_task(rel) for rel in ("l1/relu", "l2/linear_gelu")]
    assert not any(is_tuning_task(t.hash) for t in held_out)
    configs = {name: CONFIGURATIONS[name] for name in ("memory", "latency")}
    result = derive_configuration_rows(env, held_out, configs, RewardTable(tmp_path / "rewards"))
    assert result == {"written": 4, "missing": []}


def test_experience_fits_on_several_recordings_with_a_training_filter():
    """Two recordings read together: the training tasks of both, and only those ``train`` keeps."""
    h100 = REPO / "datasets" / "recorded" / "h100"
    one = ExperienceRewriter.from_recording(H200, train=lambda h: True)
    both = ExperienceRewriter.from_recording([H200, h100], train=lambda h: True)
    other = ExperienceRewriter.from_recording(h100, train=lambda h: True)
    assert len(both.experience) == len(one.experience) + len(other.experience)
    keep = {e.task_hash for e in both.experience[::2]}
    some = ExperienceRewriter.from_recording([H200, h100], train=keep.__contains__)
    assert {e.task_hash for e in some.experience} == keep and some.identity != both.identity
    common = ExperienceRewriter.from_recording([H200, h100], train=lambda h: True, common_actions_only=True)
    assert common.actions() == both.common_actions()
    assert common.identity == both.with_actions(both.common_actions()).identity
    with pytest.raises(FileNotFoundError, match="profiles/"):
        ExperienceRewriter.from_recording([H200, REPO / "datasets" / "suite"])


def test_experience_leaves_out_a_task_still_being_recorded(tmp_path):
    """A training task with rows for only some rule actions (a recording stopped mid-task) is not
    fitted on, so the actions every fitted task has stay the five rule actions; fitted on, it would have
    narrowed them to its own."""
    import shutil

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    copy = tmp_path / "h200"
    shutil.copytree(H200, copy)
    whole = ExperienceRewriter.from_recording(copy, train=lambda h: True, common_actions_only=True)
    assert set(RULE_ACTIONS) <= set(whole.actions())
    victim = whole.experience[0].task_hash
    for part in sorted((copy / "rewards").rglob("*.parquet")):
        table = pq.read_table(part)
        gone = pc.and_(pc.equal(table["task_hash"], victim), pc.not_equal(table["action"], "torch_compile"))
        pq.write_table(table.filter(pc.invert(pc.fill_null(gone, False))), part)
    fitted = ExperienceRewriter.from_recording(copy, train=lambda h: True, common_actions_only=True)
    assert victim not in {e.task_hash for e in fitted.experience}
    assert len(fitted.experience) == len(whole.experience) - 1 and fitted.actions() == whole.actions()
    for e in fitted.experience:
        assert set(RULE_ACTIONS) <= set(e.outcomes)


# ------------------------------------------------------------------------------------------------
# ExperienceRewriter on hand-made experience
# ------------------------------------------------------------------------------------------------
def _experience(task_hash: str, metrics: dict, outcomes: dict) -> Experience:
    groups = frozenset({"memory", "stalls"})
    return Experience(
        task_hash,
        f"t/{task_hash}",
        Profile(task_hash, "ncu", groups, metrics, kernels((POINTWISE, 10))),
        outcomes,
    )


def test_experience_similarity_uses_only_the_shown_groups():
    """Task a and b differ in their memory metric, b and c in their stalls metric: shown memory, the
    probe is nearest a; shown stalls, nearest c, whose best actions differ."""
    lat = stall("long_scoreboard")
    train = [
        _experience("a", {LOAD_BYTES_PER_SECTOR: 4.0, lat: 50.0}, {"keep": 1.0, "torch_compile": 3.0}),
        _experience("b", {LOAD_BYTES_PER_SECTOR: 32.0, lat: 50.0}, {"keep": 1.0, "torch_compile": 0.5}),
        _experience("c", {LOAD_BYTES_PER_SECTOR: 32.0, lat: 1.0}, {"keep": 1.2, "torch_compile": 0.9}),
    ]
    rewriter = ExperienceRewriter(train, k=1)
    probe = Profile(
        "p",
        "ncu",
        frozenset({"memory", "stalls"}),
        {LOAD_BYTES_PER_SECTOR: 5.0, lat: 2.0},
        kernels((POINTWISE, 10)),
    )
    assert rewriter.decide(probe.restrict(["memory"]))[0] == "torch_compile"
    action, reason = rewriter.decide(probe.restrict(["stalls"]))
    assert action == "keep" and "t/c" in reason
    # blind: the best geomean over all three, torch_compile (1.35 ** (1/3) = 1.105) over keep (1.063)
    blind, why = rewriter.decide(None)
    assert blind == "torch_compile" and why.startswith("blind") and f"{1.35 ** (1 / 3):.2f}x" in why


def test_experience_leave_one_out_keeps_a_training_task_out_of_its_own_neighbours():
    """Shown training task a's own profile: a is its nearest neighbour (torch_compile, in-sample) unless
    leave_one_out, which takes the next nearest, b (keep); identities differ; another task is unaffected."""
    train = [
        _experience("a", {LOAD_BYTES_PER_SECTOR: 4.0}, {"keep": 1.0, "torch_compile": 3.0}),
        _experience("b", {LOAD_BYTES_PER_SECTOR: 6.0}, {"keep": 1.1, "torch_compile": 0.5}),
        _experience("c", {LOAD_BYTES_PER_SECTOR: 64.0}, {"keep": 1.0, "torch_compile": 2.0}),
    ]
    plain, loo = ExperienceRewriter(train, k=1), ExperienceRewriter(train, k=1, leave_one_out=True)
    own = train[0].profile.restrict(["memory"])
    assert plain.decide(own)[0] == "torch_compile"
    action, reason = loo.decide(own)
    assert action == "keep" and "t/b" in reason and "t/a" not in reason
    assert loo.identity == plain.identity[:-1] + ",loo]"
    other = Profile("z", "ncu", frozenset({"memory"}), {LOAD_BYTES_PER_SECTOR: 4.5}, kernels((POINTWISE, 10)))
    assert plain.decide(other) == loo.decide(other)


def test_experience_identity_names_k_and_the_training_set():
    train = [_experience("a", {LOAD_BYTES_PER_SECTOR: 4.0}, {"keep": 1.0})]
    other = [_experience("b", {LOAD_BYTES_PER_SECTOR: 4.0}, {"keep": 1.0})]
    assert ExperienceRewriter(train).identity != ExperienceRewriter(other).identity
    assert ExperienceRewriter(train, k=1).identity != ExperienceRewriter(train, k=3).identity
    with pytest.raises(ValueError, match="at least one training task"):
        ExperienceRewriter([])
    with pytest.raises(ValueError, match="outside the catalog"):
        ExperienceRewriter([_experience("a", {}, {"fp8": 2.0})])


def test_experience_with_common_actions_never_chooses_an_action_some_tasks_lack():
    """Two training tasks near the probe record compile_max_autotune (best there), a third does not: fitted
    on everything, the probe gets compile_max_autotune, which a replay of a task without that row cannot
    answer; restricted to the actions every task has, it gets torch_compile, and the identity says so."""
    train = [
        _experience(
            "a",
            {LOAD_BYTES_PER_SECTOR: 4.0},
            {"keep": 1.0, "torch_compile": 1.5, "compile_max_autotune": 3.0},
        ),
        _experience(
            "b",
            {LOAD_BYTES_PER_SECTOR: 5.0},
            {"keep": 1.0, "torch_compile": 1.2, "compile_max_autotune": 2.0},
        ),
        _experience("c", {LOAD_BYTES_PER_SECTOR: 64.0}, {"keep": 1.0, "torch_compile": 0.8}),
    ]
    every = ExperienceRewriter(train, k=2)
    assert set(every.actions()) == {"keep", "torch_compile", "compile_max_autotune"}
    assert every.common_actions() == [a for a in every.actions() if a != "compile_max_autotune"]
    probe = Profile("p", "ncu", frozenset({"memory"}), {LOAD_BYTES_PER_SECTOR: 4.5}, kernels((POINTWISE, 10)))
    assert every.decide(probe)[0] == "compile_max_autotune"
    common = every.with_actions(every.common_actions())
    assert common.decide(probe)[0] == "torch_compile" and common.decide(None)[0] == "torch_compile"
    assert common.identity != every.identity and common.identity.endswith(",actions=2]")
    assert common.k == every.k and common.leave_one_out == every.leave_one_out
    with pytest.raises(ValueError, match="outside the catalog"):
        every.with_actions(["keep", "fp8"])
    with pytest.raises(ValueError, match="no training task has an outcome"):
        every.with_actions(["sdpa"])


def test_split_is_a_third_by_hash():
    hashes = [f"{i:016x}" for i in range(300)]
    tuning, held_out = split_hashes(hashes)
    assert 70 <= len(tuning) <= 130 and len(tuning) + len(held_out) == 300
    assert split_hashes(hashes) == (tuning, held_out)


# ------------------------------------------------------------------------------------------------
# The reachability report on a small slice
# ------------------------------------------------------------------------------------------------
@needs_h200
def test_reachability_report_on_two_tasks(tmp_path):
    import json

    module = load_script(REPO / "bench" / "rewriter_reachability.py", "reach")
    assert module.main([str(H200), "--out", str(tmp_path / "reach"), "--limit", "2"]) == 0
    data = json.loads((tmp_path / "reach.json").read_text())
    assert data["meta"]["tasks"] == 2 and data["meta"]["subsets"] == 1024
    by_name = {r["rewriter"]: r for r in data["results"]}
    assert set(by_name) == {"rule-v2", "playbook-v1", "playbook-v1 (tolerance 1e-2)", "experience-v1"}
    for r in data["results"]:
        assert sum(r["reachable_distribution"].values()) == 2
        assert sum(r["action_counts"].values()) == 2 * 1024
    assert "## Group influence" in (tmp_path / "reach.md").read_text()


def test_recording_script_adds_action_rows_and_resumes(tmp_path):
    """bench/h200_record_playbook.py on CPU (small sizes): one task, two new actions -> two keyed action
    rows (rewriter rule-v1); a second call evaluates nothing; a bad action name fails before any work."""
    from autoprofiler.tables import RewardTable

    module = _record_module()
    args = [
        "--recording",
        str(tmp_path / "rec"),
        "--device",
        "cpu",
        "--task-size",
        "small",
        "--source",
        "torch",
    ]
    args += [
        "--filter",
        "l1/relu",
        "--actions",
        "sdpa,cudnn_benchmark",
        "--jobs",
        "1",
        "--timing-trials",
        "3",
    ]
    args += ["--warmup", "1", "--correctness-trials", "1"]
    assert module.main(args) == 0
    rows = RewardTable(tmp_path / "rec" / "rewards").rows()
    assert sorted((r.action, r.rewriter, r.kind, r.correct) for r in rows) == [
        ("cudnn_benchmark", "rule-v1", "action", True),
        ("sdpa", "rule-v1", "action", True),
    ]
    assert module.main(args) == 0
    assert len(RewardTable(tmp_path / "rec" / "rewards").rows()) == 2
    assert module.main(["--actions", "fp8"]) == 2


def _record_module():
    return load_script(REPO / "bench" / "h200_record_playbook.py", "record")


def _reach_report(path, per_task: dict[str, list[str]], rewriter: str = "playbook-v1"):
    import json

    tasks = [{"task": t, "reachable": a} for t, a in per_task.items()]
    path.write_text(json.dumps({"meta": {}, "results": [{"rewriter": rewriter, "per_task": tasks}]}))
    return path


def test_plan_cells_keeps_only_reachable_actions_grouped_by_need():
    plan = _record_module().plan_cells
    reach = {"a": {"keep", "sdpa", "compile_max_autotune"}, "b": {"torch_compile"}, "c": {"sdpa"}}
    cells = plan(["a", "b", "c", "d"], ["sdpa", "compile_max_autotune"], reach)
    assert cells == {("sdpa", "compile_max_autotune"): ["a"], ("sdpa",): ["c"]}
    assert plan(["a", "b"], ["sdpa"], None) == {("sdpa",): ["a", "b"]}


def test_recording_script_evaluates_only_reachable_cells(tmp_path, capsys):
    """With --reachable, a task gets only the listed actions its report entry reaches: here relu reaches
    cudnn_benchmark, not sdpa, so one row; a task the report reaches nothing new for gets none, and a
    task the report does not list (recorded after it) gets none with a note that says so."""
    from autoprofiler.tables import RewardTable

    module = _record_module()
    report = _reach_report(
        tmp_path / "reach.json",
        {"suite/l1/relu": ["keep", "cudnn_benchmark"], "suite/l1/tiny_add": ["torch_compile"]},
    )
    args = ["--recording", str(tmp_path / "rec"), "--device", "cpu", "--task-size", "small"]
    args += ["--source", "torch", "--filter", "l1/relu,l1/tiny_add,l1/sum_rows"]
    args += ["--actions", "sdpa,cudnn_benchmark"]
    args += ["--jobs", "1", "--timing-trials", "3", "--warmup", "1", "--correctness-trials", "1"]
    assert module.main(args + ["--reachable", str(report)]) == 0
    rows = RewardTable(tmp_path / "rec" / "rewards").rows()
    assert [(r.task_id, r.action) for r in rows] == [("suite/l1/relu", "cudnn_benchmark")]
    assert "note: 1 of 3 tasks (first: suite/l1/sum_rows) are not in" in capsys.readouterr().out


def test_recording_script_rejects_a_bad_reachability_report(tmp_path, capsys):
    module = _record_module()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert module.main(["--reachable", str(bad)]) == 2
    assert "is not a rewriter_reachability.py report" in capsys.readouterr().err
    report = _reach_report(tmp_path / "reach.json", {"x": ["keep"]}, rewriter="rule-v2")
    assert module.main(["--reachable", str(report)]) == 2
    assert "'playbook-v1' is not in" in capsys.readouterr().err
