/**
 * What the service answers, as the client hands it on: camelCase, numbers as numbers, `null` for
 * "unlimited" and "no period". Enumerations come from src/wire.ts, which is checked against the
 * service's /openapi.json. Parsers read the fields they know and ignore the rest, so a service that
 * adds fields does not break an older client.
 */

import { ApiError } from "./errors.js";
import type { Wire } from "./wire.js";

export type LimitSource = NonNullable<Wire<"TakeResponse">["limit_source"]>;
export type AccountKind = NonNullable<Wire<"Account">["kind"]>;
export type SubscriptionStatus = NonNullable<Wire<"Account">["subscription_status"]>;
export type MetricKind = NonNullable<Wire<"MetricLimit">["kind"]>;
export type Reset = NonNullable<Wire<"MetricLimit">["reset"]>;
export type ReleaseReason = NonNullable<Wire<"ReleaseResponse">["reason"]>;

/** A take the service granted. Pass it to `release` to give its units back. `limit` null =
 * unlimited; `period` null for an allocation (seats); `replayed`: the idempotency key returned an
 * earlier take, and nothing moved this time. */
export interface TakeGranted {
  granted: true;
  accountId: string;
  metric: string;
  units: number;
  takeId: number;
  used: number;
  limit: number | null;
  remaining: number | null;
  limitSource: LimitSource | null;
  period: string | null;
  /** Of `units`, those drawn from the account's grants (0: the plan allowance covered the take). */
  fromCredits: number;
  idempotencyKey: string;
  replayed: boolean;
}

/** A take refused because the quota is spent: nothing was taken; the counter as it stood. */
export interface TakeExhausted {
  granted: false;
  reason: "exhausted";
  accountId: string;
  metric: string;
  units: number;
  used: number;
  limit: number | null;
  remaining: number | null;
  limitSource: LimitSource | null;
  period: string | null;
  idempotencyKey: string;
  message: string;
}

/** A take refused because no account has this id ("unknown-account") or it was deleted
 * ("deleted"). */
export interface TakeRefusedAccount {
  granted: false;
  reason: "unknown-account" | "deleted";
  accountId: string;
  metric: string;
  units: number;
  idempotencyKey: string;
  message: string;
}

export type TakeRefused = TakeExhausted | TakeRefusedAccount;
export type TakeResult = TakeGranted | TakeRefused;
export type RefusalReason = TakeRefused["reason"];

/** The lines of a multi-line take: `{ metric: units }`, or `[metric, units]` pairs, in order. */
export type Lines = Record<string, number> | ReadonlyArray<readonly [string, number]>;

/** A line of a refused multi-line take that did not fit. */
export interface LineShortfall {
  metric: string;
  units: number;
  remaining: number | null;
  limit: number | null;
}

/** Every line taken, in the order given; each take is released on its own. */
export interface TakeLinesGranted {
  granted: true;
  accountId: string;
  lines: Array<[string, number]>;
  takes: TakeGranted[];
  idempotencyKey: string;
  replayed: boolean;
}

/** A quota is spent: nothing was taken; `short` names every line that did not fit. */
export interface TakeLinesExhausted {
  granted: false;
  reason: "exhausted";
  accountId: string;
  lines: Array<[string, number]>;
  short: LineShortfall[];
  idempotencyKey: string;
  message: string;
}

export interface TakeLinesRefusedAccount {
  granted: false;
  reason: "unknown-account" | "deleted";
  accountId: string;
  lines: Array<[string, number]>;
  idempotencyKey: string;
  message: string;
}

export type TakeLinesRefused = TakeLinesExhausted | TakeLinesRefusedAccount;
export type TakeLinesResult = TakeLinesGranted | TakeLinesRefused;

/** One take of `takeBatch`: what `take` takes, for any account. */
export interface BatchItem {
  accountId: string;
  metric: string;
  units?: number;
  idempotencyKey?: string;
}

/** What `onReleaseError` is handed: a granted take, or one whose answer never arrived (`takeId`
 * null): `take(accountId, metric, { units, idempotencyKey })` returns it, to be released. */
export interface HeldTake {
  accountId: string;
  metric: string;
  units: number;
  idempotencyKey: string;
  takeId: number | null;
}

/** `released` false says why in `reason`: "already_released" (also what a retried release whose
 * first answer was lost gets) or "period_closed" (a consumable's take from an earlier period). */
export interface ReleaseResult {
  released: boolean;
  takeId: number;
  reason: ReleaseReason | null;
  metric: string | null;
  units: number;
  used: number | null;
  limit: number | null;
  remaining: number | null;
  limitSource: LimitSource | null;
  period: string | null;
}

/** One metric of an account now; see the service's docs/api.md. */
export interface MetricLimit {
  limit: number | null;
  limitSource: LimitSource;
  used: number;
  remaining: number | null;
  period: string | null;
  resetsAt: string | null;
  kind: MetricKind;
  reset: Reset | null;
  overLimit: boolean;
  /** What the account's live grants of this metric have left, drawn after the allowance. */
  credits: number;
}

export interface FeatureState {
  enabled: boolean;
  source: LimitSource;
}

export interface Account {
  id: string;
  kind: AccountKind;
  plan: string;
  subscriptionStatus: SubscriptionStatus;
  deleted: boolean;
  limits: Record<string, MetricLimit>;
  /** Every feature any plan names. */
  features: Record<string, FeatureState>;
}

