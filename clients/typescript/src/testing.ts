/**
 * An in-memory quota service for product services' own unit tests, the same as the Python client's
 * `quota_client.testing` (clients/python/quota_client/testing.py), rule for rule.
 *
 *     import { InMemoryQuota } from "@quota-ledger/client/testing";
 *
 *     const quota = new InMemoryQuota({ limits: { links: 5, seats: 1 }, metrics: { seats: { kind: "allocation" } } });
 *     await quota.ensureAccount("acc-1");
 *     quota.setLimit("acc-1", "links", 0);
 *     await assert.rejects(quota.withSlot("acc-1", "links", () => work()), QuotaExceededError);
 *
 * `InMemoryQuota` is a `QuotaClient` whose fetch is `InMemoryService`: code typed against the client
 * takes the fake as it is, and every answer goes through the client's own parsing, errors, retries
 * and `withSlot`. The service side keeps what the real one keeps for these calls: accounts,
 * per-metric limits and overrides, counters of the three kinds of metric (consumed monthly,
 * consumed daily, allocations held until released), boolean features and their overrides, checks,
 * takes (multi-line takes and batches too), releases, idempotency keys, exhaustion, and the same
 * answers and error codes; the client's contract tests run against both. Time is the service's
 * `clock`, which a test can set. Not kept: plans and billing (one plan for every account, so no
 * free-plan fallback), the ledger, admin resets, authentication (any key is accepted).
 */

import { QuotaClient } from "./client.js";
import type { OnReleaseError } from "./client.js";

