"""Rewriters: code extraction, LLMRewriter over a loopback server, RuleRewriter decisions and candidates.

CPU: ``python -m pytest tests/test_rewriters.py -m "not slow"`` (about 30 s on 2 CPUs). The sweep of every
rule action over suite tasks (on CPU and on CUDA) is ``workflows/rule_sweep.py``, tested in
``tests/test_workflows.py``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from conftest import load_tiny_task
from openai_server import OpenAIServer, malformed, ok, rate_limited, server_error, slow

from autoprofiler.profiling.profile import Profile, render_profile
from autoprofiler.rewriters import (
    NO_CODE_ERROR,
    ExtractionError,
    LLMRewriter,
    Rewrite,
    RuleRewriter,
    extract_code,
)
from autoprofiler.rewriters.llm import NO_PROFILE_TEXT
from autoprofiler.rewriters.rule import (
    DRAM,
    DRAM_READ,
    DURATION,
    FMA_PIPE,
    INTENSITY,
    KERNELS,
    LAUNCH_SHARE,
    LOAD_BYTES_PER_SECTOR,
    SM,
    TENSOR_SHARE,
    WAVES,
    build_source,
    rename_model,
)
from autoprofiler.tasks import Task, load_task_file

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "datasets" / "suite"
LOAD_BPS = LOAD_BYTES_PER_SECTOR
NCU_REFERENCE = Path(os.environ.get("AUTOPROFILER_NCU_REFERENCE", "/work/shared/reference/ncu-h200"))

GOOD = "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
ANSWER = f"Here is the faster version.\n```python\nimport torch.nn as nn\n\n{GOOD}```\nIt fuses nothing."


def suite_task(rel: str) -> Task:
    return load_task_file(SUITE / f"{rel}.py")


def ncu_profile(metrics: dict, kernels=(), groups=("root",)) -> Profile:
    return Profile("h", "ncu", frozenset(groups), dict(metrics), list(kernels), device="NVIDIA H200")


def torch_profile(metrics: dict, kernels=(), groups=("torch_root",)) -> Profile:
    return Profile("h", "torch", frozenset(groups), dict(metrics), list(kernels), device="cpu")


# ------------------------------------------------------------------------------------------------
# extract_code
# ------------------------------------------------------------------------------------------------
def test_extract_single_block_with_prose():
    """Prose around one fenced block: the block's code."""
    assert extract_code(ANSWER) == f"import torch.nn as nn\n\n{GOOD}"


def test_extract_takes_last_block_defining_modelnew():
    """Several blocks: helpers and usage blocks are skipped; of two ModelNew blocks the last wins."""
    answer = (
        "First try:\n```python\nclass ModelNew:\n    v = 1\n```\nUsage:\n```python\nm = ModelNew()\n```\n"
        "Better:\n```py\nclass ModelNew:\n    v = 2\n```\n```bash\npip install x\n```\n"
    )
    assert extract_code(answer) == "class ModelNew:\n    v = 2\n"


def test_extract_accepts_bare_code():
    """No fence, but the whole answer is Python defining ModelNew: accepted."""
    assert extract_code("\n\nimport torch\n" + GOOD + "\n") == "import torch\n" + GOOD


@pytest.mark.parametrize(
    "answer, detail",
    [
        ("I cannot help with that.", "no class ModelNew in the text"),
        ("Sure! class ModelNew(nn.Module): uses a fused kernel, see above.", "is not Python"),
        ("```python\nclass Model(nn.Module):\n    pass\n```", "1 code block(s), none defines class ModelNew"),
        ("", "the answer is empty"),
        ("<think>```python\nclass ModelNew: pass\n```</think>All done.", "no class ModelNew in the text"),
    ],
)
def test_extract_errors_name_what_was_found(answer, detail):
    """Prose only, prose with inline code, blocks without ModelNew, empty, code only inside <think>."""
    with pytest.raises(ExtractionError) as info:
        extract_code(answer)
    assert str(info.value).startswith(NO_CODE_ERROR) and detail in str(info.value)


