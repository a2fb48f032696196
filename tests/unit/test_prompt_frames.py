"""services/data/prompt_frames.py writes a prompt item's frame without torch: byte for byte
the frame ``services.wire`` encodes of ``prompt_item(...)``, and it decodes to the same item."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from services import wire
from services.data import prompt_frames
from services.data.prompt_frames import prompt_frame
from services.data.prompt_items import prompt_item

ROOT = Path(__file__).resolve().parents[2]

ROWS = [
    {"raw_prompt_ids": [1, 446, 263, 201, 19, 20, 21, 2], "data_source": "arith", "index": 0,
     "reward_model": {"style": "rule", "ground_truth": "7"}, "extra_info": {}},
    {"raw_prompt_ids": list(range(300)), "data_source": "reasoning_gym/chain_sum", "index": 1999,
     "reward_model": {"style": "rule", "ground_truth": json.dumps({"answer": 3, "meta": [1, 2]})},
     "extra_info": {"split": "train", "index": 12, "nested": {"a": [1, 2.5, None, True, "x"], "t": (1, "b", (2,))},
                    "big": 2**62, "neg": -(2**63), "f": float("inf"), "bytes": b"\x00\xff", 7: "int key", None: 1}},
    {"raw_prompt_ids": [], "data_source": "ünïcödé ∑ 你好 🙂", "index": 5,
     "reward_model": {"style": "model", "ground_truth": None}, "extra_info": None},
]


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("validate", [False, True])
def test_the_frame_is_the_wire_codecs_byte_for_byte(row, validate) -> None:
    uid = f"job-e3-p{row['index']}"
    want = bytes(wire.encode(prompt_item(row, uid=uid, n=16, epoch=3, validate=validate)))
    got = prompt_frame(row, uid=uid, n=16, epoch=3, validate=validate)
    assert got == want
    back = wire.decode(got)
    item = prompt_item(row, uid=uid, n=16, epoch=3, validate=validate)
    assert back.meta_info == item.meta_info and list(back.non_tensor_batch) == list(item.non_tensor_batch)
    for k, col in item.non_tensor_batch.items():
        assert back.non_tensor_batch[k].tolist() == col.tolist()


def test_what_is_not_plain_python_falls_back() -> None:
    base = dict(ROWS[0])
    for extra in ({"x": np.int64(3)}, {"x": np.array([1, 2])}, {"x": bytearray(b"a")}, {(1, 2): "tuple key"},
                  {"x": 2**64}, {"x": "\ud800"}):
        assert prompt_frame({**base, "extra_info": extra}, uid="u", n=1, epoch=0) is None
    assert prompt_frame(base, uid="u", n=np.int64(2), epoch=0) is None


def test_the_layout_constants_are_the_codecs() -> None:
    from services.wire import codec, plain

    assert (prompt_frames.MAGIC, prompt_frames.SCHEMA_VERSION, prompt_frames.ALIGN, prompt_frames.PREFIX.format) == \
        (codec.MAGIC, codec.SCHEMA_VERSION, codec.ALIGN, codec.PREFIX.format)
    assert (prompt_frames.EXT_TUPLE, prompt_frames.MAX_EXT_DEPTH, prompt_frames.MAX_INT_KEY) == \
        (plain.EXT_TUPLE, plain.MAX_EXT_DEPTH, plain.MAX_INT_KEY)


def test_no_torch_is_imported() -> None:
    code = ("import sys; from services.data.prompt_frames import prompt_frame; "
            "f = prompt_frame({'raw_prompt_ids': [1], 'data_source': 'd', 'index': 0, 'reward_model': {}}, "
            "uid='u', n=1, epoch=0); print(len(f), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "False"
