"""The soak harness's review scenario: corpus, pseudonymisation, leak gate, parser, tools,
ledger, phase narrowing, the scripted policy, and whole tasks run through polyloop.

Everything runs in process: the "model" is ``policy()`` called directly by a small
``ModelClient`` (no HTTP), the store is a ``VolatileRunStore``, and the workspaces live under
pytest's temporary directories. The corpus is generated once per module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tools.soak.review import corpus as corpus_module
from tools.soak.review import parser as parser_module
from tools.soak.review import redaction
from tools.soak.review.ledger import ledger_entry
from tools.soak.scenarios import review
from tools.soak.scenarios.base import (
    PERSONAS,
    PolicyRequest,
    RunOutcome,
    RunSpec,
    ScenarioEnv,
    decode_user,
    encode_user,
)

from _shared_doubles import SETTLEMENTS, Without
from polyloop.ports import Action, FinalAnswer, InvalidDecision, ModelCall, ToolCall
from polyloop.session import AgentDefinition, RunRequest, resume, run
from polyloop.sinks import NullEventSink
from polyloop.stores import ForwardingRunStore, VolatileRunStore
from polyloop.testing import DecisionParserContract, RecordFactory
from polyloop.types import (
    ActionStatus,
    IntentKind,
    ModelReply,
    ReplayPolicy,
    RunResult,
    StepCompleted,
    StopReason,
)

pytestmark = pytest.mark.integration

SEED = 20261129
LIMIT = 12  # four categories x three verdicts


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("review-data")


@pytest.fixture(scope="module")
def tasks(data_dir: Path) -> list[review.ReviewTask]:
    return review.build_tasks(seed=SEED, limit=LIMIT, data_dir=data_dir)


def _task(tasks: list[review.ReviewTask], category: str, verdict: str) -> review.ReviewTask:
    return next(
        t for t in tasks if t.checkpoint.category == category and t.expected_verdict == verdict
    )


# --------------------------------------------------------------------------- the fake driver


class _DirectPolicyModel:
    """A ``ModelClient`` that answers by calling the scenario's policy in process."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def call(self, call: ModelCall) -> ModelReply:
        scenario, task_id, phase, persona, seed = decode_user(call.binding["gateway.user"])
        messages = [
            {"role": m.role.value, "content": "".join(block.text for block in m.content)}
            for m in call.messages
        ]
        self.prompts.append("\n".join(m["content"] for m in messages))
        content = review.policy(
            PolicyRequest(
                scenario=scenario,
                task_id=task_id,
                phase=phase,
                persona=persona,
                seed=seed,
                messages=messages,
            )
        )
        return ModelReply(call_id=f"{call.run_id}-{call.call_index}", content=content)

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "direct-policy"}


@dataclasses.dataclass
class _Harness:
    env: ScenarioEnv
    model: _DirectPolicyModel
    store: VolatileRunStore
    results: dict[str, RunResult]
    specs: list[RunSpec]
    after_run: dict[str, tuple[int, bool | None]]
    """Per run id, ``env_executions()`` and ``success()`` read right after the run (as the
    driver reads them)."""


def _binding(persona: str, seed: int = 7) -> Any:
    def binding_for(task_id: str, phase: str | None) -> Mapping[str, str]:
        user = encode_user(
            scenario=review.NAME, task_id=task_id, phase=phase, persona=persona, seed=seed
        )
        return {"gateway.user": user}

    return binding_for


def _harness(root: Path, persona: str = "competent", seed: int = 7) -> _Harness:
    model = _DirectPolicyModel()
    store = VolatileRunStore()
    results: dict[str, RunResult] = {}
    specs: list[RunSpec] = []
    after_run: dict[str, tuple[int, bool | None]] = {}

    async def execute_run(spec: RunSpec) -> RunOutcome:
        specs.append(spec)
        definition = AgentDefinition(
            model_client=model,
            decision_parser=spec.decision_parser,
            store=store,
            event_sink=NullEventSink(),
            synthetic_observations=spec.synthetic_observations,
        )
        request = spec.request
        try:
            result = await run(definition, request)
        except Exception as exc:
            return RunOutcome(
                run_id=request.run_id,
                scenario=review.NAME,
                task_id=spec.task_id,
                phase=spec.phase,
                stop_reason=None,
                steps=0,
                model_calls=0,
                wall_ms=0,
                error=f"{type(exc).__name__}: {exc}",
            )
        results[request.run_id] = result
        after_run[request.run_id] = (spec.env_executions(), spec.success())
        return RunOutcome(
            run_id=request.run_id,
            scenario=review.NAME,
            task_id=spec.task_id,
            phase=spec.phase,
            stop_reason=result.stop_reason.value,
            steps=len(result.steps),
            model_calls=len(result.steps),
            wall_ms=0,
        )

    env = ScenarioEnv(
        runs_dir=root / "runs",
        workspace_root=root / "workspaces",
        model_client=model,
        execute_run=execute_run,
        binding_for=_binding(persona, seed),
    )
    return _Harness(
        env=env, model=model, store=store, results=results, specs=specs, after_run=after_run
    )


# --------------------------------------------------------------------------- corpus