def test_extract_unterminated_block_and_think():
    """An answer cut off mid-block still yields its code; reasoning in <think> is ignored."""
    answer = (
        "<think>maybe ```python\nclass ModelNew: old\n```</think>\n```python\nclass ModelNew:\n    pass\n"
    )
    assert extract_code(answer) == "class ModelNew:\n    pass\n"


def test_extract_crlf_and_indented_block():
    """CRLF line endings and a fence indented inside a Markdown list still give clean code."""
    assert extract_code("Steps:\r\n```python\r\nclass ModelNew:\r\n    pass\r\n```\r\n") == (
        "class ModelNew:\n    pass\n"
    )
    assert extract_code("1. Code:\n   ```python\n   class ModelNew:\n       pass\n   ```\n") == (
        "class ModelNew:\n    pass\n"
    )


# ------------------------------------------------------------------------------------------------
# LLMRewriter over the loopback server
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def server():
    pytest.importorskip("openai")
    with OpenAIServer() as s:
        yield s


def make_rewriter(server, **kw) -> LLMRewriter:
    options = dict(model="test-model", api_key="k", timeout_s=2.0, max_retries=2, backoff_base_s=0.01)
    options.update(kw)
    return LLMRewriter(base_url=server.base_url, gpu_name="NVIDIA H200", **options)


ROOT_PROFILE = ncu_profile({SM: 81.5, DRAM: 12.25, DURATION: 176416.0, KERNELS: 1.0})


def test_llm_happy_path_prompt_and_tokens(server, tiny_task):
    """The prompt holds the task source, GPU name, rendered profile and the ModelNew instruction."""
    server.script(ok(ANSWER))
    rewrite = make_rewriter(server).rewrite(tiny_task, ROOT_PROFILE)
    assert rewrite.ok and rewrite.source == f"import torch.nn as nn\n\n{GOOD}"
    assert (rewrite.llm_calls, rewrite.attempts, rewrite.raw, rewrite.action) == (1, 1, ANSWER, "")
    request = server.requests[0]
    user, system = request.content("user"), request.content("system")
    assert tiny_task.source.strip() in user
    assert render_profile(ROOT_PROFILE).strip() in user
    assert "Target GPU: NVIDIA H200" in user and "load_inline" in user
    assert "ModelNew" in system and "exactly one fenced code block" in system
    assert rewrite.prompt_tokens == len(user.split()) + len(system.split()) > 100
    assert rewrite.completion_tokens == len(ANSWER.split())
    assert (request.body["temperature"], request.body["seed"]) == (0.0, 0)


def test_llm_blind_and_triton_prompt(server, tiny_task):
    """No profile: the prompt says so; target triton swaps the implementation instructions."""
    server.default = ok(ANSWER)
    make_rewriter(server, target="triton").rewrite(tiny_task, None)
    user = server.requests[0].content("user")
    assert NO_PROFILE_TEXT in user and "@triton.jit" in user and "load_inline" not in user


def test_llm_identity_tracks_settings(server):
    """identity names model, target, temperature and the prompt version; it is stable across instances."""
    a, b = make_rewriter(server), make_rewriter(server)
    assert a.identity == b.identity and a.identity.startswith("openai:test-model:cuda:t0:p")
    assert make_rewriter(server, target="triton").identity != a.identity
    assert make_rewriter(server, temperature=0.7).identity != a.identity
    with pytest.raises(ValueError, match="target must be one of"):
        make_rewriter(server, target="opencl")


def test_llm_429_then_success(server, tiny_task):
    """A 429 with Retry-After 0.2 s is waited out and retried: one call, two attempts, a source."""
    server.script(rate_limited(retry_after=0.2), ok(ANSWER))
    rewrite = make_rewriter(server).rewrite(tiny_task, ROOT_PROFILE)
    assert rewrite.ok and (rewrite.llm_calls, rewrite.attempts) == (1, 2)
    assert server.requests[1].arrived - server.requests[0].arrived >= 0.19