// The service's words (service/vocabulary.py) that this fake answers with.
const ACCOUNT_KINDS = ["user", "team"];
const ACCOUNT_ID = /^[A-Za-z0-9._:@-]{1,128}$/;
const ACCOUNT_ID_RULE = "1-128 characters of [A-Za-z0-9._:@-]";
const ALREADY_RELEASED = "already_released";
const PERIOD_CLOSED = "period_closed";
const OVERRIDE = "override";
const PLAN = "plan"; // no plans here, so no free_fallback
const NO_SUBSCRIPTION = "none";
const CONSUMABLE = "consumable";
const ALLOCATION = "allocation";
const MONTH = "month";
const DAY = "day";
const USAGE_PERIOD = /^[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?$/;
const HELD = "held"; // the period of an allocation's counter; the API shows it as null
const MAX_UNITS = 2 ** 31 - 1;
const MAX_LINES = 20;
const MAX_ITEMS = 1000;
const LINE_SEPARATOR = "\x1f";
const BASE_URL = "http://quota.in-memory";

/** The service's words and bounds as this fake copies them; the service's test run holds each to its
 * original (tests/client/test_typescript.py passes them, test/testing.test.ts compares). */
export const VOCABULARY = {
  accountKinds: ACCOUNT_KINDS,
  accountId: ACCOUNT_ID.source,
  accountIdRule: ACCOUNT_ID_RULE,
  releaseReasons: [ALREADY_RELEASED, PERIOD_CLOSED],
  limitSources: [OVERRIDE, PLAN],
  noSubscription: NO_SUBSCRIPTION,
  metricKinds: [CONSUMABLE, ALLOCATION],
  resets: [MONTH, DAY],
  held: HELD,
  usagePeriod: USAGE_PERIOD.source,
  maxUnits: MAX_UNITS,
  maxLines: MAX_LINES,
  maxItems: MAX_ITEMS,
  lineSeparator: LINE_SEPARATOR,
} as const;

type Json = Record<string, unknown>;
type Reply = [number, Json];
type Fields = Record<string, string[]>;

/** plans.toml's [metrics]: `{ seats: { kind: "allocation" }, exports: { reset: "day" } }`. */
export type Metrics = Record<string, { kind?: "consumable" | "allocation"; reset?: "month" | "day" }>;

class Refused extends Error {
  readonly reply: Reply;
  constructor(status: number, code: string, message: string, details: Json = {}) {
    super(message);
    this.reply = [status, { error: code, message, ...details }];
  }
}

function invalid(fields: Fields, message = "the request is not valid"): Refused {
  return new Refused(422, "validation_failed", message, { fields });
}

interface AccountState {
  kind: string;
  deleted: boolean;
  overrides: Map<string, number | null>;
  featureOverrides: Map<string, boolean>;
}

interface Take {
  takeId: number;
  accountId: string;
  metric: string;
  units: number;
  period: string; // the counter's: a month, a day, or HELD
  answer: Json; // as first answered; a replay repeats it
  released: boolean;
}

interface MetricRule {
  kind: string;
  reset: string | null;
}

function periodAt(rule: MetricRule, at: Date): string {
  if (rule.reset === null) return HELD;
  const iso = at.toISOString();
  return rule.reset === DAY ? iso.slice(0, 10) : iso.slice(0, 7);
}

function metricKinds(limits: Record<string, unknown>, metrics: Metrics): Map<string, MetricRule> {
  const kinds = new Map<string, MetricRule>();
  for (const [name, item] of Object.entries(metrics)) {
    if (!(name in limits)) throw new Error(`metrics.${name}: no limit names this metric`);
    for (const key of Object.keys(item)) {
      if (key !== "kind" && key !== "reset") throw new Error(`metrics.${name}.${key}: unknown key; known: kind, reset`);
    }
    const kind = item.kind ?? CONSUMABLE;
    if (kind !== CONSUMABLE && kind !== ALLOCATION) {
      throw new Error(`metrics.${name}.kind: ${JSON.stringify(kind)}; one of consumable, allocation`);
    }
    if (kind === ALLOCATION && "reset" in item) throw new Error(`metrics.${name}.reset: an allocation is never reset`);
    const reset = kind === ALLOCATION ? null : (item.reset ?? MONTH);
    if (reset !== null && reset !== MONTH && reset !== DAY) {
      throw new Error(`metrics.${name}.reset: ${JSON.stringify(reset)}; one of month, day`);
    }
    kinds.set(name, { kind, reset });
  }
  return kinds;
}

/** When `period` ends (ISO 8601, UTC): the next month's or day's start; null for HELD. */
function resetsAt(period: string): string | null {
  if (period === HELD) return null;
  if (period.length === "YYYY-MM-DD".length) {
    const end = new Date(`${period}T00:00:00Z`);
    end.setUTCDate(end.getUTCDate() + 1);
    return `${end.toISOString().slice(0, 10)}T00:00:00Z`;
  }
  const year = Number(period.slice(0, 4));
  const month = Number(period.slice(5));
  return `${String(year + Math.floor(month / 12)).padStart(4, "0")}-${String((month % 12) + 1).padStart(2, "0")}-01T00:00:00Z`;
}

function shown(period: string): string | null {
  return period === HELD ? null : period;
}

function isUnits(units: unknown): units is number {
  return typeof units === "number" && Number.isInteger(units) && units >= 1 && units <= MAX_UNITS;
}

export interface InMemoryServiceOptions {
  /** Every account's plan limit per metric (null = unlimited); other metrics are unknown. */
  limits: Record<string, number | null>;
  /** plans.toml's [metrics]: a metric not in it is consumed monthly. */
  metrics?: Metrics;
  /** Every boolean feature, with whether the plan has it. */
  features?: Record<string, boolean>;
  plan?: string;
  /** The time; default the system clock. `now` and `period` set it. */
  clock?: () => Date;
}

/**
 * The service's product API in memory, as a `fetch`. `limits` are every account's plan limits;
 * `metrics` the kinds of metric (`{ kind: "allocation" }` is held until released, `{ reset: "day" }`
 * consumed daily, UTC); `features` every boolean feature. Admin actions (`setLimit`, `setFeature`,
 * `deleteAccount`...) act at once; `failNext` makes the next requests fail; `now` / `period` move
 * the clock.
 */
export class InMemoryService {
  readonly limits: Record<string, number | null>;
  readonly features: Record<string, boolean>;
  readonly plan: string;
  clock: () => Date;
  /** Every request that arrived, failed ones included. */
  requests = 0;
  readonly #kinds: Map<string, MetricRule>;
  readonly #accounts = new Map<string, AccountState>();
  readonly #used = new Map<string, number>();
  readonly #takes = new Map<number, Take>();
  // Each key's takes: one single take's, or a multi-line take's, in metric order.
  readonly #keys = new Map<string, number[]>();
  readonly #failures: number[] = [];

  constructor(options: InMemoryServiceOptions) {
    this.limits = { ...options.limits };
    this.#kinds = metricKinds(this.limits, options.metrics ?? {});
    this.features = { ...(options.features ?? {}) };
    for (const name of Object.keys(this.features)) {
      if (name in this.limits) throw new Error(`features: ${JSON.stringify(name)} is also a metric; a name is one or the other`);
    }
    this.plan = options.plan ?? "free";
    this.clock = options.clock ?? (() => new Date());
  }

  /** The service's time. Setting it stops the clock at that instant. */
  get now(): Date {
    return this.clock();
  }
  set now(at: Date) {
    const fixed = new Date(at.getTime());
    this.clock = () => fixed;
  }

  /** The current month, YYYY-MM. Setting it stops the clock at the month's first instant (UTC). */
  get period(): string {
    return this.now.toISOString().slice(0, 7);
  }
  set period(month: string) {
    if (!/^[0-9]{4}-(0[1-9]|1[0-2])$/.test(month)) throw new Error(`period: YYYY-MM, not ${JSON.stringify(month)}`);
    this.now = new Date(`${month}-01T00:00:00Z`);
  }

  /** Answer the next `count` requests with `status` and do nothing, as a service that is down would. */
  failNext(count = 1, status = 503): void {
    for (let i = 0; i < count; i++) this.#failures.push(status);
  }

  // What an admin would do through the admin API.

  /** A sticky override of the account's limit (null = unlimited). */
  setLimit(accountId: string, metric: string, limit: number | null): void {
    if (!(metric in this.limits)) throw new Error(`unknown metric ${JSON.stringify(metric)}; known: ${Object.keys(this.limits).join(", ")}`);
    this.#admin(accountId).overrides.set(metric, limit);
  }

  clearLimit(accountId: string, metric: string): void {
    this.#admin(accountId).overrides.delete(metric);
  }

  /** A sticky override of a boolean feature. */
  setFeature(accountId: string, feature: string, enabled: boolean): void {
    if (!(feature in this.features)) {
      throw new Error(`unknown feature ${JSON.stringify(feature)}; known: ${Object.keys(this.features).join(", ") || "none"}`);
    }
    this.#admin(accountId).featureOverrides.set(feature, enabled);
  }

  clearFeature(accountId: string, feature: string): void {
    this.#admin(accountId).featureOverrides.delete(feature);
  }

  /** Soft delete: takes are refused with 410 from now on. */
  deleteAccount(accountId: string): void {
    this.#admin(accountId).deleted = true;
  }

  #admin(accountId: string): AccountState {
    const account = this.#accounts.get(accountId);
    if (account === undefined) throw new Error(`unknown account ${JSON.stringify(accountId)}; create it with ensureAccount first`);
    return account;
  }

  /** The service as a fetch: a request in, a Response out. */
  async fetch(input: string, init: RequestInit = {}): Promise<Response> {
    this.requests += 1;
    const failure = this.#failures.shift();
    if (failure !== undefined) return json(failure, { error: "unavailable", message: "failing on purpose" });
    const url = new URL(input);
    const params: Record<string, string> = {};
    url.searchParams.forEach((value, name) => (params[name] = value));
    const method = (init.method ?? "GET").toUpperCase();
    const content = typeof init.body === "string" ? init.body : "";
    let reply: Reply;
    try {
      reply = this.#route(method, decodeURIComponent(url.pathname), params, content);
    } catch (error) {
      if (!(error instanceof Refused)) throw error;
      reply = error.reply;
    }
    return json(...reply);
  }

  #route(method: string, path: string, params: Record<string, string>, content: string): Reply {
    const parts = path.replace(/^\/+|\/+$/g, "").split("/");
    const [v1, what, id, sub, takeId, release] = parts;
    if (v1 === "v1" && what === "accounts" && id !== undefined) {
      if (parts.length === 3 && method === "PUT") return this.#putAccount(id, jsonObject(content));
      if (parts.length === 3 && method === "GET") return [200, this.#view(accountId(id))];
      if (parts.length === 4 && sub === "takes" && method === "POST") {
        const body = jsonObject(content);
        return "lines" in body ? this.#takeLines(id, body) : this.#take(id, body);
      }
      if (parts.length === 6 && sub === "takes" && release === "release" && method === "POST" && /^[0-9]+$/.test(takeId!)) {
        return this.#release(Number(takeId), accountId(id));
      }
      if (parts.length === 4 && sub === "usage" && method === "GET") return this.#usage(id, params);
      if (parts.length === 4 && sub === "check" && method === "GET") return this.#check(id, params);
    }
    if (v1 === "v1" && what === "takes" && parts.length === 3 && id === "batch" && method === "POST") {
      return this.#batch(jsonObject(content));
    }
    if (v1 === "v1" && what === "takes" && parts.length === 4 && sub === "release" && method === "POST" && /^[0-9]+$/.test(id!)) {
      return this.#release(Number(id));
    }
    throw new Refused(404, "not_found", `no route ${method} ${path}`);
  }

  // The product API.

  #putAccount(id: string, body: Json): Reply {
    only(body, "kind", "stripe_customer_id");
    if (!ACCOUNT_KINDS.includes(body["kind"] as string)) {
      throw invalid({ kind: [`Must be one of: ${ACCOUNT_KINDS.join(", ")}.`] });
    }
    const customer = body["stripe_customer_id"];
    if (customer !== undefined && customer !== null && !(typeof customer === "string" && customer.length >= 1 && customer.length <= 255)) {
      throw invalid({ stripe_customer_id: ["Length must be between 1 and 255."] });
    }
    const account = this.#accounts.get(accountId(id));
    if (account?.deleted) throw new Refused(410, "account_deleted", `account ${JSON.stringify(id)} was deleted`);
    if (account === undefined) {
      this.#accounts.set(id, { kind: body["kind"] as string, deleted: false, overrides: new Map(), featureOverrides: new Map() });
    } else {
      account.kind = body["kind"] as string;
    }
    return [account === undefined ? 201 : 200, this.#view(id)];
  }

  #take(id: string, body: Json): Reply {
    only(body, "metric", "units", "idempotency_key");
    const metric = body["metric"];
    const units = body["units"] ?? 1;
    const key = body["idempotency_key"];
    const fields: Fields = {};
    if (typeof metric !== "string" || metric.length < 1 || metric.length > 64) {
      fields["metric"] = ["A string of 1-64 characters is required."];
    }
    if (!isUnits(units)) fields["units"] = [`An integer from 1 to ${MAX_UNITS}.`];
    checkKey(key, fields);
    if (Object.keys(fields).length) throw invalid(fields);
    accountId(id);
    const m = metric as string;
    const u = units as number;
    this.#knownMetric(m);
    if (typeof key === "string" && this.#keys.has(keyOf(id, key))) {
      const earlier = this.#earlier(id, key, [[m, u]]);
      return [200, earlier[0]!.answer];
    }
    const account = this.#live(id);
    const period = this.#current(m);
    const [limit, source] = this.#limit(account, m);
    const used = this.#used.get(counterOf(id, m, period)) ?? 0;
    if (limit !== null && used + u > limit) {
      throw new Refused(409, "quota_exhausted", `${m}: ${u} more would exceed the limit of ${limit}`, {
        used,
        limit,
        remaining: Math.max(limit - used, 0),
        period: shown(period),
        limit_source: source,
      });
    }
    const take = this.#record(id, m, u, period);
    if (typeof key === "string") this.#keys.set(keyOf(id, key), [take.takeId]);
    return [201, take.answer];
  }

  #record(id: string, metric: string, units: number, period: string): Take {
    const counter = counterOf(id, metric, period);
    this.#used.set(counter, (this.#used.get(counter) ?? 0) + units);
    const take: Take = { takeId: this.#takes.size + 1, accountId: id, metric, units, period, answer: {}, released: false };
    // no grants in this fake: every take is the allowance's
    take.answer = { take_id: take.takeId, ...this.#counterJson(id, metric), units, from_credits: 0 };
    this.#takes.set(take.takeId, take);
    return take;
  }

  #takeLines(id: string, body: Json): Reply {
    only(body, "lines", "idempotency_key");
    const key = body["idempotency_key"];
    const fields: Fields = {};
    const asked = lines(body["lines"], fields);
    checkKey(key, fields);
    if (Object.keys(fields).length) throw invalid(fields);
    accountId(id);
    for (const [metric] of asked) this.#knownMetric(metric);
    if (typeof key === "string" && this.#keys.has(keyOf(id, key))) {
      const byMetric = new Map(this.#earlier(id, key, asked).map((t) => [t.metric, t]));
      return [200, { takes: asked.map(([m]) => byMetric.get(m)!.answer) }];
    }
    const account = this.#live(id);
    const short: Json[] = [];
    for (const [metric, units] of asked) {
      const [limit] = this.#limit(account, metric);
      const used = this.#used.get(counterOf(id, metric, this.#current(metric))) ?? 0;
      if (limit !== null && used + units > limit) {
        short.push({ metric, units, remaining: Math.max(limit - used, 0), limit });
      }
    }
    if (short.length) {
      const message = short.map((s) => `${s["metric"]}: ${s["units"]} more would exceed the limit of ${s["limit"]}`).join("; ");
      throw new Refused(409, "quota_exhausted", message, { lines: short });
    }
    const taken = new Map<string, Take>();
    for (const [metric, units] of asked) taken.set(metric, this.#record(id, metric, units, this.#current(metric)));
    if (typeof key === "string") {
      this.#keys.set(keyOf(id, key), [...taken.keys()].sort().map((m) => taken.get(m)!.takeId));
    }
    return [201, { takes: asked.map(([m]) => taken.get(m)!.answer) }];
  }

  /** The takes of a key used before, if they are what `asked` asks again; else 409 reused. */
  #earlier(id: string, key: string, asked: Array<[string, number]>): Take[] {
    const earlier = this.#keys.get(keyOf(id, key))!.map((takeId) => this.#takes.get(takeId)!);
    const was = earlier.map((t) => `${t.metric}\x00${t.units}`).sort().join("\x01");
    const now = asked.map(([m, u]) => `${m}\x00${u}`).sort().join("\x01");
    if (was !== now) {
      throw new Refused(409, "idempotency_key_reused", "This idempotency key was already used for a different take on this account.", {
        take_id: earlier[0]!.takeId,
      });
    }
    return earlier;
  }

  #batch(body: Json): Reply {
    only(body, "items");
    const items = body["items"];
    if (!Array.isArray(items) || items.length < 1 || items.length > MAX_ITEMS) {
      throw invalid({ items: [`A list of 1 to ${MAX_ITEMS} objects.`] });
    }
    if (!items.every((item) => item !== null && typeof item === "object" && !Array.isArray(item))) {
      throw invalid({ items: ["Not a valid mapping type."] });
    }
    const results = (items as Json[]).map((item) => {
      let reply: Reply;
      try {
        const id = item["account_id"];
        if (typeof id !== "string") throw invalid({ account_id: ["Missing data for required field."] });
        const { account_id: _, ...rest } = item;
        reply = this.#take(id, rest);
      } catch (error) {
        if (!(error instanceof Refused)) throw error;
        reply = error.reply;
      }
      return { status: reply[0], ...reply[1] };
    });
    return [200, { results }];
  }

  #release(takeId: number, onAccount?: string): Reply {
    const take = this.#takes.get(takeId);
    if (take === undefined || (onAccount !== undefined && take.accountId !== onAccount)) {
      throw new Refused(404, "unknown_take", `unknown take ${takeId}`);
    }
    if (take.released) return [200, { released: false, reason: ALREADY_RELEASED, take_id: takeId }];
    if (take.period !== this.#current(take.metric)) {
      return [200, { released: false, reason: PERIOD_CLOSED, take_id: takeId }];
    }
    take.released = true;
    const counter = counterOf(take.accountId, take.metric, take.period);
    const given = Math.min(take.units, this.#used.get(counter) ?? 0);
    this.#used.set(counter, (this.#used.get(counter) ?? 0) - given);
    return [200, { released: true, take_id: takeId, ...this.#counterJson(take.accountId, take.metric), units: given }];
  }

  #usage(id: string, params: Record<string, string>): Reply {
    const fields: Fields = {};
    for (const name of Object.keys(params)) if (name !== "metric" && name !== "period") fields[name] = ["Unknown field."];
    const metric = params["metric"];
    let period = params["period"];
    if (metric === undefined) fields["metric"] = ["Missing data for required field."];
    if (period !== undefined && !USAGE_PERIOD.test(period)) fields["period"] = ["a calendar month YYYY-MM, or a day YYYY-MM-DD"];
    if (Object.keys(fields).length) throw invalid(fields);
    accountId(id);
    this.#knownMetric(metric!);
    const current = this.#current(metric!);
    period = period ?? current;
    if (period.length !== current.length) {
      throw invalid({ period: [PERIOD_OF_KIND[current.length]!.replace("{metric}", metric!)] }, "the period is not of the metric's kind");
    }
    this.#account(id);
    return [200, { metric, period: shown(period), used: this.#used.get(counterOf(id, metric!, period)) ?? 0 }];
  }

  #check(id: string, params: Record<string, string>): Reply {
    const fields: Fields = {};
    for (const name of Object.keys(params)) {
      if (!["metric", "units", "feature"].includes(name)) fields[name] = ["Unknown field."];
    }
    const { metric, feature, units: unitsText } = params;
    for (const [name, value] of [["metric", metric], ["feature", feature]] as const) {
      if (value !== undefined && (value.length < 1 || value.length > 64)) fields[name] = ["Length must be between 1 and 64."];
    }
    let units = 1;
    if (unitsText !== undefined) {
      if (/^[0-9]+$/.test(unitsText) && Number(unitsText) >= 1 && Number(unitsText) <= MAX_UNITS) units = Number(unitsText);
      else fields["units"] = [`An integer from 1 to ${MAX_UNITS}.`];
    }
    if ((metric === undefined) === (feature === undefined)) fields["_schema"] = ["name either a metric or a feature"];
    else if (feature !== undefined && unitsText !== undefined) fields["units"] = ["units applies to a metric"];
    if (Object.keys(fields).length) throw invalid(fields);
    accountId(id);
    if (feature !== undefined) {
      this.#knownFeature(feature);
      const [enabled, source] = this.#feature(this.#live(id), feature);
      return [200, { allowed: enabled, feature, source }];
    }
    this.#knownMetric(metric!);
    this.#live(id);
    const counter = this.#counterJson(id, metric!);
    const limit = counter["limit"] as number | null;
    const used = counter["used"] as number;
    return [200, { ...counter, allowed: limit === null || used + units <= limit, units, resets_at: resetsAt(this.#current(metric!)) }];
  }

  // Helpers.

  #knownMetric(metric: string): void {
    if (!(metric in this.limits)) {
      throw new Refused(422, "unknown_metric", `unknown metric ${JSON.stringify(metric)}; known: ${Object.keys(this.limits).join(", ")}`);
    }
  }

  #knownFeature(feature: string): void {
    if (!(feature in this.features)) {
      const known = Object.keys(this.features).join(", ") || "none";
      throw new Refused(422, "unknown_feature", `unknown feature ${JSON.stringify(feature)}; known: ${known}`);
    }
  }

  /** The period a take of `metric` counts in now: this month, today, or HELD. */
  #current(metric: string): string {
    return periodAt(this.#kinds.get(metric) ?? { kind: CONSUMABLE, reset: MONTH }, this.now);
  }

  #account(id: string): AccountState {
    const account = this.#accounts.get(id);
    if (account === undefined) throw new Refused(404, "unknown_account", `unknown account ${JSON.stringify(id)}`);
    return account;
  }

  #live(id: string): AccountState {
    const account = this.#account(id);
    if (account.deleted) throw new Refused(410, "account_deleted", `account ${JSON.stringify(id)} was deleted`);
    return account;
  }

  #feature(account: AccountState, feature: string): [boolean, string] {
    const override = account.featureOverrides.get(feature);
    return override !== undefined ? [override, OVERRIDE] : [this.features[feature]!, PLAN];
  }

  #limit(account: AccountState, metric: string): [number | null, string] {
    if (account.overrides.has(metric)) return [account.overrides.get(metric)!, OVERRIDE];
    return [this.limits[metric]!, PLAN];
  }

  #counterJson(id: string, metric: string): Json {
    const period = this.#current(metric);
    const [limit, source] = this.#limit(this.#accounts.get(id)!, metric);
    const used = this.#used.get(counterOf(id, metric, period)) ?? 0;
    return {
      metric,
      used,
      limit,
      remaining: limit === null ? null : Math.max(limit - used, 0),
      period: shown(period),
      limit_source: source,
    };
  }

  #view(id: string): Json {
    const account = this.#account(id);
    const limits: Record<string, Json> = {};
    for (const metric of Object.keys(this.limits)) {
      const { metric: _, ...counter } = this.#counterJson(id, metric);
      const rule = this.#kinds.get(metric) ?? { kind: CONSUMABLE, reset: MONTH };
      const limit = counter["limit"] as number | null;
      limits[metric] = {
        ...counter,
        kind: rule.kind,
        reset: rule.reset,
        over_limit: limit !== null && (counter["used"] as number) > limit,
        resets_at: resetsAt(this.#current(metric)),
        credits: 0,
      };
    }
    const features: Record<string, Json> = {};
    for (const feature of Object.keys(this.features)) {
      const [enabled, source] = this.#feature(account, feature);
      features[feature] = { enabled, source };
    }
    return {
      id,
      kind: account.kind,
      plan: this.plan,
      subscription_status: NO_SUBSCRIPTION,
      deleted: account.deleted,
      limits,
      features,
    };
  }
}

