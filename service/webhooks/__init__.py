"""Provider adapters: verify a webhook delivery and translate it into a provider-neutral change.

They know each provider's signature scheme and payload shape, and nothing about storage.
`translators` gives each provider's translation under the deployment's environment policy
(service/billing/delivery.py), for deliveries and replays alike.
"""

from __future__ import annotations

from collections.abc import Callable

from service.billing.delivery import Translate, for_environment
from service.webhooks import revenuecat, stripe

ADAPTERS = {
    stripe.PROVIDER: (stripe.translate, stripe.environment),
    revenuecat.PROVIDER: (revenuecat.translate, revenuecat.environment),
}
PROVIDERS = tuple(ADAPTERS)


def translators(wanted: str | None) -> Callable[[str], Translate]:
    """Each provider's translation, applying only events of the `wanted` environment
    (WEBHOOK_ENVIRONMENT; None: both)."""

    def translator(provider: str) -> Translate:
        translate, environment_of = ADAPTERS[provider]
        return for_environment(translate, environment_of, wanted)

    return translator
