"""The fault switches and knobs: plain attributes of `FakeComfyUI`, read where they act, so that a test
may flip one at any time, also while a prompt runs. `FakeComfyUI`'s docstring says what each does."""

from __future__ import annotations


class Switches:
    def __init__(self, gpus: int) -> None:
        self.gpus = gpus  # GPUs the Raylight log lines and the "Loading workers" bar count
        self.step_seconds: float = 0.01  # per progress tick of a sampler (and of SaveImageWebsocket)
        self.node_seconds: float = 0.0  # per call of every other node
        self.hold_node: str | None = None  # the node whose call waits (past its interrupt check) while this names it
        self.send_progress: bool = True  # False: samplers send no progress/progress_state ticks (Raylight)
        self.sampler_checks_interrupt: bool | None = None  # None: only where it reports progress
        self.log_progress: bool = False  # tqdm lines in root/comfyui.log
        self.oom_at_step: int | None = None
        self.error_at_step: int | None = None
        self.drop_sockets_at_step: int | None = None  # fires once, then resets to None
        self.http_delay: float = 0.0
        self.caching: bool = True  # False: like --cache-none
        self.model_files: dict[str, list[str]] | None = None  # folder -> names; None: any name is accepted
        self.missing_nodes: set[str] = set()  # node classes this server lacks (as without a custom node pack)
        self.video_size: tuple[int, int] = (64, 64)
        self.max_video_frames: int = 240
