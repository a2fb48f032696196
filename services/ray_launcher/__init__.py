"""``services.launcher: ray``: each service instance of a job in its own Ray actor. Three
processes' code, one module each:

    placement.py  the controller's side (the Ray driver): the job's placement group, one
                  RayServiceProcess handle per service instance, what each instance asks for
    actor.py      what runs inside each Ray actor, on its node: ServiceActor starts the
                  service process and its guard
    guard.py      ``python -m services.ray_launcher.guard PGID WORKER_PID``: kills a service's
                  process group once its actor's worker is gone

Nothing is imported here: the guard process loads only what it needs. docs/ray.md has the design.
"""
