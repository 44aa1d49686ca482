"""A small world of simulated apps and the Python API agent code calls.

A ``World`` holds four apps' data: contacts, calendar events, notes, and a shop (products and
orders). ``World.generate(rng)`` builds one deterministically from a ``random.Random``; the
same rng state always gives the same world. ``Apps(world)`` is what agent code sees as
``apps``: ``apps.contacts.find("Ada")``, ``apps.shop.buy("SKU-104", 2)`` and so on.

Every API call returns fresh plain values (dicts, lists, ints), never the world's own objects,
so agent code changes the world only through the API. That is a convenience for honest code,
not a protection: the sandbox is not a security boundary (see ``sandbox``).

API errors are ``AppError`` with a message that says what was wrong and what is valid; agent
code sees them as tracebacks, which is the feedback a model learns from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "API_DESCRIPTION",
    "AppError",
    "Apps",
    "Contact",
    "Event",
    "Note",
    "Order",
    "Product",
    "World",
]

FIRST_NAMES: Final = (
    "Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas",
    "Keiko", "Liam", "Maya", "Nils", "Olga", "Pablo", "Quinn", "Rosa", "Sven", "Tara",
)  # fmt: skip
LAST_NAMES: Final = (
    "Abbott", "Berger", "Castillo", "Dubois", "Eriksen", "Fischer", "Garcia", "Holm",
    "Ivanova", "Jensen", "Kowalski", "Lindqvist", "Moreau", "Novak", "Ortega", "Peters",
)  # fmt: skip
CITIES: Final = (
    "Aarhus", "Bilbao", "Coimbra", "Dresden", "Espoo", "Florence", "Graz", "Haarlem",
    "Innsbruck", "Lyon", "Malmo", "Nantes", "Porto", "Riga", "Tartu", "Utrecht",
)  # fmt: skip
EVENT_TITLES: Final = (
    "Budget review", "Dentist", "Team standup", "Lunch with Sam", "Quarterly planning",
    "Yoga class", "Car service", "Book club", "Design critique", "Parent evening",
    "Release retro", "Piano lesson",
)  # fmt: skip
CATEGORIES: Final = {
    "tea": ("Green tea", "Earl grey", "Rooibos", "Jasmine tea", "Mint tea"),
    "coffee": ("Espresso beans", "Filter roast", "Decaf blend", "Cold brew pack"),
    "stationery": ("Dot notebook", "Gel pen set", "Sticky notes", "Fountain pen", "Ruler"),
    "lighting": ("Desk lamp", "Reading light", "LED strip", "Bulb pack"),
}
DATES: Final = tuple(f"2026-12-{day:02d}" for day in range(1, 15))
TIMES: Final = ("08:30", "09:00", "10:00", "11:30", "13:00", "14:00", "15:30", "17:00")

API_DESCRIPTION: Final = """\
apps.contacts.find(name) -> list of contacts whose name contains `name` (case-insensitive)
apps.contacts.get(contact_id) -> one contact
apps.contacts.all() -> every contact
apps.contacts.add(name, email, phone, city) -> the new contact_id
apps.contacts.update(contact_id, email=None, phone=None, city=None) -> the updated contact
  a contact is {"contact_id", "name", "email", "phone", "city"}
apps.calendar.events_on(date) -> events on that date ("YYYY-MM-DD"), ordered by start time
apps.calendar.find(title) -> events whose title contains `title`
apps.calendar.create(title, date, start, attendee_ids=()) -> the new event_id
apps.calendar.cancel(event_id) -> None
  an event is {"event_id", "title", "date", "start", "attendee_ids"}
apps.notes.list() -> [{"note_id", "title"}, ...]
apps.notes.read(note_id) -> {"note_id", "title", "body"}
apps.notes.search(text) -> notes whose title or body contains `text`
apps.notes.write(title, body) -> the new note_id
apps.shop.search(query) -> products whose name contains `query`
apps.shop.by_category(category) -> products of one category (tea, coffee, stationery, lighting)
apps.shop.buy(sku, quantity) -> the new order_id
apps.shop.orders() -> every order
  a product is {"sku", "name", "category", "price_cents", "stock"}
  an order is {"order_id", "sku", "quantity", "total_cents"}
complete_task(answer=None) -> call exactly once when the task is done; pass the answer if the
  task asks a question"""
"""The API as the agent's prompt describes it (also the reference for policies)."""


_Rows = list[dict[str, object]]
"""What a listing API returns (an alias: ``_Notes`` has a method named ``list``)."""


class AppError(Exception):
    """An API call that the app refuses; the message says what was wrong."""


@dataclass(slots=True)
class Contact:
    contact_id: int
    name: str
    email: str
    phone: str
    city: str

    def public(self) -> dict[str, object]:
        return {
            "contact_id": self.contact_id,
            "name": self.name,
            "email": self.email,
            "phone": self.phone,
            "city": self.city,
        }


