"""The attention kernel, chosen on purpose and never the quadratic MATH path by accident.

`resolve(choice, device)` turns an operator's choice (`auto | sage | flash | efficient |
native`) into a plan: which diffusers backend the transformer uses and which SDPA kernels it
may reach. `install(transformer, plan)` applies it; from then on every transformer call runs
under `torch.nn.attention.sdpa_kernel` restricted to the plan's kernels, so where none applies
SDPA raises instead of falling back to MATH. MATH is admitted only for sequences up to
`math_max_tokens`, where its quadratic memory is harmless; a longer job is refused with
`AttentionRefused`, which the executor records as `invalid`.

SageAttention comes in two shapes: diffusers' `sage` backends need sageattention >= 2.1.1
(built from source), while PyPI's 1.0.6 has only the Triton `sageattn` (int8 QK, fp16 PV).
For the latter, h3core puts a function calling it behind diffusers' matching backend name,
`_sage_qk_int8_pv_fp16_triton`, and points the transformer's processors at it directly
(diffusers' own requirement check would refuse 1.0.6).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
from dataclasses import dataclass
from typing import Literal

Choice = Literal["auto", "sage", "flash", "efficient", "native"]
CHOICES: tuple[str, ...] = ("auto", "sage", "flash", "efficient", "native")
DEFAULT_MATH_MAX_TOKENS = 4096

_SDPA = {
    "flash": ("FLASH_ATTENTION",),
    "efficient": ("EFFICIENT_ATTENTION",),
    "native": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"),
}


class AttentionError(Exception):
    """The chosen kernel cannot run on this machine (raised when the executor starts)."""


class AttentionRefused(Exception):
    """A job would need the MATH kernel above the limit."""

    def __init__(self, tokens: int, plan: AttentionPlan) -> None:
        self.tokens = tokens
        self.plan = plan
        super().__init__(
            f"attention: no {'/'.join(k.lower() for k in plan.sdpa)} kernel applies to this job's {tokens}-token sequence "
            f"on {plan.device}, and the quadratic MATH fallback is allowed only up to {plan.math_max_tokens} tokens; "
            f"choose another attention kernel (H3_ATTENTION) or a smaller canvas or fewer frames"
        )


@dataclass(frozen=True)
class AttentionPlan:
    choice: str  # what the operator asked for
    kernel: str  # what runs: sage, sage-triton, flash, efficient, native
    backend: str  # the diffusers backend name set on the transformer
    sdpa: tuple[str, ...]  # SDPA kernels reachable (MATH never listed; see math_max_tokens)
    device: str
    math_max_tokens: int = DEFAULT_MATH_MAX_TOKENS

    def describe(self) -> str:
        sdpa = ",".join(k.split("_")[0].lower() for k in self.sdpa)
        return f"{self.kernel} (asked {self.choice}; sdpa {sdpa or '-'}; math up to {self.math_max_tokens} tokens)"

    @contextlib.contextmanager
    def guard(self, tokens: int):
        """Run attention for a `tokens`-long sequence under the plan's kernel restriction."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        allowed = [getattr(SDPBackend, name) for name in self.sdpa]
        if tokens <= self.math_max_tokens:
            allowed.append(SDPBackend.MATH)
        try:
            with sdpa_kernel(allowed):
                yield
        except RuntimeError as exc:
            if _no_kernel(exc):
                raise AttentionRefused(tokens, self) from exc
            raise


def _no_kernel(exc: RuntimeError) -> bool:
    text = str(exc)
    return "No viable backend for scaled_dot_product_attention" in text or "No available kernel" in text


def sage_version() -> str | None:
    try:
        return importlib.metadata.version("sageattention")
    except importlib.metadata.PackageNotFoundError:
        return None


def _sage_kind() -> str | None:
    """'sage' (diffusers' backend, >= 2.1.1), 'sage-triton' (1.x sageattn) or None."""
    version = sage_version()
    if version is None:
        return None
    parts = tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
    if parts >= (2, 1, 1):
        return "sage"
    try:
        from sageattention import sageattn  # noqa: F401
    except ImportError:
        return None
    return "sage-triton"


def resolve(choice: str, device: str, *, math_max_tokens: int = DEFAULT_MATH_MAX_TOKENS) -> AttentionPlan:
    """The plan for `choice` on `device`; raises `AttentionError` when it cannot run there."""
    import torch

    if choice not in CHOICES:
        raise AttentionError(f"attention must be one of {', '.join(CHOICES)}, not {choice!r}")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sage = _sage_kind() if cuda and torch.cuda.is_available() and torch.cuda.get_device_capability(dev) >= (8, 0) else None

    def plan(kernel: str, backend: str, sdpa: tuple[str, ...]) -> AttentionPlan:
        return AttentionPlan(choice, kernel, backend, sdpa, str(dev), math_max_tokens)

    if choice == "sage" or (choice == "auto" and sage):
        if not sage:
            raise AttentionError(
                f"attention 'sage' needs a CUDA device of compute capability 8.0 or newer and sageattention "
                f"(found {sage_version() or 'none'} on {dev})"
            )
        if sage == "sage":
            return plan("sage", "sage", ())
        return plan("sage-triton", "_sage_qk_int8_pv_fp16_triton", ())
    if choice == "auto":
        return plan("native", "native", _SDPA["native"])
    return plan(choice, "native", _SDPA[choice])


def install(model, plan: AttentionPlan, *, guard_forward: bool = True) -> None:
    """Point `model`'s attention at the plan and (for a transformer) guard every forward call."""
    if plan.kernel == "sage-triton":
        _point_at_sage_triton(model)
    else:
        model.set_attention_backend(plan.backend)
    if not guard_forward:
        return
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


def _point_at_sage_triton(model) -> None:
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    name = AttentionBackendName._SAGE_QK_INT8_PV_FP16_TRITON
    _AttentionBackendRegistry._backends[name] = sage_triton_attention
    _AttentionBackendRegistry._constraints[name] = []
    _AttentionBackendRegistry._supported_arg_names[name] = {
        "query",
        "key",
        "value",
        "attn_mask",
        "is_causal",
        "scale",
        "return_lse",
        "_parallel_config",
    }
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            processor._attention_backend = name


def sage_triton_attention(
    query, key, value, attn_mask=None, is_causal=False, scale=None, return_lse=False, _parallel_config=None
):
    """diffusers' attention-backend signature over sageattention 1.x's Triton `sageattn`.

    diffusers hands tensors as (batch, sequence, heads, head_dim), which sageattn calls "NHD".
    """
    from sageattention import sageattn

    if attn_mask is not None:
        raise ValueError("SageAttention takes no attention mask")
    if return_lse:
        raise ValueError("SageAttention 1.x does not return the log-sum-exp")
    return sageattn(query, key, value, tensor_layout="NHD", is_causal=is_causal, sm_scale=scale)
