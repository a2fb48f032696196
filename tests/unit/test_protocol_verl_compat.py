"""verl-style user code runs against services.protocol with only its import lines changed.

``VERL_USER_CODE`` is written exactly as code importing verl would be (keyword arguments by
name, verl's helper functions, DataProtoConfig, auto-padding dispatch, metric merging). The
test rewrites *only* the ``verl`` import lines and executes it.
"""

from __future__ import annotations

import textwrap

VERL_USER_CODE = textwrap.dedent(
    '''
    import numpy as np
    import torch

    from verl import DataProto
    from verl.protocol import DataProtoConfig, pad_dataproto_to_divisor, unpad_dataproto, union_tensor_dict


    def grpo_step(n_prompts=3, n_samples=4, prompt_len=5, resp_len=6, n_workers=2, n_rollout_workers=5):
        # --- the dataloader hands over a dict batch (tensors + numpy object columns)
        batch_dict = {
            "input_ids": torch.randint(3, 50, (n_prompts, prompt_len)),
            "attention_mask": torch.ones(n_prompts, prompt_len, dtype=torch.int64),
            "position_ids": torch.arange(prompt_len).expand(n_prompts, -1).clone(),
            "data_source": np.array(["gsm8k"] * n_prompts, dtype=object),
            "reward_model": np.array([{"ground_truth": str(i)} for i in range(n_prompts)], dtype=object),
            "raw_prompt_ids": np.array([list(range(prompt_len))] * n_prompts + [None], dtype=object)[:-1],
        }
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array([f"uid-{i}" for i in range(len(batch))], dtype=object)

        gen_batch = batch.pop(
            batch_keys=["input_ids", "attention_mask", "position_ids"],
            non_tensor_batch_keys=["raw_prompt_ids"],
        )
        gen_batch.meta_info = {"eos_token_id": 2, "do_sample": True, "global_steps": 1}
        gen_batch = gen_batch.repeat(repeat_times=n_samples, interleave=True)

        # --- rollout workers (dispatch with auto padding, like DP_COMPUTE_PROTO)
        DataProtoConfig.auto_padding = True
        try:
            padded, pad_size = pad_dataproto_to_divisor(gen_batch, n_rollout_workers)
            assert pad_size == 3 and len(padded) == 15
            outputs = []
            for rank, shard in enumerate(padded.chunk(chunks=n_rollout_workers)):
                bsz = len(shard)
                responses = torch.randint(3, 50, (bsz, resp_len))
                out = DataProto.from_dict(
                    tensors={
                        "prompts": shard.batch["input_ids"],
                        "responses": responses,
                        "response_mask": torch.ones(bsz, resp_len, dtype=torch.int64),
                        "rollout_log_probs": -torch.rand(bsz, resp_len),
                    },
                    meta_info={"metrics": {"gen/rank": rank}, "timing": 1.0},
                )
                outputs.append(out)
            gen_out = unpad_dataproto(DataProto.concat(outputs), pad_size=pad_size)
        finally:
            DataProtoConfig.auto_padding = False
        assert gen_out.meta_info["metrics"] == {"gen/rank": [0, 1, 2, 3, 4]}
        gen_out.meta_info.pop("metrics")

        batch = batch.repeat(repeat_times=n_samples, interleave=True)
        batch = batch.union(gen_out)

        # --- reward: last-token score; GRPO advantage grouped by uid
        scores = torch.tensor([float(len(s)) % 3 for s in batch.non_tensor_batch["uid"]]) + torch.rand(len(batch))
        token_level_scores = torch.zeros_like(batch.batch["responses"], dtype=torch.float32)
        token_level_scores[:, -1] = scores
        batch.batch["token_level_scores"] = token_level_scores
        batch.batch["token_level_rewards"] = token_level_scores
        uids = batch.non_tensor_batch["uid"]
        adv = torch.zeros(len(batch))
        for uid in np.unique(uids):
            idx = torch.from_numpy(np.where(uids == uid)[0])
            group = scores[idx]
            adv[idx] = (group - group.mean()) / (group.std() + 1e-6)
        batch.batch["advantages"] = adv.unsqueeze(-1) * batch.batch["response_mask"]
        batch.batch["returns"] = batch.batch["advantages"].clone()

        # --- actor update: select, iterate mini-batches, merge metrics
        batch.meta_info["temperature"] = 1.0
        data = batch.select(
            batch_keys=["responses", "response_mask", "rollout_log_probs", "advantages"],
            non_tensor_batch_keys=["uid"],
            meta_info_keys=["temperature"],
        )
        worker_results = []
        for worker, shard in enumerate(data.chunk(chunks=n_workers)):
            losses = []
            for mini in shard.make_iterator(mini_batch_size=2, epochs=1, seed=0, dataloader_kwargs={"shuffle": True}):
                assert mini.meta_info["temperature"] == 1.0
                losses.append(float((mini.batch["advantages"] * mini.batch["rollout_log_probs"]).mean()))
            worker_results.append(DataProto(meta_info={"metrics": {"actor/pg_loss": losses, "worker": worker}}))
        metrics = DataProto.concat(worker_results).meta_info["metrics"]

        # --- misc verl API used around the trainer
        item = batch[0]
        sub = batch[np.array([0, 1])]
        mask = batch[batch.batch["token_level_scores"][:, -1] > 1.0]
        union_tensor_dict(sub.batch.clone(), sub.batch.clone())
        batch.rename(old_keys="returns", new_keys="value_targets")
        batch.reorder(torch.arange(len(batch)).flip(0))
        return {
            "len": len(batch),
            "keys": sorted(batch.batch.keys()),
            "uid_groups": [list(batch.non_tensor_batch["uid"][i * n_samples:(i + 1) * n_samples]) for i in range(n_prompts)],
            "metrics": metrics,
            "item_uid": item.non_tensor_batch["uid"],
            "sub_len": len(sub),
            "mask_len": len(mask),
            "expected_mask_len": int((batch.batch["token_level_scores"][:, -1] > 1.0).sum()),
            "group_adv_sums": [float(adv[i * n_samples:(i + 1) * n_samples].sum()) for i in range(n_prompts)],
            "data_source": batch.non_tensor_batch["data_source"].tolist(),
            "rollout_log_probs_dtype": str(batch.batch["rollout_log_probs"].dtype),
        }
    '''
)


