"""Kill trials: real processes killed with SIGKILL mid-work and restarted; counted, what must be zero."""
