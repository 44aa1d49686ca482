#!/usr/bin/env bash
# make release-check: build what we would upload, inspect it, install it where nothing of this
# repository is importable, and use it there.
#
#   1. build the sdist and the wheel from a clean dist/ (python -m build, with build isolation:
#      the build backend comes from the package index, not from .venv);
#   2. twine check --strict (a missing or broken long description fails the release);
#   3. inspect both archives: the wheel ships every module under src/polyloop, py.typed and
#      polyloop.testing, declares no runtime dependency, and contains nothing but the package
#      (no tests/, no tools/); the sdist holds the package source and README.md, and no tests/,
#      tools/, runs/ or .env (tests need the dev tree and tools/, so they are not shipped);
#   4. create a fresh virtualenv, install the wheel offline (--no-index: a runtime dependency
#      would make this fail), import polyloop from outside the repository, check that neither
#      httpx nor pytest was imported, and drive one tiny run to completion and resume it.
#
# Needs .venv (make install) and, for build isolation, access to the package index.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
if [[ ! -x $PY ]]; then
    echo "release check: $PY not found; run 'make install' first" >&2
    exit 2
fi
started=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/polyloop-release.XXXXXX")
trap 'rm -rf "$work"' EXIT

step() { printf '== %s\n' "$*"; }

step "build sdist and wheel"
rm -rf dist build
if ! "$PY" -m build --outdir dist . >"$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    echo "release check: python -m build failed (log above)" >&2
    exit 1
fi

