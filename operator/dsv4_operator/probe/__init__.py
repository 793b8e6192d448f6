"""Probe: the DSML detector, leak statistics and the multi-turn tool-calling canary harness.

- `dsml`: classify one chat-completion response (non-streaming, or an SSE stream assembled
  first) as ok / leaked_markup / malformed_call / missing_call / degenerate / error.
- `stats`: Wilson score interval and Fisher's exact two-proportion test.
- `canary`: N concurrent sessions x R tool-calling rounds against `/v1/chat/completions`.
- `cli`: `dsv4 probe`.
"""
