"""The stock: one line per SKU, with the unit price of its last delivery."""

from __future__ import annotations

import attrs


class InsufficientStock(Exception):
    """A shipment asks for more of an SKU than the stock holds."""


@attrs.frozen(kw_only=True)
class Line:
    """``quantity`` units of ``sku`` held, each worth ``unit_cents``."""

    sku: str
    unit_cents: int = attrs.field(validator=attrs.validators.ge(0))
    quantity: int = attrs.field(validator=attrs.validators.ge(0))


@attrs.define
class Stock:
    """What is held, by SKU."""

    lines: dict[str, Line] = attrs.field(factory=dict)

    def receive(self, sku: str, unit_cents: int, quantity: int) -> None:
        """A delivery of ``quantity`` units of ``sku`` at ``unit_cents`` each."""
        held = self.lines.get(sku)
        if held is None:
            self.lines[sku] = Line(sku=sku, unit_cents=unit_cents, quantity=quantity)
        else:
            self.lines[sku] = attrs.evolve(held, unit_cents=unit_cents)

    def ship(self, sku: str, quantity: int) -> None:
        """Take ``quantity`` units of ``sku`` out of the stock.

        Raises:
            InsufficientStock: fewer units are held.
        """
        held = self.lines.get(sku)
        if held is None or held.quantity < quantity:
            have = 0 if held is None else held.quantity
            raise InsufficientStock(f"{sku}: {quantity} asked, {have} held")
        self.lines[sku] = attrs.evolve(held, quantity=held.quantity - quantity)

    def quantity(self, sku: str) -> int:
        """Units of ``sku`` held (0 for an SKU never received)."""
        held = self.lines.get(sku)
        return 0 if held is None else held.quantity

    def value_cents(self) -> int:
        """What the whole stock is worth at each line's unit price."""
        return sum(line.unit_cents * line.quantity for line in self.lines.values())
