"""root/comfyui.log: the lines ComfyUI prints that a client may tail, tqdm progress bars included."""

from __future__ import annotations

import contextlib
from pathlib import Path


class ComfyLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, text: str) -> None:
        # A log that cannot be written is not the client's problem: ComfyUI's goes to a terminal.
        with contextlib.suppress(OSError):
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(text)

    def line(self, line: str) -> None:
        self.write(line + "\n")

    def workers_bar(self, gpus: int) -> None:
        """Raylight's "Loading workers" bar, one tick a GPU, redrawn with \\r."""
        g = max(1, gpus)
        self.write("".join(f"\rLoading workers: {tqdm(i, g, 1.25 * i)}" for i in range(g + 1)) + "\n")


def tqdm(i: int, n: int, elapsed: float) -> str:
    """A tqdm bar as it prints at step i of n."""
    frac = i / n if n else 1.0
    whole, part = divmod(int(frac * 10 * 8), 8)
    bar = "█" * whole + ("▏▎▍▌▋▊▉"[part - 1] if part and whole < 10 else "")
    bar = bar.ljust(10)
    rate = i / elapsed if elapsed > 0 else 0.0
    remaining = (n - i) / rate if rate > 0 else 0.0

    def hms(s: float) -> str:
        m, s = divmod(int(s), 60)
        return f"{m:02d}:{s:02d}"

    return f"{int(frac * 100):3d}%|{bar}| {i}/{n} [{hms(elapsed)}<{hms(remaining)}, {rate:5.2f}it/s]"
