"""The timeline: Chrome trace events (ui.perfetto.dev, chrome://tracing)."""