def test_llm_500_every_time_is_an_error_result(server, tiny_task):
    """500 on all 3 attempts: no exception, Rewrite(source=None) saying why; the call still counts."""
    server.default = server_error(500)
    rewrite = make_rewriter(server).rewrite(tiny_task, ROOT_PROFILE)
    assert rewrite.source is None and rewrite.error.startswith("llm server_error: HTTP 500")
    assert (rewrite.llm_calls, rewrite.attempts, len(server.requests)) == (1, 3, 3)


def test_llm_slow_is_a_timeout_result(server, tiny_task):
    """Slower than the timeout on every attempt: an error result naming the timeout."""
    server.default = slow(1.0)
    rewrite = make_rewriter(server, timeout_s=0.25, max_retries=1).rewrite(tiny_task, None)
    assert rewrite.source is None and rewrite.error.startswith("llm timeout: no answer within 0.25s")
    assert rewrite.attempts == 2


def test_llm_malformed_json_is_an_error_result(server, tiny_task):
    """A 200 with a truncated JSON body: an error result, not an exception."""
    server.script(malformed())
    rewrite = make_rewriter(server).rewrite(tiny_task, None)
    assert rewrite.source is None and rewrite.error.startswith("llm bad_response")


def test_llm_no_code_block_is_an_error_result(server, tiny_task):
    """Prose only: source None, the canonical error, the raw answer and its tokens kept."""
    server.script(ok("I would use shared memory tiling here."))
    rewrite = make_rewriter(server).rewrite(tiny_task, None)
    assert rewrite.source is None and rewrite.error.startswith(NO_CODE_ERROR)
    assert rewrite.raw == "I would use shared memory tiling here." and rewrite.completion_tokens == 7
    assert rewrite.llm_calls == 1


def test_llm_multiple_blocks(server, tiny_task):
    """Several blocks in the answer: the last one defining ModelNew."""
    server.script(
        ok("```python\nclass ModelNew: a = 1\n```\n```python\nclass ModelNew: a = 2\n```\n```\nx\n```")
    )
    assert make_rewriter(server).rewrite(tiny_task, None).source == "class ModelNew: a = 2\n"


def test_llm_cache_hit_is_free(server, tiny_task):
    """Two identical rewrites: one request; the second is 0 calls, 0 tokens, same source."""
    server.default = ok(ANSWER)
    rewriter = make_rewriter(server)
    first, second = rewriter.rewrite(tiny_task, ROOT_PROFILE), rewriter.rewrite(tiny_task, ROOT_PROFILE)
    assert len(server.requests) == 1 and first.source == second.source
    assert (second.llm_calls, second.prompt_tokens, second.completion_tokens, second.attempts) == (0, 0, 0, 0)
    rewriter.rewrite(tiny_task, None)  # another prompt: another request
    assert len(server.requests) == 2


