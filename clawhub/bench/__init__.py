"""The persona benchmark (``manage.py bench_personas``) and the dashboard's progress view.

- ``personas``: plain Python, no Django. Personas with a fixed preference, code-scored compliance, scripted
  users, and the homework prompt bank with its fixed held-out split.
- ``plots``: a small PNG writer (no matplotlib in the environment) and the geometry of the dashboard's SVG.
- ``driver``: drives a running stack over HTTP only, like real users, and reports per training method.
- ``progress``: the reads behind the dashboard's "adapter progress" section.
"""
