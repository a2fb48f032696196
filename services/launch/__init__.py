"""What runs inside one job: ``meshrl run``'s controller and what it runs the job with
(controller.py, mesh.py, supervision.py, ledger.py, job_status.py, broker_host.py,
ray_placement.py for ``services.launcher: ray``, ...), and ``meshrl worker`` (worker.py),
which runs one service of a deployment's jobs in its container, handed over through the
files of handoff.py.

The gateway's launchers, which start whole jobs, are services/gateway/launchers/.
"""
