"""Private building blocks of the soak harness's review scenario.

The public surface is ``tools.soak.scenarios.review``; import from there. The modules here are
split by concern: ``domain`` (phases, tools per phase, verdicts, checkpoints), ``corpus`` (the
deterministic synthetic document generator), ``redaction`` (pseudonymisation and the leak
gate), ``ledger`` (the environment-side audit ledger), ``workspace_tools`` (the four tools and
the gated executor), ``parser`` (JSON tool calls), ``prompts`` (the context), ``tasks`` (corpus
to redacted tasks) and ``policy`` (the scripted agent the loopback policy server plays).
"""
