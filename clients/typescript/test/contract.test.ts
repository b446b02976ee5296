/**
 * The client's contract, run against the real service (when tests/client/test_typescript.py started
 * it) and against InMemoryService alike: what the fake promises product tests is what the service
 * does. A port of tests/client/test_contract.py and test_bulk_contract.py.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  AccountDeletedError,
  ApiError,
  ConflictError,
  ConnectionFailedError,
  LinesExceededError,
  NotFoundError,
  QuotaExceededError,
  ServerError,
  UnaddressableAccountError,
  UnknownAccountError,
  UnknownTakeError,
  ValidationError,
} from "@quota-ledger/client";
import type { HeldTake, QuotaClient, TakeGranted, TakeResult } from "@quota-ledger/client";

import { BACKENDS, FREE_PLAN, SERVICE, acc } from "./backend.js";
import type { Backend } from "./backend.js";

const PERIOD = new Date().toISOString().slice(0, 7);
const LINES = { urls: 3, exports: 2, seats: 1 };

class Boom extends Error {}

function granted(took: TakeResult): TakeGranted {
  assert.equal(took.granted, true, `refused: ${JSON.stringify(took)}`);
  return took as TakeGranted;
}

async function used(quota: QuotaClient, account: string): Promise<Record<string, number>> {
  const limits = await quota.limits(account);
  return Object.fromEntries(Object.keys(LINES).map((m) => [m, limits[m]!.used]));
}

async function requests(backend: Backend): Promise<number> {
  return (await backend.stats()).requests;
}

test("the in-memory backend's free plan is tests/plans.toml's", { skip: !SERVICE?.freePlan }, () => {
  assert.deepEqual(JSON.parse(SERVICE!.freePlan), FREE_PLAN);
});

for (const { name, make } of BACKENDS) {
  describe(`contract (${name})`, () => {
    test("ensureAccount, then its limits", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      const created = await quota.ensureAccount(a, { kind: "team" });
      assert.deepEqual([created.id, created.kind, created.deleted], [a, "team", false]);
      const urls = (await quota.limits(a))["urls"]!;
      assert.deepEqual([urls.limit, urls.limitSource, urls.used, urls.remaining, urls.period], [50, "plan", 0, 50, PERIOD]);
      assert.match(urls.resetsAt!, /-01T00:00:00Z$/);
      assert.deepEqual([urls.kind, urls.reset, urls.overLimit], ["consumable", "month", false]);
      const seats = (await quota.limits(a))["seats"]!;
      assert.deepEqual([seats.kind, seats.reset, seats.period, seats.resetsAt], ["allocation", null, null, null]);
      assert.equal((await quota.ensureAccount(a, { kind: "user" })).kind, "user");
      assert.equal((await quota.account(a)).kind, "user");
      assert.deepEqual((await quota.account(a)).features["export_csv"], { enabled: true, source: "plan" });
    });

    test("a take is granted with the numbers", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const first = granted(await quota.take(a, "urls"));
      const second = granted(await quota.take(a, "urls", { units: 3 }));
      assert.equal(second.replayed, false);
      assert.ok(Number.isInteger(first.takeId) && second.takeId !== first.takeId);
      assert.deepEqual(
        [second.used, second.limit, second.remaining, second.limitSource, second.period],
        [4, 50, 46, "plan", PERIOD],
      );
      assert.deepEqual([second.accountId, second.metric, second.units], [a, "urls", 3]);
      assert.match(second.idempotencyKey, /^qc-[0-9a-f]{32}$/);
      assert.equal((await quota.usage(a, "urls")).used, 4);
    });

    test("a spent quota is an answer with the numbers, and takes nothing", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await b.setLimit(a, "urls", 2);
      granted(await quota.take(a, "urls", { units: 2 }));
      const refused = await quota.take(a, "urls");
      assert.ok(!refused.granted && refused.reason === "exhausted");
      assert.deepEqual(
        [refused.used, refused.limit, refused.remaining, refused.limitSource, refused.period],
        [2, 2, 0, "override", PERIOD],
      );
      assert.equal("takeId" in refused, false);
      assert.equal((await quota.usage(a, "urls")).used, 2);
    });

    test("unlimited has no limit and no remaining", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await b.setLimit(a, "urls", null);
      const took = granted(await quota.take(a, "urls", { units: 1000 }));
      assert.deepEqual([took.limit, took.remaining, took.used], [null, null, 1000]);
    });

    test("the same idempotency key returns the original take", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const first = granted(await quota.take(a, "urls", { units: 2, idempotencyKey: "order-17" }));
      await quota.take(a, "urls");
      const again = granted(await quota.take(a, "urls", { units: 2, idempotencyKey: "order-17" }));
      assert.ok(again.replayed && !first.replayed);
      assert.deepEqual([again.takeId, again.used, again.idempotencyKey], [first.takeId, 2, "order-17"]);
      assert.equal((await quota.usage(a, "urls")).used, 3);
      await assert.rejects(quota.take(a, "urls", { units: 5, idempotencyKey: "order-17" }), (e: unknown) => {
        assert.ok(e instanceof ConflictError);
        assert.deepEqual([e.status, e.code], [409, "idempotency_key_reused"]);
        return true;
      });
    });

    test("a release gives back once", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const took = granted(await quota.take(a, "urls", { units: 3 }));
      const released = await quota.release(took);
      assert.deepEqual([released.released, released.takeId, released.units, released.used], [true, took.takeId, 3, 0]);
      assert.deepEqual([released.limit, released.remaining, released.metric], [50, 50, "urls"]);
      const again = await quota.release(took.takeId);
      assert.deepEqual([again.released, again.reason], [false, "already_released"]);
      assert.equal((await quota.usage(a, "urls")).used, 0);
    });

    test("a take is released through its own account", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await quota.ensureAccount(`${a}-other`);
      const took = granted(await quota.take(a, "urls", { units: 2 }));
      await assert.rejects(quota.release({ ...took, accountId: `${a}-other` }), UnknownTakeError);
      assert.equal((await quota.usage(a, "urls")).used, 2);
      assert.ok((await quota.release(took)).released);
    });

    test("release refusals", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await assert.rejects(quota.release(987654321), (e: unknown) => {
        assert.ok(e instanceof UnknownTakeError);
        assert.deepEqual([e.status, e.code], [404, "unknown_take"]);
        return true;
      });
      await b.setLimit(a, "urls", 0);
      const refused = await quota.take(a, "urls");
      await assert.rejects(quota.release(refused as never), /refused/);
      const pending: HeldTake = { accountId: a, metric: "urls", units: 1, idempotencyKey: "k", takeId: null };
      await assert.rejects(quota.release(pending), /never confirmed/);
    });

    test("unknown and deleted accounts: a take's answer, the other calls' errors", async () => {
      const b = await make();
      const quota = b.client();
      const nobody = acc();
      const refused = await quota.take(nobody, "urls");
      assert.ok(!refused.granted && refused.reason === "unknown-account");
      assert.equal(refused.accountId, nobody);
      for (const call of [() => quota.account(nobody), () => quota.limits(nobody), () => quota.usage(nobody, "urls")]) {
        await assert.rejects(call(), (e: unknown) => {
          assert.ok(e instanceof UnknownAccountError);
          assert.deepEqual([e.status, e.code], [404, "unknown_account"]);
          return true;
        });
      }
      const a = acc();
      await quota.ensureAccount(a);
      const kept = granted(await quota.take(a, "urls", { idempotencyKey: "before" }));
      await b.deleteAccount(a);
      const gone = await quota.take(a, "urls");
      assert.ok(!gone.granted && gone.reason === "deleted");
      await assert.rejects(quota.ensureAccount(a), (e: unknown) => {
        assert.ok(e instanceof AccountDeletedError);
        assert.deepEqual([e.status, e.code], [410, "account_deleted"]);
        return true;
      });
      await assert.rejects(quota.check(a, "urls"), AccountDeletedError);
      assert.ok((await quota.release(kept)).released); // what was taken before the delete can be given back
    });

    test("invalid requests throw ValidationError with the fields", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const fields = async (call: Promise<unknown>, code: string, names: string[] | null) =>
        assert.rejects(call, (e: unknown) => {
          assert.ok(e instanceof ValidationError, String(e));
          assert.equal(e.code, code);
          if (names) assert.deepEqual(Object.keys(e.fields).sort(), names);
          return true;
        });
      await fields(quota.take(a, "bananas"), "unknown_metric", null);
      await fields(quota.take(a, "urls", { units: 0 }), "validation_failed", ["units"]);
      await fields(quota.take(a, "urls", { idempotencyKey: "" }), "validation_failed", ["idempotency_key"]);
      await fields(quota.usage(a, "urls", { period: "2024-13" }), "validation_failed", ["period"]);
      await fields(quota.ensureAccount(a, { kind: "robot" as never }), "validation_failed", ["kind"]);
      await fields(quota.take("bad id", "urls"), "validation_failed", ["id"]);
      await fields(quota.check(a, "bananas"), "unknown_metric", null);
      await assert.rejects(quota.take("bad/id", "urls"), (e: unknown) => {
        assert.ok(e instanceof NotFoundError && !(e instanceof UnknownAccountError));
        assert.equal(e.code, "not_found");
        return true;
      });
      assert.equal((await quota.usage(a, "urls")).used, 0);
    });

    test("account ids with every allowed character; '.' and '..' cannot be sent", async () => {
      const b = await make();
      const quota = b.client();
      const a = `a:b@c.d-_${acc()}`;
      assert.equal((await quota.ensureAccount(a)).id, a);
      granted(await quota.take(a, "urls"));
      assert.equal((await quota.usage(a, "urls")).used, 1);
      const before = await requests(b);
      for (const id of [".", ".."]) {
        await assert.rejects(quota.ensureAccount(id), UnaddressableAccountError);
        await assert.rejects(quota.withSlot(id, "urls", () => 1), UnaddressableAccountError);
      }
      assert.equal(await requests(b), before);
    });

    test("usage of a period without takes is zero", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await quota.take(a, "urls");
      assert.equal((await quota.usage(a, "urls", { period: "2020-01" })).used, 0);
      assert.equal((await quota.usage(a, "urls", { period: PERIOD })).used, 1);
      assert.deepEqual(await quota.usage(a, "seats"), { metric: "seats", period: null, used: 0 });
    });

    test("check answers with the counter's numbers and takes nothing; features too", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await b.setLimit(a, "urls", 3);
      await quota.take(a, "urls", { units: 2 });
      const fits = await quota.check(a, "urls");
      assert.deepEqual(
        [fits.allowed, fits.metric, fits.units, fits.used, fits.limit, fits.remaining, fits.limitSource, fits.period],
        [true, "urls", 1, 2, 3, 1, "override", PERIOD],
      );
      assert.match(fits.resetsAt!, /-01T00:00:00Z$/);
      assert.equal((await quota.check(a, "urls", { units: 2 })).allowed, false);
      assert.equal((await quota.usage(a, "urls")).used, 2);
      assert.deepEqual(await quota.checkFeature(a, "export_csv"), { allowed: true, feature: "export_csv", source: "plan" });
      assert.equal(await quota.featureEnabled(a, "sso"), false);
      await b.setFeature(a, "sso", true);
      assert.deepEqual(await quota.checkFeature(a, "sso"), { allowed: true, feature: "sso", source: "override" });
      await b.setFeature(a, "sso", null);
      assert.equal(await quota.featureEnabled(a, "sso"), false);
      await assert.rejects(quota.checkFeature(a, "teleport"), (e: unknown) => e instanceof ValidationError && e.code === "unknown_feature");
    });

    test("withSlot keeps the take when fn succeeds, and resolves to fn's value", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const value = await quota.withSlot(a, "urls", async (take) => {
        assert.equal(take.used, 2);
        return "done";
      }, { units: 2 });
      assert.equal(value, "done");
      assert.equal((await quota.usage(a, "urls")).used, 2);
    });

    test("withSlot refused throws with the numbers, and fn never runs", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await b.setLimit(a, "urls", 1);
      await quota.take(a, "urls");
      let ran = false;
      await assert.rejects(quota.withSlot(a, "urls", () => (ran = true)), (e: unknown) => {
        assert.ok(e instanceof QuotaExceededError);
        assert.deepEqual([e.used, e.limit, e.remaining, e.take.reason], [1, 1, 0, "exhausted"]);
        return true;
      });
      assert.equal(ran, false);
      await b.deleteAccount(a);
      await assert.rejects(quota.withSlot(a, "urls", () => (ran = true)), AccountDeletedError);
      const before = await requests(b);
      await assert.rejects(quota.withSlot(acc(), "urls", () => (ran = true)), UnknownAccountError);
      assert.equal(await requests(b), before + 1); // a refusal by an answer sends nothing more
      assert.equal(ran, false);
    });

    test("withSlot releases when fn throws or rejects, and rethrows the original", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const original = new Boom("the work failed");
      const rejected = quota.withSlot(a, "urls", async () => {
        assert.equal((await quota.usage(a, "urls")).used, 1);
        throw original;
      });
      await assert.rejects(rejected, (e: unknown) => e === original);
      const thrown = quota.withSlot(a, "urls", () => {
        throw original;
      });
      await assert.rejects(thrown, (e: unknown) => e === original);
      assert.equal((await quota.usage(a, "urls")).used, 0);
    });

    test("a failed release goes to onReleaseError, and the original propagates", async () => {
      const b = await make();
      const failures: Array<[unknown, HeldTake]> = [];
      const quota = b.client({ retries: 1, onReleaseError: (error, take) => failures.push([error, take]) });
      const a = acc();
      await quota.ensureAccount(a);
      const original = new Boom("the work failed");
      let held: TakeGranted | undefined;
      const slot = quota.withSlot(a, "urls", async (take) => {
        held = take;
        await b.failNext(2); // the release and its one retry
        throw original;
      });
      await assert.rejects(slot, (e: unknown) => e === original);
      assert.equal(failures.length, 1);
      const [error, take] = failures[0]!;
      assert.ok(error instanceof ServerError);
      assert.deepEqual([error.status, error.code], [503, "unavailable"]);
      assert.deepEqual(take, held);
      assert.equal((await quota.usage(a, "urls")).used, 1); // not given back: the callback's to handle
    });

    test("a failing onReleaseError does not replace the original either", async () => {
      const b = await make();
      const quota = b.client({
        retries: 0,
        onReleaseError: () => {
          throw new Error("the callback broke too");
        },
      });
      const a = acc();
      await quota.ensureAccount(a);
      const original = new Boom();
      const errors: unknown[][] = [];
      const consoleError = console.error;
      console.error = (...args: unknown[]) => errors.push(args);
      try {
        const slot = quota.withSlot(a, "urls", async () => {
          await b.failNext(1);
          throw original;
        });
        await assert.rejects(slot, (e: unknown) => e === original);
      } finally {
        console.error = consoleError;
      }
      assert.match(String(errors[0]?.[0]), /onReleaseError failed/);
    });

    test("a 503 is retried, and the take counts once", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const before = await requests(b);
      await b.failNext(2);
      const took = granted(await quota.take(a, "urls"));
      assert.equal(took.used, 1);
      assert.equal((await requests(b)) - before, 3);
      assert.equal((await quota.usage(a, "urls")).used, 1);
    });

    test("retries give up with the last server error", async () => {
      const b = await make();
      const quota = b.client({ retries: 2 });
      const a = acc();
      await quota.ensureAccount(a);
      const before = await requests(b);
      await b.failNext(3);
      await assert.rejects(quota.take(a, "urls"), (e: unknown) => e instanceof ServerError && e.status === 503);
      assert.equal((await requests(b)) - before, 3);
      assert.equal((await quota.usage(a, "urls")).used, 0);
    });

    test("a 4xx is never retried", async () => {
      const b = await make();
      const quota = b.client({ retries: 3 });
      const a = acc();
      await quota.ensureAccount(a);
      for (const [call, error] of [
        [() => quota.take(a, "bananas"), ValidationError],
        [() => quota.account(acc()), UnknownAccountError],
        [() => quota.release(987654321), UnknownTakeError],
      ] as const) {
        const before = await requests(b);
        await assert.rejects(call(), error);
        assert.equal((await requests(b)) - before, 1);
      }
    });

    test("an answer lost after the service committed the take: the retry is not counted twice", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const before = await b.stats();
      await b.dropNext(1);
      const took = granted(await quota.take(a, "urls", { units: 2 }));
      const after = await b.stats();
      assert.equal(after.dropped - before.dropped, 1);
      assert.equal(after.requests - before.requests, 2);
      assert.ok(took.replayed, "the retry got the original take back");
      assert.equal(took.used, 2);
      assert.equal((await quota.usage(a, "urls")).used, 2);
    });

    test("an answer held back until the attempt times out: the retry is not counted twice", async () => {
      const b = await make();
      const quota = b.client({ timeoutMs: 500 });
      const a = acc();
      await quota.ensureAccount(a);
      await b.stallNext(1);
      const took = granted(await quota.take(a, "urls"));
      assert.ok(took.replayed);
      assert.equal((await b.stats()).dropped, 1);
      assert.equal((await quota.usage(a, "urls")).used, 1);
    });

    test("no answer through every retry: ConnectionFailedError, and a take with its key finds it", async () => {
      const b = await make();
      const quota = b.client({ retries: 1 });
      const a = acc();
      await quota.ensureAccount(a);
      await b.dropNext(2);
      await assert.rejects(quota.take(a, "urls", { idempotencyKey: "lost-1" }), ConnectionFailedError);
      assert.equal((await quota.usage(a, "urls")).used, 1);
      const found = granted(await quota.take(a, "urls", { idempotencyKey: "lost-1" }));
      assert.ok(found.replayed && (await quota.release(found)).released);
    });

    test("withSlot whose take's answer was lost gives the take back before the error goes on", async () => {
      const b = await make();
      const quota = b.client({ retries: 0 });
      const a = acc();
      await quota.ensureAccount(a);
      await b.dropNext(1);
      let ran = false;
      await assert.rejects(quota.withSlot(a, "urls", () => (ran = true), { units: 2 }), ConnectionFailedError);
      assert.equal(ran, false);
      assert.equal((await b.stats()).dropped, 1);
      assert.equal((await quota.usage(a, "urls")).used, 0);
    });

    test("a lost take that cannot be found goes to onReleaseError with its key", async () => {
      const b = await make();
      const failures: Array<[unknown, HeldTake]> = [];
      const quota = b.client({ retries: 0, onReleaseError: (error, take) => failures.push([error, take]) });
      const a = acc();
      await quota.ensureAccount(a);
      await b.dropNext(1);
      await b.failNext(1); // the service is unavailable when the slot looks for the take
      await assert.rejects(quota.withSlot(a, "urls", () => 1, { units: 2 }), ConnectionFailedError);
      assert.equal(failures.length, 1);
      const [error, take] = failures[0]!;
      assert.ok(error instanceof ServerError && error.status === 503);
      assert.deepEqual([take.accountId, take.metric, take.units, take.takeId], [a, "urls", 2, null]);
      assert.equal((await quota.usage(a, "urls")).used, 2); // held: the callback's to handle
      const found = granted(await quota.take(a, "urls", { units: 2, idempotencyKey: take.idempotencyKey }));
      assert.ok(found.replayed && (await quota.release(found)).released);
      assert.equal((await quota.usage(a, "urls")).used, 0);
    });

    // Multi-line takes and batches (test_bulk_contract.py).

    test("takeLines takes every line, in order", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const taken = await quota.takeLines(a, LINES);
      assert.ok(taken.granted && !taken.replayed);
      assert.deepEqual(
        taken.takes.map((t) => [t.metric, t.units, t.used, t.granted]),
        [["urls", 3, 3, true], ["exports", 2, 2, true], ["seats", 1, 1, true]],
      );
      assert.equal(taken.takes[2]!.period, null);
      assert.equal(new Set(taken.takes.map((t) => t.takeId)).size, 3);
      assert.ok((await quota.release(taken.takes[0]!)).released);
      assert.deepEqual(await used(quota, a), { urls: 0, exports: 2, seats: 1 });
    });

    test("takeLines refused names every short line and takes nothing", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await b.setLimit(a, "exports", 1);
      const refused = await quota.takeLines(a, [["urls", 3], ["exports", 2], ["seats", 2]]);
      assert.ok(!refused.granted && refused.reason === "exhausted");
      assert.deepEqual(
        refused.short.map((s) => [s.metric, s.units, s.remaining, s.limit]),
        [["exports", 2, 1, 1], ["seats", 2, 1, 1]],
      );
      assert.deepEqual(await used(quota, a), { urls: 0, exports: 0, seats: 0 });
    });

    test("takeLines with its key again returns the original takes", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const first = await quota.takeLines(a, LINES, { idempotencyKey: "lines-1" });
      const again = await quota.takeLines(a, LINES, { idempotencyKey: "lines-1" });
      assert.ok(first.granted && again.granted && again.replayed);
      assert.deepEqual(again.takes.map((t) => t.takeId), first.takes.map((t) => t.takeId));
      await assert.rejects(quota.takeLines(a, { urls: 3 }, { idempotencyKey: "lines-1" }), (e: unknown) =>
        e instanceof ConflictError && e.code === "idempotency_key_reused",
      );
      await assert.rejects(quota.take(a, "urls", { units: 3, idempotencyKey: "lines-1" }), ConflictError);
      assert.deepEqual(await used(quota, a), { urls: 3, exports: 2, seats: 1 });
    });

    test("takeLines refuses what a body may not be", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const many = Object.fromEntries(Array.from({ length: 21 }, (_, i) => [`m${i}`, 1]));
      for (const lines of [{}, [["urls", 1], ["urls", 2]] as Array<[string, number]>, { urls: 0 }, many]) {
        await assert.rejects(quota.takeLines(a, lines), ValidationError);
      }
      await assert.rejects(quota.takeLines(a, LINES, { idempotencyKey: "a\x1fb" }), (e: unknown) =>
        e instanceof ValidationError && "idempotency_key" in e.fields,
      );
      const unknown = await quota.takeLines(acc(), LINES);
      assert.ok(!unknown.granted && unknown.reason === "unknown-account");
    });

    test("takeBatch answers each item as its single take", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await b.setLimit(a, "urls", 3);
      const nobody = acc();
      const [one, refused, replayed, unknown, invalid, seat, ...rest] = await quota.takeBatch([
        { accountId: a, metric: "urls", units: 2, idempotencyKey: "b1" },
        { accountId: a, metric: "urls", units: 2 },
        { accountId: a, metric: "urls", units: 2, idempotencyKey: "b1" },
        { accountId: nobody, metric: "urls" },
        { accountId: a, metric: "urls", units: 0 },
        { accountId: a, metric: "seats" },
      ]);
      assert.equal(rest.length, 0);
      const first = granted(one as TakeResult);
      assert.equal(first.used, 2);
      assert.ok(!(refused instanceof ApiError) && !refused!.granted && refused!.reason === "exhausted" && refused!.remaining === 1);
      assert.ok(!(replayed instanceof ApiError) && granted(replayed!).replayed && granted(replayed!).takeId === first.takeId);
      assert.ok(!(unknown instanceof ApiError) && !unknown!.granted && unknown!.reason === "unknown-account");
      assert.ok(invalid instanceof ValidationError && "units" in invalid.fields);
      assert.ok(!(seat instanceof ApiError) && granted(seat!).period === null);
      assert.deepEqual(await used(quota, a), { urls: 2, exports: 0, seats: 1 });
    });

    test("takeBatch of no items is refused whole", async () => {
      const b = await make();
      await assert.rejects(b.client().takeBatch([]), ValidationError);
    });

    test("a retried batch counts each item once, the answer lost or the request refused", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await b.failNext(1); // the first attempt never reaches the quota logic; the retry does
      const results = await quota.takeBatch([{ accountId: a, metric: "urls" }, { accountId: a, metric: "urls" }]);
      assert.ok(results.every((r) => !(r instanceof ApiError) && r.granted && !r.replayed));
      await b.dropNext(1); // applied, its answer lost: the retry gets each item's original take
      const again = await quota.takeBatch([{ accountId: a, metric: "urls" }, { accountId: a, metric: "urls", units: 3 }]);
      assert.ok(again.every((r) => !(r instanceof ApiError) && r.granted && r.replayed));
      assert.equal((await quota.usage(a, "urls")).used, 6);
    });

    test("withLines keeps every line when fn succeeds", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      const metrics = await quota.withLines(a, LINES, (taken) => taken.takes.map((t) => t.metric));
      assert.deepEqual(metrics, Object.keys(LINES));
      assert.deepEqual(await used(quota, a), LINES);
    });

    test("withLines refused throws LinesExceededError naming the short lines", async () => {
      const b = await make();
      const quota = b.client();
      const a = acc();
      await quota.ensureAccount(a);
      await b.setLimit(a, "seats", 0);
      let ran = false;
      await assert.rejects(quota.withLines(a, LINES, () => (ran = true)), (e: unknown) => {
        assert.ok(e instanceof LinesExceededError && !(e instanceof QuotaExceededError));
        assert.deepEqual(e.lines.map((s) => s.metric), ["seats"]);
        return true;
      });
      assert.equal(ran, false);
      await assert.rejects(quota.withLines(acc(), LINES, () => (ran = true)), UnknownAccountError);
      assert.deepEqual(await used(quota, a), { urls: 0, exports: 0, seats: 0 });
    });

    test("withLines gives every line back when fn fails, or when the take's answer was lost", async () => {
      const b = await make();
      const quota = b.client({ retries: 0 });
      const a = acc();
      await quota.ensureAccount(a);
      const original = new Boom();
      await assert.rejects(
        quota.withLines(a, LINES, () => {
          throw original;
        }),
        (e: unknown) => e === original,
      );
      await b.dropNext(1);
      await assert.rejects(quota.withLines(a, LINES, () => 1), ConnectionFailedError);
      assert.equal((await b.stats()).dropped, 1);
      assert.deepEqual(await used(quota, a), { urls: 0, exports: 0, seats: 0 });
    });
  });
}
