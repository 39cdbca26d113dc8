"""frozen_survivors: the objects alive at entry are left out of collections within, and still freed by refcount."""

from __future__ import annotations

import gc
import weakref

from llmaudit.common.memory import frozen_survivors, release_memory


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_frozen_survivors_freezes_within_and_unfreezes_after():
    assert gc.get_freeze_count() == 0
    with frozen_survivors():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_an_object_alive_at_entry_is_freed_when_its_last_reference_goes():
    before = _Node()
    alive = weakref.ref(before)
    with frozen_survivors():
        del before
        assert alive() is None  # no cycle: freed at once, frozen or not


def test_cycles_made_within_are_collected_and_frozen_cycles_wait_for_the_exit():
    old_a, old_b = _Node(), _Node()
    old_a.other, old_b.other = old_b, old_a
    old = weakref.ref(old_a)
    with frozen_survivors():
        new_a, new_b = _Node(), _Node()
        new_a.other, new_b.other = new_b, new_a
        new = weakref.ref(new_a)
        del new_a, new_b, old_a, old_b
        release_memory()
        assert new() is None  # made within: collected
        assert old() is not None  # frozen at entry: left out of the collection
    gc.collect()
    assert old() is None  # unfrozen after: collected again
