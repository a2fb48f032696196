"""The control plane's gateway: submit, list, control and watch jobs.

    store.py        job store (SQLite / PostgreSQL, ordered migrations)
    spec_validation.py  validation of submitted specs (services.config.job.parse_job)
    jobs.py         JobManager: the logic both front ends share
    app.py          REST API (FastAPI) + /metrics + the dashboard page
    models.py       REST bodies (the OpenAPI schema)
    grpc_server.py  gRPC JobService (proto/job.proto)
    dashboard.py    the built-in dashboard page (HTML + JS)
    server.py       Gateway: runs REST and gRPC together (`meshrl gateway`)
"""
