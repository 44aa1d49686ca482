"""OpenTelemetry traces of runs: ``OtelEventSink`` (needs the ``otel`` extra, opentelemetry-api).

::

    from polyloop.otel import OtelEventSink

    tracing = OtelEventSink()                       # the global tracer provider, or pass one
    definition = AgentDefinition(..., event_sink=tracing)
    result = await tracing.run(definition, request)  # or tracing.resume(...)

The span tree of one run (design 0182):

* ``invoke_agent <run_id>``: one span per ``tracing.run``/``tracing.resume`` call, from the
  call to its return; ``gen_ai.operation.name = "invoke_agent"``, ``gen_ai.request.model``
  (the model client's ``parameters()["model"]`` when it reports one), ``polyloop.run_id`` and,
  at the end, ``polyloop.stop_reason`` and ``polyloop.steps``. An exception out of the run
  (an executor that raised, a drift error, a cancellation) is recorded on the span, which ends
  with an error status, and propagates unchanged.
* ``polyloop.step <n>``: one span per completed step, a child of the run span, placed at the
  step's real start and end (``Event.timing``); ``polyloop.step_idx``, ``polyloop.run_id``,
  ``polyloop.prompt_chars``, ``polyloop.parse_ok``, ``polyloop.action_status``. A step that
  calls a tool gets it when the call starts (``action_scope``, below).
* ``chat <model>``: the step's model call, a child of the step span, when this process made
  it; ``gen_ai.operation.name = "chat"``, ``gen_ai.request.model``, ``gen_ai.response.id``
  (the provider's call id), ``gen_ai.usage.input_tokens`` / ``output_tokens`` when the reply
  carried usage, ``polyloop.usage.cost`` (the step's recorded cost as an exact decimal
  string, when the run has prices; design 0236); error status for a failed call.
* ``execute_tool <tool>``: the step's action, a child of the step span, opened when the call
  starts and current while it runs (the sink is a ``polyloop.ports.TracingSink``: the session
  enters its ``action_scope`` around each call; an attempt that raises ends its span with an
  error status); ``gen_ai.operation.name = "execute_tool"``, ``gen_ai.tool.name`` and
  ``gen_ai.tool.call.id`` when known; error status for an ``ENV_ERROR`` outcome;
  ``polyloop.child_run_id`` when the call ran a child run (a tool of ``Agent.as_tool``, design
  0245).
* ``invoke_agent <child run id>``: a child run's span, a child of the parent's
  ``execute_tool`` span that ran it (the child-run tool enters the child's sink's
  ``run_scope``), with the child's step spans under it: a tree of runs is one trace, nested
  as the calls were.

* ``polyloop.tool_progress``: a span event per progress report of a running tool call
  (``emit_progress``, design 0211 amendment), on the span current in the reporting task (the
  call's ``execute_tool`` span), at the report's time; ``polyloop.step_idx``,
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``polyloop.progress``,
  ``polyloop.progress_total``, ``polyloop.progress_message``, ``polyloop.progress_origin``
  when known.

Without ``tracing.run`` (the sink passed to ``polyloop.session.run`` directly), step spans are
children of whatever span is current in the caller's task, or roots.

Exporting happens in the tracer provider's span processors, outside the run's control: an
exporter that raises or a collector that is down never changes a run's result (the SDK's
processors catch and log export failures, and anything ``emit`` raises is counted by the
library as a failed delivery, never fatal). ``parameters()`` is ``{"kind": "otel"}``: where
spans go is deployment, not run configuration, so moving the collector is not drift.

This is the only module that imports ``opentelemetry`` (an import-linter contract keeps it
so), and ``import polyloop`` does not import it.
"""

from polyloop._common import claim_public_names as _claim_public_names
from polyloop.otel._sink import OtelEventSink

__all__ = ["OtelEventSink"]

# Documented, printed and pickled under this module's name, not the room that defines it
# (design 0221): the one place that sets ``__module__`` for the public names.
_claim_public_names(__name__, globals())
