"""The replica's end of the weight channel: the receiver (control stream, data plane,
snapshot client) and ``python -m rollout_svc.weights.probe``, a stand-alone receiver that
prints one JSON line per version. The shared half is :mod:`services.weights`."""
