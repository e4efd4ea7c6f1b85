"""`python -m tests.integration.distributed.head_owner thread|host`: ask for a local Ray from a
thread that ends at once (as a pooled thread does when retired), and print as JSON what became
of its head. `thread`: that thread starts Ray itself; `host`: it asks a `RayHost`."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import psutil

from h3core.executors.distributed.cluster import ClusterSettings, RayHost, connect


def alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main(mode: str) -> None:
    settings = ClusterSettings(cpus=1)
    host = RayHost(settings, ranks=1) if mode == "host" else None
    asker = threading.Thread(target=host.connect if host is not None else lambda: connect(settings, ranks=1))
    asker.start()
    asker.join()
    (gcs,) = [p for p in psutil.Process().children(recursive=True) if p.name() == "gcs_server"]
    if host is None:
        deadline = time.monotonic() + 30
        while alive(gcs) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"gcs_alive": alive(gcs)}), flush=True)
        os._exit(0)  # no ray.shutdown: the head is gone, and nothing is left to stop
    import ray

    @ray.remote(num_cpus=1)
    def pid() -> int:
        return os.getpid()

    answered = ray.get(pid.remote(), timeout=120) > 0
    out = {"answered": answered, "gcs_alive": alive(gcs), "lost": host.lost()}
    host.close()
    out["gcs_alive_after_close"] = alive(gcs)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
