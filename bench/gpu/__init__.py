"""The GPU acceptance check's steps (bench/gpu_check.sh runs them as `python -m bench.gpu.<step>`); see
bench/gpu/README.md."""
