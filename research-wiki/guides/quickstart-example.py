"""Run an agent, lose the process mid-action, resume it. Offline; standard library only.

The explicit form: every seam written out by hand. The README's first example is the short
path (``polyloop.Agent`` with stock parts, which builds these same objects); start there for a
tool-calling agent over an OpenAI-compatible endpoint, and come here when you write a seam of
your own (a model client, a parser, an executor for code, a sink) or need what the ``Agent``
does not offer (injections, bindings, time bounds). Run it with
``python research-wiki/guides/quickstart-example.py``.
"""

import asyncio
import json
import tempfile

from polyloop.ports import Action, FinalAnswer, InvalidDecision, ParsedReply, ToolCall
from polyloop.session import AgentDefinition, RunRequest, resume, run
from polyloop.stores import JsonlRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import Budget, Context, Message, ModelReply, ReplayPolicy, Role
from polyloop.types import SyntheticObservations, TextBlock

class ScriptedModel:  # a ModelClient with one canned reply per step; swap in a real one later
    REPLIES = ('{"tool": "add", "arguments": {"a": 2, "b": 3}}', '{"final_answer": "5"}')
    async def call(self, call):
        return ModelReply(call_id=f"c{call.call_index}", content=self.REPLIES[call.call_index])
    def parameters(self):
        return {"model": "scripted-v1"}

class JsonParser:  # a DecisionParser: bad output becomes an InvalidDecision, never an exception
    def parse(self, reply):
        text = reply.content
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: "[" * 100_000
            return self.invalid(text, f"Your reply is not JSON ({exc}).")
        if not isinstance(data, dict):
            return self.invalid(text, "Your reply must be one JSON object.")
        tool, arguments = data.get("tool"), data.get("arguments", {})
        if isinstance(tool, str) and tool and isinstance(arguments, dict):
            call = ToolCall(name=tool, arguments=arguments)
            return ParsedReply(history_text=text, decision=Action(text=text, tool_call=call))
        answer = data.get("final_answer")
        if isinstance(answer, str) and answer.strip():
            return ParsedReply(history_text=text, decision=FinalAnswer(text=answer))
        return self.invalid(text, 'Give "tool" and "arguments" (an object), or "final_answer".')
    def invalid(self, text, why):
        return ParsedReply(history_text=text, decision=InvalidDecision(explanation=why))
    def parameters(self):
        return {"kind": "json"}

class PrintSink:  # an EventSink: one event per completed step
    async def emit(self, event):
        print(f"  step {event.step.step_idx}: {event.step.action or 'final answer'}")
    def parameters(self):
        return {"kind": "print"}

class PowerCut(Exception):  # what our pretend crash raises
    pass

class DyingExecutor:  # stands in for a crash while an action is in flight
    def __init__(self, inner):
        self.inner = inner
    async def execute(self, action):  # an executor's exception leaves run() untouched
        raise PowerCut("the process died while `add` was running")
    def parameters(self):
        return self.inner.parameters()  # the same settings, so resume() sees no drift

async def add(arguments):
    return str(arguments["a"] + arguments["b"])

async def main():
    numbers = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}
    tools = ToolRegistry([ToolSpec(name="add", description="Add two numbers.", handler=add,
                                   parameters=numbers, replay_policy=ReplayPolicy.SAFE)])
    texts = SyntheticObservations(action_rejected="[rejected]", env_failed="[env failed]",
                                  model_call_failed="[no reply]")
    goal = Message(role=Role.USER, content=(TextBlock(text="What is 2 + 3?"),))
    budget = Budget(max_steps=5, max_actions=5, max_consecutive_parse_failures=2,
                    max_prompt_chars=10_000)
    with tempfile.TemporaryDirectory() as logs:
        agent = AgentDefinition(model_client=ScriptedModel(), decision_parser=JsonParser(),
                                store=JsonlRunStore(directory=logs), event_sink=PrintSink(),
                                synthetic_observations=texts)
        def request(executor):
            return RunRequest(run_id="quickstart-1", tools=tools, action_executor=executor,
                              budget=budget, context=Context(goal_level=(goal,)),
                              model_replay_policy=ReplayPolicy.SAFE)
        try:
            await run(agent, request(DyingExecutor(tools.executor())))
        except PowerCut as exc:
            print(f"crashed: {exc}")
        result = await resume(agent, request(tools.executor()))  # replays the SAFE `add`
    print(f"{result.stop_reason.value}: {result.final_answer!r} after {len(result.steps)} steps")
    assert result.final_answer == "5"

if __name__ == "__main__":
    asyncio.run(main())
