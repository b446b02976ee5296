/**
 * InMemoryQuota's own rules, beyond the contract tests: its options, the clock (a month's and a
 * day's reset, an allocation never reset, a release after the period closed), features, failures
 * on purpose; as tests/client/test_in_memory.py and test_plan_items.py for the Python fake.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { QuotaExceededError, ServerError, UnknownAccountError, ValidationError } from "@quota-ledger/client";
import { InMemoryQuota, InMemoryService, VOCABULARY } from "@quota-ledger/client/testing";

import { SERVICE } from "./backend.js";

test("the five-line example of the README", async () => {
  const quota = new InMemoryQuota({ limits: { links: 5 } });
  await quota.ensureAccount("user-1");
  const result = await quota.withSlot("user-1", "links", async () => "shortened", { units: 5 });
  assert.equal(result, "shortened");
  await assert.rejects(quota.withSlot("user-1", "links", () => "never"), QuotaExceededError);
  const refused = await quota.take("user-1", "links");
  assert.deepEqual([refused.granted, !refused.granted && refused.reason], [false, "exhausted"]);
});

test("options are refused as the service refuses a plan file", () => {
  assert.throws(() => new InMemoryQuota({ limits: { a: 1 }, metrics: { b: { kind: "allocation" } } }), /no limit names/);
  assert.throws(() => new InMemoryQuota({ limits: { a: 1 }, metrics: { a: { kind: "allocation", reset: "day" } } }), /never reset/);
  assert.throws(() => new InMemoryQuota({ limits: { a: 1 }, metrics: { a: { reset: "week" as never } } }), /one of month, day/);
  assert.throws(() => new InMemoryQuota({ limits: { a: 1 }, features: { a: true } }), /also a metric/);
  assert.throws(() => new InMemoryQuota({}), /limits/);
  assert.throws(() => new InMemoryQuota({ limits: { a: 1 }, service: new InMemoryService({ limits: { a: 1 } }) }), /or an InMemoryService/);
  const quota = new InMemoryQuota({ limits: { a: 1 } });
  assert.throws(() => quota.setLimit("nobody", "a", 1), /ensureAccount first/);
});

test("consumables reset with their month or day, allocations are held, old takes close", async () => {
  const quota = new InMemoryQuota({
    limits: { urls: 2, exports: 1, seats: 1 },
    metrics: { seats: { kind: "allocation" }, exports: { reset: "day" } },
  });
  quota.service.now = new Date("2026-11-30T23:59:00Z");
  await quota.ensureAccount("a");
  const url = await quota.take("a", "urls", { units: 2 });
  const seat = await quota.take("a", "seats");
  await quota.take("a", "exports");
  assert.equal((await quota.take("a", "exports")).granted, false);
  assert.ok(url.granted && url.period === "2026-11" && seat.granted && seat.period === null);
  const limits = await quota.limits("a");
  assert.deepEqual(
    [limits["urls"]!.resetsAt, limits["exports"]!.resetsAt, limits["exports"]!.period, limits["seats"]!.resetsAt],
    ["2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z", "2026-11-30", null],
  );
  quota.service.now = new Date("2026-12-01T00:01:00Z");
  assert.equal((await quota.take("a", "urls", { units: 2 })).granted, true);
  assert.equal((await quota.take("a", "exports")).granted, true);
  assert.equal((await quota.take("a", "seats")).granted, false); // the seat is still held
  const closed = await quota.release(url);
  assert.deepEqual([closed.released, closed.reason], [false, "period_closed"]);
  assert.ok((await quota.release(seat)).released);
  assert.equal((await quota.usage("a", "urls", { period: "2026-11" })).used, 2);
  await assert.rejects(
    quota.usage("a", "exports", { period: "2026-12" }),
    (e: unknown) => e instanceof ValidationError && /resets daily/.test(e.fields["period"]![0]!),
  );
  quota.service.period = "2027-01";
  assert.equal((await quota.usage("a", "urls")).period, "2027-01");
});

test("a take from a closed period is not released", async () => {
  const quota = new InMemoryQuota({ limits: { urls: 5 } });
  quota.service.period = "2026-11";
  await quota.ensureAccount("a");
  const took = await quota.take("a", "urls");
  quota.service.period = "2026-12";
  const released = await quota.release(took as never);
  assert.deepEqual([released.released, released.reason], [false, "period_closed"]);
});

test("features: the plan's, then an override, then the plan's again", async () => {
  const quota = new InMemoryQuota({ limits: { urls: 5 }, features: { sso: false } });
  await quota.ensureAccount("a");
  assert.equal(await quota.featureEnabled("a", "sso"), false);
  quota.setFeature("a", "sso", true);
  assert.deepEqual((await quota.account("a")).features, { sso: { enabled: true, source: "override" } });
  quota.clearFeature("a", "sso");
  assert.deepEqual(await quota.checkFeature("a", "sso"), { allowed: false, feature: "sso", source: "plan" });
  assert.throws(() => quota.setFeature("a", "teleport", true), /unknown feature/);
});

test("overrides, over the limit after a lower one, and back to the plan", async () => {
  const quota = new InMemoryQuota({ limits: { urls: 5 } });
  await quota.ensureAccount("a");
  await quota.take("a", "urls", { units: 4 });
  quota.setLimit("a", "urls", 2);
  const urls = (await quota.limits("a"))["urls"]!;
  assert.deepEqual([urls.limit, urls.limitSource, urls.overLimit, urls.remaining], [2, "override", true, 0]);
  assert.equal((await quota.take("a", "urls")).granted, false);
  quota.clearLimit("a", "urls");
  assert.equal((await quota.take("a", "urls")).granted, true);
});

test("failNext fails the next calls as a service that is down would; the client retries", async () => {
  const quota = new InMemoryQuota({ limits: { urls: 5 }, retries: 1 });
  await quota.ensureAccount("a");
  quota.service.failNext(1);
  assert.equal((await quota.take("a", "urls")).granted, true);
  quota.service.failNext(2);
  await assert.rejects(quota.take("a", "urls"), ServerError);
  assert.equal((await quota.usage("a", "urls")).used, 1);
  quota.deleteAccount("a");
  await assert.rejects(quota.withSlot("a", "urls", () => 1), /deleted/);
  await assert.rejects(quota.withSlot("b", "urls", () => 1), UnknownAccountError);
});

test("two fakes can share one service", async () => {
  const service = new InMemoryService({ limits: { urls: 1 } });
  const one = new InMemoryQuota({ service });
  const two = new InMemoryQuota({ service });
  await one.ensureAccount("a");
  assert.equal((await one.take("a", "urls")).granted, true);
  assert.equal((await two.take("a", "urls")).granted, false);
});

test("the fake's words are the service's", { skip: !SERVICE?.vocabulary }, () => {
  const service = JSON.parse(SERVICE!.vocabulary) as Record<string, unknown>;
  // The fake has no plans, so no free_fallback: its limit sources are some of the service's.
  const { limitSources, ...rest } = VOCABULARY;
  const { limitSources: all, ...theirs } = service as { limitSources: string[] };
  assert.deepEqual(rest, theirs);
  assert.ok(limitSources.every((s) => all.includes(s)));
});

test("the default onReleaseError warns on the console, naming the take", async () => {
  const quota = new InMemoryQuota({ limits: { urls: 5 }, retries: 0 });
  await quota.ensureAccount("a");
  const warnings: unknown[] = [];
  const warn = console.warn;
  console.warn = (...args: unknown[]) => warnings.push(args.join(" "));
  let takeId = 0;
  try {
    const slot = quota.withSlot("a", "urls", (take) => {
      takeId = take.takeId;
      quota.service.failNext(1);
      throw new Error("the work failed");
    });
    await assert.rejects(slot, /the work failed/);
  } finally {
    console.warn = warn;
  }
  assert.equal(warnings.length, 1);
  assert.match(String(warnings[0]), new RegExp(`could not release take ${takeId} \\(1 units of urls for a\\)`));
});
