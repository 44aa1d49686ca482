"""The code scenario's tasks: generated per seed, each with its own world and success check.

``build_tasks(seed)`` returns ``TASK_COUNT`` tasks (ids ``t000``, ``t001``, ...). Task ``i``
of seed ``s`` is a pure function of ``(s, i)``: its world comes from
``random.Random(f"codeworld:{s}:{i}")`` and its parameters (who, which day, which product) are
drawn from that world, so a worker process, the policy server and the driver all rebuild the
same task and the same world from the task id and the seed alone.

Ten task kinds cycle through the list (a question to answer, or a change to make); ``check``
judges the world state after the run plus the answer given to ``complete_task``.
``solution`` is the reference code a scripted policy uses: an exploring step, a solving step
that relies on the variables the exploring step left behind (the executor is stateful), and a
wrong and a buggy variant for the sloppy persona.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from tools.soak.codeworld.world import CATEGORIES, CITIES, DATES, TIMES, World

__all__ = [
    "KINDS",
    "TASK_COUNT",
    "CodeTask",
    "Solution",
    "build_tasks",
    "check",
    "solution",
    "task_for",
    "world_for",
]

TASK_COUNT: Final = 40
"""Tasks per seed (four of each kind)."""

KINDS: Final = (
    "phone_lookup",
    "count_events",
    "add_contact",
    "cancel_event",
    "buy_cheapest",
    "note_email",
    "order_total",
    "move_contact",
    "schedule",
    "who_lives",
)

_TASK_ID = re.compile(r"t(\d{3})")


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeTask:
    """One task. ``params`` holds the values the instruction and the check refer to."""

    task_id: str
    index: int
    seed: int
    kind: str
    instruction: str
    params: Mapping[str, object]


@dataclass(frozen=True, slots=True, kw_only=True)
class Solution:
    """Reference code for one task (see the module docstring)."""

    explore: str
    solve: str
    wrong: str
    buggy: str

    @property
    def full(self) -> str:
        """Explore and solve in one self-contained block (for a fresh or confused session)."""
        return f"{self.explore}\n{self.solve}"

    @property
    def wrong_full(self) -> str:
        return f"{self.explore}\n{self.wrong}"


def _generate(seed: int, index: int) -> tuple[World, CodeTask]:
    rng = random.Random(f"codeworld:{seed}:{index}")
    world = World.generate(rng)
    kind = KINDS[index % len(KINDS)]
    person = rng.choice(world.contacts)
    params: dict[str, object]
    if kind == "phone_lookup":
        params = {"name": person.name, "phone": person.phone}
        text = f"What is the phone number of {person.name}? Answer with the number."
    elif kind == "count_events":
        date = rng.choice(DATES)
        count = sum(1 for e in world.events if e.date == date)
        params = {"date": date, "count": count}
        text = f"How many events are on my calendar on {date}? Answer with a number."
    elif kind == "add_contact":
        # "Zoe" is not among the generated first names, so the new name is never taken.
        name = f"Zoe {rng.choice(('Quill', 'Marsh', 'Vance', 'Wilde'))}"
        city = rng.choice(CITIES)
        email = f"zoe.q{index}@example.net"
        phone = f"555-{rng.randint(100, 999):03d}-{rng.randint(0, 9999):04d}"
        params = {"name": name, "email": email, "phone": phone, "city": city}
        text = (
            f"Add a new contact: name {name}, email {email}, phone {phone}, city {city}. "
            "Then complete the task."
        )
    elif kind == "cancel_event":
        event = rng.choice(world.events)
        duplicates = [e for e in world.events if e.title == event.title and e.date == event.date]
        for extra in duplicates[1:]:
            world.events.remove(extra)
        params = {"title": event.title, "date": event.date, "event_count": len(world.events)}
        text = f"Cancel the event titled '{event.title}' on {event.date}."
    elif kind == "buy_cheapest":
        category = rng.choice(sorted(CATEGORIES))
        cheapest = min(
            (p for p in world.products if p.category == category), key=lambda p: p.price_cents
        )
        quantity = rng.randint(1, 3)
        params = {"category": category, "sku": cheapest.sku, "quantity": quantity}
        text = f"Buy {quantity} unit(s) of the cheapest product in the '{category}' category."
    elif kind == "note_email":
        title = f"Email of {person.name.split(' ')[0]}"
        params = {"name": person.name, "email": person.email, "title": title}
        text = (
            f"Write a note titled '{title}' whose body is exactly the email address of "
            f"{person.name}."
        )
    elif kind == "order_total":
        product = rng.choice(world.products)
        quantity = rng.randint(2, 6)
        params = {
            "product": product.name,
            "quantity": quantity,
            "total": quantity * product.price_cents,
        }
        text = (
            f"How much would {quantity} units of '{product.name}' cost, in cents? "
            "Answer with a number; do not buy anything."
        )
    elif kind == "move_contact":
        city = rng.choice([c for c in CITIES if c != person.city])
        params = {"name": person.name, "city": city, "phone": person.phone}
        text = f"{person.name} moved to {city}. Update their city in my contacts."
    elif kind == "schedule":
        date = rng.choice(DATES)
        start = rng.choice(TIMES)
        title = f"Coffee with {person.name.split(' ')[0]}"
        params = {
            "title": title,
            "date": date,
            "start": start,
            "name": person.name,
            "contact_id": person.contact_id,
        }
        text = f"Schedule '{title}' on {date} at {start} with {person.name} as the attendee."
    else:  # who_lives
        params = {"city": person.city, "name": person.name}
        text = f"Which of my contacts lives in {person.city}? Answer with their full name."
    task = CodeTask(
        task_id=f"t{index:03d}",
        index=index,
        seed=seed,
        kind=kind,
        instruction=text,
        params=MappingProxyType(params),
    )
    return world, task


def build_tasks(seed: int, limit: int | None = None) -> list[CodeTask]:
    """The first ``limit`` (default: all ``TASK_COUNT``) tasks of ``seed``."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    count = TASK_COUNT if limit is None else min(limit, TASK_COUNT)
    return [_generate(seed, index)[1] for index in range(count)]


