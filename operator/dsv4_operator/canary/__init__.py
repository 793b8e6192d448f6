"""The multi-turn tool-calling canary: N concurrent sessions x R rounds, every response judged by
the leak detector (`leak/`).

- `scenario`: the conversation: tools, prompts, fake tool results;
- `transport`: model discovery, one request, which failures are retried, the typed errors;
- `report`: records, session results, the per-response and per-session leak rates;
- `harness`: `run_canary`;
- `remote`: a run asked of a router pod's leak tap (`POST /canary`), both sides;
- `cli`: `dsv4 probe`.
"""
