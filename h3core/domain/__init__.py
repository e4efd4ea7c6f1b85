"""The pure domain: requests, events, the job-state fold, admission and retry policies.

No I/O, no clock, no asyncio: everything here is a function of its arguments.
"""
