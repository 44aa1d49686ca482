"""The code scenario's environment: a small world of simulated apps, served by worker processes.

Modules, from the inside out:

* ``world``   - the apps (contacts, calendar, notes, shop) and their Python API;
* ``tasks``   - the deterministic task list, one world per task, and each task's success check;
* ``sandbox`` - running one piece of agent code against a world (best effort, *not* a
  security boundary);
* ``worker``  - ``python -m tools.soak.codeworld.worker``: one HTTP server on a loopback port
  serving one task at a time (``/reset``, ``/execute``, ``/evaluate``, ``/close``);
* ``pool``    - starts N worker processes, leases them out, kills and restarts broken ones;
* ``client``  - the httpx side of the worker protocol, with transport errors translated.

``world``, ``tasks``, ``sandbox`` and ``worker`` use the standard library only (a worker
process never imports httpx or polyloop); ``pool`` and ``client`` run in the driver.
This package imports none of its modules eagerly.
"""
