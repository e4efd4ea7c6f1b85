"""The attention kernel: named, one at a time, never a silent fallback.

Each kernel in `KERNELS` is one real path, with the devices, dtypes, compute capabilities and
head dims it takes (`Kernel.unsupported` names what a target lacks):

- `cudnn`, `flash`, `efficient`, `math`: torch's SDPA restricted to exactly that backend, so
  where it cannot take a call SDPA raises instead of picking another; `math` (quadratic memory)
  also refuses a sequence longer than `math_max_tokens`.
- `sage-fp16` (SageAttention 2's `sageattn_qk_int8_pv_fp16_cuda`: the deployment's SAGE_FP16,
  sm_75 builds included), `sage-fp8` (2.x, FP8 PV, sm_89/sm_90), `sage-triton` (1.x's Triton
  `sageattn`, or 2.x's `sageattn_qk_int8_pv_fp16_triton`): the installed build's function
  behind diffusers' matching backend name, with SDPA switched off inside the transformer.

A plan (`AttentionPlan`) is one kernel: what the Running event records is what runs. Which one
is decided when the executor starts (`kernel_probe.decide`: `auto` measures every candidate).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MATH_MAX_TOKENS = 4096
HALF = frozenset({"float16", "bfloat16"})
ANY_FLOAT = frozenset({"float32", "float16", "bfloat16"})


class AttentionError(Exception):
    """The chosen kernel cannot run on this machine (raised when the executor starts)."""


class AttentionRefused(Exception):
    """A job's sequence is longer than the plan's kernel may take (MATH), or the kernel cannot take it."""

    def __init__(self, tokens: int, plan: AttentionPlan, why: str | None = None) -> None:
        self.tokens = tokens
        self.plan = plan
        reason = why or f"the quadratic MATH kernel is allowed only up to {plan.math_max_tokens} tokens"
        super().__init__(
            f"attention: kernel {plan.kernel} cannot take this job's {tokens}-token sequence on {plan.device}: {reason}; "
            f"choose another attention kernel (H3_ATTENTION) or a smaller canvas or fewer frames"
        )


# -- where each kernel runs ---------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What the attention runs on: the device, the dtype and the model's attention geometry."""

    device: str  # "cpu", "cuda:0"
    dtype: str  # float32 | bfloat16 | float16
    heads: int
    head_dim: int
    capability: tuple[int, int] | None = None  # CUDA compute capability; None on a CPU
    name: str = "cpu"  # the device's name, e.g. "NVIDIA H200"

    @property
    def kind(self) -> str:
        """The device's kind, "cpu" or "cuda", without its index."""
        return self.device.split(":")[0]

    @classmethod
    def detect(cls, device: str, dtype: str, heads: int, head_dim: int) -> Target:
        """Read the device's capability; raises AttentionError for a device torch cannot use here."""
        import torch

        try:
            dev = torch.device(device)
        except RuntimeError as exc:
            raise AttentionError(f"device {device!r}: {exc}") from exc
        if dev.type == "cpu":
            import platform

            return cls(str(dev), dtype, heads, head_dim, None, platform.processor() or platform.machine() or "cpu")
        if dev.type != "cuda":
            raise AttentionError(f"device {device!r}: h3core's attention kernels run on 'cpu' or 'cuda'")
        if not torch.cuda.is_available():
            raise AttentionError(
                f"device {device!r}: torch {torch.__version__} sees no CUDA device here (built for CUDA {torch.version.cuda})"
            )
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return cls(f"cuda:{index}", dtype, heads, head_dim, (props.major, props.minor), props.name)


@dataclass(frozen=True)
class Rule:
    """Where a kernel runs: one device kind, its dtypes, capability and head dims."""

    device: str  # "cpu" | "cuda"
    dtypes: frozenset[str]
    min_capability: tuple[int, int] | None = None
    head_dims: frozenset[int] | None = None  # exactly these
    max_head_dim: int | None = None
    head_dim_multiple: int = 1


@dataclass(frozen=True)
class SageBuild:
    """What the installed sageattention provides (its functions by name), or why it does not import."""

    version: str | None
    functions: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def major(self) -> int:
        """The build's major version; 0 where it is unknown."""
        try:
            return int((self.version or "0").split(".")[0])
        except ValueError:
            return 0


