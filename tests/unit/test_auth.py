"""The job credential itself: creation, files, checking, never shown."""

from __future__ import annotations

import os
import stat

import pytest

from services import auth


def test_written_file_is_private_and_reads_back(tmp_path):
    cred = auth.JobCredential.generate()
    path = cred.write(tmp_path / "sub" / auth.FILE_NAME)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = auth.JobCredential.load(path)
    assert again.accepts(cred.metadata()) and cred.accepts(again.metadata())
    assert not auth.JobCredential.generate().accepts(cred.metadata())


def test_secret_is_never_shown(tmp_path):
    cred = auth.JobCredential.generate()
    secret = dict(cred.metadata())[auth.METADATA_KEY].removeprefix("Bearer ")
    assert secret not in repr(cred) and secret not in str(cred)
    (tmp_path / "short").write_text("abc")
    with pytest.raises(auth.CredentialError) as ei:
        auth.JobCredential.load(tmp_path / "short")
    assert "abc" not in str(ei.value) and "16" in str(ei.value)


def test_bad_files_are_refused_clearly(tmp_path):
    with pytest.raises(auth.CredentialError, match="does not exist"):
        auth.JobCredential.load(tmp_path / "missing")
    p = tmp_path / "open"
    p.write_text("x" * 32)
    p.chmod(0o666)
    with pytest.raises(auth.CredentialError, match="writable by every user"):
        auth.JobCredential.load(p)
    p.chmod(0o600)
    p.write_text("has a space inside it ok")
    with pytest.raises(auth.CredentialError, match="without spaces"):
        auth.JobCredential.load(p)


@pytest.mark.parametrize("metadata, ok", [
    ((), False),
    (None, False),
    ((("authorization", "Bearer "),), False),
    ((("x-other", "RIGHT"),), False),
    ((("authorization", "Basic RIGHT"),), False),
    ((("authorization", "Bearer RIGHT"),), True),
    ((("authorization", b"Bearer RIGHT"),), True),
    ((("authorization", "Bearer WRONG"), ("authorization", "Bearer RIGHT")), True),
    ((("authorization", "Bearer RIGHTX"),), False),
])
def test_accepts_only_the_exact_bearer_secret(metadata, ok):
    secret = "s3cret-" + "k" * 20
    cred = auth.JobCredential(secret)

    def sub(v):
        return v.replace("RIGHT", secret) if isinstance(v, str) else v.replace(b"RIGHT", secret.encode())

    md = None if metadata is None else tuple((k, sub(v)) for k, v in metadata)
    assert cred.accepts(md) is ok


def test_current_needs_a_credential(monkeypatch, tmp_path):
    monkeypatch.setattr(auth, "_installed", None)
    monkeypatch.delenv(auth.ENV, raising=False)
    with pytest.raises(auth.CredentialError, match="auth.credential_file|MESHRL_JOB_CREDENTIAL_FILE"):
        auth.current()
    path = auth.JobCredential.generate().write(tmp_path / "c")
    monkeypatch.setenv(auth.ENV, str(path))
    assert auth.current().source == str(path)
