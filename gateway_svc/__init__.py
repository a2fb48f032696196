"""The control plane's gateway: submit, list, control and watch jobs.

    store.py        job store (SQLite / PostgreSQL, ordered migrations)
    spec_validation.py  validation of submitted specs (services.config.job.parse_job)
    jobs.py         JobManager: the logic both front ends share
    launchers/      how it starts whole jobs: local, ray, deployment (a registry by kind)
    app.py          REST API (FastAPI): the app, its access log, the routers of routes/
    routes/         the REST routes by resource (jobs, job output, probes, dashboard, docs)
    models.py       REST bodies (the OpenAPI schema)
    grpc_server.py  gRPC JobService (proto/job.proto)
    dashboard.py    the built-in dashboard page (HTML + JS)
    server.py       Gateway: runs REST and gRPC together (`meshrl gateway`)
"""