@functools.cache
def sage_build() -> SageBuild:
    """Import sageattention once, if installed; any failure to import is reported, never raised."""
    try:
        version = importlib.metadata.version("sageattention")
    except importlib.metadata.PackageNotFoundError:
        return SageBuild(None, error="sageattention is not installed (pip install 'h3core[sage]', or a local build)")
    try:
        import sageattention
    except Exception as exc:  # noqa: BLE001 - a broken build (no triton, no CUDA) must not break a job
        return SageBuild(version, error=f"sageattention {version} does not import: {type(exc).__name__}: {exc}"[:300])
    names = (
        "sageattn",
        "sageattn_qk_int8_pv_fp16_cuda",
        "sageattn_qk_int8_pv_fp8_cuda",
        "sageattn_qk_int8_pv_fp8_cuda_sm90",
        "sageattn_qk_int8_pv_fp16_triton",
    )
    return SageBuild(version, {n: getattr(sageattention, n) for n in names if callable(getattr(sageattention, n, None))})


@dataclass(frozen=True)
class Kernel:
    """One attention kernel: its name, where it runs (`rules`), and how it is reached (an SDPA backend,
    or a diffusers backend over a sageattention function)."""

    name: str
    rules: tuple[Rule, ...]
    sdpa: str | None = None  # torch's SDPBackend member, for the SDPA kernels
    backend: str = "native"  # the diffusers backend name the transformer's processors use
    sage: bool = False  # runs a function of the installed sageattention build

    def unsupported(self, target: Target, sage: SageBuild | None = None) -> str | None:
        """Why this kernel cannot run on `target` (naming what is missing), or None."""
        rule = next((r for r in self.rules if r.device == target.kind), None)
        if rule is None:
            kinds = " or ".join(r.device.upper() if r.device == "cuda" else r.device for r in self.rules)
            return f"{self.name} needs a {kinds} device, not {target.device}"
        if target.dtype not in rule.dtypes:
            return f"{self.name} takes {'/'.join(sorted(rule.dtypes))} on {rule.device}, not {target.dtype}"
        if rule.min_capability and (target.capability or (0, 0)) < rule.min_capability:
            need = "sm_{}{}".format(*rule.min_capability)
            have = "sm_{}{}".format(*target.capability) if target.capability else "none"
            return f"{self.name} needs compute capability {need} or newer; {target.name} is {have}"
        d = target.head_dim
        if rule.head_dims is not None and d not in rule.head_dims:
            return f"{self.name} takes head dims {'/'.join(map(str, sorted(rule.head_dims)))}, not {d}"
        if rule.max_head_dim is not None and d > rule.max_head_dim:
            return f"{self.name} takes head dims up to {rule.max_head_dim}, not {d}"
        if d % rule.head_dim_multiple:
            return f"{self.name} takes head dims that are multiples of {rule.head_dim_multiple}, not {d}"
        if self.sage:
            build = sage if sage is not None else sage_build()
            if build.error:
                return f"{self.name}: {build.error}"
            if sage_function(self.name, build, target.capability) is None:
                missing = " or ".join(SAGE_FUNCTIONS[self.name](build, target.capability))
                return f"{self.name}: sageattention {build.version} has no {missing}"
        return None


# The functions of a sageattention build that implement each sage kernel, in order of preference.
SAGE_FUNCTIONS = {
    "sage-fp16": lambda build, cap: ("sageattn_qk_int8_pv_fp16_cuda",),
    "sage-fp8": lambda build, cap: (
        ("sageattn_qk_int8_pv_fp8_cuda_sm90", "sageattn_qk_int8_pv_fp8_cuda")
        if cap == (9, 0)
        else ("sageattn_qk_int8_pv_fp8_cuda",)
    ),
    # 1.x's `sageattn` is its Triton kernel; 2.x's `sageattn` dispatches to the CUDA kernels, so 2.x names its own.
    "sage-triton": lambda build, cap: ("sageattn",) if build.major < 2 else ("sageattn_qk_int8_pv_fp16_triton",),
}


def sage_function(kernel: str, build: SageBuild, capability: tuple[int, int] | None):
    """The installed build's function that implements the sage `kernel` at `capability`, the preferred one
    first; None where the build has none."""
    for name in SAGE_FUNCTIONS[kernel](build, capability):
        if name in build.functions:
            return build.functions[name]
    return None


