"""The fleet: warm rollout replicas of one base model, shared by the adapter jobs attached
to it (``meshrl fleet start FLEET.yaml``; docs/fleet.md).

``main.py`` is the command line (start, status, stop); ``fleet.py`` the process that starts
the replicas, restarts those that die and stops them; the replicas themselves are
``rollout_svc`` processes in fleet mode (``rollout_svc/fleet_member.py``), which serve each
attached job's adapter and follow its weight channel. Jobs and the fleet meet only in the
fleet's directory (:mod:`services.fleets`).
"""
