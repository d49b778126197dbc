"""Candidate builders: a task's ``Model`` wrapped into a ``ModelNew`` that applies one torch-level action.

Every candidate is built the same way (``build_source``): the task source is copied with ``class Model``
renamed to ``_Original`` (every ``Model`` name token, so ``super(Model, self)`` follows), then

    class ModelNew(nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()
            self.inner = _Original(*args, **kwargs)   # same seed => same parameters as the reference
            ...                                        # the action

so the candidate never touches the evaluator's reference ``Model`` and has the same constructor
signature. Flags an action sets (TF32, cudnn.benchmark) are set for the call and restored. The catalog
(``ACTIONS``; the first five are ``RuleRewriter``'s, ``RULE_ACTIONS``):

========================== =====================================================================
action                     what the candidate does (and where it does nothing)
========================== =====================================================================
keep                       a copy of the original (never wrong, never faster)
torch_compile              ``torch.compile`` (inductor, ``compile_mode``, default ``"default"``): fuses
                           elementwise/reduction chains into generated kernels (C++ on CPU)
cuda_graph                 captures the forward into a CUDA graph with static input buffers; each call
                           copies the inputs in, replays, returns clones of the outputs; plain forward
                           off CUDA
tf32                       TF32 for fp32 matmul and convolution during the call
channels_last              channels-last 4-D/5-D parameters and inputs, cudnn.benchmark during the call
compile_max_autotune       ``torch.compile(mode="max-autotune-no-cudagraphs")``: Triton GEMM templates
                           with the epilogue fused, benchmarked against cuBLAS; autotuned pointwise and
                           reduction launch configurations
compile_cudagraphs         ``torch.compile(mode="reduce-overhead")``: inductor's fusion plus CUDA-graph
                           trees (a new step per call, outputs cloned); on CPU as torch_compile
compile_coordinate_descent ``torch.compile(options={"coordinate_descent_tuning": True})``: inductor
                           searches block sizes and warps of its generated kernels (GPU only)
cudnn_benchmark            cudnn.benchmark during the call: cuDNN times every convolution algorithm
                           for the shapes and keeps the fastest instead of its heuristic pick
autocast_fp16              ``torch.autocast(dtype=float16)`` of fp32 work: matmul/conv on fp16 tensor
                           cores, fp32 accumulation, outputs cast back; plain forward for non-fp32 tasks
autocast_bf16              the same with bfloat16 (fp32's exponent range, 3 fewer mantissa bits)
channels_last_compile      channels-last parameters and inputs, then ``torch.compile``: NHWC convolutions
                           with inductor fusing the elementwise ops around them
sdpa                       explicit attention (softmax(Q K^T * s) V, optionally causal-masked) replaced
                           in the source by ``F.scaled_dot_product_attention`` (``attention.py``); the
                           plain forward where the source holds no recognized pattern
========================== =====================================================================

Action rows (one candidate evaluated whatever a profile says) are keyed by ``ACTIONS_VERSION`` and the
action's name, so every rewriter built on this catalog (``RuleRewriter``, ``PlaybookRewriter``,
``ExperienceRewriter``) shares them: the five ``rule-v1`` builders are byte-identical to the ones that
made ``datasets/h200_suite`` (a test checks the recorded candidate hashes), and a new builder comes under
a new name. Changing an existing builder needs a new name or a bump of ``ACTIONS_VERSION`` (which
re-keys every action row).

Example::

    >>> "compile_max_autotune" in ACTIONS and RULE_ACTIONS[:2] == ("keep", "torch_compile")
    True
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass

from autoprofiler.rewriters.attention import substitute_attention
from autoprofiler.rewriters.base import Rewrite

ACTIONS_VERSION = "rule-v1"  # the candidate builders: action rows are keyed by it
ORIGINAL_NAME = "_Original"

_HEADER = """

