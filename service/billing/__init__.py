"""Billing domain: plan config, provider-neutral subscription events, the webhook inbox."""
