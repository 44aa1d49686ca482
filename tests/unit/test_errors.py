"""One exception root (design 0003): every exception polyloop defines derives from it; the
families under it (design 0221) only ever add bases."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import polyloop
from polyloop import errors

pytestmark = pytest.mark.unit


def _all_polyloop_modules() -> list[str]:
    names = ["polyloop"]
    for info in pkgutil.walk_packages(polyloop.__path__, prefix="polyloop."):
        names.append(info.name)
    return names


def _exception_classes_defined_in_polyloop() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _all_polyloop_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.startswith("polyloop")
            ):
                found[f"{value.__module__}.{attr}"] = value
    return found


def test_the_package_defines_exceptions_at_all() -> None:
    # Guards the next test against passing on an empty walk.
    assert len(_exception_classes_defined_in_polyloop()) >= 10


def test_every_exception_class_derives_from_the_root() -> None:
    strays = {
        name
        for name, cls in _exception_classes_defined_in_polyloop().items()
        if not issubclass(cls, errors.PolyloopError)
    }
    assert strays == set(), f"exceptions outside PolyloopError: {sorted(strays)}"


def test_type_and_value_errors_keep_their_builtin_meaning() -> None:
    assert issubclass(errors.PolyloopTypeError, TypeError)
    assert issubclass(errors.PolyloopValueError, ValueError)
    for cls in (errors.DecodeError, errors.AssemblyError, errors.ToolValidationError):
        assert issubclass(cls, ValueError), cls


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("polyloop.session", "RunIdentityError"),
        ("polyloop.session", "ParameterDriftError"),
        ("polyloop.session", "LogCorruptError"),
        ("polyloop.session", "AssemblyError"),
        ("polyloop.serialization", "DecodeError"),
        ("polyloop.tools", "ToolValidationError"),
        ("polyloop.tools", "ToolEnvironmentError"),
    ],
)
def test_the_0_1_0_import_paths_still_name_the_same_class(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_gateway_errors_are_polyloop_errors() -> None:
    adapters = pytest.importorskip("polyloop.adapters", reason="needs the gateway extra (httpx)")
    assert issubclass(adapters.GatewayHTTPError, errors.PolyloopError)
    assert issubclass(adapters.GatewayResponseError, errors.PolyloopValueError)


# --------------------------------------------------------------------------- type vs value (0110)

SRC = Path(__file__).resolve().parents[2] / "src" / "polyloop"


def _builtin_raises() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id in {"TypeError", "ValueError"}:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} raises {target.id}")
    return found


def test_the_package_raises_no_bare_type_or_value_error() -> None:
    """Wrong types raise ``PolyloopTypeError``, wrong values ``PolyloopValueError``, so that
    ``except PolyloopError`` catches every refusal and ``except TypeError`` still works."""
    assert _builtin_raises() == []


def test_a_wrong_type_is_a_type_error_in_records_and_in_requests_alike() -> None:
    from polyloop.session import RunRequest
    from polyloop.tools import ToolRegistry
    from polyloop.types import Budget, Context, ReplayPolicy, RunStarted

    with pytest.raises(errors.PolyloopTypeError, match=r"RunStarted\.parameter_snapshot"):
        RunStarted(run_id="r", parameter_snapshot={"a": 1})  # type: ignore[dict-item]
    tools = ToolRegistry()
    with pytest.raises(errors.PolyloopTypeError, match=r"RunRequest\.model_binding"):
        RunRequest(
            run_id="r",
            budget=Budget(
                max_steps=1, max_actions=1, max_consecutive_parse_failures=1, max_prompt_chars=9
            ),
            action_executor=tools.executor(),
            context=Context(),
            model_replay_policy=ReplayPolicy.SAFE,
            model_binding={"a": 1},  # type: ignore[dict-item]
        )


def test_a_wrong_value_is_a_value_error() -> None:
    from polyloop.types import Budget

    with pytest.raises(errors.PolyloopValueError, match=r"Budget\.max_steps must be >= 1"):
        Budget(max_steps=0, max_actions=1, max_consecutive_parse_failures=1, max_prompt_chars=9)


# --------------------------------------------------------------------------- the exclusive start


def test_a_taken_run_id_is_a_polyloop_error_that_is_still_a_file_exists_error() -> None:
    """``write_run_started`` on a used id raised the builtin ``FileExistsError``, the one
    exception outside the root (issue 20). ``RunAlreadyStartedError`` is both, so code that
    catches either keeps working."""
    import errno as errno_codes

    exc = errors.RunAlreadyStartedError("S: run id 'r1' already has a log", run_id="r1")
    assert isinstance(exc, errors.PolyloopError)
    assert isinstance(exc, FileExistsError)
    assert exc.run_id == "r1"
    assert exc.errno == errno_codes.EEXIST
    assert str(exc) == "S: run id 'r1' already has a log"
    assert "RunAlreadyStartedError" in errors.__all__
    assert "``RunAlreadyStartedError``" in (errors.__doc__ or "")
    with pytest.raises(FileExistsError):
        raise exc


def test_the_package_raises_no_builtin_file_exists_error() -> None:
    raised = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Name) and target.id == "FileExistsError":
                    raised.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert raised == []


# --------------------------------------------------------------------------- families (0221)

BASES_BEFORE_0221 = {
    "AssemblyError": ("PolyloopValueError",),
    "ContextLengthExceededError": ("PolyloopError",),
    "DecodeError": ("PolyloopValueError",),
    "EngineCapacityError": ("PolyloopError", "TimeoutError"),
    "EngineNotConnectedError": ("PolyloopError",),
    "EventLoopRunningError": ("PolyloopError", "RuntimeError"),
    "FinishedRunDriftWarning": ("PolyloopError", "UserWarning"),
    "InspectError": ("PolyloopError",),
    "LogChecksumError": ("LogCorruptError", "DecodeError"),
    "LogCorruptError": ("PolyloopError",),
    "McpConnectionError": ("PolyloopError",),
    "McpToolError": ("PolyloopError",),
    "OutputValidationError": ("PolyloopValueError",),
    "ParameterDriftError": ("PolyloopError",),
    "PolyloopError": ("Exception",),
    "PolyloopTypeError": ("PolyloopError", "TypeError"),
    "PolyloopValueError": ("PolyloopError", "ValueError"),
    "ResolutionError": ("PolyloopError",),
    "RunAlreadyStartedError": ("PolyloopError", "FileExistsError"),
    "RunIdentityError": ("PolyloopError",),
    "RunLeaseHeldError": ("PolyloopError",),
    "RunLeaseLostError": ("PolyloopError",),
    "SeamTimeoutError": ("PolyloopError", "TimeoutError"),
    "StoreSchemaError": ("PolyloopError",),
    "StoreUnavailableError": ("PolyloopError", "OSError"),
    "ToolEnvironmentError": ("PolyloopError",),
    "ToolValidationError": ("PolyloopValueError",),
    "UnleasedStoreWarning": ("PolyloopError", "UserWarning"),
}
"""Each class's bases as 0.2.0 shipped them (frozen): a family adds a base, never removes one."""