def _switch_imports(source: str) -> str:
    """The only change: ``verl`` imports point at ``services.protocol``."""
    out = source.replace("from verl.protocol import", "from services.protocol import")
    out = out.replace("from verl import DataProto", "from services.protocol import DataProto")
    changed = [(a, b) for a, b in zip(source.splitlines(), out.splitlines()) if a != b]
    assert len(changed) == 2 and all(a.startswith("from verl") for a, _ in changed)
    return out


def test_verl_style_grpo_code_runs_with_only_the_import_changed():
    namespace: dict = {}
    exec(compile(_switch_imports(VERL_USER_CODE), "verl_user_code.py", "exec"), namespace)
    result = namespace["grpo_step"]()
    assert result["len"] == 12
    assert result["keys"] == sorted(
        ["advantages", "value_targets", "prompts", "responses", "response_mask", "rollout_log_probs",
         "token_level_scores", "token_level_rewards"]
    )
    # after the final reorder (reverse), groups of 4 interleaved samples are still contiguous
    assert result["uid_groups"] == [["uid-2"] * 4, ["uid-1"] * 4, ["uid-0"] * 4]
    assert result["item_uid"] == "uid-0"
    assert result["sub_len"] == 2 and result["mask_len"] == result["expected_mask_len"]
    assert result["metrics"]["worker"] == [0, 1]
    assert [len(x) for x in result["metrics"]["actor/pg_loss"]] == [3, 3]
    assert all(abs(s) < 1e-4 for s in result["group_adv_sums"])  # GRPO advantages are zero-mean per group
    assert result["data_source"] == ["gsm8k"] * 12
    assert result["rollout_log_probs_dtype"] == "torch.float32"


def test_unchanged_verl_code_does_not_import_here():
    """The un-rewritten code really targets verl (not installed), so the rewrite is what runs it."""
    import importlib.util

    assert importlib.util.find_spec("verl") is None
