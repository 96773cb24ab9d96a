"""Tools for developing and measuring ClawHub, never on a request path.

- ``fake_upstream``: a vLLM-shaped upstream for tests, demos and benchmarks (``manage.py fake_upstream``).
- ``gateway_bench``: ``manage.py bench_gateway``, the same load straight at a fake upstream, through ClawHub
  and through LiteLLM.
- ``profiled``: uvicorn with its event loop under cProfile, for ``bench_gateway --profile``.
- ``personas``: ``manage.py bench_personas``, the persona (learning) benchmark against a running ClawHub.
"""
