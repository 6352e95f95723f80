"""Packed answers: the successful answers of a task worker's batch in one ``end-tasks``
entry (:data:`lifecycle.events.END_TASKS`) instead of one ``end-task`` each.

One XADD per batch instead of one per task: fewer Redis commands, and fewer entries
for the lifecycle and receipts workers to read (docs/performance.md). Only lifecycle
workers of this version or later read such an entry, so a deployment turns packing on
(``--pack-answers``) once every lifecycle worker is at this version
(docs/operations.md). Failures always go as ``end-task``: they carry an error, not an
output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lifecycle.events import end_tasks_fields

__all__ = ["PACK_ANSWERS", "PACK_BYTES", "AnswerPack", "batch_pack"]

# The most a pack holds: far below a listener's max_entry_bytes (8 MB by default), past
# which the lifecycle worker would dead-letter the whole entry; and few enough answers
# for the lifecycle worker to advance them together (it watches every workflow of what
# it advances at once, at a cost in Redis that grows with the square of their number).
PACK_BYTES = 1 << 20
PACK_ANSWERS = 200


class AnswerPack:
    """The answers of the batch in hand, sent by ``send`` (a listener's ``emit_command``:
    in the batch's transaction, with its acknowledgement) as ``end-tasks`` entries of
    at most ``most_bytes`` and ``most_answers`` each."""

    def __init__(
        self,
        send: Callable[..., None],
        stream: str,
        worker: str,
        most_bytes: int = PACK_BYTES,
        most_answers: int = PACK_ANSWERS,
    ) -> None:
        self._send, self.stream, self.worker = send, stream, worker
        self.most_bytes, self.most_answers = most_bytes, most_answers
        self._answers: list[bytes] = []
        self._size = 0

    def add(self, workflow: bytes, key: bytes, attempt: bytes, token: bytes, output: bytes) -> bool:
        """Pack one answer, each value its JSON; False (nothing packed) when it alone
        is larger than a pack may be: the caller sends it as an ``end-task``."""
        return self.add_answer(b"[%b,%b,%b,%b,%b]" % (workflow, key, attempt, token, output))

    def add_answer(self, answer: bytes) -> bool:
        """:meth:`add` of an answer already in JSON: ``[workflow,key,attempt,token,output]``."""
        if len(answer) > self.most_bytes:
            return False
        if self._size + len(answer) > self.most_bytes or len(self._answers) >= self.most_answers:
            self.send_pack()
        self._answers.append(answer)
        self._size += len(answer) + 1
        return True

    def clear(self) -> None:
        """Forget what is packed: a batch that did not finish (its entries, unacknowledged,
        are delivered again) leaves nothing to the next."""
        self._answers, self._size = [], 0

    def send_pack(self) -> None:
        """Send what is packed (nothing when empty)."""
        if not self._answers:
            return
        fields = end_tasks_fields(self.worker, self._answers)
        self._answers, self._size = [], 0
        self._send("XADD", self.stream, "*", *fields)


def batch_pack(pack: AnswerPack | None, listener: Any) -> AnswerPack | None:
    """The pack a new batch of ``listener`` (a task worker: its ``pack_answers``,
    ``emit_command``, ``keys`` and ``consumer``) answers into: made at the first batch
    that packs, emptied at every other (of what a batch that did not finish left)."""
    if pack is not None:
        pack.clear()
        return pack
    if listener.pack_answers:
        return AnswerPack(listener.emit_command, listener.keys.lifecycle, listener.consumer)
    return None
