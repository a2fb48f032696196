"""The feeder's admission rule (feeder_svc.admission): the one place that decides how many
prompts may be put."""

from feeder_svc.admission import room


def test_room_fills_up_to_the_limit_and_no_further():
    assert room(limit=8, in_flight=0) == 8
    assert room(limit=8, in_flight=8) == 0
    assert room(limit=8, in_flight=5) == 3
    assert room(limit=8, in_flight=20) == 0  # over the limit already: nothing, never negative


def test_sync_waits_for_the_whole_batch_and_the_replicas():
    assert room(limit=4, in_flight=1, sync=True) == 0
    assert room(limit=4, in_flight=0, sync=True, replicas_current=False) == 0
    assert room(limit=4, in_flight=0, sync=True, replicas_current=True) == 4
    assert room(limit=4, in_flight=1, sync=False, replicas_current=False) == 3  # async ignores the replicas