def test_the_corpus_has_at_least_thirty_tasks_covering_every_category_and_verdict(
    data_dir: Path,
) -> None:
    records = corpus_module.load_manifest(corpus_module.ensure_corpus(data_dir, SEED), SEED)
    assert len(records) == corpus_module.TASK_COUNT >= 30
    pairs = Counter((r.category, r.expected_verdict) for r in records)
    assert set(pairs) == {
        (category, verdict) for category in review.CATEGORIES for verdict in review.VERDICT_LEVELS
    }
    assert len({r.task_id for r in records}) == len(records)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", r.task_id) for r in records)


def test_build_tasks_without_a_limit_gives_every_task_gated(
    data_dir: Path, tasks: list[review.ReviewTask]
) -> None:
    everything = review.build_tasks(seed=SEED, limit=None, data_dir=data_dir)
    assert len(everything) == review.TASK_COUNT >= 30
    assert everything[: len(tasks)] == tasks
    assert all(len(task.documents) == 2 for task in everything)


def test_generation_is_deterministic_per_seed(tmp_path: Path, data_dir: Path) -> None:
    first, again = corpus_module.generate_task(SEED, 5), corpus_module.generate_task(SEED, 5)
    assert first == again
    assert corpus_module.generate_task(SEED + 1, 5).texts != first.texts
    other = corpus_module.ensure_corpus(tmp_path, SEED)
    original = corpus_module.corpus_dir(data_dir, SEED)
    for relative in ("manifest.json", "rv006/tender.md", "rv036/notice.md"):
        assert (other / relative).read_bytes() == (original / relative).read_bytes()


def test_documents_are_long_and_full_of_sensitive_values() -> None:
    generated = corpus_module.generate_task(SEED, 0)
    tender = generated.texts["tender.md"]
    assert tender.count("\n") > 1500
    assert len(tender) > 100_000
    everything = "\n".join(generated.texts.values())
    for category, values in generated.sensitive.items():
        assert values, f"no {category} in the task"
        for value in values:
            assert value in everything, f"{category} value never appears"
    for phone in generated.sensitive["phone"]:
        assert re.fullmatch(r"[0-9()+ -]{11,17}", phone)
    for email in generated.sensitive["email"]:
        assert email.endswith(".example")  # a reserved top-level domain: nobody's address


def test_credit_codes_are_18_characters_with_a_valid_check_character() -> None:
    codes = {
        code
        for index in range(0, corpus_module.TASK_COUNT, 5)
        for code in corpus_module.generate_task(SEED, index).sensitive["credit_code"]
    }
    assert len(codes) > 40
    alphabet = corpus_module.CREDIT_CODE_CHARS
    for code in codes:
        assert len(code) == 18
        assert set(code) <= set(alphabet)
        assert code[2:8].isdigit()  # the administrative region
        # The standard's rule, computed independently: sum(value * 3^i mod 31) + check = 0 mod 31.
        total = sum(alphabet.index(c) * pow(3, i, 31) for i, c in enumerate(code[:17]))
        assert (total + alphabet.index(code[17])) % 31 == 0
    with pytest.raises(ValueError, match="17 characters"):
        corpus_module.credit_code_check_char("91440300MA5")


def test_a_damaged_corpus_is_refused_not_silently_used(tmp_path: Path) -> None:
    root = corpus_module.ensure_corpus(tmp_path, SEED)
    path = root / "rv001" / "notice.md"
    path.write_text(path.read_text(encoding="utf-8") + "tampered\n", encoding="utf-8")
    with pytest.raises(review.ReviewScenarioError, match=r"rv001/notice\.md.*Delete"):
        review.build_tasks(seed=SEED, limit=1, data_dir=tmp_path)


def test_a_smaller_limit_gives_a_prefix_of_the_same_tasks(
    data_dir: Path, tasks: list[review.ReviewTask]
) -> None:
    small = review.build_tasks(seed=SEED, limit=3, data_dir=data_dir)
    assert [t.task_id for t in small] == [t.task_id for t in tasks[:3]]
    assert [t.documents for t in small] == [t.documents for t in tasks[:3]]
    assert review.build_tasks(seed=SEED, limit=0, data_dir=data_dir) == []
    with pytest.raises(ValueError, match="limit"):
        review.build_tasks(seed=SEED, limit=-1, data_dir=data_dir)


# --------------------------------------------------------------------------- pseudonymisation


def test_redaction_removes_every_sensitive_value_and_keeps_the_facts() -> None:
    generated = corpus_module.generate_task(SEED, 8)  # bid_security, doubtful: two amounts
    redactor = review.Redactor()
    for text in generated.texts.values():
        redactor.learn(text)
    results = {doc: redactor.redact(text) for doc, text in generated.texts.items()}
    redacted = "\n".join(r.text for r in results.values())
    for category, values in generated.sensitive.items():
        assert sum(r.counts[category] for r in results.values()) >= 1, category
        for value in values:
            assert value not in redacted, f"a {category} survived redaction"
    original = "\n".join(generated.texts.values())
    amounts = re.findall(r"CNY [0-9,]+\.[0-9]{2}", original)
    assert len(set(amounts)) >= 3  # budget and two different bid security amounts
    dates = re.findall(r"\b\d{4}-\d{2}-\d{2}\b", original)
    generic = [
        phrase
        for phrase in ("evaluation committee", "head office and branch office", "the Purchaser")
        if phrase in original.lower() or phrase in original
    ]
    assert generic
    for fact in [*amounts, *dates, generated.record.project_number, *generic]:
        assert fact in redacted or fact in redacted.lower(), fact


