"""``meshrl worker``: a deployment's service container (compose, Kubernetes). It waits for
the jobs the gateway's deployment launcher hands out through the files of
:mod:`services.handoff` and runs its one service for each (worker.py)."""
