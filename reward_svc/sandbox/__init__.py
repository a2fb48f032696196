"""Sandboxed execution of user reward functions in a pool of worker processes.

:mod:`.worker` is the child process (the call loop around the user's function), :mod:`.pool`
the service side (deadlines, replacement of dead or stuck workers, result validation). The
isolation itself (pipes, limits, network namespace) is the shared :mod:`services.sandbox`.
"""
