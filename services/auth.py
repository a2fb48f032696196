"""The job credential: who may call a job's internal gRPC services.

Every internal gRPC server of a job -- the queue broker, the weight publisher, the rollout
replicas' ``RolloutService``, the reward workers' ``RewardService`` -- refuses a call that
does not carry the job's credential with ``UNAUTHENTICATED``, before the handler runs (a
refused call reads no request message and changes nothing). The credential is one random
secret per job:

* ``meshrl run`` creates it as ``<run_dir>/job.credential`` (mode 0600) and names that file in
  every service's resolved config (``auth.credential_file``) and in the environment
  (``MESHRL_JOB_CREDENTIAL_FILE``) of every child;
* compose and Kubernetes mount it from a secret and point ``MESHRL_JOB_CREDENTIAL_FILE`` at it.

Clients send it as ``authorization: Bearer <secret>`` call metadata; servers compare it in
constant time. It proves the caller was handed the job's secret; it does not encrypt the
traffic (see docs/security.md for what is not covered and how to fence it).

    cred = auth.current()                    # the process's credential (config, then environment)
    server = grpc.aio.server(interceptors=[cred.aio_server_interceptor()])
    channel = auth.aio_channel(address, cred)   # or: stub.Call(req, metadata=cred.metadata())
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger("meshrl.auth")

ENV = "MESHRL_JOB_CREDENTIAL_FILE"
"""Environment variable naming the file that holds the job's credential."""
FILE_NAME = "job.credential"
"""Name of the credential file ``meshrl run`` creates in the run directory."""
METADATA_KEY = "authorization"
_SCHEME = "Bearer "
MIN_LENGTH = 16
MAX_LENGTH = 1024


class CredentialError(RuntimeError):
    """The job credential is missing, unreadable or malformed (the message says which and what to do)."""


class JobCredential:
    """One job's shared secret. ``repr`` never shows it."""

    __slots__ = ("_secret", "_header", "source")

    def __init__(self, secret: str, source: str = "<memory>") -> None:
        secret = secret.strip()
        if not MIN_LENGTH <= len(secret) <= MAX_LENGTH:
            raise CredentialError(f"{source}: a job credential is {MIN_LENGTH}..{MAX_LENGTH} characters, "
                                  f"got {len(secret)} (create one with `meshrl credential PATH`)")
        if not secret.isascii() or not secret.isprintable() or any(c.isspace() for c in secret):
            raise CredentialError(f"{source}: a job credential is printable ASCII without spaces "
                                  "(create one with `meshrl credential PATH`)")
        self._secret = secret
        self._header = (_SCHEME + secret).encode()
        self.source = source

    def __repr__(self) -> str:
        return f"JobCredential(source={self.source!r})"

    # -- creating and reading ---------------------------------------------------------------------
    @classmethod
    def generate(cls) -> "JobCredential":
        """A fresh random credential (256 bits)."""
        return cls(secrets.token_urlsafe(32), "<generated>")

    def write(self, path: str | Path) -> Path:
        """Write the secret to ``path`` readable by this user only (0600); replaces an old file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self._secret + "\n")
        os.replace(tmp, path)
        self.source = str(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "JobCredential":
        """Read a credential file (its whole content, surrounding whitespace stripped)."""
        path = Path(path)
        try:
            st = path.stat()
            text = path.read_text()
        except FileNotFoundError:
            raise CredentialError(f"job credential file {path} does not exist "
                                  f"(meshrl run creates one; for a service on its own, point {ENV} at "
                                  "the job's secret)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialError(f"cannot read the job credential file {path}: {exc.__class__.__name__}") from None
        if st.st_mode & stat.S_IWOTH:
            raise CredentialError(f"job credential file {path} is writable by every user (chmod 0600 it)")
        if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
            log.warning("job credential file %s is readable by other users; 0600 (0400) keeps it private", path)
        return cls(text, str(path))

    # -- checking (servers) -----------------------------------------------------------------------
    def accepts(self, metadata: Iterable[Any] | None) -> bool:
        """True if ``metadata`` (gRPC invocation metadata) carries this credential.

        Every ``authorization`` entry is compared in constant time; the answer depends only on
        whether one of them matches, never on where a wrong one differs."""
        ok = False
        for item in metadata or ():
            key, value = (item.key, item.value) if hasattr(item, "key") else item
            if key != METADATA_KEY:
                continue
            if isinstance(value, str):
                value = value.encode("utf-8", "replace")
            ok |= hmac.compare_digest(value, self._header)
        return ok

    def server_interceptor(self) -> grpc.ServerInterceptor:
        """Interceptor for a threaded ``grpc.server(interceptors=[...])``."""
        return _SyncInterceptor(self)

    def aio_server_interceptor(self) -> "grpc.aio.ServerInterceptor":
        """Interceptor for ``grpc.aio.server(interceptors=[...])``."""
        return _AioInterceptor(self)

    # -- presenting (clients) ---------------------------------------------------------------------
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the credential: ``stub.Call(req, metadata=cred.metadata())``."""
        return ((METADATA_KEY, _SCHEME + self._secret),)


# ------------------------------------------------------------------------------------------------
# Which credential a process uses

_installed: JobCredential | None = None
_cache: dict[str, JobCredential] = {}


