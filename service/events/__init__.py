"""Events out (docs/events.md): DOMAIN, no Flask. The events themselves are written into
event_outbox by the database functions that cause them; this package delivers them: webhook
endpoints (endpoints), the URL rules against SSRF (addresses), the Standard Webhooks signature
(signing), the HTTP attempt (transport), the outbox's fan-out and purge (outbox) and the relay that
claims and sends due deliveries (relay)."""
