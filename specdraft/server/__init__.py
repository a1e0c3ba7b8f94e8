"""The OpenAI-compatible server (specdraft serve)."""
