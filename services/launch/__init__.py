"""Launchers: how a job's services get started.

    base.py    Launcher interface + JobHandle/JobState; make_launcher(kind)
    local.py   subprocesses on this machine (the default; what `meshrl run` uses)
    ray.py     Ray actors on a Ray cluster

The gateway and the CLI speak only to :class:`services.launch.base.Launcher`.
"""
