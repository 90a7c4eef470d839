"""Seeing a job while it runs and after: live view, stall reports, traces, metrics."""
