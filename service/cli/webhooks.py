"""`quota-ledger webhooks send-test`: a signed sample event sent to a running service, as `stripe
trigger` does, so that a plan change can be seen without a provider account. The events are built
in service.webhooks.samples; this module only reads the credentials and sends."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

from service.webhooks import samples

# The variable the service reads each provider's credential from, and its role in the request.
CREDENTIAL = {"stripe": "STRIPE_WEBHOOK_SECRETS", "revenuecat": "REVENUECAT_WEBHOOK_AUTH"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    events = "\n".join(
        f"  {provider:<10} {e.name:<30} {e.help}" for provider, evs in samples.EVENTS.items() for e in evs
    )
    webhooks = sub.add_parser("webhooks", help="webhook tools").add_subparsers(
        dest="webhooks_command", required=True
    )
    send = webhooks.add_parser(
        "send-test",
        help="send a signed sample provider event to a running service",
        description="Send a sample event, signed with STRIPE_WEBHOOK_SECRETS (its first secret) or "
        "authorised with REVENUECAT_WEBHOOK_AUTH as the service reads them (`quota-ledger dev` sets "
        "and prints both), to BASE_URL/webhooks/PROVIDER.",
        epilog=f"events:\n{events}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    send.add_argument("provider", choices=list(samples.EVENTS))
    send.add_argument("--account", required=True, metavar="ID", help="the account the event is for")
    send.add_argument("--event", required=True, metavar="NAME", help="one of the events below")
    send.add_argument("--url", default="http://127.0.0.1:8000", metavar="BASE_URL")
    send.set_defaults(func=cmd_send_test)


def cmd_send_test(args: argparse.Namespace) -> int:
    """Exit 0 when the service took the event, 1 when it refused it or did not answer, 2 on a usage
    or configuration error."""
    provider, variable = args.provider, CREDENTIAL[args.provider]
    credential = os.environ.get(variable, "").split(",")[0].strip()
    if not credential:
        print(
            f"quota-ledger webhooks: {variable} is not set; use the value `quota-ledger dev` prints",
            file=sys.stderr,
        )
        return 2
    try:
        body = json.dumps(samples.build(provider, args.event, account_id=args.account), indent=2).encode()
    except ValueError as e:
        print(
            f"quota-ledger webhooks: {e}; `quota-ledger webhooks send-test --help` lists them",
            file=sys.stderr,
        )
        return 2
    headers = {"Content-Type": "application/json"}
    if provider == "stripe":
        headers["Stripe-Signature"] = samples.stripe_signature(body, credential)
    else:
        headers["Authorization"] = credential
    url = f"{args.url.rstrip('/')}/webhooks/{provider}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            print(f"{args.event} for {args.account}: {r.status} {r.read().decode()}")
            return 0
    except urllib.error.HTTPError as e:
        answer = e.read().decode(errors="replace")
        print(f"quota-ledger webhooks: {url} refused the event: {e.code} {answer}", file=sys.stderr)
        if e.code in (400, 401, 503):
            print(
                f"  the service must read the same {variable} as this command: set it here to the value "
                "`quota-ledger dev` prints (or the one the service was started with)",
                file=sys.stderr,
            )
    except OSError as e:
        print(
            f"quota-ledger webhooks: no answer from {url} ({e}); is the service running? (--url)",
            file=sys.stderr,
        )
    return 1
