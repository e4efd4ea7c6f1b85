"""What h3core itself costs, on the current code: the store, the runner, the HTTP service, the pipeline."""