// What a usage query must name for a metric whose current period is this long, as the service says.
const PERIOD_OF_KIND: Record<number, string> = {
  [HELD.length]: "{metric} is an allocation: it has no period; omit period for what is held now",
  ["YYYY-MM".length]: "{metric} resets monthly: name a month, YYYY-MM",
  ["YYYY-MM-DD".length]: "{metric} resets daily: name a day, YYYY-MM-DD",
};

function json(status: number, body: Json): Response {
  return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });
}

function keyOf(id: string, key: string): string {
  return JSON.stringify([id, key]);
}

function counterOf(id: string, metric: string, period: string): string {
  return JSON.stringify([id, metric, period]);
}

function jsonObject(content: string): Json {
  let body: unknown = null;
  try {
    body = content ? JSON.parse(content) : null;
  } catch {
    body = null;
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new Refused(400, "invalid_json", "the body must be a JSON object");
  }
  return body as Json;
}

function checkKey(key: unknown, fields: Fields): void {
  if (key !== undefined && key !== null && !(typeof key === "string" && key.length >= 1 && key.length <= 255)) {
    fields["idempotency_key"] = ["Length must be between 1 and 255."];
  } else if (typeof key === "string" && key.includes(LINE_SEPARATOR)) {
    fields["idempotency_key"] = ["Must not contain U+001F (it separates a multi-line take's lines)."];
  }
}