def task_for(seed: int, task_id: str) -> CodeTask:
    """The task ``task_id`` (``t000`` ... ``t039``) of ``seed``; ``ValueError`` otherwise."""
    match = _TASK_ID.fullmatch(task_id)
    if match is None or int(match.group(1)) >= TASK_COUNT:
        raise ValueError(
            f"task id {task_id!r} is not a code task; ids run from t000 to t{TASK_COUNT - 1:03d}"
        )
    return _generate(seed, int(match.group(1)))[1]


def world_for(task: CodeTask) -> World:
    """A fresh copy of the task's initial world."""
    return _generate(task.seed, task.index)[0]


def _same(answer: object, expected: object) -> bool:
    if isinstance(expected, int) and not isinstance(answer, bool):
        try:
            return int(str(answer).strip()) == expected
        except ValueError:
            return False
    return isinstance(answer, str) and answer.strip() == expected


def check(task: CodeTask, world: World, *, completed: bool, answer: object) -> bool:
    """Whether the task is solved: completed, and the world and the answer are as asked."""
    if not completed:
        return False
    p = task.params
    if task.kind == "phone_lookup":
        return _same(answer, p["phone"])
    if task.kind == "count_events":
        return _same(answer, p["count"])
    if task.kind == "add_contact":
        found = [c for c in world.contacts if c.name == p["name"]]
        return len(found) == 1 and (found[0].email, found[0].phone, found[0].city) == (
            p["email"],
            p["phone"],
            p["city"],
        )
    if task.kind == "cancel_event":
        gone = not any(e.title == p["title"] and e.date == p["date"] for e in world.events)
        return gone and len(world.events) == p["event_count"] - 1  # type: ignore[operator]
    if task.kind == "buy_cheapest":
        return [(o.sku, o.quantity) for o in world.orders] == [(p["sku"], p["quantity"])]
    if task.kind == "note_email":
        return any(n.title == p["title"] and n.body.strip() == p["email"] for n in world.notes)
    if task.kind == "order_total":
        return not world.orders and _same(answer, p["total"])
    if task.kind == "move_contact":
        contact = world.contact_named(str(p["name"]))
        return contact is not None and (contact.city, contact.phone) == (p["city"], p["phone"])
    if task.kind == "schedule":
        return any(
            (e.title, e.date, e.start, e.attendee_ids)
            == (p["title"], p["date"], p["start"], [p["contact_id"]])
            for e in world.events
        )
    return _same(answer, p["name"])


