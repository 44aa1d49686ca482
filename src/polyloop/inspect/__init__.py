"""Look at what a run did: the library behind ``python -m polyloop``.

Subcommands (``python -m polyloop --help``): ``show`` (one run as a transcript, and for an
unfinished run what ``resume`` would do), ``ls`` (one line per run, with filters and
``--json``; several targets), ``verify`` (decode every log of one or more targets and
check its structure with ``polyloop.session.check_log``, the check the soak scoreboard
shares), ``diff`` (where two
runs diverge first, and the snapshot keys that differ), ``html`` (one self-contained static
page), ``resolve`` (a person's verdict on the action a run is in doubt about, written through
``polyloop.session.resolve``; see ``polyloop.inspect._resolve``), and ``approvals``,
``approve`` and ``reject`` (the calls that wait for a person, and the decision on one;
``polyloop.inspect._approvals``). The three that write write only their one record, on a
directory of logs or on a ``postgres://`` URL with ``--run-id``. ``fork`` writes a fork's
log (a run's first steps under a new run id, ``polyloop.session.fork``, design 0239) and
``replay`` drives recorded runs through an agent's settings offline, one line per run
(``polyloop.session.replay``, design 0240); both take ``--agent module:function``
(``polyloop.inspect._replaying``). A target is a ``.jsonl`` log,
a directory of them (read with the directories below it: ``runs/`` after ``make demo``;
design 0234), or a store URL (``jsonl:///path``, or ``postgresql://user@host/db`` for
the runs of a ``PostgresRunStore``, read through its public API; ``polyloop.inspect._postgres``):
every command finds it through one store locator, a table keyed by scheme
(``polyloop.inspect._locator``, design 0222). Bad input, and every
refusal of ``resolve``, is an ``InspectError``, printed as one line with exit status 2.
Every text taken from a log is printed with its control, bidi and other invisible format
characters written as escapes (``\\x1b``), never passed to the terminal, and cannot start a
line of the layout (``polyloop.inspect._safe``; issue 22, item 6).

This package sits above the assembly layer (it reads logs with ``polyloop.stores``, plans with
``polyloop.session.plan_resume``, the code ``resume`` uses, and settles with
``polyloop.session.resolve``) and uses only the standard library; a ``postgres://`` target
opens a ``PostgresRunStore``, which needs the ``postgres`` extra (the driver is imported by the
store when it opens, never by this package). Nothing imports it:
``import polyloop`` does not load it.

``view_run`` builds the one interpretation of a log (``RunView``) every output renders;
``load_target`` resolves a target; ``main`` is the command line.
"""

from polyloop._common import claim_public_names as _claim_public_names
from polyloop.inspect._cli import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_OK, main
from polyloop.inspect._html import render_html
from polyloop.inspect._load import Loaded, Unreadable, load_target
from polyloop.inspect._locator import SCHEMES
from polyloop.inspect._verify import LogVerdict, verify_log_bytes, verify_target
from polyloop.inspect._view import (
    InDoubt,
    RunView,
    SettlementView,
    StepKind,
    StepView,
    resolve_commands,
    resume_sentence,
    view_run,
)

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FINDING",
    "EXIT_OK",
    "SCHEMES",
    "InDoubt",
    "Loaded",
    "LogVerdict",
    "RunView",
    "SettlementView",
    "StepKind",
    "StepView",
    "Unreadable",
    "load_target",
    "main",
    "render_html",
    "resolve_commands",
    "resume_sentence",
    "verify_log_bytes",
    "verify_target",
    "view_run",
]

# Documented, printed and pickled under this module's name, not the room that defines it
# (design 0221): the one place that sets ``__module__`` for the public names.
_claim_public_names(__name__, globals())
