"""A batch driver killed (SIGKILL) at random moments and started again with the same command
ends with every item done once (design 0242; issue 39's acceptance: 20 kills during a
2,000-item batch, 16 items in flight).

``tools/batch_chaos.py`` does the killing and the checks (its docstring lists them): 0 items
lost, exactly one ``final_answer`` run per done item, every earlier attempt a retryable stop,
0 ``never`` effects executed twice (a ledger the tool appends to), every log passes
``check_log``, and the report the driver wrote equals the one rebuilt from the store. The
figure for 100 kills and 2,000 items is ``python -m tools.bench.batch --chaos`` (in
``research-wiki/reference/reliability.md``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tools.batch_chaos import kill_storm
from tools.bench.postgres_listing import url_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLS = 20
ITEMS = 2_000
IN_FLIGHT = 16
EFFECT_SECONDS = 0.02
"""How long each item's ``never`` tool takes: long enough for kills to land inside it."""


def _assert_clean(storm: object) -> None:
    assert storm.problems == [], storm.problems  # type: ignore[attr-defined]
    assert storm.kills == KILLS, storm  # type: ignore[attr-defined]
    assert storm.retried > 0, "the retried items were checked too"  # type: ignore[attr-defined]


def test_kills_of_the_driver_on_a_jsonl_store_lose_and_repeat_nothing(tmp_path: Path) -> None:
    storm = kill_storm(
        str(tmp_path / "runs"),
        tmp_path / "work",
        items=ITEMS,
        kills=KILLS,
        concurrency=IN_FLIGHT,
        delay=EFFECT_SECONDS,
        seed=1,
    )
    _assert_clean(storm)


def test_kills_of_the_driver_on_postgres_lose_and_repeat_nothing(
    postgres_database: str, tmp_path: Path
) -> None:
    storm = kill_storm(
        url_of(postgres_database),
        tmp_path / "work",
        items=ITEMS,
        kills=KILLS,
        concurrency=IN_FLIGHT,
        delay=EFFECT_SECONDS,
        seed=2,
    )
    _assert_clean(storm)
