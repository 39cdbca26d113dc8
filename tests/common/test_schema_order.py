"""`in_read_order`: a block written back keeps the order its keys were read in, new keys after them."""

from llmaudit.common.schema import in_read_order


def test_keys_come_back_in_the_order_they_were_read_and_new_ones_after():
    written = {"b": 2, "new": 9, "a": 1, "c": 3}
    out = in_read_order(written, ("c", "a", "gone", "b"))
    assert list(out) == ["c", "a", "b", "new"]  # a key read but not written any more is not invented
    assert out == written


def test_without_a_recorded_order_the_written_order_stays():
    written = {"z": 1, "a": 2}
    assert list(in_read_order(written, ())) == ["z", "a"]
