"""saucer: a durable, typed, event-sourced runtime for agent sessions."""

__version__ = "0.8.0"
