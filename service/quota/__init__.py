"""Quota domain: accounts, effective limits, takes, releases, resets and the ledger. No Flask, no Celery."""
