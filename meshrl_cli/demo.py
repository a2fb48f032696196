"""``meshrl demo``: build a rollout-shaped DataProto, send it through the wire format,
and show that what comes back is identical."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=8, help="sequences in the batch")
    p.add_argument("--seq-len", type=int, default=32, help="prompt + response length")


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from services import wire
    from services.protocol import DataProto

    b, t = args.batch, args.seq_len
    data = DataProto.from_dict(
        tensors={
            "input_ids": torch.randint(0, 1000, (b, t)),
            "attention_mask": torch.ones(b, t, dtype=torch.int64),
            "rollout_log_probs": torch.randn(b, t // 2),
            "policy_version": torch.zeros(b, dtype=torch.int64),
        },
        non_tensors={
            "uid": np.array([f"prompt-{i // 4}" for i in range(b)], dtype=object),
            "sample_id": np.array([f"s{i}" for i in range(b)], dtype=object),
            "data_source": np.array(["arith"] * b, dtype=object),
        },
        meta_info={"eos_token_id": 2, "temperature": 1.0},
    )
    frame = wire.encode(data)
    back = wire.decode(frame)
    same = all(torch.equal(data.batch[k], back.batch[k]) for k in data.batch.keys()) and all(
        (data.non_tensor_batch[k] == back.non_tensor_batch[k]).all() for k in data.non_tensor_batch
    )
    print(data)
    print(f"frame: {len(frame)} bytes; round trip identical: {same}")
    return 0 if same else 1
