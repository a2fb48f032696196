"""The OpenAI endpoint's request checks and the Serve application's arguments (no engine:
what is refused, and how it is said)."""

from __future__ import annotations

import pytest

from rollout_svc.openai_api import ChatRequest, CompletionRequest, OpenAIError, parse


def _refused(cls, body) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        parse(cls, body)
    return info.value


def test_requests_parse_like_openai_clients_send_them() -> None:
    req = parse(ChatRequest, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                              "temperature": 0, "seed": 1, "stop": "\n"})
    assert req.messages[0].content == "hi" and req.max_tokens == 4 and req.stop == "\n"
    assert parse(CompletionRequest, {"model": "m", "prompt": [1, 2, 3]}).prompt == [1, 2, 3]


@pytest.mark.parametrize(("cls", "body", "param", "text"), [
    (CompletionRequest, {"model": "m", "prompt": "x", "logit_bias": {"1": 2}}, "logit_bias",
     "logit_bias: is not supported by this endpoint"),
    (CompletionRequest, {"model": "m", "prompt": "x", "stream": True}, "stream", "stream=true is not supported"),
    (CompletionRequest, {"model": "m", "prompt": "x", "n": 0}, "n", "n: Input should be greater than or equal to 1"),
    (CompletionRequest, {"model": "m"}, "prompt", "prompt: Field required"),
    (ChatRequest, {"model": "m", "messages": []}, "messages", "messages: List should have at least 1 item"),
    (ChatRequest, {"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "messages.0.role"),
])  # fmt: skip
def test_bad_requests_are_refused_naming_the_field(cls, body, param, text) -> None:
    err = _refused(cls, body)
    assert err.status == 400 and err.param == param and text in err.message, err.message
    assert err.body()["error"]["type"] == "invalid_request_error"


def test_a_body_that_is_not_an_object_is_refused() -> None:
    assert "JSON object" in _refused(CompletionRequest, ["model"]).message


def test_the_serve_application_says_what_is_missing(tmp_path) -> None:
    pytest.importorskip("ray.serve")
    from rollout_svc.ray_serve import ServeSetupError, build

    with pytest.raises(ServeSetupError, match="give run_dir="):
        build({})
    with pytest.raises(ServeSetupError, match="unknown argument.*replicas"):
        build({"run_dir": str(tmp_path), "replicas": "2"})
    with pytest.raises(ServeSetupError, match="no rollout view there"):
        build({"run_dir": str(tmp_path)})
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "rollout-0.yaml").write_text("service: trainer\n")
    with pytest.raises(ServeSetupError, match="is not a rollout view"):
        build({"run_dir": str(tmp_path)})


def test_the_serve_application_is_built_from_a_run_dir(tmp_path) -> None:
    pytest.importorskip("ray.serve")
    from rollout_svc.ray_serve import ServeSetupError, build
    from services.config.views import RolloutView, write_view

    run = tmp_path / "job7"
    view = RolloutView.model_validate({"model": {"path": str(tmp_path / "model")},
                                       "rollout": {"prompt_length": 8, "response_length": 8}})
    write_view(view, run / "config" / "rollout-0.yaml")
    with pytest.raises(ServeSetupError, match="no job credential there"):
        build({"run_dir": str(run)})
    (run / "job.credential").write_text("x" * 32)
    with pytest.raises(ServeSetupError, match="min_replicas=3 / max_replicas=2"):
        build({"run_dir": str(run), "min_replicas": "3", "max_replicas": "2"})
    deployment = build({"run_dir": str(run), "min_replicas": "1", "max_replicas": "4"})._bound_deployment
    assert deployment.name == "policy"
    assert deployment._deployment_config.autoscaling_config.max_replicas == 4
    assert deployment.ray_actor_options["num_cpus"] == 1 and deployment.ray_actor_options["num_gpus"] == 0
    assert build({"run_dir": str(run), "num_replicas": "2"})._bound_deployment.num_replicas == 2


def test_an_api_key_file_must_hold_a_key(tmp_path) -> None:
    pytest.importorskip("ray.serve")
    from rollout_svc.ray_serve import ServeSetupError, build
    from services.config.views import RolloutView, write_view

    write_view(RolloutView.model_validate({"model": {"path": str(tmp_path / "model")},
                                           "rollout": {"prompt_length": 8, "response_length": 8}}),
               tmp_path / "config" / "rollout-0.yaml")
    (tmp_path / "job.credential").write_text("x" * 32)
    (tmp_path / "key").write_text("short\n")
    with pytest.raises(ServeSetupError, match="an API key is 16..1024 characters"):
        build({"run_dir": str(tmp_path), "api_key_file": str(tmp_path / "key")})
    (tmp_path / "key").write_text("a" * 20 + "\n")
    assert build({"run_dir": str(tmp_path), "api_key_file": str(tmp_path / "key")})._bound_deployment
