"""The leak detector: markup, degenerate text, verdicts, classify_response, SSE, leak statistics."""
