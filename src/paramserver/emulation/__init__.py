"""Injected slowness and emulated links: stragglers, device time, link grammar. Pure."""
