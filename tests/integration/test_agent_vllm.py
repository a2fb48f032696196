"""Agentic rollouts on a real vLLM engine (the tiny model) with real sandboxed tools.

The random tiny model cannot write tool calls, so the tests use pluggable parsers from
``tests/agent_tools.py`` that read every model turn as a call to a given tool: the rest --
generation per turn, the sandbox, the chat template, packing -- is the real path.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import torch

from tests.fixtures.engine_loop import EngineLoop

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT_LEN, RESPONSE_LEN, TURN = 24, 320, 8
DEADLINE_S = 180.0


def _cfg(parser: str, tools: list[dict], **mt):
    from services.config.rollout import RolloutConfig

    mt = {"enable": True, "format": parser, "tools": tools, "max_tokens_per_turn": TURN, **mt}
    return RolloutConfig(prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN, n=2, temperature=1.0, seed=7,
                         max_num_seqs=64, multi_turn=mt)


def _tool(cls: str, **kw) -> dict:
    return {"class_name": f"tests.agent_tools.{cls}", "num_workers": 1, "timeout_s": 5.0, **kw}


@pytest.fixture(scope="module")
def rig(tiny_model: str):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from rollout_svc.agent.loop import AgentLoop
    from rollout_svc.engine import RolloutEngine
    from rollout_svc.replica import Replica

    cfg = _cfg("tests.agent_tools.CallOnce", [_tool("Echo")], max_assistant_turns=2)
    engine = RolloutEngine(cfg, tiny_model)
    el = EngineLoop(DEADLINE_S)
    el.run(engine.start(), timeout=600)
    agent = el.run(AgentLoop(engine, cfg).start())
    replica = Replica(engine, cfg, name="agent-replica", agent=agent)
    try:
        yield el, engine, replica, agent
    finally:
        el.run(agent.close())
        el.close()
        engine.shutdown()


def _tok(tiny_model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _prompt(tiny_model: str, text: str = "12+7=") -> list[int]:
    return _tok(tiny_model).apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                add_generation_prompt=True, return_dict=False)


def _item(prompt: list[int], uid: str, extra: dict | None = None):
    from services.protocol import DataProto

    ids = np.empty(1, dtype=object)
    ids[0] = prompt
    ex = np.empty(1, dtype=object)
    ex[0] = extra or {}
    return DataProto.from_dict(
        non_tensors={"raw_prompt_ids": ids, "uid": np.array([uid], dtype=object),
                     "sample_id": np.array([uid], dtype=object),
                     "data_source": np.array(["meshrl/arith"], dtype=object),
                     "reward_model": np.array([{"style": "rule", "ground_truth": "19"}], dtype=object),
                     "extra_info": ex},
        meta_info={"validate": False, "epoch": 0, "n": 2},  # the rig's rollout.n, as the feeder writes it
    )


def _obs_text(closed: bool, content: str) -> str:
    return ("" if closed else "<|im_end|>") + f"\n<|im_start|>tool\n{content}<|im_end|>\n<|im_start|>assistant\n"


def test_two_turn_trajectory_token_by_token(rig, tiny_model: str) -> None:
    from transformers import AutoModelForCausalLM

    from reward_svc.decode import final_turn_spans, response_lengths
    from services import wire

    el, engine, replica, agent = rig
    prompt = _prompt(tiny_model)
    tok = _tok(tiny_model)
    [out] = el.run(replica.generate_item(_item(prompt, "two", {"tools_kwargs": {"echo": {"create_kwargs": {"start": 4}}}})))
    out = wire.decode(wire.encode(out))  # what the reward service and the trainer receive
    b, nt = out.batch, out.non_tensor_batch
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    eos = set(engine.eos_token_ids)
    for i in range(2):
        assert nt["error"][i] == "" and nt["assistant_turns"][i] == 2 and nt["num_turns"][i] == 4
        assert nt["tool_calls"][i] == 1 and nt["tool_errors"][i] == 0
        assert list(nt["turn_policy_versions"][i]) == [0, 0] and int(b["policy_version"][i]) == 0
        assert nt["finish_reason"][i] == "max_turns"
        assert nt["extra_info"][i]["env_reward"] == 2.5 and nt["extra_info"][i]["tool_rewards"] == {"echo": 2.5}
        mask = b["response_mask"][i].tolist()
        n_resp = int(b["attention_mask"][i, PROMPT_LEN:].sum())
        resp = b["responses"][i, :n_resp].tolist()
        # layout: model turn 1 (1s), observation (0s), model turn 2 (1s), then padding (0s)
        t1 = mask.index(0)
        obs_end = t1 + mask[t1:].index(1)
        t2_end = obs_end + (mask[obs_end:].index(0) if 0 in mask[obs_end:] else RESPONSE_LEN - obs_end)
        assert t2_end == n_resp and all(m == 0 for m in mask[n_resp:])
        # reward.solution_str=final_turn decodes exactly model turn 2 of the received group
        start, end = final_turn_spans(b, response_lengths(b))
        assert (int(start[i]), int(end[i])) == (obs_end, t2_end)
        assert 1 <= t1 <= TURN and 1 <= t2_end - obs_end <= TURN
        # the observation is exactly the chat template's rendering of the tool message
        closed = resp[t1 - 1] in eos
        assert tok.decode(resp[t1:obs_end]) == _obs_text(closed, "echo:5")  # create_kwargs start=4 -> 5
        assert resp[t1:obs_end] == tok.encode(_obs_text(closed, "echo:5"), add_special_tokens=False)
        # log-probs: vLLM's on model tokens equal a fresh forward pass; -1 on observation and pad
        lp = b["rollout_log_probs"][i]
        full = prompt + resp
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([full])).logits[0].float()
        ref = torch.log_softmax(logits, dim=-1)
        p = len(prompt)
        for j in range(RESPONSE_LEN):
            if j < n_resp and mask[j] == 1:
                expect = float(ref[p + j - 1, resp[j]])
                assert abs(float(lp[j]) - expect) < 2e-3, (i, j, float(lp[j]), expect)
            else:
                assert float(lp[j]) == -1.0
        # the full sequence is what the trainer will see
        assert b["input_ids"][i, PROMPT_LEN - p:PROMPT_LEN + n_resp].tolist() == full
        assert int(b["attention_mask"][i].sum()) == p + n_resp


def test_failing_tools_give_error_observations_and_the_trajectory_goes_on(rig, tiny_model: str) -> None:
    from rollout_svc.agent.loop import AgentLoop

    el, engine, _, _ = rig
    cfg = _cfg("tests.agent_tools.CallAllFailing",
               [_tool("Raises"), _tool("Hangs", timeout_s=1.0), _tool("Huge", max_result_bytes=65536)],
               max_assistant_turns=2, max_parallel_calls=4, max_tool_response_length=400)
    agent = el.run(AgentLoop(engine, cfg).start())
    try:
        tok = _tok(tiny_model)
        trajs = el.run(agent.run_group(_prompt(tiny_model), cfg.sampling_for(False), ["fail/0", "fail/1"]))
    finally:
        el.run(agent.close())
    for t in trajs:
        assert t.error == "" and t.assistant_turns == 2 and t.user_turns == 1
        assert t.tool_calls == 4 and t.tool_errors == 4  # raises, hangs, huge, unknown tool
        obs = tok.decode([x for x, m in zip(t.response_ids, t.response_mask) if m == 0])
        assert "error: RuntimeError: boom from the tool" in obs
        assert "error: tool call (execute) exceeded its 1s deadline" in obs
        assert "error: tool reply is larger than 65536 bytes" in obs
        assert "error: unknown tool 'nope' (available: hangs, huge, raises)" in obs
    assert agent.tools["hangs"].restarts >= 1 and agent.tools["huge"].restarts >= 1


def test_trajectories_run_without_a_barrier_and_one_spans_a_weight_update(rig, tiny_model: str, tmp_path,
                                                                          monkeypatch) -> None:
    from safetensors.torch import load_file

    from rollout_svc.agent.loop import AgentLoop
    from services.sandbox.confine import INPUTS_ENV

    el, engine, replica, echo_agent = rig
    # the tool's sandbox sees the flag's directory (bound read-only, as a job's inputs are): it
    # must see the flag appear, not wait out its deadline (the observation would then be an error)
    flag_dir = tmp_path / "flag"
    flag_dir.mkdir(mode=0o755)
    flag_dir.chmod(0o755)  # readable by the sandbox's unprivileged user
    monkeypatch.setenv(INPUTS_ENV, str(flag_dir))
    flag = flag_dir / "go"
    cfg = _cfg("tests.agent_tools.CallWait", [_tool("WaitsForFile", timeout_s=120.0, config={"path": str(flag)})],
               max_assistant_turns=2)
    agent = el.run(AgentLoop(engine, cfg).start())
    try:
        v0 = engine.version
        waiting = asyncio.run_coroutine_threadsafe(
            agent.run_group(_prompt(tiny_model), cfg.sampling_for(False), ["span/0"]), el.loop)

        def calls() -> float:
            return agent.metrics.tool_calls.labels("wait")._value.get()

        async def until_waiting():
            while calls() < 1:
                await asyncio.sleep(0.05)

        el.run(until_waiting(), timeout=120)
        # no barrier: another group runs to completion while the first waits on its tool
        [other] = el.run(replica.generate_item(_item(_prompt(tiny_model, "3+4="), "other")))
        assert list(other.non_tensor_batch["assistant_turns"]) == [2, 2] and not waiting.done()
        el.run(replica.apply_weights(v0 + 1, load_file(f"{tiny_model}/model.safetensors").items()))
        flag.write_text("go")
        [t] = waiting.result(timeout=DEADLINE_S)
    finally:
        el.run(agent.close())
    assert t.error == "" and t.turn_versions == [v0, v0 + 1] and t.policy_version == v0
    assert t.tool_calls == 1 and t.tool_errors == 0, (t.tool_calls, t.tool_errors)  # the tool saw the flag
