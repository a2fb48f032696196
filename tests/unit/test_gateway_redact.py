"""Secrets by key pattern (issue 40, docs/security.md "Secrets"): every key that names a
password, token, secret, key, authorization or credential is masked, at any depth, in spec
values, overrides and free text; keys that only name a path, a file, an env var, a count or
a column are not."""

from __future__ import annotations

import pytest

from gateway_svc.redact import REDACTED, is_secret_key, redact_overrides, redact_spec, redact_text, restore

SECRET_KEYS = ["password", "openai_api_key", "hf_token", "aws_secret_access_key",
               "Authorization", "db_credential", "my_token", "API_KEY", "passwd", "key", "private_key"]
NOT_SECRET_KEYS = ["tokenizer_path", "password_env", "max_tokens_per_turn", "prompt_key", "reward_fn_key", "tls_key_file",
                   "response_length", "max_prompt_length"]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_keys(key):
    assert is_secret_key(key)
    spec = {"reward": {"kwargs": {key: "S3CRET-VALUE", "other": [{key: "S3CRET-2"}]}}}
    shown, found = redact_spec(spec)
    assert "S3CRET" not in repr(shown), shown
    assert shown["reward"]["kwargs"][key] == REDACTED and shown["reward"]["kwargs"]["other"][0][key] == REDACTED
    assert restore(shown, found) == spec  # the job itself gets the real values back
    assert "S3CRET" not in "".join(redact_overrides([f"reward.kwargs.{key}=S3CRET-VALUE"]))
    assert "S3CRET" not in redact_text(f"loaded {key}=S3CRET-VALUE from the env")


@pytest.mark.parametrize("key", NOT_SECRET_KEYS)
def test_keys_that_name_no_secret(key):
    assert not is_secret_key(key)
    assert redact_spec({"a": {key: "/models/tok"}}) == ({"a": {key: "/models/tok"}}, {})


def test_secrets_in_free_text_and_yaml_overrides():
    assert redact_text("redis://:hunter2@localhost:6379/0") == "redis://:***@localhost:6379/0"
    assert "abcdef123" not in redact_text("header Authorization: Bearer abcdef123")
    assert "abcdef123" not in redact_text("Bearer abcdef123")
    assert redact_text("max_tokens_per_turn=512 tokenizer_path=/x") == "max_tokens_per_turn=512 tokenizer_path=/x"
    shown = redact_overrides(["reward.kwargs.extra={api_key: LEAK6, n: 3}", "rollout.n=4"])
    assert "LEAK6" not in shown[0] and "n: 3" in shown[0] and shown[1] == "rollout.n=4"
