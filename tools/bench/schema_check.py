"""Diagnostic: the cost of checking one tool call's arguments (design 0223; not in ``run_all``).

``python -m tools.bench.schema_check [--number N] [--repeats K]``

Times, per check, in µs of CPU (``time.thread_time``: the machine's other load counts less
than with a wall clock): the lowest of K repeats of N checks, and their median:

* ``registry.validate``: ``ToolRegistry.validate(call)``, what ``RegistryExecutor`` runs before
  every tool call (on the tree on ``PYTHONPATH``: run it on two trees to compare them);
* ``JsonSchema.problems``: the library's schema check alone, every problem collected (what a
  structured answer gets), when the tree has it;
* ``jsonschema.is_valid`` and ``jsonschema.iter_errors``: ``Draft7Validator.is_valid`` and
  the first of ``iter_errors`` (the validator built once), when ``jsonschema`` is importable;
* ``fastjsonschema``: the function ``fastjsonschema.compile`` returns, when importable.

The third-party validators get plain ``dict``/``list`` arguments; polyloop gets the same
arguments as a ``ToolCall`` holds them. Two workloads: ``flat`` (a path and an encoding
``enum``, ``additionalProperties: false``) and ``nested`` (the MCP filesystem server's
``edit_file``: a path, an array of two ``{oldText, newText}`` objects and a flag, with
``$schema`` and ``default``), each with fitting arguments and with one nested violation.
It also prints, for each third-party validator, the time to import it in a fresh process.

``python -m tools.bench.schema_check --run-only CHECK WORKLOAD N`` (``WORKLOAD`` is e.g.
``nested-fits``) builds everything and runs ``CHECK`` N times, timing nothing: under
``valgrind --tool=callgrind``, N = 2000 minus N = 0, divided by 2000, is the instructions of
one check, which the machine's load does not change (design 0214).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from polyloop.ports import ToolCall
from polyloop.tools import ToolRegistry, ToolSpec, ToolValidationError

FLAT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "the file to read"},
        "encoding": {"type": "string", "enum": ["utf-8", "latin-1"]},
    },
    "required": ["path"],
    "additionalProperties": False,
}
NESTED: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "edits": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "oldText": {"type": "string", "description": "Text to search for"},
                    "newText": {"type": "string", "description": "Text to replace with"},
                },
                "required": ["oldText", "newText"],
                "additionalProperties": False,
            },
        },
        "dryRun": {"type": "boolean", "default": False},
    },
    "required": ["path", "edits"],
    "additionalProperties": False,
}
WORKLOADS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    # name: (schema, fitting arguments, arguments with one violation below the top level)
    "flat": (FLAT, {"path": "src/app.py", "encoding": "utf-8"}, {"path": "a", "encoding": "x"}),
    "nested": (
        NESTED,
        {
            "path": "src/app.py",
            "edits": [
                {"oldText": "def main():", "newText": "def main() -> None:"},
                {"oldText": "return 1", "newText": "return 0"},
            ],
            "dryRun": True,
        },
        {"path": "src/app.py", "edits": [{"oldText": "a", "newText": 1}]},
    ),
}


async def _noop(arguments: Mapping[str, object], /) -> str:
    return ""


def _timed(check: Callable[[], object], number: int, repeats: int) -> str:
    check()
    timer = timeit.Timer(check, timer=time.thread_time)
    runs = [t / number * 1e6 for t in timer.repeat(number=number, repeat=repeats)]
    return f"{min(runs):8.2f} µs  (median {statistics.median(runs):.2f})"


def _polyloop(schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Callable[[], object]]:
    registry = ToolRegistry([ToolSpec(name="t", description="d", parameters=schema, handler=_noop)])
    call = ToolCall(name="t", arguments=arguments)

    def validate() -> object:
        try:
            registry.validate(call)
        except ToolValidationError as exc:
            return exc
        return None

    found: dict[str, Callable[[], object]] = {"registry.validate": validate}
    try:
        from polyloop._common import JsonSchema  # absent before design 0223
    except ImportError:
        return found
    compiled = JsonSchema(schema)
    found["JsonSchema.problems"] = lambda: compiled.problems(call.arguments)
    return found


def _third_party(
    schema: dict[str, Any], arguments: dict[str, Any]
) -> dict[str, Callable[[], object]]:
    found: dict[str, Callable[[], object]] = {}
    if importlib.util.find_spec("jsonschema") is not None:
        import jsonschema

        validator = jsonschema.Draft7Validator(schema)
        found["jsonschema.is_valid"] = lambda: validator.is_valid(arguments)
        found["jsonschema.iter_errors"] = lambda: next(validator.iter_errors(arguments), None)
    if importlib.util.find_spec("fastjsonschema") is not None:
        import fastjsonschema

        validate = fastjsonschema.compile(schema)

        def fast() -> object:
            try:
                return validate(arguments)
            except fastjsonschema.JsonSchemaValueException as exc:
                return exc

        found["fastjsonschema"] = fast
    return found


def _import_seconds(module: str) -> str:
    if importlib.util.find_spec(module) is None:
        return "not installed"
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = []
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        runs.append(float(out.stdout) * 1e3)
    return f"{statistics.median(runs):.1f} ms"


def _checks(workload: str) -> dict[str, Callable[[], object]]:
    name, _, label = workload.partition("-")
    schema, fitting, violating = WORKLOADS[name]
    arguments = fitting if label == "fits" else violating
    return {**_polyloop(schema, arguments), **_third_party(schema, arguments)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--number", type=int, default=20_000, help="checks per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--run-only", nargs=3, metavar=("CHECK", "WORKLOAD", "N"))
    args = parser.parse_args(argv)
    if args.run_only:
        check_name, workload, count = args.run_only
        check = _checks(workload)[check_name]
        for _ in range(int(count)):
            check()
        return
    for name in WORKLOADS:
        for label in ("fits", "violates"):
            print(f"{name}-{label}")
            for check_name, check in _checks(f"{name}-{label}").items():
                print(f"  {check_name:24} {_timed(check, args.number, args.repeats)}")
    for module in ("jsonschema", "fastjsonschema"):
        print(f"import {module}: {_import_seconds(module)}")


if __name__ == "__main__":
    main()
