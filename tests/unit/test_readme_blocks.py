"""Every README code block marked ``python runnable`` runs, as a script, and exits cleanly.

A block opts in with the exact info string ``python runnable`` (a plain ``python`` block is
illustration and is not run). Each one is written to a file in a fresh temporary directory and
run there with this interpreter, the way a reader would paste and run it: only the installed
``polyloop`` is importable, not ``tests/`` or ``tools/``.

Blocks talk to an OpenAI-compatible endpoint named by ``OPENAI_BASE_URL`` (with
``OPENAI_API_KEY`` and ``OPENAI_MODEL``), as a reader's would. Here that endpoint is
``ScriptedEndpoint``: a loopback stub (127.0.0.1, started and stopped by each test) that answers
the way OpenAI and vLLM do, with native ``tool_calls`` and ``content: null``. The first block is
also crashed mid-run (the process is killed while it waits for the model) and started again,
which must resume the run from its JSONL log and finish it (issue 12, item 6).

These tests spawn processes, hence the ``integration`` marker despite the directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
INFO_STRING = "python runnable"
_OPENING = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    line: int
    """1-based line number of the opening fence in the Markdown file."""
    info: str
    code: str


def fenced_blocks(markdown: str) -> list[Block]:
    """Every fenced code block (CommonMark rules that matter here): the closing fence uses the
    same character, is at least as long as the opening one and has nothing after it; an
    unclosed block runs to the end of the document."""
    blocks = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        opening = _OPENING.match(lines[index])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            body.append(re.sub(rf"^ {{0,{indent}}}", "", lines[end]))
            end += 1
        code = "\n".join(body) + "\n" if body else ""
        blocks.append(Block(line=index + 1, info=opening["info"].strip(), code=code))
        index = end + 1
    return blocks


def runnable_blocks() -> list[Block]:
    if not README.is_file():
        return []
    return [b for b in fenced_blocks(README.read_text(encoding="utf-8")) if b.info == INFO_STRING]


def test_readme_has_a_runnable_block() -> None:
    assert README.is_file(), f"{README} is missing; the README is the newcomer's entry point"
    assert runnable_blocks(), (
        f"README.md has no `{INFO_STRING}` block: mark the complete run/resume example with "
        f"```{INFO_STRING} so that this suite proves it works"
    )


_BLOCKS = runnable_blocks()


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=f"README.md:{b.line}") for b in _BLOCKS]
    or [
        pytest.param(
            None,
            marks=pytest.mark.skip(
                reason="README.md has no runnable block yet; test_readme_has_a_runnable_block "
                "fails and says so"
            ),
            id="no-runnable-block",
        )
    ],
)
def test_runnable_block_exits_cleanly(
    block: Block, tmp_path: Path, endpoint: ScriptedEndpoint
) -> None:
    process = _run_block(block, tmp_path, endpoint)
    assert process.returncode == 0, _failure(block, process)


# --------------------------------------------------------------------------- the first example


def _is_tool_start(lines: list[str], index: int) -> bool:
    """A top-level ``async def`` other than ``main`` (a tool function), or a decorator line of
    one (``@tool(...)`` belongs to the function it decorates)."""
    for line in lines[index:]:
        if line.startswith("@"):
            continue
        return line.startswith("async def ") and not line.startswith("async def main")
    return False


def _count_user_lines(code: str) -> int:
    """Lines of user code: not blank, not a comment, not an import, not inside an
    ``async def`` tool function (a top-level ``async def`` whose docstring makes it a tool),
    its decorators included."""
    count = 0
    in_tool = False
    lines = code.splitlines()
    for index, line in enumerate(lines):
        stripped = line.strip()
        if (line.startswith(("@", "async def "))) and _is_tool_start(lines, index):
            in_tool = True
            continue
        if in_tool and (not line or line[0] in " \t"):
            continue
        in_tool = False
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith(("import ", "from ")):
            continue
        count += 1
    return count


def test_the_first_example_is_an_agent_in_at_most_6_lines() -> None:
    """Issue 25: the short path leads, in at most 6 lines beyond imports and tool functions."""
    first = _BLOCKS[0]
    assert "from polyloop import Agent, tool" in first.code
    assert "@tool" in first.code
    assert "Agent(" in first.code
    lines = _count_user_lines(first.code)
    assert lines <= 6, f"the first README example has {lines} lines of user code (max 6)"


def test_what_the_agent_builds_follows_in_the_explicit_form() -> None:
    """The explicit form comes right after, introduced as what the Agent builds."""
    readme = README.read_text(encoding="utf-8")
    explicit = [b for b in _BLOCKS if "GatewayModelClient" in b.code]
    assert len(explicit) == 1
    (block,) = explicit
    heading = readme.index("### What the Agent builds")
    assert readme.index(block.code.splitlines()[0]) > heading
    for name in ("NativeToolCallParser", "JsonlRunStore", "run_or_resume", "RunRequest"):
        assert name in block.code
    assert _count_user_lines(block.code) <= 15


def test_the_commands_for_the_explicit_form_set_every_variable_it_reads() -> None:
    """The explicit form reads ``os.environ["..."]`` without defaults: each command the README
    gives for it sets every one of those variables (the first example's "OpenAI itself"
    command sets only the key, which would be a ``KeyError`` here)."""
    (block,) = [b for b in _BLOCKS if "GatewayModelClient" in b.code]
    required = set(re.findall(r'os\.environ\["(\w+)"\]', block.code))
    assert required == {"OPENAI_BASE_URL", "OPENAI_MODEL"}
    readme = README.read_text(encoding="utf-8")
    after = readme[readme.index(block.code) + len(block.code) :]
    after = after[after.index("```") + 3 :]  # past the block's closing fence
    commands = next(b for b in fenced_blocks(after) if b.info == "bash").code.replace("\\\n", "")
    runs = [line for line in commands.splitlines() if "explicit_agent.py" in line]
    assert len(runs) == 2
    for line in runs:
        assigned = set(re.findall(r"(?:^|\s)(\w+)=\S", line.split(".venv/bin/python")[0]))
        assert required <= assigned, line


def test_the_counter_leaves_out_tool_functions_and_their_decorators() -> None:
    code = (
        "from polyloop import Agent, tool\n\n"
        '@tool(replay=\'safe\')\nasync def add(a: int) -> str:\n    """Add."""\n'
        "    return ''\n\n"
        "@dataclass\nclass Answer:\n    value: int\n\n"
        "agent = Agent('openai:m', tools=[add])\n"
    )
    assert _count_user_lines(code) == 4  # the dataclass (3 lines) and the agent


def test_the_typed_output_example_prints_an_instance_of_its_type(
    tmp_path: Path, endpoint: ScriptedEndpoint
) -> None:
    (typed,) = [b for b in _BLOCKS if "output_type=" in b.code]
    process = _run_block(typed, tmp_path, endpoint)
    assert process.returncode == 0, _failure(typed, process)
    assert process.stdout.startswith("Answer(value=20, working=")
    offered = [tool["function"]["name"] for tool in endpoint.requests[0]["tools"]]
    assert offered == ["final_result"]


_ALREADY = (
    " (already finished: this is its stored result and nothing ran now; a new run_id runs the "
    "task again)"
)
"""What ``summary()`` adds for a run that had finished before this start (design 0230)."""


def test_the_first_example_resumes_after_a_crash_and_then_only_reports(
    tmp_path: Path, endpoint: ScriptedEndpoint
) -> None:
    first = _BLOCKS[0]
    endpoint.hang_at = 2  # the second model request never gets an answer...
    script = _write(first, tmp_path)
    crashed = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=_env(endpoint), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        endpoint.wait_for_requests(2, timeout=60)
    finally:
        crashed.kill()  # ...and the process dies waiting for it (SIGKILL: no cleanup at all)
        crashed.communicate(timeout=30)
    endpoint.hang_at = None

    resumed = _run_block(first, tmp_path, endpoint)
    assert resumed.returncode == 0, _failure(first, resumed)
    assert endpoint.request_count == 4  # the lost request is made again, then the last one
    assert endpoint.tool_messages_per_request() == [0, 1, 1, 2]
    assert "final_answer" in resumed.stdout

    again = _run_block(first, tmp_path, endpoint)
    assert again.returncode == 0, _failure(first, again)
    assert endpoint.request_count == 4  # a finished run is reported, not run again
    # The stored result, saying that nothing ran (design 0230).
    assert again.stdout == resumed.stdout.replace("tool calls:", f"tool calls{_ALREADY}:", 1)
    # Nothing changed between the starts: no drift warning, nothing at all on stderr.
    assert "FinishedRunDriftWarning" not in again.stderr
    assert again.stderr == "", again.stderr


# --------------------------------------------------------------------------- issue 26


def test_the_cluster_snippet_prints_the_stop_reason_value_not_the_enum() -> None:
    """The README's cluster block (not runnable: it needs a cluster and a factory) prints each
    outcome; its print, run on outcomes like the ones ``run_on_ray`` yields, shows
    ``step_budget``, never ``StopReason.STEP_BUDGET``, and the error of a failed one."""
    import contextlib
    import io
    from types import SimpleNamespace

    from polyloop.types import StopReason

    block = next(b for b in fenced_blocks(README.read_text("utf-8")) if "run_on_ray(" in b.code)
    body = block.code[block.code.index("print(") :]
    printed = io.StringIO()
    for outcome in (
        SimpleNamespace(progress=SimpleNamespace(finished=1), run_id="r1",
                        stop_reason=StopReason.STEP_BUDGET, error=None),
        SimpleNamespace(progress=SimpleNamespace(finished=2), run_id="r2",
                        stop_reason=None, error="WorkerCrashedError: gone"),
    ):  # fmt: skip
        with contextlib.redirect_stdout(printed):
            exec(body, {"outcome": outcome})
    assert printed.getvalue() == "1 r1 step_budget\n2 r2 WorkerCrashedError: gone\n"


ADD_SCHEMA = {
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}


def test_the_first_example_sends_its_tools_with_tool_choice_auto_and_counts_them(
    tmp_path: Path, endpoint: ScriptedEndpoint
) -> None:
    """Issue 26 item 1: the request body the first example sends, pinned (design 0216): the
    instructions as the system message (llama-cpp-python renders the tools into it), both
    tools, ``tool_choice: "auto"``, one call per reply; and a summary that counts."""
    first = _BLOCKS[0]
    process = _run_block(first, tmp_path, endpoint)
    assert process.returncode == 0, _failure(first, process)
    assert process.stdout == "final_answer after 3 steps and 2 tool calls: (2 + 3) * 4 = 20\n"
    body = endpoint.requests[0]
    assert body["messages"] == [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "What is (2 + 3) * 4?"},
    ]
    multiply = {**ADD_SCHEMA, "name": "multiply", "description": "Multiply two integers."}
    assert body["tools"] == [
        {"type": "function", "function": ADD_SCHEMA},
        {"type": "function", "function": multiply},
    ]
    assert body["tool_choice"] == "auto"
    assert body["parallel_tool_calls"] is False
    assert all(request["tool_choice"] == "auto" for request in endpoint.requests)


def test_a_keyless_local_server_gets_no_authorization_header_from_either_example(
    tmp_path: Path, endpoint: ScriptedEndpoint
) -> None:
    """Issue 26 item 3: without ``OPENAI_API_KEY`` both forms of the first example run and
    send no ``Authorization`` header."""
    first, explicit = _BLOCKS[0], next(b for b in _BLOCKS if "GatewayModelClient" in b.code)
    for index, block in enumerate((first, explicit)):
        directory = tmp_path / str(index)
        directory.mkdir()
        process = _run_block(block, directory, endpoint, key=False)
        assert process.returncode == 0, _failure(block, process)
        assert "2 tool calls: (2 + 3) * 4 = 20" in process.stdout
    assert len(endpoint.headers) == 6
    assert all("authorization" not in headers for headers in endpoint.headers)


def test_rerunning_the_finished_first_example_with_a_change_warns_and_names_it(
    tmp_path: Path, endpoint: ScriptedEndpoint
) -> None:
    """Issue 26 item 2: the stored result comes back (nothing is sent), and stderr names the
    changed settings and says to pick a new run id (design 0217)."""
    first = _BLOCKS[0]
    done = _run_block(first, tmp_path, endpoint)
    assert done.returncode == 0, _failure(first, done)
    changed = Block(
        line=first.line,
        info=first.info,
        code=first.code.replace('"openai:gpt-4o-mini"', '"openai:gpt-4.1-mini"').replace(
            "(2 + 3) * 4?", "(2 + 3) * 5?"
        ),
    )
    assert changed.code != first.code
    again = _run_block(changed, tmp_path, endpoint)
    assert again.returncode == 0, _failure(changed, again)
    assert endpoint.request_count == 3  # nothing was sent for the second start
    # The stored result, saying that nothing ran (design 0230).
    assert again.stdout == done.stdout.replace("tool calls:", f"tool calls{_ALREADY}:", 1)
    assert "FinishedRunDriftWarning" in again.stderr
    assert "model_client.model" in again.stderr
    assert "request.fingerprint.prompt" in again.stderr
    assert "pick a new run id" in again.stderr
    assert "Warning" not in done.stderr


# --------------------------------------------------------------------------- harness


def _write(block: Block, directory: Path) -> Path:
    script = directory / f"readme_line_{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    return script


def _env(endpoint: ScriptedEndpoint, *, key: bool = True) -> dict[str, str]:
    env = {
        **os.environ,
        "OPENAI_BASE_URL": endpoint.base_url,
        "OPENAI_API_KEY": "sk-readme-test",
        "OPENAI_MODEL": "readme-model",
    }
    if not key:
        del env["OPENAI_API_KEY"]
    return env


def _run_block(
    block: Block, directory: Path, endpoint: ScriptedEndpoint, *, key: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(_write(block, directory))],
        cwd=directory,
        env=_env(endpoint, key=key),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _failure(block: Block, process: subprocess.CompletedProcess[str]) -> str:
    return (
        f"the `{INFO_STRING}` block at README.md line {block.line} failed with exit status "
        f"{process.returncode}\n--- stdout\n{process.stdout}--- stderr\n{process.stderr}"
    )


SCRIPT: tuple[tuple[str, dict[str, int]] | str, ...] = (
    ("add", {"a": 2, "b": 3}),
    ("multiply", {"a": 5, "b": 4}),
    "(2 + 3) * 4 = 20",
)
"""What the endpoint answers, by how many tool results the request already carries: a tool
call (name, arguments) or a final text. It matches the README's first example."""