def test_redaction_round_trip_restores_the_original_exactly() -> None:
    redactor = review.Redactor()
    texts = [
        text for index in (0, 1) for text in corpus_module.generate_task(SEED, index).texts.values()
    ]
    for text in texts:
        redactor.learn(text)
    for text in texts:
        redacted = redactor.redact(text).text
        assert redacted != text
        assert redactor.restore(redacted) == text


def test_one_stable_alias_per_original_across_documents() -> None:
    generated = corpus_module.generate_task(SEED, 2)
    redactor = review.Redactor()
    notice = redactor.redact(generated.texts["notice.md"])
    tender = redactor.redact(generated.texts["tender.md"])
    purchaser = generated.record.project_title.split(" for ", 1)[1]
    alias = redactor.alias_of(purchaser)
    assert alias is not None
    assert alias.startswith("Example ")
    assert alias in notice.text
    assert alias in tender.text
    # a second redactor fed the same texts in the same order assigns the same aliases
    again = review.Redactor()
    assert again.redact(generated.texts["notice.md"]).text == notice.text
    assert tender.distinct["credit_code"] < tender.counts["credit_code"]  # repeats, one alias


def test_redaction_is_idempotent() -> None:
    text = corpus_module.generate_task(SEED, 3).texts["notice.md"]
    redactor = review.Redactor()
    once = redactor.redact(text)
    twice = redactor.redact(once.text)
    assert twice.text == once.text
    assert twice.total == 0


def test_tasks_hand_out_only_pseudonymised_text(tasks: list[review.ReviewTask]) -> None:
    for task in tasks:
        generated = corpus_module.generate_task(SEED, task.index)
        text = "\n".join(["\n".join(doc.lines) for doc in task.documents] + [task.project_title])
        for category, values in generated.sensitive.items():
            for value in values:
                assert value not in text, f"{task.task_id}: a {category} reached a task"
                assert value in task.gate.ground_truth, "the gate must know every original"
                assert value in task.gate.learned, f"the redactor never learned a {category}"
        assert "Example Company" in text
        assert sum(task.redaction_counts.values()) > 50


def test_the_leak_gate_catches_a_planted_sentinel_and_never_prints_it(
    tasks: list[review.ReviewTask],
) -> None:
    task = tasks[0]
    sentinel = sorted(corpus_module.generate_task(SEED, task.index).sensitive["person"])[0]
    clean = "\n".join(task.documents[0].lines[:40])
    review.assert_no_residue(clean, where="clean", known=task.gate)
    # Unlabelled, the name is invisible to the rules; the known-originals sweep still sees it.
    planted = clean + f"\nThe minutes were taken by {sentinel}."
    review.assert_no_residue(planted, where="rules only")
    with pytest.raises(review.RedactionResidueError) as caught:
        review.assert_no_residue(planted, where="planted", known=task.gate)
    assert caught.value.where == "planted"
    assert [hit.category for hit in caught.value.hits] == ["person"]
    assert caught.value.hits[0].length == len(sentinel)
    assert sentinel not in str(caught.value)
    assert sentinel.split(" ")[1] not in str(caught.value)


def _without_mobile_patterns(rules: tuple[redaction.DetectionRule, ...]) -> tuple[Any, ...]:
    """``rules`` with the two mobile-phone alternatives cut out of the phone pattern."""
    weakened = []
    for rule in rules:
        if rule.category == "phone":
            pattern = rule.pattern.pattern
            mobiles = (r"|1[3-9][0-9] [0-9]{4} [0-9]{4}", r"|1[3-9][0-9]{9}")
            for alternative in mobiles:
                assert alternative in pattern
                pattern = pattern.replace(alternative, "")
            rule = redaction.DetectionRule(rule.category, re.compile(pattern), rule.anchors)
        weakened.append(rule)
    return tuple(weakened)


def test_the_generators_ground_truth_matches_the_generated_task() -> None:
    for index in (0, 7, corpus_module.TASK_COUNT - 1):
        generated = corpus_module.generate_task(SEED, index)
        assert corpus_module.sensitive_values(SEED, index) == generated.sensitive


