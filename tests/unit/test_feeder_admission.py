"""The feeder's admission rule (feeder_svc.admission): the one place that decides how many
prompts may be put."""

from feeder_svc.admission import finished_prompts, room


def test_room_fills_up_to_the_limit_and_no_further():
    assert room(limit=8, fed=0, finished=0) == 8
    assert room(limit=8, fed=8, finished=0) == 0
    assert room(limit=8, fed=8, finished=3) == 3
    assert room(limit=8, fed=20, finished=3) == 0  # over the limit already: nothing, never negative


def test_sync_waits_for_the_whole_batch_and_the_replicas():
    assert room(limit=4, fed=4, finished=3, sync=True) == 0
    assert room(limit=4, fed=4, finished=4, sync=True, replicas_current=False) == 0
    assert room(limit=4, fed=4, finished=4, sync=True, replicas_current=True) == 4
    assert room(limit=4, fed=4, finished=3, sync=False, replicas_current=False) == 3  # async ignores replicas


def test_finished_prompts_counts_trained_and_dropped_groups():
    assert finished_prompts({}, 4) is None  # the trainer is down: unknown, not zero
    got = {"meshrl_trainer_samples_total": 16.0, "meshrl_trainer_dropped_stale_samples_total": 4.0,
           "meshrl_trainer_dropped_error_samples_total": 4.0}
    assert finished_prompts(got, 4) == 6
