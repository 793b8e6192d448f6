"""Probe: the DSML detector and the multi-turn tool-calling canary harness.

- `dsml`: the detector's public names; it classifies one chat-completion response (non-streaming,
  or an SSE stream assembled first) as ok / leaked_markup / malformed_call / missing_call /
  degenerate / error. Its parts: `verdict`, `markup`, `degenerate`, `classifier`, `sse`.
- `canary`: the canary's public names; N concurrent sessions x R tool-calling rounds against
  `/v1/chat/completions`. Its parts: `scenario`, `transport`, `report`, `harness`.
- `cli`: `dsv4 probe`.
"""
