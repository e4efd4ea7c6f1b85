"""How a prompt stops early: a node's failure (an `execution_error`'s fields) or an interrupt.

Tracebacks are canned look-alikes of ComfyUI 0.3.64's frames (the recording's paths and line numbers),
and the out-of-memory message is the recorded one: a client sees the text it would see from a real server.
"""

from __future__ import annotations

ROOT = "/opt/ComfyUI"  # where the recorded server ran: the paths in its tracebacks

EXEC_FRAMES = [
    f'  File "{ROOT}/execution.py", line 496, in execute\n    output_data, output_ui, has_subgraph, '
    "has_pending_tasks = await get_output_data(prompt_id, unique_id, obj, input_data_all, "
    "execution_block_cb=execution_block_cb, pre_execute_cb=pre_execute_cb, hidden_inputs=hidden_inputs)\n",
    f'  File "{ROOT}/execution.py", line 315, in get_output_data\n    return_values = await '
    "_async_map_node_over_list(prompt_id, unique_id, obj, input_data_all, obj.FUNCTION, allow_interrupt=True, "
    "execution_block_cb=execution_block_cb, pre_execute_cb=pre_execute_cb, hidden_inputs=hidden_inputs)\n",
    f'  File "{ROOT}/execution.py", line 289, in _async_map_node_over_list\n    await process_inputs(input_dict, i)\n',
    f'  File "{ROOT}/execution.py", line 277, in process_inputs\n    result = f(**inputs)\n             ^^^^^^^^^^^\n',
]
VALIDATION_FRAMES = [
    f'  File "{ROOT}/execution.py", line 1010, in validate_prompt\n    m = await validate_inputs(prompt_id, prompt, o, '
    "validated)\n        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
    f"  File \"{ROOT}/execution.py\", line 788, in validate_inputs\n    o_class_type = prompt[o_id]['class_type']\n"
    "                   ~~~~~~^^^^^^\n",
]
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 22.00 GiB of which 1.02 GiB "
    "is free. Including non-PyTorch memory, this process has 20.96 GiB memory in use. Of the allocated memory "
    "18.71 GiB is allocated by PyTorch, and 1.80 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
OOM_TIPS = (
    "This error means you ran out of memory on your GPU.\n\nTIPS: If the workflow worked before you might have "
    "accidentally set the batch_size to a large number."
)


class Interrupted(Exception):
    """Raised at an interrupt check: the prompt ends with `execution_interrupted`."""


class NodeFailure(Exception):
    """Raised inside a fake node: becomes an `execution_error` with these fields."""

    def __init__(self, exception_type: str, message: str, traceback: list[str] | None = None) -> None:
        super().__init__(message)
        self.exception_type = exception_type
        self.message = message
        self.traceback = traceback if traceback is not None else list(EXEC_FRAMES)


def full_type_name(exc: BaseException) -> str:
    """The exception's type as ComfyUI reports it: `RuntimeError`, `torch.OutOfMemoryError`."""
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def sampler_frame(class_type: str) -> str:
    """The innermost frame of a sampler that fails mid-run."""
    if class_type == "XFuserSamplerCustomAdvanced":
        return '  File "/opt/ComfyUI/custom_nodes/raylight/nodes.py", line 612, in sample\n    result = ray.get(futures)\n'
    return (
        '  File "/opt/ComfyUI/comfy/samplers.py", line 1035, in sample\n    output = executor.execute(noise, '
        "latent_image, sampler, sigmas, denoise_mask, callback, disable_pbar, seed, latent_shapes=latent_shapes)\n"
    )
