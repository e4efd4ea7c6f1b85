"""The step cache behind a request's quality level, on diffusers' First Block Cache hooks.

`exact` enables nothing: the transformer runs as it always did. `balanced` and `fast` enable
diffusers' First Block Cache (`FirstBlockCacheConfig`) on the job's denoiser for that job only
(`step_cache`, removed in its `finally`): at each step the first block runs, and where its
residual moved less than the level's threshold since the last computed step, the other blocks are
skipped and the previous step's residual of the whole stack is reused. Why this cache and these
thresholds: docs/operations.md, "Quality levels".

Three things diffusers 0.42.1 leaves to h3core, done here and nowhere else:

1. `MiniMaxH3TransformerBlock` is not in diffusers' block registry, which the hooks read the block's
   outputs from; it returns the hidden states alone (the text is packed into the sequence). Every
   block class of the denoiser is registered as it is found, FSDP2's wrapped classes too.
2. The hooks keep their state per cache context: every transformer call runs inside
   `cache_context` (`StepCache.step`, around each iteration of h3core's denoising loop).
3. On a group, the skip decision must be the same on every rank at every step, or the next
   collective hangs (a rank that skips the blocks skips their all-to-alls) and the shards diverge.
   Under Ulysses each rank holds a slice of the sequence, so diffusers' ratio (an `absmean` over the
   local tensor) differs per rank. `_CollectiveHead` sums |residual change| and |previous residual|
   in float64 over every rank's slice (one all-reduce: the ratio of the whole sequence, as one
   device computes it), then takes rank 0's decision (one broadcast of one flag), so the ranks
   cannot disagree even where the reduced sums differed in the last bit. And since diffusers'
   context parallelism splits the sequence in a hook on the first block, the cache's hook on that
   block must run inside the split (it compares the block's input with its output): the split is
   moved outermost again after the cache's hooks are added.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from h3core.domain.quality import Quality, StepCounts

__all__ = ["THRESHOLDS", "StepCache", "describe", "quality_info", "step_cache"]

# First Block Cache's threshold per level: the relative change of the first block's residual below
# which a step is served from the cache (docs/operations.md, "Quality levels"). None: no cache.
THRESHOLDS: dict[Quality, float | None] = {"exact": None, "balanced": 0.05, "fast": 0.10}


def describe(quality: Quality) -> str | None:
    """The cache a level runs with, for the job's `running` event; None for `exact`."""
    threshold = THRESHOLDS[quality]
    return None if threshold is None else f"diffusers FirstBlockCacheConfig(threshold={threshold:g}), decided across the group"


def quality_info(quality: Quality) -> dict[str, str]:
    """What a job's `running` event records of its level: the level, and its cache where it has one."""
    cache = describe(quality)
    return {"quality": quality} | ({"cache": cache} if cache is not None else {})


class StepCache:
    """One job's cache on its denoiser: the context each step runs in, and what the steps did."""

    def __init__(self, transformer: Any, quality: Quality) -> None:
        self.transformer = transformer
        self.quality = quality
        self.computed = 0
        self.cached = 0

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """The context one denoising iteration's transformer call runs in."""
        with self.transformer.cache_context("cond"):
            yield

    def decided(self, compute: bool) -> None:
        """Count one step's decision (called by the head block's hook)."""
        if compute:
            self.computed += 1
        else:
            self.cached += 1

    def counts(self) -> StepCounts:
        """The steps computed in full and served from the cache so far."""
        return StepCounts(quality=self.quality, computed=self.computed, cached=self.cached)


@contextlib.contextmanager
def step_cache(transformer: Any, quality: Quality) -> Iterator[StepCache | None]:
    """Enable the level's cache on `transformer` for the block, and remove it after, whatever
    happens (the next job finds the model as it was). None for `exact`: nothing is enabled."""
    threshold = THRESHOLDS[quality]
    if threshold is None:
        yield None
        return
    from diffusers.hooks import FirstBlockCacheConfig

    cache = StepCache(transformer, quality)
    _register_blocks(transformer)
    transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    try:
        _collective_head(transformer, cache, threshold)
        yield cache
    finally:
        transformer.disable_cache()


def _blocks(transformer: Any) -> Any:
    return transformer.transformer_blocks


def _register_blocks(transformer: Any) -> None:
    """Register each block class of `transformer` (FSDP2 wraps each block in a class of its own) in
    diffusers' block registry: one tensor out, the hidden states; no encoder states."""
    from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry

    for cls in {type(block) for block in _blocks(transformer)}:
        try:
            TransformerBlockRegistry.get(cls)
        except ValueError:
            # Its own default is None (typed `int`): the hooks then read the output as the hidden states.
            TransformerBlockRegistry.register(cls, TransformerBlockMetadata(return_hidden_states_index=0))


def _collective_head(transformer: Any, cache: StepCache, threshold: float) -> None:
    """Replace the cache's hook on the first block by `_CollectiveHead` (same state, same name, so
    `disable_cache` removes it), with the context-parallel splits of that block outside it.

    Hooks are only ever removed from the end of the block's chain: diffusers' `remove_hook` relinks
    the hook after the one removed through its `forward`, which bypasses that hook where it has a
    `new_forward` of its own (as the cache's hooks do)."""
    from diffusers.hooks.first_block_cache import _FBC_LEADER_BLOCK_HOOK

    registry = _blocks(transformer)[0]._diffusers_hook
    order = registry._hook_order
    splits = [name for name in order if name.startswith("cp_input---")]
    if order != [*splits, _FBC_LEADER_BLOCK_HOOK]:  # what h3core builds: context parallelism (or none), then the cache
        raise RuntimeError(f"unexpected hooks on the first block: {order}")
    plain = registry.hooks[_FBC_LEADER_BLOCK_HOOK]
    held = [(name, registry.hooks[name]) for name in splits]
    for name in reversed(order):
        registry.remove_hook(name, recurse=False)
    registry.register_hook(_head_class()(plain.state_manager, threshold, cache), _FBC_LEADER_BLOCK_HOOK)
    for name, hook in held:  # registered after it, so they run before it: the head sees this rank's slice
        registry.register_hook(hook, name)


_HEAD: list[type] = []


def _head_class() -> type:
    """`_CollectiveHead`, defined once diffusers is imported (the module imports without it)."""
    if _HEAD:
        return _HEAD[0]
    import torch
    import torch.distributed as dist
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook

    class _CollectiveHead(FBCHeadBlockHook):
        """First Block Cache's head hook, deciding for the whole group (the module's docstring)."""

        def __init__(self, state_manager: Any, threshold: float, cache: StepCache) -> None:
            super().__init__(state_manager, threshold)
            self.cache = cache

        @torch.compiler.disable
        def _should_compute_remaining_blocks(self, hidden_states_residual: torch.Tensor) -> bool:
            previous = self.state_manager.get_state().head_block_residual
            group = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
            if previous is None:
                compute = True  # the first step of the job (or of a resumed attempt): nothing cached
            else:
                sums = torch.stack(
                    [
                        (hidden_states_residual - previous).abs().sum(dtype=torch.float64),
                        previous.abs().sum(dtype=torch.float64),
                    ]
                )
                if group:
                    dist.all_reduce(sums)
                change, scale = sums.tolist()
                compute = not scale > 0 or change / scale > self.threshold
            if group:
                flag = torch.tensor([1.0 if compute else 0.0], device=hidden_states_residual.device)
                dist.broadcast(flag, src=0)
                compute = bool(flag.item())
            self.cache.decided(compute)
            return compute

    _HEAD.append(_CollectiveHead)
    return _CollectiveHead