@dataclass(slots=True)
class Event:
    event_id: int
    title: str
    date: str
    start: str
    attendee_ids: list[int]

    def public(self) -> dict[str, object]:
        return {
            "event_id": self.event_id,
            "title": self.title,
            "date": self.date,
            "start": self.start,
            "attendee_ids": list(self.attendee_ids),
        }


@dataclass(slots=True)
class Note:
    note_id: int
    title: str
    body: str

    def public(self) -> dict[str, object]:
        return {"note_id": self.note_id, "title": self.title, "body": self.body}


@dataclass(slots=True)
class Product:
    sku: str
    name: str
    category: str
    price_cents: int
    stock: int

    def public(self) -> dict[str, object]:
        return {
            "sku": self.sku,
            "name": self.name,
            "category": self.category,
            "price_cents": self.price_cents,
            "stock": self.stock,
        }


@dataclass(slots=True)
class Order:
    order_id: int
    sku: str
    quantity: int
    total_cents: int

    def public(self) -> dict[str, object]:
        return {
            "order_id": self.order_id,
            "sku": self.sku,
            "quantity": self.quantity,
            "total_cents": self.total_cents,
        }


@dataclass(slots=True)
class World:
    """The state of every app. Mutable: the apps change it, the success checks read it."""

    contacts: list[Contact] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    products: list[Product] = field(default_factory=list)
    orders: list[Order] = field(default_factory=list)

    @classmethod
    def generate(cls, rng: random.Random) -> World:
        """A world drawn from ``rng``: 12 contacts with unique names and unique cities, about
        20 events over two weeks, a few notes, and every product of the catalogue."""
        world = cls()
        names = rng.sample([f"{f} {last}" for f in FIRST_NAMES for last in LAST_NAMES], 12)
        cities = rng.sample(CITIES, 12)
        for index, (name, city) in enumerate(zip(names, cities, strict=True), start=1):
            first, last = name.lower().split(" ")
            world.contacts.append(
                Contact(
                    contact_id=index,
                    name=name,
                    email=f"{first}.{last}@example.org",
                    phone=f"555-{rng.randint(100, 999):03d}-{rng.randint(0, 9999):04d}",
                    city=city,
                )
            )
        for index in range(1, rng.randint(18, 24) + 1):
            attendees = rng.sample(range(1, 13), rng.randint(0, 3))
            world.events.append(
                Event(
                    event_id=index,
                    title=rng.choice(EVENT_TITLES),
                    date=rng.choice(DATES),
                    start=rng.choice(TIMES),
                    attendee_ids=sorted(attendees),
                )
            )
        for index in range(1, 5):
            contact = rng.choice(world.contacts)
            world.notes.append(
                Note(
                    note_id=index,
                    title=f"Call {contact.name.split(' ')[0]}",
                    body=f"Ask about the {rng.choice(EVENT_TITLES).lower()}.",
                )
            )
        sku = 100
        for category, product_names in CATEGORIES.items():
            prices = rng.sample(range(150, 4900, 7), len(product_names))
            for name, price in zip(product_names, prices, strict=True):
                world.products.append(
                    Product(
                        sku=f"SKU-{sku}",
                        name=name,
                        category=category,
                        price_cents=price,
                        stock=rng.randint(3, 40),
                    )
                )
                sku += 1
        return world

    def contact_named(self, name: str) -> Contact | None:
        for contact in self.contacts:
            if contact.name == name:
                return contact
        return None


