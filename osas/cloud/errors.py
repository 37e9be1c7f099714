"""Errors a cloud adapter raises. Each adapter translates its own failures into these, once;
what a create's failure means for the lifecycle is decided here, once (``create_outcome``)."""

from __future__ import annotations

from osas.domain.errors import OsasError
from osas.domain.ledger import CreateOutcome, InDoubt, NotSent, Refused
from osas.domain.servers import ErrorClass, ErrorInfo


class CloudError(OsasError):
    """Any failure talking to the cloud."""

    code = "CloudError"
    error_class = ErrorClass.OTHER

    def error_info(self) -> ErrorInfo:
        """How a create that failed with this error is reported to the Cluster Autoscaler."""
        return ErrorInfo(self.code, str(self), self.error_class)


class CloudUnavailable(CloudError):
    """Transient: 5xx, connection refused or reset, timeout. The request may have taken effect."""

    code = "CloudUnavailable"


class CreateNotSent(CloudUnavailable):
    """A create failed in a way that proves Nova never received it (name look-ups failed, the
    connection was refused or timed out before the request went out). Sending it again is safe."""

    code = "CreateNotSent"


class RateLimited(CreateNotSent):
    """The cloud's rate limit answered "not now" (429, or 503 with ``Retry-After``): the
    request never reached Nova, so even a create may be sent again, after ``retry_after``
    seconds when the cloud named them. Pace, never failure: not a send of a create."""

    code = "RateLimited"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CreateInDoubt(CloudUnavailable):
    """A create was sent and its outcome is unknown: timeout after sending, 5xx, the connection
    dropped, the answer lost. Nova may or may not have made the server; it must never be sent
    again (Nova has no idempotency key)."""

    code = "CreateInDoubt"


class QuotaExceeded(CloudError):
    """Nova refused a create for quota (403 or 413 "Quota exceeded ...")."""

    code = "QuotaExceeded"
    error_class = ErrorClass.OUT_OF_RESOURCES


class RequestRejected(CloudError):
    """Any other refusal (4xx): bad flavor, image, network, microversion... Not retried."""

    code = "RequestRejected"

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class CloudConfigurationError(CloudError):
    """The cloud cannot be used as configured (auth, endpoint, microversion)."""

    code = "CloudConfigurationError"


class CredentialsRefused(CloudConfigurationError):
    """OpenStack refused osas's credentials (401), and a fresh token, got once for every
    thread that saw the refusal, was refused too: an operator's error, not an outage. Nova did
    nothing with a request it answered 401, so a create refused this way was never made."""

    code = "CredentialsRefused"


def create_outcome(error: CloudError) -> CreateOutcome:
    """What a create that failed with ``error`` means, for the ledger: the one table.

    - ``RateLimited``: the cloud asked to slow down; sent again at the adapter's pace, and
      not counted as a send (never reported to CA as a failed create).
    - ``CreateNotSent``: proof Nova never received it; it may be sent again.
    - ``CredentialsRefused``: a 401, so Nova did nothing; sent again once the credentials
      work, and not counted as a send (never reported to CA as a failed create).
    - any other ``CloudUnavailable`` (``CreateInDoubt`` among them): sent, outcome unknown.
    - anything else: a definite refusal, reported to CA with its error class.
    """
    if isinstance(error, RateLimited):
        return NotSent(error.error_info(), counts=False, paced=True)
    if isinstance(error, CreateNotSent):
        return NotSent(error.error_info())
    if isinstance(error, CredentialsRefused):
        return NotSent(error.error_info(), counts=False)
    if isinstance(error, CloudUnavailable):
        return InDoubt(str(error))
    return Refused(error.error_info())
