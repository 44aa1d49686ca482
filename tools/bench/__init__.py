"""Benchmarks that make polyloop's own cost visible (issue 9).

Each benchmark is a module runnable on its own and prints a table plus writes JSON:

* ``python -m tools.bench.per_step``        - µs and fsyncs per step, N = 10..1000, per store;
* ``python -m tools.bench.many_runs``       - 1..1000 concurrent runs on one event loop;
* ``python -m tools.bench.resume_cost``     - resuming a finished and an interrupted run;
* ``python -m tools.bench.prompt_assembly`` - bytes assembled per step and prefix reuse;
* ``python -m tools.bench.run_all``         - all of the above (``make bench``).

Diagnostics (not in ``run_all``): ``profile_step`` (where a step's time goes, cProfile),
``encode_step`` (instructions of encoding).

Every module takes ``--quick`` (tiny sizes, a few seconds; what CI runs to keep them working)
and ``--json-out PATH`` (default: ``bench-results/<name>.json``, git-ignored). The numbers and
the commands that produced them are written down in ``research-wiki/reference/performance.md``.

The workload is the same everywhere: a scripted model that asks for one no-op tool call per
step, a trivial parser, a ``RegistryExecutor`` over one no-op tool, a sink that drops events.
Nothing but the library costs anything, so what is measured is the library. Only public API is
used. Benchmarks are never timed tests: nothing here asserts on speed.
"""
