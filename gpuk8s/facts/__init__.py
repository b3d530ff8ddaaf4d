"""Host facts: the probe script run once per host, and pure parsers that turn its output into types."""