/** A multi-line take's lines as [metric, units], or their faults in `fields`. */
function lines(value: unknown, fields: Fields): Array<[string, number]> {
  if (!Array.isArray(value) || value.length < 1 || value.length > MAX_LINES) {
    fields["lines"] = [`Length must be between 1 and ${MAX_LINES}.`];
    return [];
  }
  const asked: Array<[string, number]> = [];
  value.forEach((line: unknown, i) => {
    if (line === null || typeof line !== "object" || Array.isArray(line) || Object.keys(line).some((k) => k !== "metric" && k !== "units")) {
      fields[`lines.${i}`] = ["A line is {metric, units?}."];
      return;
    }
    const { metric, units = 1 } = line as Json;
    if (typeof metric !== "string" || metric.length < 1 || metric.length > 64) {
      fields[`lines.${i}.metric`] = ["A string of 1-64 characters is required."];
    } else if (!isUnits(units)) {
      fields[`lines.${i}.units`] = [`An integer from 1 to ${MAX_UNITS}.`];
    } else {
      asked.push([metric, units]);
    }
  });
  if (new Set(asked.map(([m]) => m)).size < asked.length) fields["lines"] = ["each line names a metric of its own"];
  return asked;
}

function only(body: Json, ...names: string[]): void {
  const unknown: Fields = {};
  for (const name of Object.keys(body)) if (!names.includes(name)) unknown[name] = ["Unknown field."];
  if (Object.keys(unknown).length) throw invalid(unknown);
}