FAMILIES = {
    "StoreError": {
        "StoreUnavailableError",
        "StoreSchemaError",
        "RunLeaseHeldError",
        "RunLeaseLostError",
        "BatchAnswerError",
    },
    "RunStateError": {
        "RunIdentityError",
        "RunAlreadyStartedError",
        "ParameterDriftError",
        "ResolutionError",
        "ForkError",
        "ChildRunOpenError",
        "TreeLimitError",
    },
    "LogCorruptError": {"LogChecksumError"},
    "SeamError": {
        "SeamTimeoutError",
        "ContextLengthExceededError",
        "ToolError",
        "ToolEnvironmentError",
        "ToolOutcomeUnknown",
        "ToolValidationError",
        "McpConnectionError",
        "McpToolError",
    },
    "ToolError": {
        "ToolEnvironmentError",
        "ToolOutcomeUnknown",
        "ToolValidationError",
        "McpConnectionError",
        "McpToolError",
    },
    "EngineError": {"EngineNotConnectedError", "EngineCapacityError"},
}


def _by_name(name: str) -> type[BaseException]:
    import builtins

    found = getattr(errors, name, None) or getattr(builtins, name)
    assert isinstance(found, type)
    return found


@pytest.mark.parametrize("name", sorted(BASES_BEFORE_0221))
def test_every_class_keeps_every_base_it_had(name: str) -> None:
    cls = _by_name(name)
    for base in BASES_BEFORE_0221[name]:
        assert issubclass(cls, _by_name(base)), f"{name} is no longer a {base}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_catches_exactly_its_members(family: str) -> None:
    members = {
        name
        for name in errors.__all__
        if name != family and issubclass(getattr(errors, name), _by_name(family))
    }
    assert members == FAMILIES[family]


def test_every_family_is_exported_documented_and_never_raised_itself() -> None:
    raised = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Name) and target.id in FAMILIES.keys() - {
                    "LogCorruptError"
                }:
                    raised.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert raised == []
    for family in FAMILIES:
        assert family in errors.__all__
        assert issubclass(_by_name(family), errors.PolyloopError)


def test_the_module_docstring_names_every_class_it_exports() -> None:
    """The table at the top of ``errors.py`` is the contract: a class it does not name is one a
    reader cannot find."""
    doc = errors.__doc__ or ""
    missing = [name for name in errors.__all__ if f"``{name}``" not in doc]
    assert missing == []


def test_the_gateway_errors_are_seam_errors() -> None:
    adapters = pytest.importorskip("polyloop.adapters", reason="needs the gateway extra (httpx)")
    for name in (
        "GatewayHTTPError",
        "GatewayContextLengthError",
        "GatewayResponseError",
        "GatewayTimeoutError",
        "GatewayConnectError",
        "GatewayTransportError",
    ):
        assert issubclass(getattr(adapters, name), errors.SeamError), name
    assert issubclass(adapters.GatewayContextLengthError, errors.ContextLengthExceededError)


def test_a_store_failure_caught_as_its_family_keeps_its_facts() -> None:
    exc = errors.StoreUnavailableError("S: could not write", store="S", run_id="r", record="log")
    exc.errno = 28
    with pytest.raises(errors.StoreError) as caught:
        raise exc
    assert caught.value is exc
    assert isinstance(exc, OSError)
    assert str(exc) == "S: could not write"
