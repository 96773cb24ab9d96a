"""The persona benchmark (``manage.py bench_personas``).

- ``personas``: plain Python, no Django. Personas with a fixed preference, code-scored compliance, scripted
  users, and the homework prompt bank with its fixed held-out split.
- ``plots``: a small PNG writer (no matplotlib in the environment) for the benchmark's charts.
- ``driver``: drives a running stack over HTTP only, like real users, and reports per training method.
"""
