"""The ComfyUI executor: drives a ComfyUI (+ Raylight) server, completion decided by /history."""