def _require_str(api: str, name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise AppError(f"{api}: {name} must be a non-empty string, got {value!r}")
    return value


def _require_int(api: str, name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AppError(f"{api}: {name} must be an integer >= {minimum}, got {value!r}")
    return value


class _Contacts:
    def __init__(self, world: World) -> None:
        self._world = world

    def find(self, name: str) -> list[dict[str, object]]:
        needle = _require_str("contacts.find", "name", name).lower()
        return [c.public() for c in self._world.contacts if needle in c.name.lower()]

    def get(self, contact_id: int) -> dict[str, object]:
        return self._get(contact_id, "contacts.get").public()

    def all(self) -> list[dict[str, object]]:
        return [c.public() for c in self._world.contacts]

    def add(self, name: str, email: str, phone: str, city: str) -> int:
        api = "contacts.add"
        contact = Contact(
            contact_id=max((c.contact_id for c in self._world.contacts), default=0) + 1,
            name=_require_str(api, "name", name),
            email=_require_str(api, "email", email),
            phone=_require_str(api, "phone", phone),
            city=_require_str(api, "city", city),
        )
        if "@" not in contact.email:
            raise AppError(f"{api}: email {email!r} has no '@'")
        self._world.contacts.append(contact)
        return contact.contact_id

    def update(
        self,
        contact_id: int,
        email: str | None = None,
        phone: str | None = None,
        city: str | None = None,
    ) -> dict[str, object]:
        api = "contacts.update"
        contact = self._get(contact_id, api)
        if email is None and phone is None and city is None:
            raise AppError(f"{api}: pass at least one of email=, phone=, city=")
        if email is not None:
            contact.email = _require_str(api, "email", email)
        if phone is not None:
            contact.phone = _require_str(api, "phone", phone)
        if city is not None:
            contact.city = _require_str(api, "city", city)
        return contact.public()

    def _get(self, contact_id: object, api: str) -> Contact:
        wanted = _require_int(api, "contact_id", contact_id, minimum=1)
        for contact in self._world.contacts:
            if contact.contact_id == wanted:
                return contact
        raise AppError(f"{api}: no contact with contact_id {wanted}")


class _Calendar:
    def __init__(self, world: World) -> None:
        self._world = world

    def events_on(self, date: str) -> list[dict[str, object]]:
        day = _require_str("calendar.events_on", "date", date)
        found = [e for e in self._world.events if e.date == day]
        return [e.public() for e in sorted(found, key=lambda e: (e.start, e.event_id))]

    def find(self, title: str) -> list[dict[str, object]]:
        needle = _require_str("calendar.find", "title", title).lower()
        return [e.public() for e in self._world.events if needle in e.title.lower()]

    def create(
        self, title: str, date: str, start: str, attendee_ids: tuple[int, ...] | list[int] = ()
    ) -> int:
        api = "calendar.create"
        if date not in DATES:
            raise AppError(f"{api}: date {date!r} is not a YYYY-MM-DD day of this calendar")
        known = {c.contact_id for c in self._world.contacts}
        attendees = [_require_int(api, "attendee id", a, minimum=1) for a in attendee_ids]
        unknown = [a for a in attendees if a not in known]
        if unknown:
            raise AppError(f"{api}: unknown attendee ids {unknown}")
        event = Event(
            event_id=max((e.event_id for e in self._world.events), default=0) + 1,
            title=_require_str(api, "title", title),
            date=date,
            start=_require_str(api, "start", start),
            attendee_ids=sorted(attendees),
        )
        self._world.events.append(event)
        return event.event_id

    def cancel(self, event_id: int) -> None:
        wanted = _require_int("calendar.cancel", "event_id", event_id, minimum=1)
        for index, event in enumerate(self._world.events):
            if event.event_id == wanted:
                del self._world.events[index]
                return
        raise AppError(f"calendar.cancel: no event with event_id {wanted}")


class _Notes:
    def __init__(self, world: World) -> None:
        self._world = world

    def list(self) -> _Rows:
        return [{"note_id": n.note_id, "title": n.title} for n in self._world.notes]

    def read(self, note_id: int) -> dict[str, object]:
        wanted = _require_int("notes.read", "note_id", note_id, minimum=1)
        for note in self._world.notes:
            if note.note_id == wanted:
                return note.public()
        raise AppError(f"notes.read: no note with note_id {wanted}")

    def search(self, text: str) -> _Rows:
        needle = _require_str("notes.search", "text", text).lower()
        return [
            n.public()
            for n in self._world.notes
            if needle in n.title.lower() or needle in n.body.lower()
        ]

    def write(self, title: str, body: str) -> int:
        note = Note(
            note_id=max((n.note_id for n in self._world.notes), default=0) + 1,
            title=_require_str("notes.write", "title", title),
            body=_require_str("notes.write", "body", body),
        )
        self._world.notes.append(note)
        return note.note_id


class _Shop:
    def __init__(self, world: World) -> None:
        self._world = world

    def search(self, query: str) -> list[dict[str, object]]:
        needle = _require_str("shop.search", "query", query).lower()
        return [p.public() for p in self._world.products if needle in p.name.lower()]

    def by_category(self, category: str) -> list[dict[str, object]]:
        name = _require_str("shop.by_category", "category", category)
        if name not in CATEGORIES:
            raise AppError(
                f"shop.by_category: unknown category {name!r}; use one of {sorted(CATEGORIES)}"
            )
        return [p.public() for p in self._world.products if p.category == name]

    def buy(self, sku: str, quantity: int) -> int:
        api = "shop.buy"
        code = _require_str(api, "sku", sku)
        count = _require_int(api, "quantity", quantity, minimum=1)
        for product in self._world.products:
            if product.sku == code:
                if product.stock < count:
                    raise AppError(f"{api}: only {product.stock} of {code} in stock")
                product.stock -= count
                order = Order(
                    order_id=len(self._world.orders) + 1,
                    sku=code,
                    quantity=count,
                    total_cents=count * product.price_cents,
                )
                self._world.orders.append(order)
                return order.order_id
        raise AppError(f"{api}: no product with sku {code!r} (skus look like 'SKU-104')")

    def orders(self) -> list[dict[str, object]]:
        return [o.public() for o in self._world.orders]


class Apps:
    """The ``apps`` object agent code calls: ``apps.contacts``, ``.calendar``, ``.notes``,
    ``.shop``. ``API_DESCRIPTION`` lists every method."""

    def __init__(self, world: World) -> None:
        self.contacts = _Contacts(world)
        self.calendar = _Calendar(world)
        self.notes = _Notes(world)
        self.shop = _Shop(world)

    def __repr__(self) -> str:
        return "<apps: contacts, calendar, notes, shop>"
