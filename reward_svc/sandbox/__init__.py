"""Sandboxed execution of user reward functions in a pool of worker processes.

:mod:`.protocol` frames JSON messages on pipes, :mod:`.worker` is the child process
(limits, network namespace, the call loop), :mod:`.pool` is the parent side (deadlines,
replacement of dead or stuck workers, result validation).
"""
