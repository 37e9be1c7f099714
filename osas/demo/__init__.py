"""``osas demo``: a Cluster Autoscaler session, played against a simulated OpenStack."""