def test_a_weakened_redaction_rule_is_caught_at_startup_by_the_ground_truth(
    tasks: list[review.ReviewTask], data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mobiles = [
        phone
        for task in tasks[:3]
        for phone in corpus_module.generate_task(SEED, task.index).sensitive["phone"]
        if re.fullmatch(r"1[3-9][0-9](?: ?[0-9]{4}){2}", phone)
    ]
    assert mobiles, "the first tasks must hold a mobile number for this test to mean anything"
    monkeypatch.setattr(redaction, "RULES", _without_mobile_patterns(redaction.RULES))
    # The rules (shared by redactor and gate) no longer see a mobile number, and neither does
    # anything the redactor learned with them: only the generator's ground truth still does.
    assert all(review.Redactor().redact(phone).text == phone for phone in mobiles)
    with pytest.raises(review.RedactionResidueError) as caught:
        review.build_tasks(seed=SEED, limit=3, data_dir=data_dir)
    assert {hit.category for hit in caught.value.hits} == {"phone"}
    assert not any(phone in str(caught.value) for phone in mobiles)


@pytest.mark.parametrize(
    ("residue", "category"),
    [
        ("Telephone: 0755-86651234", "phone"),
        ("call +86 20 8123 4567 today", "phone"),
        ("mobile 139 1234 5678", "phone"),
        ("write to lin.yu@qinghai-soft.example", "email"),
        ("Unified social credit code: 91330100MA2CDEF6X0", "credit_code"),
        ("supplied by Baiquan Logistics Co., Ltd. last year", "company"),
        ("at Meishan Maternal and Child Health Hospital", "hospital"),
        ("approved by Lanxi County Finance Bureau", "bureau"),
        ("Contact person: Gao Meiling", "person"),
    ],
)
def test_the_shared_rules_catch_residue_nobody_registered(residue: str, category: str) -> None:
    with pytest.raises(review.RedactionResidueError) as caught:
        review.assert_no_residue(f"Line one.\n{residue}\n", where="probe")
    assert [hit.category for hit in caught.value.hits] == [category]
    redacted = review.Redactor().redact(residue).text
    review.assert_no_residue(redacted, where="after redaction")


def test_fixed_texts_and_contexts_pass_the_leak_gate(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    fixed = [
        review.SYNTHETIC_OBSERVATIONS.action_rejected,
        review.SYNTHETIC_OBSERVATIONS.env_failed,
        review.SYNTHETIC_OBSERVATIONS.model_call_failed,
        parser_module.NO_JSON,
        parser_module.NOT_AN_OBJECT,
        parser_module.NEITHER_TOOL_NOR_FINAL_ANSWER,
        parser_module.ARGUMENTS_NOT_AN_OBJECT,
    ]
    for text in fixed:
        review.assert_no_residue(text, where="fixed text", known=tasks[0].gate)
    for phase in review.PHASES:
        request = _request(tasks[0], phase, tmp_path)
        for message in (*request.context.run_level, *request.context.goal_level):
            review.assert_no_residue(message.content[0].text, where=phase, known=tasks[0].gate)


# --------------------------------------------------------------------------- parser


class TestReviewParserContract(DecisionParserContract):
    @pytest.fixture
    def decision_parser(self) -> review.ReviewParser:
        return review.ReviewParser()

    @pytest.fixture
    def reply_samples(self, records: RecordFactory) -> SimpleNamespace:
        return SimpleNamespace(
            yields_an_action=records.reply(
                content='{"tool": "read_document", "arguments": {"doc_id": "a", "start_line": 1}}'
            ),
            yields_invalid=records.reply(content="I will look at the tender first."),
        )


def _parse(content: str) -> Action | FinalAnswer | InvalidDecision:
    return review.ReviewParser().parse(ModelReply(call_id=None, content=content)).decision


def test_every_spelling_of_a_tool_call_traces_identically() -> None:
    body = '{"tool": "grep_document", "arguments": {"doc_id": "tender.md", "pattern": "CNY"}}'
    spellings = [
        body,
        f"```json\n{body}\n```",
        f"```\n{body}\n```",
        f"I will search for amounts {{like this}}.\n{body}\nThat should find them.",
        '{"tool": "grep_document", "doc_id": "tender.md", "pattern": "CNY"}',
    ]
    decisions = [_parse(text) for text in spellings]
    for decision in decisions:
        assert isinstance(decision, Action)
        assert decision.tool_call == ToolCall(
            name="grep_document", arguments={"doc_id": "tender.md", "pattern": "CNY"}
        )
    assert len({d.text for d in decisions if isinstance(d, Action)}) == 1


def test_final_answers_and_which_key_wins() -> None:
    answer = _parse('Done.\n```json\n{"final_answer": "plan.md is written"}\n```')
    assert answer == FinalAnswer(text="plan.md is written")
    both = _parse('{"tool": "write_note", "name": "a.md", "text": "x", "final_answer": "done"}')
    assert isinstance(both, Action)
    assert both.tool_call is not None
    assert dict(both.tool_call.arguments) == {"name": "a.md", "text": "x"}  # not swallowed


@pytest.mark.parametrize(
    ("content", "marker"),
    [
        ("no json here at all", "contains no JSON"),
        ('{"tool": "read_document", "arguments": {"doc_id": "x"', "syntax error"),
        ("[1, 2, 3]", "not an object"),
        ('{"answer": "compliant"}', '"tool"'),
        ('{"tool": "read_document", "arguments": ["x", 1]}', '"arguments"'),
    ],
)
def test_each_failure_has_its_own_explanation(content: str, marker: str) -> None:
    decision = _parse(content)
    assert isinstance(decision, InvalidDecision)
    assert marker in decision.explanation


def test_the_five_failure_explanations_are_distinct() -> None:
    contents = ["prose", '{"tool": 1,', "[1]", "{}", '{"tool": "x", "arguments": 3}']
    explanations = set()
    for content in contents:
        decision = _parse(content)
        assert isinstance(decision, InvalidDecision)
        explanations.add(decision.explanation)
    assert len(explanations) == 5
    neither = _parse("{}")
    assert isinstance(neither, InvalidDecision)
    assert "final_answer" in neither.explanation


@pytest.mark.parametrize(
    "content",
    [
        '{"answer": 1}',
        '{"arguments": {"doc_id": "x"}}',
        '{"tool": null}',
        '{"tool": ""}',
        "{}",
        '{"final_answer": "   "}',
        '{"answer": {"tool": "read_document"}}',
    ],
)
def test_objects_without_a_usable_key_are_invalid(content: str) -> None:
    assert isinstance(_parse(content), InvalidDecision)


_ODD_INPUTS = [
    "",
    "{" * 500,
    "[" * 100_000,
    "```",
    "```json\n```",
    '{"tool": "x", "arguments": {"n": NaN}}',
    '{"tool": "x", "arguments": {"n": ' + "9" * 5000 + "}}",
    "\x00\x01\x02{\x03}",
    '{"final_answer": 5}',
]


@pytest.mark.parametrize("content", _ODD_INPUTS, ids=range(len(_ODD_INPUTS)))
def test_odd_inputs_are_invalid_decisions_not_exceptions(content: str) -> None:
    parsed = review.ReviewParser().parse(ModelReply(call_id=None, content=content))
    assert isinstance(parsed.decision, InvalidDecision)
    assert parsed.history_text == content


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_parse_never_raises_and_never_rewrites_the_reply(content: str) -> None:
    parsed = review.ReviewParser().parse(ModelReply(call_id=None, content=content))
    assert parsed.history_text == content
    if isinstance(parsed.decision, InvalidDecision):
        assert parsed.decision.explanation.strip()


# --------------------------------------------------------------------------- tools and ledger


def _request(task: review.ReviewTask, phase: str, workspace: Path) -> RunRequest:
    return review.build_run_request(
        task=task,
        phase=phase,
        run_id=review.make_run_id(task.task_id, phase),
        workspace=workspace,
        model_binding=_binding("competent")(task.task_id, phase),
    )


def _executor(task: review.ReviewTask, phase: str, workspace: Path) -> review.ReviewExecutor:
    executor = _request(task, phase, workspace).action_executor
    assert isinstance(executor, review.ReviewExecutor)
    return executor


def _call(tool: str, **arguments: object) -> Action:
    return Action(text=tool, tool_call=ToolCall(name=tool, arguments=arguments))


async def test_read_document_numbers_lines_and_says_what_it_left_out(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    task = tasks[0]
    executor = _executor(task, "plan", tmp_path)
    tender = task.document("tender.md")
    assert tender is not None
    outcome = await executor.execute(_call("read_document", doc_id="tender.md", start_line=3))
    assert outcome.status is ActionStatus.EXECUTED
    lines = outcome.observation.split("\n")
    assert len(lines) == review.MAX_READ_LINES + 1
    assert lines[0] == f"3: {tender.lines[2]}"
    last = 3 + review.MAX_READ_LINES - 1
    assert lines[-1] == (
        f"[lines 3 to {last} of {tender.line_count} in tender.md; "
        f"{tender.line_count - last} more lines after line {last}]"
    )
    tail = await executor.execute(
        _call("read_document", doc_id="tender.md", start_line=tender.line_count, max_lines=5)
    )
    assert tail.observation.endswith("end of document]")
    grep = await executor.execute(_call("grep_document", doc_id="tender.md", pattern="^## "))
    assert grep.observation.split("\n")[-1] == "[10 matching lines in tender.md]"


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("read_document", {"doc_id": "../notice.md", "start_line": 1}),
        ("read_document", {"doc_id": "/etc/passwd", "start_line": 1}),
        ("read_document", {"doc_id": ".write_audit.log", "start_line": 1}),
        ("read_document", {"doc_id": "notes/plan.md", "start_line": 1}),
        ("read_document", {"doc_id": "nope.md", "start_line": 1}),
        ("read_document", {"doc_id": "tender.md", "start_line": 0}),
        ("read_document", {"doc_id": "tender.md", "start_line": 1, "max_lines": 201}),
        ("read_document", {"doc_id": "tender.md", "start_line": True}),
        ("read_document", {"doc_id": "tender.md", "start_line": 1, "extra": 1}),
        ("grep_document", {"doc_id": "tender.md", "pattern": "(unclosed"}),
        ("grep_document", {"doc_id": "tender.md", "pattern": ""}),
        ("write_note", {"name": "../escape.md", "text": "x"}),
        ("write_note", {"name": "sub/plan.md", "text": "x"}),
        ("write_note", {"name": "", "text": "x"}),
        ("write_note", {"name": ".hidden.md", "text": "x"}),
        ("write_note", {"name": "plan.md", "text": "   "}),
        ("search_web", {"query": "x"}),
    ],
)
async def test_argument_rules_reject_before_anything_runs(
    tasks: list[review.ReviewTask], tmp_path: Path, tool: str, arguments: dict[str, object]
) -> None:
    executor = _executor(tasks[0], "plan", tmp_path)
    outcome = await executor.execute(_call(tool, **arguments))
    assert outcome.status is ActionStatus.NOT_EXECUTED
    assert outcome.observation.startswith("not executed:")
    assert review.ledger_lines(tmp_path) == []
    assert not (tmp_path / "notes").exists()


@pytest.mark.parametrize("verdict", ["compliant ", "Compliant", "mostly compliant", ""])
async def test_a_misspelt_verdict_never_reaches_the_completing_tool(
    tasks: list[review.ReviewTask], tmp_path: Path, verdict: str
) -> None:
    executor = _executor(tasks[0], "summarize", tmp_path)
    outcome = await executor.execute(_call("submit_finding", verdict=verdict, summary="s"))
    # NOT_EXECUTED, never EXECUTED: polyloop completes a run on any executed completes_run call
    assert outcome.status is ActionStatus.NOT_EXECUTED
    assert review.finding_verdict(tmp_path) is None
    assert review.ledger_lines(tmp_path) == []


async def test_writes_append_one_ledger_line_each_and_a_replay_looks_identical(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    executor = _executor(tasks[0], "plan", tmp_path)
    write = _call("write_note", name="plan.md", text="first\n")
    assert (await executor.execute(write)).status is ActionStatus.EXECUTED
    await executor.execute(_call("write_note", name="plan.md", text="second\n"))
    assert (tmp_path / "notes" / "plan.md").read_text(encoding="utf-8") == "second\n"
    lines = review.ledger_lines(tmp_path)
    assert len(lines) == 2
    assert all(line.startswith("write_note\tplan.md\tsha256:") for line in lines)
    assert review.duplicate_lines(lines) == {}
    await executor.execute(write)  # what a replay of the first write would leave behind
    replayed = review.ledger_lines(tmp_path)
    assert replayed[:2] == lines  # append-only
    assert review.duplicate_lines(replayed) == {lines[0]: 2}
    read = await executor.execute(_call("read_document", doc_id="plan.md", start_line=1))
    assert read.observation.startswith("1: first\n")


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["plan.md", "evidence.md", "x.txt"]),
            st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40).filter(
                str.strip
            ),
        ),
        max_size=8,
    )
)
def test_the_ledger_records_exactly_the_executed_writes(writes: list[tuple[str, str]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        workspace = Path(directory)
        tools = review.ReviewTools(documents={}, workspace=workspace)
        expected: list[str] = []
        for name, text in writes:
            asyncio.run(tools.write_note({"name": name, "text": text}))
            expected.append(ledger_entry("write_note", name, text))
            assert review.ledger_lines(workspace) == expected  # every earlier line unchanged
        repeats = {
            ledger_entry("write_note", name, text): n
            for (name, text), n in Counter(writes).items()
            if n > 1
        }
        assert review.duplicate_lines(expected) == repeats


async def test_submit_finding_keeps_the_last_verdict_and_audits_each(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    executor = _executor(tasks[0], "summarize", tmp_path)
    for verdict in review.VERDICT_LEVELS:
        outcome = await executor.execute(_call("submit_finding", verdict=verdict, summary="s"))
        assert outcome.observation == f"finding recorded: {verdict}"
    assert review.finding_verdict(tmp_path) == review.VERDICT_LEVELS[-1]
    lines = review.ledger_lines(tmp_path)
    assert [line.split("\t")[:2] for line in lines] == [["submit_finding", "finding.json"]] * 3


def test_replay_policies_and_the_completing_tool(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    registry = review.ReviewTools(
        documents=tasks[0].document_lines(), workspace=tmp_path
    ).registry()
    assert registry.names() == ("read_document", "grep_document", "write_note", "submit_finding")
    policies = {name: registry.spec_for(name) for name in registry.names()}
    assert {n: s.replay_policy for n, s in policies.items() if s} == {
        "read_document": ReplayPolicy.SAFE,
        "grep_document": ReplayPolicy.SAFE,
        "write_note": ReplayPolicy.NEVER,
        "submit_finding": ReplayPolicy.NEVER,
    }
    assert {n for n, s in policies.items() if s and s.completes_run} == review.COMPLETING_TOOLS
    for entry in registry.schema_for_model():
        parameters = entry["parameters"]
        assert isinstance(parameters, dict)
        assert parameters["type"] == "object"
        assert parameters["additionalProperties"] is False
        assert parameters["required"]
        json.dumps(entry)


async def test_a_broken_workspace_is_an_environment_error(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    executor = _executor(tasks[0], "plan", tmp_path / "gone")
    outcome = await executor.execute(_call("write_note", name="plan.md", text="x"))
    assert outcome.status is ActionStatus.ENV_ERROR
    assert "ToolEnvironmentError" in outcome.observation


# --------------------------------------------------------------------------- phases


def test_phase_narrowing_covers_schema_validation_and_dispatch(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    tools = review.ReviewTools(documents=tasks[0].document_lines(), workspace=tmp_path)
    full = tools.registry()
    for phase in review.PHASES:
        request = _request(tasks[0], phase, tmp_path)
        assert request.tools.names() == review.PHASE_TOOLS[phase]
        narrowed = full.restrict_to(review.PHASE_TOOLS[phase])
        assert request.tools.schema_for_model() == narrowed.schema_for_model()
        executor = request.action_executor
        assert isinstance(executor, review.ReviewExecutor)
        assert executor.registry == request.tools
        visible = {entry["name"] for entry in request.tools.schema_for_model()}
        assert visible == set(review.PHASE_TOOLS[phase])
    assert full.names() == ("read_document", "grep_document", "write_note", "submit_finding")
    assert review.PHASE_TOOLS["plan"] == review.PHASE_TOOLS["execute"]
    assert review.PHASE_TOOLS["plan"] == ("read_document", "grep_document", "write_note")
    assert review.PHASE_TOOLS["summarize"] == ("read_document", "submit_finding")


async def test_a_narrowed_out_tool_is_rejected_in_summarize(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    executor = _executor(tasks[0], "summarize", tmp_path)
    for action in (
        _call("grep_document", doc_id="tender.md", pattern="CNY"),
        _call("write_note", name="plan.md", text="x"),
    ):
        outcome = await executor.execute(action)
        assert outcome.status is ActionStatus.NOT_EXECUTED
        assert "does not exist" in outcome.observation
    assert review.ledger_lines(tmp_path) == []


def test_only_plan_and_execute_prompts_offer_a_final_answer(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    for phase in review.PHASES:
        system = _request(tasks[0], phase, tmp_path).context.run_level[0].content[0].text
        if phase == "summarize":
            assert "final_answer" not in system
            assert "no search tool" in system
            assert '"name": "submit_finding"' in system
        else:
            assert '{"final_answer":' in system
            assert '"name": "submit_finding"' not in system


def test_the_context_lists_documents_but_never_their_text(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    task = tasks[0]
    context = _request(task, "plan", tmp_path).context
    goal = context.goal_level[0].content[0].text
    assert task.checkpoint.title in goal
    assert task.project_title in goal
    for doc in task.documents:
        assert f"- {doc.doc_id}: {doc.line_count} lines" in goal
    body_line = next(line for line in task.documents[1].lines if "Bid security amount" in line)
    everything = goal + context.run_level[0].content[0].text
    assert body_line not in everything


def test_run_requests_pin_the_scenario_settings(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    budgets = {}
    for phase in review.PHASES:
        request = _request(tasks[0], phase, tmp_path)
        assert request.model_replay_policy is ReplayPolicy.NEVER
        assert request.cancel_grace_seconds == 5.0
        assert dict(request.injections) == {}
        assert "{observation}" in request.observation_template
        assert request.fingerprints["review.corpus"] == tasks[0].corpus_digest
        budgets[phase] = request.budget
        assert request.budget.max_consecutive_parse_failures == 3
        assert request.budget.max_prompt_chars == 400_000
        snapshot = request.parameter_snapshot()
        assert str(tmp_path) not in "".join(snapshot.values())  # no path: resume stays valid
    assert [(b.max_steps, b.max_actions) for b in budgets.values()] == [
        (20, 20),
        (25, 25),
        (16, 16),
    ]


def test_run_ids_are_store_safe_and_unknown_phases_are_refused() -> None:
    assert review.make_run_id("rv007", "plan") == "review-rv007-plan"
    for phase in review.PHASES:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", review.make_run_id("rv007", phase))
    with pytest.raises(review.ReviewScenarioError, match="finalize"):
        review.make_run_id("rv007", "finalize")
    with pytest.raises(review.ReviewScenarioError, match="task id"):
        review.make_run_id("rv/7", "plan")


# --------------------------------------------------------------------------- policy


def _policy_request(
    task: review.ReviewTask, phase: str, persona: str, seed: int, tmp_path: Path
) -> PolicyRequest:
    context = _request(task, phase, tmp_path).context
    messages = [
        {"role": m.role.value, "content": m.content[0].text}
        for m in (*context.run_level, *context.goal_level)
    ]
    return PolicyRequest(
        scenario=review.NAME,
        task_id=task.task_id,
        phase=phase,
        persona=persona,
        seed=seed,
        messages=messages,
    )


def test_the_policy_is_a_pure_function_of_its_request(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    outputs = {}
    for persona in PERSONAS:
        for seed in range(6):
            request = _policy_request(tasks[1], "plan", persona, seed, tmp_path)
            outputs[persona, seed] = review.policy(request)
            assert review.policy(request) == outputs[persona, seed]
    assert len({outputs["malformed", s] for s in range(6)}) > 1  # the seed matters
    assert min(len(outputs["verbose", s]) for s in range(6)) > 2_000
    competent = _parse(outputs["competent", 0])
    assert isinstance(competent, Action)
    assert competent.tool_call is not None
    assert competent.tool_call.name == "grep_document"


def test_the_policy_refuses_requests_it_does_not_serve(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    request = _policy_request(tasks[0], "plan", "competent", 1, tmp_path)
    for wrong, marker in (
        (dataclasses.replace(request, persona="lazy"), "persona"),
        (dataclasses.replace(request, scenario="code"), "scenario"),
        (dataclasses.replace(request, phase="finalize"), "phase"),
    ):
        with pytest.raises(ValueError, match=marker):
            review.policy(wrong)


# --------------------------------------------------------------------------- whole tasks


async def test_competent_tasks_run_three_phases_and_reach_the_right_verdict(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    harness = _harness(tmp_path)
    for task in tasks:
        outcomes = await review.run_task(task, harness.env)
        assert [o.phase for o in outcomes] == list(review.PHASES)
        assert [o.error for o in outcomes] == [None, None, None]
        assert [o.stop_reason for o in outcomes] == [
            StopReason.FINAL_ANSWER.value,
            StopReason.FINAL_ANSWER.value,
            StopReason.TASK_COMPLETED.value,
        ]
        assert [o.run_id for o in outcomes] == [
            review.make_run_id(task.task_id, p) for p in review.PHASES
        ]
        workspace = review.workspace_for(harness.env, task)
        lines = review.ledger_lines(workspace)
        assert [line.split("\t")[:2] for line in lines] == [
            ["write_note", "plan.md"],
            ["write_note", "evidence.md"],
            ["submit_finding", "finding.json"],
        ]
        assert review.finding_verdict(workspace) == task.expected_verdict, task.task_id
        assert [harness.after_run[o.run_id] for o in outcomes] == [
            (1, None),
            (1, None),
            (1, True),
        ]


@pytest.mark.parametrize("persona", [p for p in PERSONAS if p != "competent"])
async def test_every_persona_runs_to_a_defined_end(
    tasks: list[review.ReviewTask], tmp_path: Path, persona: str
) -> None:
    harness = _harness(tmp_path, persona=persona, seed=3)
    for task in tasks[:4]:
        outcomes = await review.run_task(task, harness.env)
        assert [o.error for o in outcomes] == [None, None, None]
        lines = review.ledger_lines(review.workspace_for(harness.env, task))
        assert review.duplicate_lines(lines) == {}
        reasons = [o.stop_reason for o in outcomes]
        if persona == "stubborn":
            assert reasons == [StopReason.STEP_BUDGET.value] * 3
            assert [o.steps for o in outcomes] == [20, 25, 16]
            assert lines == []
        elif persona in ("sloppy", "verbose"):
            assert reasons[-1] == StopReason.TASK_COMPLETED.value
            assert harness.after_run[outcomes[-1].run_id] == (1, True)
        else:
            assert set(reasons) <= {
                StopReason.FINAL_ANSWER.value,
                StopReason.TASK_COMPLETED.value,
                StopReason.PARSE_FAILURES.value,
            }
    if persona == "sloppy":
        statuses = [s.action_status for r in harness.results.values() for s in r.steps]
        assert ActionStatus.NOT_EXECUTED in statuses
    if persona == "malformed":
        parse_failures = [s for r in harness.results.values() for s in r.steps if not s.parse_ok]
        assert parse_failures


def _leaky(task: review.ReviewTask, line_marker: str, sentinel: str) -> review.ReviewTask:
    documents = tuple(
        dataclasses.replace(
            doc,
            lines=tuple(
                f"{line} (questions: {sentinel})" if line_marker in line else line
                for line in doc.lines
            ),
        )
        for doc in task.documents
    )
    return dataclasses.replace(task, documents=documents)


async def test_a_leak_in_a_document_stops_the_run_before_the_model_sees_it(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    task = _task(tasks, "bid_security", "compliant")
    sentinel = sorted(corpus_module.generate_task(SEED, task.index).sensitive["person"])[-1]
    assert sentinel in task.gate
    leaky = _leaky(task, "Procurement budget", sentinel)
    harness = _harness(tmp_path)
    outcomes = await review.run_task(leaky, harness.env)
    assert len(outcomes) == 1  # the later phases never ran
    assert outcomes[0].error is not None
    assert outcomes[0].error.startswith("RedactionResidueError")
    assert sentinel not in outcomes[0].error
    assert harness.model.prompts  # the model was called, but never with the sentinel
    assert not any(sentinel in prompt for prompt in harness.model.prompts)
    log = await harness.store.read_log(outcomes[0].run_id)
    assert log.finished is None
    assert log.intents[-1].kind is IntentKind.ACTION
    assert all(sentinel not in step.step.observation for step in log.steps)


async def test_a_leak_in_the_context_refuses_the_task_before_any_call(
    tasks: list[review.ReviewTask], tmp_path: Path
) -> None:
    task = tasks[0]
    sentinel = sorted(corpus_module.generate_task(SEED, task.index).sensitive["company"])[0]
    harness = _harness(tmp_path)
    leaky = dataclasses.replace(task, project_title=f"{task.project_title} and {sentinel}")
    with pytest.raises(review.RedactionResidueError) as caught:
        await review.run_task(leaky, harness.env)
    assert sentinel not in str(caught.value)
    assert harness.model.prompts == []


async def test_a_used_workspace_is_refused(tasks: list[review.ReviewTask], tmp_path: Path) -> None:
    harness = _harness(tmp_path)
    await review.run_task(tasks[0], harness.env)
    with pytest.raises(review.ReviewScenarioError, match="not empty"):
        await review.run_task(tasks[0], _harness(tmp_path).env)


class _Crash(Exception):
    """Stands in for the process dying right after a write landed."""


class _CrashBeforeStep(ForwardingRunStore):
    """A store that dies instead of recording the step of one tool's first call (the volatile
    store ``inner`` otherwise, without the optional settlements, as the store it stands for)."""

    offers_leases = False  # unleased on purpose: the writes must reach the crash here

    def __init__(self, inner: VolatileRunStore, tool: str) -> None:
        super().__init__(Without(inner, *SETTLEMENTS))  # type: ignore[arg-type]
        self.tool = tool

    async def write_step_completed(self, record: StepCompleted) -> None:
        if record.step.action is not None and f'"tool": "{self.tool}"' in record.step.action:
            raise _Crash
        await super().write_step_completed(record)


@pytest.mark.parametrize(
    ("tool", "expected"),
    [("write_note", StopReason.RESUME_STATE_UNKNOWN), ("grep_document", StopReason.FINAL_ANSWER)],
)
async def test_after_a_crash_a_never_write_is_not_executed_again(
    tasks: list[review.ReviewTask], tmp_path: Path, tool: str, expected: StopReason
) -> None:
    task = tasks[0]
    store = VolatileRunStore()
    model = _DirectPolicyModel()

    def definition(run_store: Any) -> AgentDefinition:
        return AgentDefinition(
            model_client=model,
            decision_parser=review.ReviewParser(),
            store=run_store,
            event_sink=NullEventSink(),
            synthetic_observations=review.SYNTHETIC_OBSERVATIONS,
        )

    with pytest.raises(_Crash):
        await run(definition(_CrashBeforeStep(store, tool)), _request(task, "plan", tmp_path))
    before = review.ledger_lines(tmp_path)
    result = await resume(definition(store), _request(task, "plan", tmp_path))
    assert result.stop_reason is expected
    after = review.ledger_lines(tmp_path)
    assert review.duplicate_lines(after) == {}
    if tool == "write_note":
        assert before == after == [after[0]]  # executed once, never replayed
    else:
        assert before == []  # the SAFE grep was replayed; the plan was then written once
        assert [line.split("\t")[1] for line in after] == ["plan.md"]