_HD8 = 8  # FlashAttention and cuDNN read head dims in 8-element (16-byte) vectors
KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in (
        Kernel("cudnn", (Rule("cuda", HALF, (8, 0), max_head_dim=128, head_dim_multiple=_HD8),), sdpa="CUDNN_ATTENTION"),
        Kernel(
            "flash",
            (Rule("cuda", HALF, (8, 0), max_head_dim=256, head_dim_multiple=_HD8), Rule("cpu", ANY_FLOAT)),
            sdpa="FLASH_ATTENTION",
        ),
        Kernel("efficient", (Rule("cuda", ANY_FLOAT, (5, 0), head_dim_multiple=_HD8),), sdpa="EFFICIENT_ATTENTION"),
        Kernel(
            "sage-fp16",
            (Rule("cuda", HALF, (7, 5), head_dims=frozenset({64, 128})),),
            backend="_sage_qk_int8_pv_fp16_cuda",
            sage=True,
        ),
        Kernel(
            "sage-fp8",
            (Rule("cuda", HALF, (8, 9), head_dims=frozenset({64, 128})),),
            backend="_sage_qk_int8_pv_fp8_cuda",
            sage=True,
        ),
        Kernel(
            "sage-triton",
            (Rule("cuda", HALF, (8, 0), head_dims=frozenset({64, 96, 128})),),
            backend="_sage_qk_int8_pv_fp16_triton",
            sage=True,
        ),
        Kernel("math", (Rule("cuda", ANY_FLOAT), Rule("cpu", ANY_FLOAT)), sdpa="MATH"),
    )
}
CHOICES: tuple[str, ...] = ("auto", *KERNELS)


