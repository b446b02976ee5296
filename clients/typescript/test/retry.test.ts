/**
 * The retry rule without a service: a scripted fetch answers each attempt as told, and records what
 * was sent. Retried: no answer (a socket's failure, a timeout), 429, 502, 503, 504, within
 * `retries` and the deadline; never another 4xx, nor a 500, nor a request that cannot be sent.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { ApiError, ConnectionFailedError, QuotaClient, ServerError, ValidationError } from "@quota-ledger/client";
import type { Fetch, QuotaClientOptions } from "@quota-ledger/client";

type Step = number | [number, Record<string, string>] | "drop" | "hang";

function scripted(steps: Step[]): { fetch: Fetch; sent: Array<{ url: string; body: unknown; at: number }> } {
  const sent: Array<{ url: string; body: unknown; at: number }> = [];
  const fetch: Fetch = async (url, init) => {
    sent.push({ url, body: init.body ? JSON.parse(String(init.body)) : null, at: Date.now() });
    const step = steps.shift() ?? 201;
    if (step === "drop") {
      throw new TypeError("fetch failed", { cause: Object.assign(new Error("reset"), { code: "ECONNRESET" }) });
    }
    if (step === "hang") {
      const signal = init.signal!;
      const alive = setInterval(() => {}, 1000);
      await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
      clearInterval(alive);
      throw signal.reason;
    }
    const [status, headers] = Array.isArray(step) ? step : [step, {}];
    const body =
      status < 300
        ? { take_id: 1, metric: "urls", units: 1, used: 1, limit: 5, remaining: 4, period: "2026-12", limit_source: "plan" }
        : { error: status === 422 ? "validation_failed" : "unavailable", message: "scripted" };
    return new Response(JSON.stringify(body), { status, headers });
  };
  return { fetch, sent };
}

function client(fetch: Fetch, options: Partial<QuotaClientOptions> = {}): QuotaClient {
  return new QuotaClient({ baseUrl: "http://quota.test/", apiKey: "k", retries: 3, backoffMs: 1, maxBackoffMs: 5, fetch, ...options });
}

test("a take's key is made once, before the first attempt, and sent with every retry", async () => {
  const { fetch, sent } = scripted(["drop", 503, 502, 201]);
  const took = await client(fetch).take("acc-1", "urls");
  assert.equal(took.granted, true);
  assert.equal(sent.length, 4);
  const keys = new Set(sent.map((s) => (s.body as { idempotency_key: string }).idempotency_key));
  assert.deepEqual([...keys], [took.idempotencyKey]);
  assert.equal(sent[0]!.url, "http://quota.test/v1/accounts/acc-1/takes");
});

test("a batch's items get their keys once too", async () => {
  const answers = [{ status: 201, take_id: 1, metric: "urls", units: 1, used: 1, limit: null, remaining: null, period: null, limit_source: "plan" }];
  const sent: unknown[] = [];
  let attempt = 0;
  const fetch: Fetch = async (_url, init) => {
    sent.push(JSON.parse(String(init.body)));
    if (attempt++ === 0) throw new TypeError("fetch failed", { cause: Object.assign(new Error("x"), { code: "UND_ERR_SOCKET" }) });
    return new Response(JSON.stringify({ results: answers }), { status: 200 });
  };
  const [one] = await client(fetch).takeBatch([{ accountId: "a", metric: "urls" }]);
  assert.ok(one && !(one instanceof ApiError) && one.granted && !one.replayed);
  assert.deepEqual(sent[0], sent[1]);
});

test("429, 502, 503 and 504 are retried; other answers are final", async () => {
  for (const status of [429, 502, 503, 504]) {
    const { fetch, sent } = scripted([status, 201]);
    assert.equal((await client(fetch).take("a", "urls")).granted, true);
    assert.equal(sent.length, 2, String(status));
  }
  for (const [status, error] of [[500, ServerError], [422, ValidationError], [400, ValidationError], [401, ApiError], [403, ApiError], [418, ApiError]] as const) {
    const { fetch, sent } = scripted([status, 201]);
    await assert.rejects(client(fetch).take("a", "urls"), error);
    assert.equal(sent.length, 1, String(status));
  }
});

test("the last retryable answer is thrown when the retries are spent", async () => {
  const { fetch, sent } = scripted([503, 503, 429]);
  await assert.rejects(client(fetch, { retries: 2 }).account("a"), (e: unknown) => e instanceof ApiError && e.status === 429);
  assert.equal(sent.length, 3);
});

test("Retry-After is honoured, up to maxBackoffMs", async () => {
  const { fetch, sent } = scripted([[503, { "Retry-After": "0.2" }], 201]);
  await client(fetch, { maxBackoffMs: 1000 }).take("a", "urls");
  assert.ok(sent[1]!.at - sent[0]!.at >= 190, `waited ${sent[1]!.at - sent[0]!.at} ms`);
  const capped = scripted([[503, { "Retry-After": "30" }], 201]);
  await client(capped.fetch, { maxBackoffMs: 20 }).take("a", "urls");
  assert.ok(capped.sent[1]!.at - capped.sent[0]!.at < 1000);
});

test("each attempt times out on its own, and no attempt starts past the deadline", async () => {
  const { fetch, sent } = scripted(["hang", "hang", 201]);
  const took = await client(fetch, { timeoutMs: 50 }).take("a", "urls");
  assert.equal(took.granted, true);
  assert.equal(sent.length, 3);
  const late = scripted(["hang", "hang", "hang", "hang", 201]);
  const started = Date.now();
  await assert.rejects(client(late.fetch, { timeoutMs: 100, deadlineMs: 250, retries: 10 }).take("a", "urls"), ConnectionFailedError);
  assert.ok(Date.now() - started < 1500, `gave up after ${Date.now() - started} ms`);
  assert.ok(late.sent.length <= 3);
});

test("a request that cannot be sent is not retried, and withSlot gives nothing back", async () => {
  let calls = 0;
  const fetch: Fetch = async () => {
    calls++;
    throw new TypeError("fetch failed", { cause: new Error("unknown scheme") });
  };
  const quota = client(fetch);
  await assert.rejects(quota.take("a", "urls"), ConnectionFailedError);
  assert.equal(calls, 1);
  await assert.rejects(quota.withSlot("a", "urls", () => 1), ConnectionFailedError);
  assert.equal(calls, 2);
  assert.throws(() => new QuotaClient({ baseUrl: "not a url", apiKey: "k" }), TypeError);
  assert.throws(() => new QuotaClient({ baseUrl: "", apiKey: "k" }), TypeError);
});

test("Node's own error of a call made wrong (ERR_*) is not a lost answer: no retry, nothing given back", async () => {
  let calls = 0;
  const releaseErrors: unknown[] = [];
  const fetch: Fetch = async () => {
    calls++;
    throw new TypeError("fetch failed", { cause: Object.assign(new TypeError("Invalid URL"), { code: "ERR_INVALID_URL" }) });
  };
  const quota = client(fetch, { onReleaseError: (e) => releaseErrors.push(e) });
  await assert.rejects(quota.withSlot("a", "urls", () => 1), ConnectionFailedError);
  assert.equal(calls, 1);
  assert.deepEqual(releaseErrors, []);
});

test("the key and the base URL go where they should", async () => {
  const seen: Array<[string, Headers]> = [];
  const fetch: Fetch = async (url, init) => {
    seen.push([url, new Headers(init.headers)]);
    return new Response(JSON.stringify({ metric: "urls", period: "2026-12", used: 0 }), { status: 200 });
  };
  await new QuotaClient({ baseUrl: "http://quota.test/base//", apiKey: "secret", fetch }).usage("a b", "urls", { period: "2026-12" });
  const [[url, headers]] = seen as [[string, Headers]];
  assert.equal(url, "http://quota.test/base/v1/accounts/a%20b/usage?metric=urls&period=2026-12");
  assert.equal(headers.get("authorization"), "Bearer secret");
});

test("an answer that is not the JSON object expected is an ApiError invalid_response", async () => {
  const fetch: Fetch = async () => new Response("<html>proxy</html>", { status: 200 });
  await assert.rejects(client(fetch).account("a"), (e: unknown) => e instanceof ApiError && e.code === "invalid_response");
  const bad: Fetch = async () => new Response("<html>bad gateway</html>", { status: 502 });
  await assert.rejects(client(bad, { retries: 0 }).account("a"), (e: unknown) => e instanceof ServerError && e.code === "http_502");
});
