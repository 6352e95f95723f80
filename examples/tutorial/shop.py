"""The tutorial's task worker (docs/tutorial.md): every task of kind ``shop``.

    python -m workers run examples.tutorial.shop:Shop --concurrency 2

``run`` gets one :class:`workers.Task` per attempt and returns its output; an
exception fails the attempt with ``"<ExceptionType>: <message>"`` and the
lifecycle retries it as the flow's ``$retries`` says.
"""

from __future__ import annotations

import time
from typing import Any

from workers import Task, TaskListener


class Shop(TaskListener):
    kind = "shop"  # serves tasks named shop:..., on the stream {flow}:tasks:shop

    def run(self, task: Task) -> Any:
        if task.operation == "orders":  # the batch's orders: a list, so `*` iterates it
            return task.input["orders"]
        if task.operation == "price":
            return self.price(task)
        if task.operation == "review":
            return {**task.input, "reviewed": True}
        if task.operation == "total":
            return {"orders": len(task.input), "total": sum(o["total"] for o in task.input)}
        raise ValueError(f"unknown operation {task.operation!r}")

    def price(self, task: Task) -> dict[str, Any]:
        order, unit = task.input, task.parameters["unit"]
        if order["qty"] < 0:
            raise ValueError(f"order {order['id']}: negative quantity {order['qty']}")
        if order["qty"] > 20 and task.attempt == 1:
            # The price service times out on big orders now and then: a retry helps.
            raise TimeoutError("price service did not answer in 5 s")
        # A slow order (seconds in "slow") stops as soon as its workflow is terminated.
        deadline = time.monotonic() + order.get("slow", 0)
        while time.monotonic() < deadline:
            if task.cancelled():
                raise InterruptedError("workflow ended")
            time.sleep(0.5)
        return {**order, "total": order["qty"] * unit}
