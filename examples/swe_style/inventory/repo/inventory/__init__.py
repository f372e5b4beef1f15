"""A stock ledger: items received and shipped, and what the stock is worth."""

from inventory.stock import InsufficientStock, Line, Stock

__all__ = ["InsufficientStock", "Line", "Stock"]