def test_llm_concurrency_limit(server):
    """8 threads rewriting 8 tasks through one rewriter with limit 2: at most 2 requests in flight."""
    server.default = ok(ANSWER, delay_s=0.1)
    rewriter = make_rewriter(server, max_concurrency=2)
    tasks = [
        Task.from_source(f"t{i}", load_tiny_task("matmul").source + f"\n# variant {i}\n") for i in range(8)
    ]
    results: list[Rewrite] = []
    threads = [threading.Thread(target=lambda t=t: results.append(rewriter.rewrite(t, None))) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(server.requests) == 8 and all(r.ok for r in results)
    assert server.max_in_flight == 2


# ------------------------------------------------------------------------------------------------
# RuleRewriter: decisions
# ------------------------------------------------------------------------------------------------
CONV_KERNEL_ROWS = [
    {"name": "void cudnn::nchwToNhwcKernel<float, float, float, 0, 1, 2>", DURATION: 60_000.0},
    {"name": "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw", DURATION: 800_000.0},
    {"name": "void cudnn::nhwcToNchwKernel<float, float, float, 0, 1, 2>", DURATION: 60_000.0},
]


GEMM_ROWS = [
    {"name": "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128", DURATION: 900_000.0},
    {"name": "void at::vectorized_elementwise_kernel<4, at::GeluCUDAKernelImpl>", DURATION: 100_000.0},
]


@pytest.mark.parametrize(
    "metrics, kernels, groups, expected, rule",
    [
        (
            {LAUNCH_SHARE: 0.8, WAVES: 0.5, KERNELS: 6.0, SM: 5.0},
            (),
            ("speed_of_light", "occupancy"),
            "cuda_graph",
            "launch_bound_small_kernels",
        ),
        (
            {LAUNCH_SHARE: 0.9, WAVES: 0.1, KERNELS: 1.0},
            (),
            ("speed_of_light", "occupancy"),
            "keep",
            "single_small_launch",
        ),
        (
            {SM: 85.0, KERNELS: 2.0, FMA_PIPE: 70.0, DURATION: 1e6},
            GEMM_ROWS,
            ("root", "compute_pipes"),
            "keep",
            "compute_bound_library_kernel",
        ),
        (
            {SM: 70.0, DRAM: 30.0, KERNELS: 3.0, DURATION: 920_000.0, DRAM_READ: 1e9},
            CONV_KERNEL_ROWS,
            ("root", "memory"),
            "channels_last",
            "conv_layout_transposes",
        ),
        (
            {SM: 25.0, DRAM: 25.0, KERNELS: 1.0, LOAD_BPS: 4.0, DRAM_READ: 1e9},
            (),
            ("root", "memory"),
            "torch_compile",
            "uncoalesced_loads",
        ),
        (
            {SM: 30.0, DRAM: 70.0, KERNELS: 4.0, DURATION: 4e6, DRAM_READ: 1e9, LOAD_BPS: 32.0},
            (),
            ("root", "memory"),
            "torch_compile",
            "memory_bound_chain",
        ),
        (
            {SM: 30.0, DRAM: 85.0, KERNELS: 1.0, DURATION: 1e6, DRAM_READ: 1e9, LOAD_BPS: 32.0},
            (),
            ("root", "memory"),
            "keep",
            "single_kernel_at_bandwidth",
        ),
        ({INTENSITY: 0.5, KERNELS: 5.0}, (), ("root", "flops"), "torch_compile", "low_intensity_chain"),
        ({INTENSITY: 300.0, KERNELS: 1.0}, (), ("root", "flops"), "keep", "high_intensity_few_kernels"),
        # root or speed of light alone never concludes: what a rule needs lives in another group
        ({SM: 88.0, DRAM: 20.0, KERNELS: 1.0, DURATION: 2e6}, (), ("root",), "torch_compile", None),
        (
            {LAUNCH_SHARE: 0.9, SM: 1.0, DRAM: 1.0, KERNELS: 40.0},
            (),
            ("speed_of_light",),
            "torch_compile",
            None,
        ),
    ],
)
def test_ncu_decisions(metrics, kernels, groups, expected, rule):
    """Each ncu rule fires on a profile built to match it; a profile matching none gets the default."""
    action, reason = RuleRewriter().decide(ncu_profile(metrics, kernels, groups))
    assert action == expected
    assert reason.startswith(f"{rule}:") if rule else reason.startswith("no rule fired")


def test_tf32_only_when_the_tolerance_allows():
    """fp32 compute-bound with idle tensor cores: tf32 at tolerance 1e-2, not at the evaluator's 1e-4."""
    profile = ncu_profile(
        {SM: 80.0, TENSOR_SHARE: 0.0, KERNELS: 2.0, DURATION: 1e6, FMA_PIPE: 75.0},
        kernels=GEMM_ROWS,
        groups=("root", "compute_pipes", "tensor_cores"),
    )
    assert RuleRewriter(tolerance=1e-2).decide(profile)[0] == "tf32"
    assert RuleRewriter().decide(profile)[0] == "keep"
    assert RuleRewriter(tolerance=1e-2).identity == "rule-v2[tolerance=0.01]"
    assert RuleRewriter(tolerance=1e-2).actions_identity == "rule-v1"  # the candidates did not change


@pytest.mark.parametrize(
    "metrics, kernels, expected",
    [
        ({"torch__launch_overhead_share": 0.8}, (), "cuda_graph"),
        ({"torch__op_count": 12.0, "torch__mean_op_time_us": 4.0}, (), "cuda_graph"),
        ({"torch__elementwise_time_share": 0.6, "torch__matmul_time_share": 0.3}, (), "torch_compile"),
        ({"torch__matmul_time_share": 0.9, "torch__elementwise_time_share": 0.05}, (), "keep"),
        (
            {"torch__copy_time_share": 0.15},
            [
                {"name": "aten::mkldnn_convolution", "torch__self_time_us": 50.0},
                {"name": "aten::copy_", "torch__self_time_us": 10.0},
            ],
            "channels_last",
        ),
        ({"torch__wall_time_us": 100.0}, (), "torch_compile"),
    ],
)
def test_torch_decisions(metrics, kernels, expected):
    """The torch.profiler rules read torch__ features and operator rows."""
    assert RuleRewriter().decide(torch_profile(metrics, kernels))[0] == expected


def test_missing_metric_falls_to_default():
    """DRAM at 85% with one kernel says keep only when the load efficiency is shown too (memory group)."""
    with_memory = ncu_profile({DRAM: 85.0, KERNELS: 1.0, LOAD_BPS: 32.0}, groups=("root", "memory"))
    without = ncu_profile({DRAM: 85.0, KERNELS: 1.0})
    assert RuleRewriter().decide(with_memory)[0] == "keep"
    assert RuleRewriter().decide(without) == (
        "torch_compile",
        "no rule fired on the ncu profile (root): default action torch_compile",
    )
    assert RuleRewriter(default_action="keep").decide(without)[0] == "keep"
    assert RuleRewriter().decide(None)[0] == "torch_compile"


def test_metrics_of_the_other_source_are_ignored():
    """A torch profile carrying an ncu-named metric does not trigger an ncu rule."""
    assert RuleRewriter().decide(torch_profile({LAUNCH_SHARE: 0.9}))[0] == "torch_compile"


def test_what_is_shown_changes_the_action():
    """One task's full profile restricted to different groups gives different actions."""
    full = ncu_profile(
        {
            SM: 80.0,
            DRAM: 10.0,
            DURATION: 300_000.0,
            KERNELS: 3.0,
            LAUNCH_SHARE: 0.6,
            WAVES: 1.0,
            FMA_PIPE: 75.0,
            TENSOR_SHARE: 0.0,
        },
        kernels=[{**row, DURATION: row[DURATION] / 4} for row in GEMM_ROWS]
        + [{"name": "fill", DURATION: 1e3}],
        groups=("root", "speed_of_light", "occupancy", "compute_pipes", "tensor_cores"),
    )
    shown = {
        "root": ["root"],
        "latency": ["speed_of_light", "occupancy"],
        "compute": ["speed_of_light", "compute_pipes"],
        "tensor": ["speed_of_light", "tensor_cores"],
    }
    rule = RuleRewriter(tolerance=1e-2)
    decisions = {name: rule.decide(full.restrict(groups))[0] for name, groups in shown.items()}
    assert decisions == {
        "root": "torch_compile",
        "latency": "cuda_graph",
        "compute": "keep",
        "tensor": "tf32",
    }
    assert rule.decide(None)[0] == "torch_compile"


H200_RECORDING = Path(__file__).resolve().parents[1] / "datasets" / "h200_suite"


@pytest.mark.skipif(not (H200_RECORDING / "profiles").is_dir(), reason="no H200 recording in datasets/")
def test_decisions_on_the_recorded_h200_suite():
    """The recorded H200 profiles of suite tasks: each fixed configuration shows different groups, and the
    rule rewriter's choice follows what is shown (relu: keep only when memory is shown; a GEMM: keep when
    compute is shown; conv+bn+relu: a CUDA graph when latency is shown)."""
    from autoprofiler.environments import ReplayEnvironment
    from autoprofiler.profiling import CONFIGURATIONS

    env = ReplayEnvironment.from_dir(H200_RECORDING, rewriter=RuleRewriter(), source="ncu")
    rule = RuleRewriter()

    def choice(rel, config):
        return rule.decide(env.profiler.snapshot(suite_task(rel), CONFIGURATIONS[config]))[0]

    assert [choice("l1/relu", c) for c in ("memory", "latency", "compute")] == ["keep"] + [
        "torch_compile"
    ] * 2
    assert choice("l1/matmul_square", "compute") == "keep" and choice("l1/matmul_square", "memory") != "keep"
    assert choice("l2/conv_bn_relu", "latency") == "cuda_graph"
    assert choice("l2/conv_bn_relu", "compute") != "cuda_graph"


@pytest.mark.skipif(not NCU_REFERENCE.is_dir(), reason="shared ncu captures not present")
def test_decisions_on_real_h200_captures():
    """Real ncu captures: Linear+GELU (bf16, one nvjet GEMM at 87% SM) -> keep when compute_pipes is shown,
    the default when only the root or memory is; the 9-kernel mix concludes nothing from compute_pipes."""
    from autoprofiler.profiling.ncu import parse_ncu_csv
    from autoprofiler.profiling.profile import profile_from_kernels

    def load(name, groups):
        table = parse_ncu_csv((NCU_REFERENCE / name).read_text())
        return profile_from_kernels(
            "h", table.rows, groups, table.units, wall_us=None, passes=0, seconds=0.0, device="NVIDIA H200"
        )

    gelu = "torch_linear_gelu_compact42.csv"
    assert RuleRewriter().decide(load(gelu, ["root", "compute_pipes"]))[1].startswith("compute_bound_library")
    assert RuleRewriter().decide(load(gelu, ["root"]))[0] == "torch_compile"
    assert RuleRewriter().decide(load(gelu, ["memory"]))[0] == "torch_compile"
    mix = load("torch_mix_full_autounits.csv", ["root", "compute_pipes"])
    assert RuleRewriter().decide(mix)[1].startswith("no rule fired")


def test_decisions_on_real_torch_profiles():
    """torch.profiler on CPU (small sizes): a lone matmul -> keep; an elementwise chain -> torch_compile;
    either one shown only its memory group -> the default (no rule reads that group)."""
    from autoprofiler.profiling.profiler import Profiler

    tasks = [suite_task("l1/matmul_square"), suite_task("l2/swish_chain")]
    matmul, chain = Profiler(source="torch", device="cpu", task_size="small").collect_many(
        tasks, ["torch_root", "torch_memory"]
    )
    rule = RuleRewriter()
    assert rule.decide(matmul.restrict(["torch_root"]))[1].startswith("torch_single_library_op:")
    assert rule.decide(chain.restrict(["torch_root"]))[1].startswith("torch_elementwise_chain:")
    assert rule.decide(matmul.restrict(["torch_memory"]))[1].startswith("no rule fired")


def test_rule_table_in_docs_matches_rules():
    """The decision table in rule.py's docstring lists RULES' names and actions, in order."""
    import re

    from autoprofiler.rewriters import rule as rule_module

    table = re.findall(r"^(\w+)\s+(\w+)\s+\S.*$", rule_module.__doc__.split("fires when")[1], re.MULTILINE)
    documented = [(name, action) for name, action in table if name in {r.name for r in rule_module.RULES}]
    assert documented == [(r.name, r.action) for r in rule_module.RULES]


def test_make_rewriter_by_name(monkeypatch):
    """make_rewriter maps names to classes; unknown names list the known ones."""
    from autoprofiler.rewriters import make_rewriter

    assert make_rewriter("rule").identity == "rule-v2"
    monkeypatch.setenv("AUTOPROFILER_LLM_MODEL", "m")
    assert make_rewriter("openai", base_url="http://127.0.0.1:9/v1").identity.startswith("openai:m:cuda:")
    known = r"\['experience', 'openai', 'playbook', 'rule'\]"
    with pytest.raises(ValueError, match=rf"rewriter must be one of {known}"):
        make_rewriter("claude")


# ------------------------------------------------------------------------------------------------
# RuleRewriter: candidate sources
# ------------------------------------------------------------------------------------------------
def test_rename_model_tokens_only():
    """Model names are renamed (class, super, isinstance); strings, comments and nn.Module are not."""
    source = (
        "import torch.nn as nn\n# the Model\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super(Model, self).__init__()\n        self.tag = 'Model'\n"
        "def check(m):\n    return isinstance(m, Model)\n"
    )
    renamed = rename_model(source)
    assert "class _Original(nn.Module)" in renamed and "super(_Original, self)" in renamed
    assert "isinstance(m, _Original)" in renamed and "# the Model" in renamed and "'Model'" in renamed
    with pytest.raises(ValueError, match="expected a task source defining 'class Model'"):
        rename_model("class Other: pass\n")
    with pytest.raises(ValueError, match="already uses the name 'ModelNew'"):
        rename_model("class Model: pass\nclass ModelNew: pass\n")


@pytest.mark.parametrize("action", RuleRewriter.actions())
@pytest.mark.parametrize("rel", ["l1/conv2d", "l2/linear_gelu", "l3/resnet_basic_block"])
def test_every_action_source_compiles(action, rel):
    """Each action's candidate compiles, defines ModelNew and never names the reference Model."""
    task = suite_task(rel)
    source = RuleRewriter().source_for(task, action)
    compile(source, f"<{rel}:{action}>", "exec")
    assert "class ModelNew(nn.Module)" in source and "class _Original(" in source
    assert "class Model(" not in source and f"action {action!r}" in source


def test_rewrite_reports_action_and_reason():
    """rewrite() returns the chosen action, its reason in raw, no LLM cost; an uncopyable task is an error."""
    task = suite_task("l1/relu")
    shown = ncu_profile({LAUNCH_SHARE: 0.9, WAVES: 0.2, KERNELS: 8.0}, groups=("speed_of_light", "occupancy"))
    rewrite = RuleRewriter().rewrite(task, shown)
    assert (rewrite.action, rewrite.llm_calls, rewrite.error) == ("cuda_graph", 0, "")
    assert "launch_bound_small_kernels" in rewrite.raw and rewrite.source == build_source(
        task.source, "cuda_graph"
    )
    bad = RuleRewriter().rewrite(Task.from_source("x", "ModelNew = 1\nclass Model: pass\n"), None)
    assert bad.source is None and "already uses the name 'ModelNew'" in bad.error
    with pytest.raises(ValueError, match="action must be one of"):
        RuleRewriter().source_for(task, "half_precision")


# ------------------------------------------------------------------------------------------------
# RuleRewriter: candidates through the real evaluator
# ------------------------------------------------------------------------------------------------
# conv_bn_relu takes every action (channels_last converts its conv weight and input); two more tasks
# cover an MLP under cuda_graph and a plain elementwise op under channels_last (a no-op on 2-D input).
CPU_CASES = [("l2/conv_bn_relu", a) for a in ("keep", "cuda_graph", "tf32", "channels_last")] + [
    ("l3/mlp_block", "cuda_graph"),
    ("l1/relu", "channels_last"),
]


@pytest.fixture(scope="module")
def cpu_evaluator():
    from autoprofiler.evaluation import EvalConfig, Evaluator

    config = EvalConfig(device="cpu", task_size="small", correctness_trials=2, timing_trials=5, warmup=1)
    with Evaluator(config, spares=2) as evaluator:
        yield evaluator


@pytest.mark.parametrize("rel, action", CPU_CASES)
def test_actions_pass_the_evaluator_on_cpu(cpu_evaluator, rel, action):
    """On CPU every action but torch_compile runs the plain computation: correct on suite tasks."""
    task = suite_task(rel)
    result = cpu_evaluator.evaluate(task, RuleRewriter().source_for(task, action))
    assert result.correct, f"{rel} {action}: {result.error_kind}: {result.error}"


@pytest.mark.slow
def test_torch_compile_passes_the_evaluator_on_cpu(cpu_evaluator):
    """torch.compile on the tiniest task (about 45 s on 2 CPUs: inductor builds C++ in a cold cache)."""
    task = suite_task("l1/relu")
    result = cpu_evaluator.evaluate(task, RuleRewriter().source_for(task, "torch_compile"))
    assert result.correct, f"{result.error_kind}: {result.error}"
