"""The leak tap: a proxy in front of the router that classifies production tool calls."""
