"""One exception root (design 0003): every exception polyloop defines derives from it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

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
