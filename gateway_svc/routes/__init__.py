"""The gateway's REST routes, one ``APIRouter`` per resource (``app.py`` includes them all):

    deps.py        what routes share: the bearer-token check, the job manager, error shapes
    docs.py        Swagger UI and ReDoc, from the gateway's own /static files
    probes.py      /health, /ready and the gateway's /metrics
    dashboard.py   / and /dashboard
    jobs.py        /v1/jobs: submit, list, get, cancel / pause / resume
    fleets.py      /v1/fleets: start, list, get, stop (gateway_svc/fleets.py)
    job_output.py  what a job produces: /v1/jobs/{id}/metrics, /events, /logs

A route reaches the gateway's state through FastAPI dependencies on ``request.app.state``
(set by ``create_app``), so one module can serve several apps (tests make many).
"""
