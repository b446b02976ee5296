"""Provider adapters: verify a webhook delivery and translate it into a provider-neutral change.

They know each provider's signature scheme and payload shape, and nothing about storage.
"""