step "twine check --strict"
.venv/bin/twine check --strict dist/*

step "inspect the archives"
"$PY" - <<'PY'
import re
import sys
import tarfile
import zipfile
from pathlib import Path

def fail(message: str) -> None:
    sys.exit(f"release check: {message}")

version = re.search(
    r'^__version__ = "([^"]+)"$', Path("src/polyloop/__init__.py").read_text(), re.MULTILINE
)
if version is None:
    fail("no __version__ line in src/polyloop/__init__.py")
version = version[1]
wheels = sorted(Path("dist").glob("*.whl"))
sdists = sorted(Path("dist").glob("*.tar.gz"))
if [w.name for w in wheels] != [f"polyloop-{version}-py3-none-any.whl"]:
    fail(f"expected one wheel polyloop-{version}-py3-none-any.whl, found {wheels}")
if [s.name for s in sdists] != [f"polyloop-{version}.tar.gz"]:
    fail(f"expected one sdist polyloop-{version}.tar.gz, found {sdists}")

# -- wheel
names = set(zipfile.ZipFile(wheels[0]).namelist())
info = f"polyloop-{version}.dist-info"
strays = sorted(n for n in names if n.split("/", 1)[0] not in {"polyloop", info})
if strays:
    fail(f"the wheel holds files outside the package (tests/ or tools/?): {strays[:10]}")
shipped = {
    "polyloop/" + p.relative_to("src/polyloop").as_posix()
    for p in Path("src/polyloop").rglob("*.py")
    if "__pycache__" not in p.parts
}
required = shipped | {"polyloop/py.typed", "polyloop/testing/__init__.py"}
missing = sorted(required - names)
if missing:
    fail(f"the wheel lacks {missing} (a subpackage without __init__.py?)")
metadata = zipfile.ZipFile(wheels[0]).read(f"{info}/METADATA").decode()
core_requirements = [
    line
    for line in metadata.splitlines()
    if line.startswith("Requires-Dist:") and "extra ==" not in line
]
if core_requirements:
    fail(f"the core must have no runtime dependency, the wheel declares {core_requirements}")
if "Requires-Python: >=3.11" not in metadata:
    fail("the wheel metadata lacks 'Requires-Python: >=3.11'")
entry_points = zipfile.ZipFile(wheels[0]).read(f"{info}/entry_points.txt").decode()
if "polyloop = polyloop.testing._plugin" not in entry_points:
    fail("the wheel lacks the pytest11 entry point polyloop = polyloop.testing._plugin")

# -- sdist
prefix = f"polyloop-{version}/"
members = {m[len(prefix):] for m in tarfile.open(sdists[0]).getnames() if m.startswith(prefix)}
for needed in ("pyproject.toml", "PKG-INFO", "README.md", "src/polyloop/py.typed",
               "src/polyloop/testing/__init__.py"):
    if needed not in members:
        fail(f"the sdist lacks {needed}")
for banned in ("tests/", "tools/", "runs/", ".venv/", ".env"):
    hits = sorted(m for m in members if m == banned.rstrip("/") or m.startswith(banned))
    if hits:
        fail(f"the sdist must not contain {banned}: {hits[:5]}")
print(f"   wheel: {len(names)} files; sdist: {len(members)} entries; version {version}")
PY

step "install the wheel into a fresh virtualenv (offline)"
"$PY" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --no-index --disable-pip-version-check dist/*.whl

step "import it and run one tiny offline run"
cd "$work"  # away from the repository, so only the installed wheel is importable
"$work/venv/bin/python" - <<'PY'
import asyncio
import sys
from pathlib import Path

import polyloop
import polyloop.session
import polyloop.stores
import polyloop.tools

site = Path(polyloop.__file__).resolve().parent
assert "site-packages" in site.parts, f"polyloop imported from {site}, not from the venv"
assert (site / "py.typed").is_file() and (site / "testing" / "__init__.py").is_file()
leaked = sorted(n for n in ("httpx", "pytest", "_pytest", "pytest_asyncio") if n in sys.modules)
assert not leaked, f"importing polyloop imported {leaked}"
import polyloop.testing  # its doubles need no pytest (design 0226)
from polyloop.testing import ScriptedModelClient  # noqa: F401
assert "pytest" not in sys.modules, "polyloop.testing's doubles imported pytest"
try:
    polyloop.testing.RunStoreContract  # noqa: B018 - the contract bases need the testing extra
except ImportError as exc:
    assert "pytest" in str(exc), exc
else:
    raise AssertionError("polyloop.testing's contract bases loaded without pytest installed")

from polyloop.ports import Action, ParsedReply
from polyloop.session import AgentDefinition, RunRequest, resume, run
from polyloop.stores import VolatileRunStore
from polyloop.types import (ActionOutcome, ActionStatus, Budget, Context, Message, ModelReply,
                            ReplayPolicy, Role, StopReason, SyntheticObservations, TextBlock)

class Model:  # two scripted replies: some code, then the code that finishes the task
    async def call(self, call):
        return ModelReply(call_id=f"c{call.call_index}", content=["x = 6 * 7", "done(x)"][call.call_index])
    def parameters(self): return {"kind": "scripted"}

class Parser:  # every reply is code
    def parse(self, reply): return ParsedReply(history_text=reply.content, decision=Action(text=reply.content))
    def parameters(self): return {"kind": "code"}

class Executor:  # pretends to run code; the environment reports completion on done(...)
    async def execute(self, action):
        return ActionOutcome(status=ActionStatus.EXECUTED, observation="ok", observation_is_synthetic=False,
                             env_reported_completion=action.text.startswith("done("), observation_truncated_chars=0)
    def parameters(self): return {"kind": "fake_code"}

class Sink:
    events = []
    async def emit(self, event): self.events.append(event)
    def parameters(self): return {"kind": "list"}

texts = SyntheticObservations(action_rejected="[rejected]", env_failed="[env]", model_call_failed="[llm]")
agent = AgentDefinition(model_client=Model(), decision_parser=Parser(), store=VolatileRunStore(),
                        event_sink=Sink(), synthetic_observations=texts)
request = RunRequest(run_id="release-check", budget=Budget(max_steps=5, max_actions=5,
                     max_consecutive_parse_failures=2, max_prompt_chars=10_000),
                     action_executor=Executor(), model_replay_policy=ReplayPolicy.NEVER,
                     context=Context(goal_level=(Message(role=Role.USER, content=(TextBlock(text="Compute 6*7."),)),)))
result = asyncio.run(run(agent, request))
assert result.stop_reason is StopReason.TASK_COMPLETED, result
assert [s.action for s in result.steps] == ["x = 6 * 7", "done(x)"] and len(Sink.events) == 2
assert asyncio.run(resume(agent, request)) == result  # a finished run hands back its result
print(f"   polyloop {polyloop.__version__} from {site}: {result.stop_reason.value} in {len(result.steps)} steps")
PY

echo "release check: OK ($((SECONDS - started)) s)"
