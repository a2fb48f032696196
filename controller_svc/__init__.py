"""The job controller: the process ``meshrl run`` (``python -m controller_svc``) runs for one
job. It resolves the spec into each service's view, hosts the embedded queue broker,
starts and supervises the job's services (local child processes, or Ray actors with
``services.launcher: ray``), keeps the ledger and the job's status, runs validation and
the loggers, and leaves the report.

    main.py          the command line (``meshrl run`` dispatches here)
    controller.py    JobController: one job from start to report
    mesh.py          the job's services as a set of supervised processes
    broker_host.py   the embedded queue broker on a thread of its own
    job_status.py    status.json and the job's metrics
    validation.py    step-0 and periodic validation through the running replicas
    run_tracking.py  the loggers of ``trainer.logger`` (tracking/)
    report.py        summary.json and plots

The Ray launcher (a service instance per Ray actor) is shared with the fleet's process, in
the core: services/ray_launcher/. The gateway's launchers, which start whole jobs, are in
gateway_svc/launchers/; the
policy every launcher applies (services.supervision), the ledger (services.ledger) and
the hand-off files of a deployment (services.handoff) are shared, in the core.
"""
