"""trainer_svc: the FSDP2 trainer service (see docs/trainer.md).

``python -m trainer_svc --config FILE`` starts the ranks (``launch``); each builds a
``worker.TrainerWorker`` (``actor``, ``critic``, ``ref`` on ``fsdp``) and runs the
``service.TrainerService`` loop; rank 0 leases experience through ``intake``, checkpoints go
through ``checkpoint``, the algorithms are in ``core_algos``.
"""
