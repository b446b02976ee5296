"""Python client of the quota ledger service.

    from quota_client import QuotaClient

    with QuotaClient("https://quota.internal", api_key) as quota:
        with quota.slot("acc-1", "urls"):
            shorten(url)

`quota_client.testing.InMemoryQuota` is the same client over an in-memory service, for tests.
"""

from quota_client._async import AsyncQuotaClient, AsyncSlot
from quota_client._core import OnReleaseError
from quota_client._sync import QuotaClient, Slot
from quota_client.errors import (
    AccountDeletedError,
    ApiError,
    AuthError,
    ConflictError,
    ConnectionFailedError,
    LinesExceededError,
    MetricKindChangedError,
    NotFoundError,
    NotResettableError,
    QuotaClientError,
    QuotaExceededError,
    ServerError,
    UnknownAccountError,
    UnknownTakeError,
    ValidationError,
)
from quota_client.models import (
    Account,
    BatchItem,
    FeatureCheck,
    FeatureState,
    Grant,
    LineShortfall,
    MetricCheck,
    MetricLimit,
    ReleaseResult,
    TakeLinesResult,
    TakeResult,
    Usage,
)

__all__ = [
    "Account",
    "AccountDeletedError",
    "ApiError",
    "AsyncQuotaClient",
    "AsyncSlot",
    "AuthError",
    "BatchItem",
    "ConflictError",
    "ConnectionFailedError",
    "FeatureCheck",
    "FeatureState",
    "Grant",
    "LineShortfall",
    "LinesExceededError",
    "MetricCheck",
    "MetricKindChangedError",
    "MetricLimit",
    "NotFoundError",
    "NotResettableError",
    "OnReleaseError",
    "QuotaClient",
    "QuotaClientError",
    "QuotaExceededError",
    "ReleaseResult",
    "ServerError",
    "Slot",
    "TakeLinesResult",
    "TakeResult",
    "UnknownAccountError",
    "UnknownTakeError",
    "Usage",
    "ValidationError",
]