TYPED_ANSWER: dict[str, object] = {"value": 20, "working": "(2 + 3) * 4 = 5 * 4 = 20"}
"""The ``final_result`` arguments for the README's typed example: when a request offers that
tool, the script's final text is given as this call instead. Tool calls of tools a request does
not offer are left out of the script."""


class ScriptedEndpoint(ThreadingHTTPServer):
    """``POST /v1/chat/completions`` answered from ``SCRIPT``, OpenAI-style (``tool_calls``
    with ``content: null``). ``hang_at`` (1-based) makes that request wait, unanswered, until
    the server closes."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        """Each request's headers, names in lower case."""
        self.hang_at: int | None = None
        self.closing = threading.Event()
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def tool_messages_per_request(self) -> list[int]:
        with self._lock:
            return [
                sum(m.get("role") == "tool" for m in body["messages"]) for body in self.requests
            ]

    def wait_for_requests(self, count: int, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.request_count < count:
            assert time.monotonic() < deadline, f"only {self.request_count} of {count} requests"
            time.sleep(0.01)

    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any] | None:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            number = len(self.requests)
        if number == self.hang_at:
            self.closing.wait(timeout=120)
            return None
        results = sum(m.get("role") == "tool" for m in body["messages"])
        offered = {tool["function"]["name"] for tool in body.get("tools", ())}
        script = [s for s in SCRIPT if isinstance(s, str) or s[0] in offered]
        step = script[min(results, len(script) - 1)]
        if isinstance(step, str) and "final_result" in offered:
            step = ("final_result", TYPED_ANSWER)  # a typed agent gives its answer as a call
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if isinstance(step, str):
            message["content"] = step
        else:
            name, arguments = step
            message["tool_calls"] = [
                {
                    "id": f"call_{number}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ]
        return {
            "id": f"chatcmpl-readme-{number}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "readme-model"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "stop" if isinstance(step, str) else "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedEndpoint

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        reply = self.server.answer(body, {k.lower(): v for k, v in self.headers.items()})
        if reply is None:
            return
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    server = ScriptedEndpoint()
    thread = threading.Thread(target=server.serve_forever, name="readme-endpoint", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# --------------------------------------------------------------------------- the block finder


def test_finder_takes_only_the_exact_info_string_and_reports_the_fence_line() -> None:
    markdown = (
        "# Title\n"  # line 1
        "```python\nprint('illustration')\n```\n"  # lines 2-4
        "```python runnable\nprint('one')\n\nprint('two')\n```\n"  # lines 5-9
        "````python runnable\n```\nnested = True\n````\n"  # lines 10-13
        "```python runnable extra\nprint('no')\n```\n"  # lines 14-16
    )
    blocks = [b for b in fenced_blocks(markdown) if b.info == INFO_STRING]
    assert [(b.line, b.code) for b in blocks] == [
        (5, "print('one')\n\nprint('two')\n"),
        (10, "```\nnested = True\n"),
    ]


def test_finder_strips_the_opening_fence_indent_and_keeps_an_unclosed_block() -> None:
    markdown = "  ```python runnable\n  x = 1\n    y = 2\n"
    (block,) = fenced_blocks(markdown)
    assert block.line == 1
    assert block.code == "x = 1\n  y = 2\n"
