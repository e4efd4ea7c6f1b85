"""The in-process MiniMax-H3 executor: diffusers' model code, h3core's orchestration.

`model.py` loads a model folder once and keeps it resident; `tiny.py` writes a tiny random
model in the same layout; `attention.py` holds the attention kernels (one per plan) and
`kernel_probe.py` chooses one by measurement when the executor starts;
`generate.py` runs one job in stages (synchronous, in a worker thread); `executor.py` is the
async shell the runner drives; `probe.py` measures a machine's token budget with random weights
(`h3core capacity probe`). Everything here needs the `pipeline` extra (torch, diffusers,
transformers).
"""

# Light to import: torch, diffusers and transformers load when the executor starts.
from h3core.executors.pipeline.executor import PipelineExecutor, PipelineSettings

__all__ = ["PipelineExecutor", "PipelineSettings"]