# -- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionPlan:
    """The one kernel a model's attention runs with, on one device: what the operator asked for, what
    runs, and MATH's bound on a sequence."""

    kernel: str  # what runs: one of KERNELS
    choice: str  # what the operator asked for (auto or a kernel's name)
    device: str
    math_max_tokens: int = DEFAULT_MATH_MAX_TOKENS

    @property
    def max_tokens(self) -> int | None:
        """The longest sequence this plan runs (None: no bound of the kernel's own)."""
        return self.math_max_tokens if self.kernel == "math" else None

    def describe(self) -> str:
        """The plan for a log line: the kernel, what was asked, and MATH's bound where it applies."""
        bound = f"; up to {self.math_max_tokens} tokens" if self.kernel == "math" else ""
        return f"{self.kernel} (asked {self.choice}{bound})"

    @contextlib.contextmanager
    def guard(self, tokens: int):
        """Run attention for a `tokens`-long sequence with nothing but this plan's kernel."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if self.max_tokens is not None and tokens > self.max_tokens:
            raise AttentionRefused(tokens, self)
        sdpa = KERNELS[self.kernel].sdpa
        # Sage plans switch SDPA off altogether: a call that reaches it is one the plan does not describe.
        allowed = [getattr(SDPBackend, sdpa)] if sdpa else []
        try:
            with sdpa_kernel(allowed):
                yield
        except RuntimeError as exc:
            if _no_kernel(exc):
                raise AttentionRefused(tokens, self, f"SDPA has no {self.kernel} kernel for it ({str(exc)[:200]})") from exc
            raise

    def attend(self, query, key, value, *, parallel_config=None):
        """One attention call as the transformer makes it: (batch, sequence, heads, head_dim) in and out."""
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        backend = _backend(self)
        with self.guard(int(query.shape[1])):
            return dispatch_attention_fn(
                query,
                key,
                value,
                attn_mask=None,
                dropout_p=0.0,
                is_causal=False,
                backend=backend,
                parallel_config=parallel_config,
            )


def plan_for(
    kernel: str, target: Target, *, choice: str | None = None, math_max_tokens: int = DEFAULT_MATH_MAX_TOKENS
) -> AttentionPlan:
    """The plan that runs `kernel` on `target`; raises AttentionError naming what the target lacks."""
    if kernel not in KERNELS:
        raise AttentionError(f"attention must be one of {', '.join(CHOICES)}, not {kernel!r}")
    why = KERNELS[kernel].unsupported(target)
    if why:
        raise AttentionError(f"attention '{kernel}' cannot run here: {why}")
    return AttentionPlan(kernel, choice or kernel, target.device, math_max_tokens)


def _no_kernel(exc: RuntimeError) -> bool:
    text = str(exc)
    return "No viable backend for scaled_dot_product_attention" in text or "No available kernel" in text


# -- installing a plan --------------------------------------------------------------------------


def install(model, plan: AttentionPlan) -> None:
    """Point `model`'s attention at the plan's kernel and guard every forward call with the plan."""
    backend = _backend(plan)
    if backend == "native":
        model.set_attention_backend("native")
    else:
        for module in model.modules():
            processor = getattr(module, "processor", None)
            if processor is not None and hasattr(processor, "_attention_backend"):
                processor._attention_backend = backend
    # Installing twice wraps the original forward, not the previous guard.
    inner = model.__dict__.get("_h3_inner_forward") or model.forward
    model._h3_inner_forward = inner

    @functools.wraps(inner)  # the denoiser reads the signature to pick its keyword arguments
    def forward(*args, **kwargs):
        tokens = _sequence_tokens(args, kwargs)
        model._h3_tokens = tokens  # the sequence a failure (OOM) happened at, for its message
        with plan.guard(tokens):
            return inner(*args, **kwargs)

    model.forward = forward


def _sequence_tokens(args, kwargs) -> int:
    """Rows of the packed sequence one MiniMax-H3 forward attends over: video, audio and text."""
    total = 0
    for name in ("hidden_states", "audio_hidden_states", "encoder_hidden_states"):
        value = kwargs.get(name)
        if value is not None and getattr(value, "ndim", 0) >= 2:
            total += int(value.shape[1])
    if total == 0 and args:
        total = int(args[0].shape[1])
    return total


def _backend(plan: AttentionPlan):
    """The diffusers backend that runs the plan: SDPA kernels go through `native` (under the plan's guard);
    a sage kernel's name is pointed at h3core's call of the installed build's function."""
    k = KERNELS[plan.kernel]
    if k.sdpa:
        return "native"
    import torch
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    capability = torch.cuda.get_device_capability(plan.device) if plan.device.startswith("cuda") else None
    fn = sage_function(plan.kernel, sage_build(), capability)
    if fn is None:  # plan_for checked this; a plan made by hand may not have been
        raise AttentionError(f"attention '{plan.kernel}': the installed sageattention has no function for it on {plan.device}")
    name = AttentionBackendName(k.backend)
    registry = _AttentionBackendRegistry
    registry._backends[name] = sage_backend(fn)
    registry._constraints[name] = []
    registry._supported_arg_names[name] = {
        "query",
        "key",
        "value",
        "attn_mask",
        "is_causal",
        "scale",
        "return_lse",
        "_parallel_config",
    }
    registry._supports_context_parallel.add(name.value)  # through diffusers' templated Ulysses, below
    return name


def sage_backend(fn):
    """diffusers' attention-backend signature over a SageAttention function; in a Ulysses group it runs
    inside diffusers' templated context-parallel attention (all-to-all to full sequences, then `fn`)."""

    def call(q, k, v, is_causal, scale):
        # diffusers hands (batch, sequence, heads, head_dim), which SageAttention calls "NHD".
        return fn(q, k, v, tensor_layout="NHD", is_causal=is_causal, sm_scale=scale)

    def attention(query, key, value, attn_mask=None, is_causal=False, scale=None, return_lse=False, _parallel_config=None):
        if attn_mask is not None:
            raise ValueError("SageAttention takes no attention mask")
        if return_lse:
            raise ValueError("h3core's SageAttention backend does not return the log-sum-exp")
        if _parallel_config is None:
            return call(query, key, value, is_causal, scale)
        from diffusers.models.attention_dispatch import _templated_context_parallel_attention

        def forward_op(
            ctx,
            q,
            k,
            v,
            attn_mask=None,
            dropout_p=0.0,
            is_causal=False,
            scale=None,
            enable_gqa=False,
            return_lse=False,
            _save_ctx=True,
            _parallel_config=None,
        ):
            return call(q, k, v, is_causal, scale)

        def backward_op(*args, **kwargs):
            raise NotImplementedError("SageAttention here is for inference only")

        return _templated_context_parallel_attention(
            query,
            key,
            value,
            None,
            0.0,
            is_causal,
            scale,
            False,
            False,
            forward_op=forward_op,
            backward_op=backward_op,
            _parallel_config=_parallel_config,
        )

    return attention


# -- what the start-up measured -----------------------------------------------------------------
