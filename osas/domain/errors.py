"""The error tree every layer raises; the service layer maps each class to one gRPC status."""


class OsasError(Exception):
    """Base of every error osas raises on purpose."""


class NodeGroupNotFound(OsasError):
    """The request names a node group that is not configured."""


class NodeNotFound(OsasError):
    """A node in the request is not a server, or placeholder, of this cluster."""


class InvalidRequest(OsasError):
    """The request is malformed whatever the state: bad delta, bad id, duplicates."""


class PreconditionFailed(OsasError):
    """The request is well formed but the node group's state forbids it (max, min, ...)."""


class NotSupported(OsasError):
    """The answer is deliberately left to the Cluster Autoscaler's defaults."""


class NotReady(OsasError):
    """The inventory has never been synced, or is too stale to act on."""


class Overloaded(OsasError):
    """The task queue has no room for the work; nothing was reserved."""
