"""The prompt feeder service: the job's training prompts onto the ``prompts`` stream, with
admission control.

    python -m feeder_svc --config feeder.yaml [--state FILE] [--poll S] [a.b=c ...]   # or: meshrl-feeder

One process per job, the same under ``meshrl run`` (a child of the controller, like the
trainer and the replicas), docker-compose and Kubernetes. Its config is its view
(:class:`services.config.views.FeederView`).

    feeder.py     PromptFeeder: the data's order, the position file, putting prompts
    admission.py  the admission rule: how many prompts may be in flight, sync pacing
    loop.py       FeedLoop: the one feeding loop (trainer counters -> rule -> put)
    metrics.py    meshrl_feeder_* and the streams' depths
    server.py     the process: view, /health /ready /metrics /status, readiness line, signals
"""
