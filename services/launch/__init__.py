"""What runs inside one job: ``meshrl run``'s controller and the pieces it supervises with
(controller.py, supervision.py, ledger.py, procs.py, ray_services.py for
``services.launcher: ray``, ...), and ``meshrl worker`` (worker.py), which runs one service
of a deployment's jobs in its container, handed over through the files of handoff.py.

The gateway's launchers, which start whole jobs, are services/gateway/launchers/.
"""
