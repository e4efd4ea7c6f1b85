"""Test doubles of the servers h3core talks to (see `comfyui.py`)."""