# ---- autoprofiler RuleRewriter ({version}): action {action!r} ----
import torch
import torch.nn as nn
"""

_KEEP = '''

class ModelNew(nn.Module):
    """The original computation, unchanged (action keep)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)

    def forward(self, *args):
        return self.inner(*args)
'''

_TORCH_COMPILE = '''

class ModelNew(nn.Module):
    """The original module under torch.compile(mode={mode!r}, dynamic=False) (action torch_compile)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)
        self.inner.compile(mode={mode!r}, dynamic=False)

    def forward(self, *args):
        return self.inner(*args)
'''

# Clones a forward's outputs (tensors, nested in tuples, lists and dicts): the candidates that replay a
# graph return these, since the graph overwrites its output buffers on the next replay.
_CLONE_OUTPUTS = """

def _ap_clone_outputs(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_ap_clone_outputs(item) for item in value)
    if isinstance(value, dict):
        return {{key: _ap_clone_outputs(item) for key, item in value.items()}}
    return value
"""

_CUDA_GRAPH = _CLONE_OUTPUTS + '''

def _ap_signature(args):
    return tuple(
        (tuple(a.shape), a.dtype, a.device, a.stride()) if isinstance(a, torch.Tensor) else ("value", repr(a))
        for a in args
    )


class ModelNew(nn.Module):
    """The original forward captured into a CUDA graph with static input buffers (action cuda_graph).

    Each call copies the inputs into the static buffers, replays the graph and returns clones of the
    static outputs (a fresh tensor per call). New shapes, dtypes or strides trigger a new capture.
    Inputs not on CUDA run the plain forward.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)
        self._graph = None
        self._graph_key = None
        self._static_inputs = None
        self._static_output = None

    def _capture(self, args, key):
        self._graph = None
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range({warmup}):  # warm up outside the capture (cuBLAS/cuDNN workspaces, autotuning)
                self.inner(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = self.inner(*static)
        self._graph, self._graph_key = graph, key
        self._static_inputs, self._static_output = static, output

    def forward(self, *args):
        if not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            return self.inner(*args)
        with torch.no_grad():
            key = _ap_signature(args)
            if self._graph is None or key != self._graph_key:
                self._capture(args, key)
            for static, a in zip(self._static_inputs, args):
                if isinstance(a, torch.Tensor):
                    static.copy_(a)
            self._graph.replay()
            return _ap_clone_outputs(self._static_output)
'''

_TF32 = '''

class ModelNew(nn.Module):
    """The original forward with TF32 allowed for fp32 matmul and convolution (action tf32).

    The flags are set for the duration of the call only and restored afterwards.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)

    def forward(self, *args):
        previous = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        try:
            return self.inner(*args)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous
'''

_CHANNELS_LAST = '''

def _ap_channels_last(t):
    if isinstance(t, torch.Tensor) and t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if isinstance(t, torch.Tensor) and t.dim() == 5:
        return t.contiguous(memory_format=torch.channels_last_3d)
    return t


class ModelNew(nn.Module):
    """Channels-last parameters and inputs, cudnn.benchmark on (action channels_last).

    cudnn.benchmark is set for the duration of the call only and restored afterwards.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)
        with torch.no_grad():
            for tensor in list(self.inner.parameters()) + list(self.inner.buffers()):
                tensor.data = _ap_channels_last(tensor.data)

    def forward(self, *args):
        previous = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            return self.inner(*[_ap_channels_last(a) for a in args])
        finally:
            torch.backends.cudnn.benchmark = previous