function accountId(value: string): string {
  if (!ACCOUNT_ID.test(value)) throw invalid({ id: [ACCOUNT_ID_RULE] }, "invalid account id");
  return value;
}

export interface InMemoryQuotaOptions extends Partial<InMemoryServiceOptions> {
  /** A service to share (e.g. between several fakes), instead of one made from limits/metrics/features. */
  service?: InMemoryService;
  /** As QuotaClient's; the waits between them are 0 unless `backoffMs` says otherwise. */
  retries?: number;
  backoffMs?: number;
  onReleaseError?: OnReleaseError;
}

/**
 * A QuotaClient over an `InMemoryService` (made from `limits`, `metrics`, `features`, or the
 * `service` given). Adds the service's admin actions: `setLimit`, `clearLimit`, `setFeature`,
 * `clearFeature`, `deleteAccount`; `service.failNext()` makes the next calls fail with 503, and
 * `service.now` (or `service.period`) moves the clock.
 */
export class InMemoryQuota extends QuotaClient {
  readonly service: InMemoryService;

  constructor(options: InMemoryQuotaOptions) {
    const { service, retries, backoffMs, onReleaseError, ...made } = options;
    if (service !== undefined && (made.limits !== undefined || made.metrics !== undefined || made.features !== undefined)) {
      throw new TypeError("give limits, metrics and features, or an InMemoryService made with them");
    }
    if (service === undefined && made.limits === undefined) {
      throw new TypeError("give the metrics' limits ({ limits: { urls: 50 } }) or an InMemoryService");
    }
    const backend = service ?? new InMemoryService(made as InMemoryServiceOptions);
    super({
      baseUrl: BASE_URL,
      apiKey: "in-memory",
      retries: retries ?? 3,
      backoffMs: backoffMs ?? 0,
      ...(onReleaseError ? { onReleaseError } : {}),
      fetch: (input, init) => backend.fetch(input, init),
    });
    this.service = backend;
  }

  setLimit(accountId: string, metric: string, limit: number | null): void {
    this.service.setLimit(accountId, metric, limit);
  }

  clearLimit(accountId: string, metric: string): void {
    this.service.clearLimit(accountId, metric);
  }

  setFeature(accountId: string, feature: string, enabled: boolean): void {
    this.service.setFeature(accountId, feature, enabled);
  }

  clearFeature(accountId: string, feature: string): void {
    this.service.clearFeature(accountId, feature);
  }

  deleteAccount(accountId: string): void {
    this.service.deleteAccount(accountId);
  }
}