/** Units of `metric` used in `period`; an allocation's is what is held now (`period` null). */
export interface Usage {
  metric: string;
  period: string | null;
  used: number;
}

/** Whether a take of `units` would be granted now; takes nothing, and can be outdated by the time
 * the caller acts: take all the same and handle a refusal. */
export interface MetricCheck {
  allowed: boolean;
  metric: string;
  units: number;
  limit: number | null;
  used: number;
  remaining: number | null;
  limitSource: LimitSource;
  period: string | null;
  resetsAt: string | null;
}

export interface FeatureCheck {
  allowed: boolean;
  feature: string;
  source: LimitSource;
}

// Parsers. A field the client needs and does not find is an ApiError "invalid_response".

function invalid(status: number, what: string): ApiError {
  return new ApiError(status, "invalid_response", what);
}

function need<T>(value: T | undefined, name: string, status: number): T {
  if (value === undefined) throw invalid(status, `the answer has no ${name}`);
  return value;
}

function orNull<T>(value: T | null | undefined): T | null {
  return value === undefined ? null : value;
}

export function takeGranted(
  body: Wire<"TakeResponse">,
  ctx: { accountId: string; units: number; idempotencyKey: string; replayed: boolean; status: number },
): TakeGranted {
  return {
    granted: true,
    accountId: ctx.accountId,
    metric: need(body.metric, "metric", ctx.status),
    units: body.units ?? ctx.units,
    takeId: need(body.take_id, "take_id", ctx.status),
    used: need(body.used, "used", ctx.status),
    limit: orNull(body.limit),
    remaining: orNull(body.remaining),
    limitSource: orNull(body.limit_source),
    period: orNull(body.period),
    fromCredits: body.from_credits ?? 0,
    idempotencyKey: ctx.idempotencyKey,
    replayed: ctx.replayed,
  };
}

export function takeExhausted(
  body: Wire<"Conflict">,
  ctx: { accountId: string; metric: string; units: number; idempotencyKey: string },
): TakeExhausted {
  return {
    granted: false,
    reason: "exhausted",
    ...ctx,
    used: need(body.used, "used", 409),
    limit: orNull(body.limit),
    remaining: orNull(body.remaining),
    limitSource: orNull(body.limit_source),
    period: orNull(body.period),
    message: body.message ?? "",
  };
}

export function lineShortfall(line: Wire<"LineShortfall">): LineShortfall {
  return {
    metric: need(line.metric, "metric", 409),
    units: need(line.units, "units", 409),
    remaining: orNull(line.remaining),
    limit: orNull(line.limit),
  };
}

export function releaseResult(body: Wire<"ReleaseResponse">, status: number): ReleaseResult {
  return {
    released: need(body.released, "released", status),
    takeId: need(body.take_id, "take_id", status),
    reason: orNull(body.reason),
    metric: orNull(body.metric),
    units: body.units ?? 0,
    used: orNull(body.used),
    limit: orNull(body.limit),
    remaining: orNull(body.remaining),
    limitSource: orNull(body.limit_source),
    period: orNull(body.period),
  };
}

function metricLimit(body: Wire<"MetricLimit">, status: number): MetricLimit {
  const limit = orNull(body.limit);
  const used = need(body.used, "used", status);
  return {
    limit,
    limitSource: need(body.limit_source, "limit_source", status),
    used,
    remaining: orNull(body.remaining),
    period: orNull(body.period),
    resetsAt: orNull(body.resets_at),
    // A service from before metric kinds had monthly consumables only, and no over_limit.
    kind: body.kind ?? "consumable",
    reset: body.reset === undefined ? "month" : body.reset,
    overLimit: body.over_limit ?? (limit !== null && used > limit),
    credits: body.credits ?? 0, // a service from before credits had none
  };
}

export function account(body: Wire<"Account">, status: number): Account {
  const limits: Record<string, MetricLimit> = {};
  for (const [metric, m] of Object.entries(body.limits ?? {})) limits[metric] = metricLimit(m, status);
  const features: Record<string, FeatureState> = {};
  for (const [name, f] of Object.entries(body.features ?? {})) {
    features[name] = { enabled: need(f.enabled, "enabled", status), source: need(f.source, "source", status) };
  }
  return {
    id: need(body.id, "id", status),
    kind: need(body.kind, "kind", status),
    plan: need(body.plan, "plan", status),
    subscriptionStatus: need(body.subscription_status, "subscription_status", status),
    deleted: body.deleted ?? false,
    limits,
    features,
  };
}

export function usage(body: Wire<"UsageResponse">, status: number): Usage {
  return {
    metric: need(body.metric, "metric", status),
    period: orNull(body.period),
    used: need(body.used, "used", status),
  };
}

export function metricCheck(body: Wire<"MetricCheck">, status: number): MetricCheck {
  return {
    allowed: need(body.allowed, "allowed", status),
    metric: need(body.metric, "metric", status),
    units: need(body.units, "units", status),
    limit: orNull(body.limit),
    used: need(body.used, "used", status),
    remaining: orNull(body.remaining),
    limitSource: need(body.limit_source, "limit_source", status),
    period: orNull(body.period),
    resetsAt: orNull(body.resets_at),
  };
}

export function featureCheck(body: Wire<"FeatureCheck">, status: number): FeatureCheck {
  return {
    allowed: need(body.allowed, "allowed", status),
    feature: need(body.feature, "feature", status),
    source: need(body.source, "source", status),
  };
}
