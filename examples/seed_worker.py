"""A task worker in the predecessor's (seed) style: subclass EventListener, override process.

It serves the ``stock`` kind of ``examples/restock.flow``::

    python -m lifecycle worker          # and the built-in wait: kind (python -m workers wait)
    python -m workers run examples.seed_worker:StockListener --concurrency 4
    python -m lifecycle run examples/restock.flow --wait

Compared with the seed's SleepListener, two things are spelled out: the
end-task goes to the lifecycle stream (``{flow}:lifecycle``; the seed had a
single stream for everything), and it echoes ``key``, which tasks inside
``*`` iterations need (for other tasks ``index`` alone is enough), and
``attempt`` and ``token``: the engine takes an answer only with the token of
the attempt it started, so a late or forged answer changes nothing.
``workers.TaskListener`` does all of this for you.
"""

from __future__ import annotations

from typing import Any

from lifecycle.events import END_TASK, START_TASK
from lifecycle.keys import Keys
from rqse import EventListener, message, receipt_for

KEYS = Keys()
INVENTORY = {"a1": 3, "b2": 0, "c3": 12, "d4": 0}  # what a real worker would look up


class StockListener(EventListener):
    def __init__(self, key=None, group="workers", consumer=None, pool=None, **options):
        super().__init__(
            key or KEYS.tasks("stock"),
            group,
            select=[START_TASK],
            consumer=consumer,
            pool=pool,
            **options,
        )

    def process(self, event_id, event):
        # start-task events all have workflow, name, index, key, input, and parameters
        category, _, operation = event["name"].partition(":")
        if category != "stock":
            return False  # not ours: acknowledged, nobody answers it

        # Visible at once, before the work (the seed's habit; optional here).
        self.append(receipt_for(event_id))

        end_event = {
            "name": event["name"],
            "index": event["index"],
            "key": event.get("key"),
            "workflow": event["workflow"],
            "attempt": event.get("attempt"),
            "token": event.get("token"),
        }
        try:
            end_event["output"] = getattr(self, f"do_{operation}")(event["input"])
            end_event["status"] = "SUCCESS"
        except Exception as error:  # the workflow sees this text as the failure reason
            end_event["status"] = "FAILURE"
            end_event["error"] = f"{type(error).__name__}: {error}"
        self.append(message(end_event, kind=END_TASK), KEYS.lifecycle)
        return True

    def do_items(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """The batch's items, each told its batch number."""
        return [{**item, "batch": batch["batch"]} for item in batch["items"]]

    def do_count(self, item: dict[str, Any]) -> dict[str, Any]:
        return {**item, "qty": INVENTORY[item["sku"]]}

    def do_reorder(self, item: dict[str, Any]) -> dict[str, Any]:
        return {**item, "reordered": True}

    def do_audit(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"audited": len(items)}

    def do_summary(self, inputs: list[Any]) -> dict[str, Any]:
        items, audit = inputs  # the join: the delay's output (the items), then the audit's
        return {
            "batch": items[0]["batch"],
            "checked": audit["audited"],
            "reordered": [item["sku"] for item in items if item.get("reordered")],
        }


if __name__ == "__main__":
    StockListener().listen()
