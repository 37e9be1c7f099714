"""osas: the OpenStack provider for the Kubernetes Cluster Autoscaler."""

__version__ = "0.1.0"
