"""The prompt feeder keeps its position across restarts (feeder.json), on a real broker."""

from __future__ import annotations

import json

import pytest

from services.config.queues import EmbeddedQueueConfig
from feeder_svc.admission import room
from feeder_svc.feeder import PromptFeeder
from services.data.feed_position import fed_uids_of
from services.queues import make_queue


class Rows:
    """A stand-in data set: 10 rows with the fields the feeder reads."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict:
        return {"raw_prompt_ids": [1, 2, i], "data_source": "t", "reward_model": {"ground_truth": str(i)},
                "extra_info": {}, "index": i}


async def _uids(queue, k: int) -> list[str]:
    got = await queue.get(max_items=k, timeout=2.0)
    await queue.ack(got)
    return [str(it.data.non_tensor_batch["uid"][0]) for it in got]


async def test_a_restarted_feeder_feeds_the_prompts_not_fed_yet_in_order(tmp_path, broker):
    cfg = EmbeddedQueueConfig(address=broker.address, op_timeout_s=5.0, put_timeout_s=5.0)
    state = tmp_path / "feeder.json"
    put_q = make_queue(cfg, stream="prompts", group="controller", consumer="feeder")
    feeder = PromptFeeder(Rows(), put_q, n=2, seed=3, job="j", state_path=state)
    assert await feeder.put(room(limit=4, in_flight=0)) == 4
    assert json.loads(state.read_text())["state"]["fed"] == 4
    first = feeder.fed_uids()
    await put_q.close()
    # a new feeder (a resumed job) on the same state file continues after those 4
    put_q = make_queue(cfg, stream="prompts", group="controller", consumer="feeder-2")
    again = PromptFeeder(Rows(), put_q, n=2, seed=3, job="j", state_path=state)
    assert again.state.fed == 4
    assert room(limit=4, in_flight=4) == 0  # admission: 4 still in flight
    assert await again.put(room(limit=4, in_flight=0)) == 4
    assert again.fed_uids()[:4] == first
    assert fed_uids_of(state) == again.fed_uids()  # the controller's audit names them from the file alone
    order = PromptFeeder(Rows(), put_q, n=2, seed=3, job="j")._order
    assert again.fed_uids() == [f"j-e0-p{i}" for i in order[:8]]
    get_q = make_queue(cfg, stream="prompts", group="rollout", consumer="r")
    assert await _uids(get_q, 100) == again.fed_uids()  # each prompt once, in order
    await put_q.close()
    await get_q.close()


def test_a_feeder_state_of_other_data_is_refused(tmp_path):
    state = tmp_path / "feeder.json"
    state.write_text(json.dumps({"data": {"prompts": 3, "shuffle": True, "seed": 0, "job": "j"},
                                 "state": {"epoch": 0, "cursor": 1, "fed": 1}}))
    with pytest.raises(ValueError, match="belongs to other data"):
        PromptFeeder(Rows(), None, n=2, job="j", state_path=state)
