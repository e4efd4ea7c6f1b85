"""Test doubles that h3core's own suite uses (`devices.py`); the fake ComfyUI server ships as `h3core.testing.comfyui`."""
