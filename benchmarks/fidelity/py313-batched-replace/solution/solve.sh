#!/bin/bash
set -euo pipefail

cat > /app/batches.py <<'PY'
"""Orders repriced in batches, with Python 3.12's itertools.batched and 3.13's copy.replace."""

import copy
import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class Order:
    sku: str
    price: float


def reprice(orders: list[Order], size: int, rate: float) -> list[tuple[Order, ...]]:
    repriced = (copy.replace(order, price=round(order.price * rate, 2)) for order in orders)
    return list(itertools.batched(repriced, size))
PY
cd /app && python3 -c 'from batches import Order, reprice; print(reprice([Order("a", 1.0)], 2, 1.1))'