def install(credential_file: str | Path | None) -> JobCredential:
    """Make ``credential_file`` this process's credential (and its children's, through
    ``MESHRL_JOB_CREDENTIAL_FILE``); ``None`` keeps what the environment names. Called once
    by each service's entry point with its config's ``auth.credential_file``."""
    global _installed
    if credential_file is not None:
        path = str(Path(credential_file).resolve())
        cred = JobCredential.load(path)
        os.environ[ENV] = path
        _installed = cred
        return cred
    return current()


def provision(path: str | Path) -> JobCredential:
    """A new credential written to ``path`` (0600) and installed for this process and its
    children -- for a process that is a whole job by itself (benchmarks, test sessions)."""
    cred = JobCredential.generate()
    cred.write(path)
    return install(path)


def provision_temporary() -> JobCredential:
    """:func:`provision` into a private temporary directory removed when the process exits.

    A process started by one that provisioned (a benchmark's receiver or client running the
    same ``__main__``) finds its parent's credential in ``MESHRL_JOB_CREDENTIAL_FILE`` and
    installs that instead: a new one would be refused by the parent's servers.
    """
    inherited = os.environ.get(ENV)
    if inherited and Path(inherited).is_file():
        return install(inherited)
    import atexit
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="meshrl-credential-")
    atexit.register(shutil.rmtree, tmp, True)
    return provision(Path(tmp) / FILE_NAME)


def current() -> JobCredential:
    """The credential of this process: the installed one, else the file ``MESHRL_JOB_CREDENTIAL_FILE`` names."""
    if _installed is not None:
        return _installed
    path = os.environ.get(ENV)
    if not path:
        raise CredentialError("no job credential: every internal gRPC service and its clients need the job's "
                              f"secret. Set auth.credential_file in the job spec or {ENV} "
                              "(meshrl run creates one per job; `meshrl credential PATH` writes a new one)")
    cred = _cache.get(path)
    if cred is None:
        cred = _cache[path] = JobCredential.load(path)
    return cred


def resolve(credential: JobCredential | None) -> JobCredential:
    """``credential`` if given, else :func:`current`."""
    return credential if credential is not None else current()


# ------------------------------------------------------------------------------------------------
# Channels that present the credential on every call


def channel(address: str, credential: JobCredential, options: Sequence[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A (threaded) insecure channel whose every call carries ``credential``."""
    return grpc.intercept_channel(grpc.insecure_channel(address, options=options), _SyncClientAuth(credential))


def aio_channel(address: str, credential: JobCredential,
                options: Sequence[tuple[str, Any]] | None = None) -> "grpc.aio.Channel":
    """A ``grpc.aio`` insecure channel whose every call carries ``credential``."""
    return grpc.aio.insecure_channel(address, options=options, interceptors=_aio_client_interceptors(credential))


# ------------------------------------------------------------------------------------------------
# Server side

_DENIED = "this service requires the job's credential (authorization metadata); the call was refused"


def _refusing(handler: grpc.RpcMethodHandler, abort: Callable) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that refuses every call without reading its request."""
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


def _abort_sync(_request: Any, context: grpc.ServicerContext) -> None:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)


async def _abort_aio(_request: Any, context: "grpc.aio.ServicerContext") -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)


class _SyncInterceptor(grpc.ServerInterceptor):
    def __init__(self, cred: JobCredential) -> None:
        self._cred = cred

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201 - gRPC API
        handler = continuation(handler_call_details)
        if handler is None or self._cred.accepts(handler_call_details.invocation_metadata):
            return handler
        return _refusing(handler, _abort_sync)


class _AioInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, cred: JobCredential) -> None:
        self._cred = cred

    async def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201 - gRPC API
        handler = await continuation(handler_call_details)
        if handler is None or self._cred.accepts(handler_call_details.invocation_metadata):
            return handler
        return _refusing(handler, _abort_aio)


# ------------------------------------------------------------------------------------------------
# Client side


def _with_credential(metadata: Any, cred: JobCredential) -> list[tuple[str, Any]]:
    kept = [tuple(m) for m in (metadata or ()) if tuple(m)[0] != METADATA_KEY]
    return kept + list(cred.metadata())


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: list) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class _SyncClientAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                      grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, cred: JobCredential) -> None:
        self._cred = cred

    def _details(self, d: grpc.ClientCallDetails) -> _CallDetails:
        return _CallDetails(d, _with_credential(d.metadata, self._cred))

    def intercept_unary_unary(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # noqa: ANN001, ANN201
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # noqa: ANN001, ANN201
        return continuation(self._details(client_call_details), request_iterator)


def _aio_client_interceptors(cred: JobCredential) -> list:
    def details(d: "grpc.aio.ClientCallDetails") -> "grpc.aio.ClientCallDetails":
        return grpc.aio.ClientCallDetails(d.method, d.timeout, _with_credential(d.metadata, cred),
                                          d.credentials, d.wait_for_ready)

    class UU(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
            return await continuation(details(client_call_details), request)

    class US(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
            return await continuation(details(client_call_details), request)

    class SU(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # noqa: ANN001, ANN201
            return await continuation(details(client_call_details), request_iterator)

    class SS(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # noqa: ANN001, ANN201
            return await continuation(details(client_call_details), request_iterator)

    return [UU(), US(), SU(), SS()]
