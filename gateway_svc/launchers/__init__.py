"""The gateway's job launchers: how ``meshrl gateway`` starts and controls whole jobs.

    base.py        the Launcher interface, JobState / JobStatus, LaunchError
    registry.py    kind -> implementation (``make_launcher``), each imported when first used
    local.py       a job is one ``meshrl run`` process group on the gateway's machine
    ray.py         a job's ``meshrl run`` under a detached actor on a Ray cluster
    deployment.py  a job handed to a deployment's own service containers (``meshrl worker``,
                   worker_svc/worker.py) through files on their shared storage

What runs inside a job (the controller, its supervision, the worker loop) is controller_svc/.
"""
