"""The offline demo: a rule-based agent in a tiny shop world, run under polyloop.

``python -m tools.demo`` (from the repository root) runs six runs against a ``JsonlRunStore``:
two that end normally (a submitted task, a final answer), one whose model sends malformed output
once and recovers, one that exhausts its step budget, and two that are killed for real (a child
process gets ``SIGKILL`` while a tool call is in flight) and then resumed:

* killed inside ``lookup`` (``ReplayPolicy.SAFE``): ``resume()`` runs the lookup again and the
  run completes;
* killed inside ``write_note`` (``ReplayPolicy.NEVER``) after the note reached the disk:
  ``resume()`` stops with ``resume_state_unknown`` and the note exists exactly once.

Everything is deterministic for a given ``--seed`` and needs no network. The demo uses only
public polyloop names, so it doubles as an example of wiring the five seams.

Modules: ``_world`` (the shop, its tools, the audit ledger), ``_agent`` (model, parser, event
sink, context), ``_scenarios`` (the six runs and how each is assembled), ``_victim`` (the child
process that gets killed), ``__main__`` (the command line and the report).
"""
