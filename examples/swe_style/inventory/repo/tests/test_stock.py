import pytest
from inventory import InsufficientStock, Stock


def test_a_first_delivery_is_held() -> None:
    stock = Stock()
    stock.receive("bolt", unit_cents=12, quantity=100)
    assert stock.quantity("bolt") == 100


def test_deliveries_of_one_sku_add_up() -> None:
    stock = Stock()
    stock.receive("bolt", unit_cents=12, quantity=100)
    stock.receive("bolt", unit_cents=15, quantity=50)
    assert stock.quantity("bolt") == 150
    assert stock.value_cents() == 150 * 15


def test_shipping_more_than_is_held_is_refused() -> None:
    stock = Stock()
    stock.receive("nut", unit_cents=3, quantity=10)
    stock.receive("nut", unit_cents=3, quantity=10)
    stock.ship("nut", 15)
    assert stock.quantity("nut") == 5
    with pytest.raises(InsufficientStock, match="nut: 6 asked, 5 held"):
        stock.ship("nut", 6)