def solution(task: CodeTask) -> Solution:
    """Reference code for ``task`` (explore, solve, wrong, buggy)."""
    p = task.params
    kind = task.kind
    if kind == "phone_lookup":
        return Solution(
            explore=f"matches = apps.contacts.find({p['name']!r})\nprint(matches)",
            solve='complete_task(answer=matches[0]["phone"])',
            wrong='complete_task(answer="555-000-0000")',
            buggy=f"print(apps.contacts.lookup({p['name']!r}))",
        )
    if kind == "count_events":
        return Solution(
            explore=(
                f"events = apps.calendar.events_on({p['date']!r})\nprint(len(events), 'events')"
            ),
            solve="complete_task(answer=len(events))",
            wrong="complete_task(answer=len(events) + 1)",
            buggy=f"print(apps.calendar.events_on({p['date']!r})['count'])",
        )
    if kind == "add_contact":
        args = f"{p['name']!r}, {p['email']!r}, {p['phone']!r}, {p['city']!r}"
        return Solution(
            explore=f"print(apps.contacts.find({p['name']!r}))",
            solve=f"new_id = apps.contacts.add({args})\nprint('added', new_id)\ncomplete_task()",
            wrong=f"apps.contacts.add({p['name']!r}, 'nobody@example.net', {p['phone']!r}, "
            f"{p['city']!r})\ncomplete_task()",
            buggy=f"apps.contacts.add({p['name']!r})",
        )
    if kind == "cancel_event":
        return Solution(
            explore=(
                f"found = [e for e in apps.calendar.events_on({p['date']!r}) "
                f"if e['title'] == {p['title']!r}]\nprint(found)"
            ),
            solve="apps.calendar.cancel(found[0]['event_id'])\ncomplete_task()",
            wrong="complete_task()",
            buggy=f"apps.calendar.cancel({p['title']!r})",
        )
    if kind == "buy_cheapest":
        return Solution(
            explore=(
                f"items = sorted(apps.shop.by_category({p['category']!r}), "
                "key=lambda item: item['price_cents'])\nprint(items)"
            ),
            solve=f"order = apps.shop.buy(items[0]['sku'], {p['quantity']})\n"
            "print('order', order)\ncomplete_task()",
            wrong=f"apps.shop.buy(items[-1]['sku'], {p['quantity']})\ncomplete_task()",
            buggy=f"apps.shop.buy({p['category']!r}, {p['quantity']})",
        )
    if kind == "note_email":
        return Solution(
            explore=f"person = apps.contacts.find({p['name']!r})[0]\nprint(person['email'])",
            solve=f"apps.notes.write({p['title']!r}, person['email'])\ncomplete_task()",
            wrong=f"apps.notes.write({p['title']!r}, person['name'])\ncomplete_task()",
            buggy=f"apps.notes.write({p['title']!r})",
        )
    if kind == "order_total":
        return Solution(
            explore=f"hits = apps.shop.search({p['product']!r})\nprint(hits)",
            solve=f"complete_task(answer=hits[0]['price_cents'] * {p['quantity']})",
            wrong="complete_task(answer=hits[0]['price_cents'])",
            buggy=f"print(apps.shop.price({p['product']!r}))",
        )
    if kind == "move_contact":
        return Solution(
            explore=f"person = apps.contacts.find({p['name']!r})[0]\nprint(person)",
            solve=f"print(apps.contacts.update(person['contact_id'], city={p['city']!r}))\n"
            "complete_task()",
            wrong=f"apps.contacts.update(person['contact_id'], phone={p['city']!r})\n"
            "complete_task()",
            buggy=f"apps.contacts.update({p['name']!r}, city={p['city']!r})",
        )
    if kind == "schedule":
        return Solution(
            explore=f"person = apps.contacts.find({p['name']!r})[0]\nprint(person)",
            solve=(
                f"event_id = apps.calendar.create({p['title']!r}, {p['date']!r}, {p['start']!r}, "
                "attendee_ids=[person['contact_id']])\nprint('created', event_id)\n"
                "complete_task()"
            ),
            wrong=f"apps.calendar.create({p['title']!r}, {p['date']!r}, {p['start']!r})\n"
            "complete_task()",
            buggy=f"apps.calendar.create({p['title']!r})",
        )
    return Solution(
        explore=f"people = [c for c in apps.contacts.all() if c['city'] == {p['city']!r}]\n"
        "print(people)",
        solve="complete_task(answer=people[0]['name'])",
        wrong="complete_task(answer=apps.contacts.all()[0]['name'] + ' Jr')",
        buggy=f"print(apps.contacts.find(city={p['city']!r}))",
    )
