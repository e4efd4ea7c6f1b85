"""One-off studies behind a decision: A/B runs against an older commit or another library, and trials
of one behaviour (Ray's niceness, an idle Ray head, a real ComfyUI)."""
