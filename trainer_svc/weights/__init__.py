"""The trainer's end of the weight channel: the publisher (rank 0), the gRPC
``WeightService`` it serves, the host-memory arena of the current version, and how a
version is promoted to the replicas (all at once, or through a canary). The shared half
(plans, messages, the data-plane group, snapshots) is :mod:`services.weights`."""