'''

_COMPILE_MAX_AUTOTUNE = """

class ModelNew(nn.Module):
    \"\"\"The original module under torch.compile(mode="max-autotune-no-cudagraphs") (compile_max_autotune).

    Inductor benchmarks Triton GEMM templates, with the elementwise epilogue fused in, against the ATen
    (cuBLAS) kernel and autotunes the launch configurations of its pointwise and reduction kernels.
    \"\"\"

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)
        self.inner.compile(mode="max-autotune-no-cudagraphs", dynamic=False)

    def forward(self, *args):
        return self.inner(*args)
"""

_COMPILE_COORDINATE_DESCENT = """

class ModelNew(nn.Module):
    \"\"\"The original module under torch.compile with coordinate-descent tuning (compile_coordinate_descent).

    Inductor searches the block sizes and warp counts of its generated (Triton) kernels around its
    heuristic choice, benchmarking each step; on CPU the option does nothing beyond torch.compile.
    \"\"\"

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)
        self.inner.compile(dynamic=False, options={{"coordinate_descent_tuning": True}})

    def forward(self, *args):
        return self.inner(*args)
"""

_COMPILE_CUDAGRAPHS = _CLONE_OUTPUTS + """

class ModelNew(nn.Module):
    \"\"\"The original module under torch.compile(mode="reduce-overhead") (compile_cudagraphs).

    Inductor fuses the graph and replays it through CUDA-graph trees. Each call starts a new step and
    returns clones of the outputs (the graph's output buffers are overwritten by the next replay).
    Off CUDA, inductor skips the graphs: the same as torch_compile.
    \"\"\"

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)
        self.inner.compile(mode="reduce-overhead", dynamic=False)

    def forward(self, *args):
        if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            torch.compiler.cudagraph_mark_step_begin()
        return _ap_clone_outputs(self.inner(*args))
"""

_CUDNN_BENCHMARK = """

class ModelNew(nn.Module):
    \"\"\"The original forward with cudnn.benchmark on (action cudnn_benchmark).

    cuDNN times every convolution algorithm for each new input shape and keeps the fastest, instead of
    its heuristic pick. The flag is set for the duration of the call only and restored afterwards.
    \"\"\"

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)

    def forward(self, *args):
        previous = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            return self.inner(*args)
        finally:
            torch.backends.cudnn.benchmark = previous
"""

_AUTOCAST = """

def _ap_floating_dtype(module, args):
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return a.dtype
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def _ap_cast_floating(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, (tuple, list)):
        return type(value)(_ap_cast_floating(item, dtype) for item in value)
    if isinstance(value, dict):
        return {{key: _ap_cast_floating(item, dtype) for key, item in value.items()}}
    return value


class ModelNew(nn.Module):
    \"\"\"The original forward under torch.autocast(dtype=torch.@DTYPE@) (action autocast_@SHORT@).

    Autocast runs matmuls and convolutions in @DTYPE@ on tensor cores (fp32 accumulation) and keeps
    precision-sensitive ops (softmax, norms, reductions) in fp32; floating outputs are cast back to the
    task's dtype. Only fp32 work is changed: a task whose floating inputs (or, without any, parameters)
    are not fp32 runs its plain forward.
    \"\"\"

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)

    def forward(self, *args):
        dtype = _ap_floating_dtype(self.inner, args)
        if dtype != torch.float32:
            return self.inner(*args)
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        with torch.autocast(device_type=device, dtype=torch.@DTYPE@):
            output = self.inner(*args)
        return _ap_cast_floating(output, dtype)
"""

_CHANNELS_LAST_COMPILE = """

def _ap_channels_last(t):
    if isinstance(t, torch.Tensor) and t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if isinstance(t, torch.Tensor) and t.dim() == 5:
        return t.contiguous(memory_format=torch.channels_last_3d)
    return t


class ModelNew(nn.Module):
    \"\"\"Channels-last parameters and inputs, then torch.compile (action channels_last_compile).

    cuDNN's NHWC convolutions without layout transposes, and inductor fusing the elementwise ops around
    them (bias, normalization, activation) into generated kernels.
    \"\"\"

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)
        with torch.no_grad():
            for tensor in list(self.inner.parameters()) + list(self.inner.buffers()):
                tensor.data = _ap_channels_last(tensor.data)
        self.inner.compile(dynamic=False)

    def forward(self, *args):
        return self.inner(*[_ap_channels_last(a) for a in args])
"""

_SDPA = """

class ModelNew(nn.Module):
    \"\"\"The original computation, explicit attention replaced by F.scaled_dot_product_attention (sdpa).

    The substitution is made in ``_Original``'s source above (see the note after the header); where no
    attention pattern was recognized the forward is the original one.
    \"\"\"

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Original(*args, **kwargs)

    def forward(self, *args):
        return self.inner(*args)
"""


@dataclass(frozen=True)
class Action:
    """One candidate builder: ``template`` (``str.format``-ed with ``mode`` and ``warmup``) is appended to
    the renamed task source; ``transform``, when set, rewrites that source first and returns it with a
    comment line saying what it did."""

    name: str
    description: str
    template: str
    transform: Callable[[str], tuple[str, str]] | None = None


def _sdpa_transform(source: str) -> tuple[str, str]:
    new, count = substitute_attention(source)
    if count:
        return (
            new,
            f"# sdpa: {count} explicit attention pattern(s) replaced by scaled_dot_product_attention\n",
        )
    return source, "# sdpa: no explicit attention pattern recognized in the source: the plain forward\n"


ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action("keep", "ModelNew is a copy of the original", _KEEP),
        Action("torch_compile", "torch.compile of the original module", _TORCH_COMPILE),
        Action("cuda_graph", "CUDA-graph capture of the forward with static input buffers", _CUDA_GRAPH),
        Action("tf32", "TF32 for fp32 matmul/conv during forward", _TF32),
        Action(
            "channels_last",
            "channels-last parameters and inputs, cudnn.benchmark during forward",
            _CHANNELS_LAST,
        ),
        Action(
            "compile_max_autotune",
            "torch.compile max-autotune-no-cudagraphs (Triton GEMM templates with fused epilogues)",
            _COMPILE_MAX_AUTOTUNE,
        ),
        Action(
            "compile_cudagraphs",
            "torch.compile reduce-overhead (fusion plus CUDA-graph trees)",
            _COMPILE_CUDAGRAPHS,
        ),
        Action(
            "compile_coordinate_descent",
            "torch.compile with coordinate-descent tuning of generated kernels' block sizes",
            _COMPILE_COORDINATE_DESCENT,
        ),
        Action(
            "cudnn_benchmark", "cudnn.benchmark during forward (fastest conv algorithm)", _CUDNN_BENCHMARK
        ),
        Action(
            "autocast_fp16",
            "torch.autocast float16 of fp32 work (fp16 tensor cores), outputs cast back",
            _AUTOCAST.replace("@DTYPE@", "float16").replace("@SHORT@", "fp16"),
        ),
        Action(
            "autocast_bf16",
            "torch.autocast bfloat16 of fp32 work (bf16 tensor cores), outputs cast back",
            _AUTOCAST.replace("@DTYPE@", "bfloat16").replace("@SHORT@", "bf16"),
        ),
        Action(
            "channels_last_compile",
            "channels-last parameters and inputs, then torch.compile",
            _CHANNELS_LAST_COMPILE,
        ),
        Action(
            "sdpa",
            "explicit attention replaced by F.scaled_dot_product_attention in the source",
            _SDPA,
            _sdpa_transform,
        ),
    )
}

#: ``RuleRewriter``'s actions (rule-v1 builders; ``datasets/h200_suite`` holds their H200 outcomes).
RULE_ACTIONS = ("keep", "torch_compile", "cuda_graph", "tf32", "channels_last")


def rename_model(source: str, new_name: str = ORIGINAL_NAME) -> str:
    """``source`` with every ``Model`` name token renamed to ``new_name`` (strings and comments untouched).

    Raises ``ValueError`` when the source defines no ``class Model`` or already uses ``new_name`` or
    ``ModelNew``.

    >>> rename_model("class Model(nn.Module):\\n    def f(self):\\n        return super(Model, self)\\n")
    'class _Original(nn.Module):\\n    def f(self):\\n        return super(_Original, self)\\n'
    """
    if not re.search(r"^class\s+Model\b", source, re.MULTILINE):
        raise ValueError("expected a task source defining 'class Model' at module level; found none")
    lines = source.splitlines(keepends=True)
    spots: list[tuple[int, int]] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.NAME and token.string in (new_name, "ModelNew"):
                raise ValueError(f"the task source already uses the name {token.string!r}; cannot rewrite it")
            if token.type == tokenize.NAME and token.string == "Model":
                spots.append(token.start)
    except (tokenize.TokenError, IndentationError, SyntaxError) as exc:
        raise ValueError(
            f"expected a tokenizable Python task source; got {type(exc).__name__}: {exc}"
        ) from exc
    for row, col in reversed(spots):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new_name + line[col + len("Model") :]
    return "".join(lines)


def build_source(task_source: str, action: str, compile_mode: str = "default", graph_warmup: int = 3) -> str:
    """The candidate source for ``action`` applied to ``task_source`` (see the module docstring)."""
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {sorted(ACTIONS)}, got {action!r}")
    spec = ACTIONS[action]
    renamed, note = rename_model(task_source), ""
    if spec.transform is not None:
        renamed, note = spec.transform(renamed)
    body = spec.template.format(mode=compile_mode, warmup=int(graph_warmup))
    header = _HEADER.format(version=ACTIONS_VERSION, action=action)
    return renamed.rstrip("\n") + "\n" + header + note + body


class CandidateBuilder:
    """What ``FixedAction`` needs of a rewriter: its builders' identity and a source per action."""

    actions_identity: str

    def source_for(self, task, action: str) -> str: ...


class FixedAction:
    """One action of a rule rewriter, applied whatever the profile: the rewriter of action cells.

    ``identity`` is the rewriter's ``actions_identity`` (the candidate builders' version), so the
    evaluation of an action is shared by every rule version that picks it.
    """

    def __init__(self, builder: CandidateBuilder, action: str):
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {sorted(ACTIONS)}, got {action!r}")
        self.builder = builder
        self.action = action
        self.identity = builder.actions_identity

    def rewrite(self, task, profile=None) -> Rewrite:
        return action_rewrite(self.builder, task, self.action, "")


def check_choices(default_action: str, rules, actions) -> None:
    """An action rewriter's settings: its default and every rule's action are among ``actions``.

    Raises ``ValueError`` naming the default or the rules that are not."""
    if default_action not in actions:
        raise ValueError(f"default_action must be one of {sorted(actions)}, got {default_action!r}")
    unknown = [rule.name for rule in rules if rule.action not in actions]
    if unknown:
        raise ValueError(f"rules {unknown} name actions outside {sorted(actions)}")


def settings_identity(version: str, settings: dict, defaults: dict, rules, default_rules) -> str:
    """An action rewriter's identity: ``version``, then the settings that differ from ``defaults`` and
    the rule list when it is not ``default_rules``, in brackets (``rule-v2[tolerance=0.001]``); rows of
    rewriters that would decide differently never share a key."""
    changed = [
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in settings.items() if v != defaults[k]
    ]
    if rules is not default_rules:
        changed.append("rules=" + "+".join(rule.name for rule in rules))
    return version + (f"[{','.join(changed)}]" if changed else "")


def action_rewrite(builder: CandidateBuilder, task, action: str, reason: str) -> Rewrite:
    """``action``'s candidate for ``task`` as a ``Rewrite`` (``reason`` shown in ``raw``); a task whose
    source cannot be copied gives a ``Rewrite`` with the error, not an exception. Every action
    rewriter's ``rewrite`` is ``decide`` followed by this."""
    raw = f"action {action}: {ACTIONS[action].description}" + (f". Reason: {reason}" if reason else "")
    try:
        source = builder.source_for(task, action)
    except ValueError as exc:
        return Rewrite(source=None, raw=raw, error=str(exc), action=action)
    return Rewrite(source=source, raw=raw, action=action)
