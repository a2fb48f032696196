"""Running untrusted code in isolated worker processes (user reward functions, tools).

:mod:`.protocol` frames JSON messages on pipes (never pickle), :mod:`.process` is the
parent's side of one worker process (start it with a scrubbed environment in its own
process group, wait for it to be ready, kill it), :mod:`.child` is the worker's side
(private protocol pipes, memory limit, network cut, death with the parent). What a worker
runs and how its answers are judged belongs to its user: ``reward_svc.sandbox`` (a pool of
reward-function workers) and ``rollout_svc.tools`` (a pool per tool).
"""
