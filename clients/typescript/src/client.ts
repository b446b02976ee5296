/**
 * QuotaClient: the service's product API over `fetch`, with the Python client's guarantees (see
 * clients/python and the service's docs/client.md): a take counts once however many attempts it
 * needed, a spent quota is an answer, and `withSlot` gives its units back when the work fails
 * without ever hiding the work's own error.
 */

import { randomUUID } from "node:crypto";

import {
  AccountDeletedError,
  ApiError,
  ConnectionFailedError,
  LinesExceededError,
  QuotaClientError,
  QuotaExceededError,
  UnaddressableAccountError,
  UnknownAccountError,
  apiError,
} from "./errors.js";
import * as models from "./models.js";
import type {
  Account,
  AccountKind,
  BatchItem,
  FeatureCheck,
  HeldTake,
  Lines,
  MetricCheck,
  MetricLimit,
  ReleaseResult,
  TakeGranted,
  TakeLinesGranted,
  TakeLinesRefused,
  TakeLinesResult,
  TakeRefused,
  TakeResult,
  Usage,
} from "./models.js";
import type { Wire, WireRequest } from "./wire.js";

export type OnReleaseError = (error: unknown, take: HeldTake) => void;
export type Fetch = (input: string, init: RequestInit) => Promise<Response>;

export interface QuotaClientOptions {
  /** The service's base URL, e.g. "http://quota.internal:8000". */
  baseUrl: string;
  /** A key of the `product` role, sent as `Authorization: Bearer <apiKey>`. */
  apiKey: string;
  /** Each attempt's limit, from sending to the answer's last byte, in ms. Default 5000. */
  timeoutMs?: number;
  /** Attempts after the first, on no answer or a 429, 502, 503 or 504. Default 3. */
  retries?: number;
  /** Before retry n (0-based) a random wait of up to min(maxBackoffMs, backoffMs * 2^n) ms, or the
   * answer's Retry-After (capped at maxBackoffMs). Default 200. */
  backoffMs?: number;
  /** Default 5000. */
  maxBackoffMs?: number;
  /** No attempt starts, and none runs on, past this many ms after the first began. Default 30000. */
  deadlineMs?: number;
  /** What a slot does with a release that failed: default a console warning naming the take. The
   * units stay taken until their period's reset (an allocation's until released). */
  onReleaseError?: OnReleaseError;
  /** The fetch to send with; default the global one (Node >= 18). */
  fetch?: Fetch;
}

export interface TakeOptions {
  units?: number;
  /** The same key returns the original take instead of taking again; default one made here, once,
   * before the first attempt. */
  idempotencyKey?: string;
}

interface Call {
  method: "GET" | "PUT" | "POST";
  path: string;
  json?: unknown;
  params?: Record<string, string>;
}

interface Answer {
  status: number;
  body: unknown;
  retryAfter: number | null;
}

/** Worth another attempt: the service may be back in a moment. Any other 4xx or 5xx is final. */
export const RETRY_STATUSES: ReadonlySet<number> = new Set([429, 502, 503, 504]);

export function newIdempotencyKey(): string {
  return `qc-${randomUUID().replaceAll("-", "")}`;
}

/** A path segment, percent-encoded. "." and ".." cannot be sent: a WHATWG URL drops them as path
 * steps even when percent-encoded. */
export function segment(value: string): string {
  if (value === "." || value === "..") throw new UnaddressableAccountError(value);
  return encodeURIComponent(value);
}

/** Whether an error of fetch means the request may not have arrived or its answer was lost: a
 * timeout, or a socket's failure (an error with a system or undici `code`: ECONNRESET,
 * UND_ERR_SOCKET, ...). A malformed URL or an unsupported scheme fails the same way every time:
 * Node's own errors of a call made wrong (`ERR_INVALID_URL`, ...) are not retried. */
export function isTransportFailure(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  if (error.name === "TimeoutError" || error.name === "AbortError") return true;
  let cause: unknown = error.cause;
  for (let depth = 0; cause instanceof Object && depth < 4; depth++) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === "string") return !code.startsWith("ERR_");
    cause = (cause as { cause?: unknown }).cause;
  }
  return false;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function object(body: unknown): Record<string, unknown> | null {
  return body !== null && typeof body === "object" && !Array.isArray(body) ? (body as Record<string, unknown>) : null;
}

function ok<T>(got: Answer): T {
  const body = object(got.body);
  if (got.status >= 200 && got.status < 300) {
    if (body === null) throw new ApiError(got.status, "invalid_response", "the answer is not a JSON object");
    return body as T;
  }
  throw apiError(got.status, got.body);
}

function code(got: Answer): unknown {
  return object(got.body)?.["error"];
}

/** The refusal of a take that is an answer, not an error: a spent quota, an unknown or deleted
 * account. */
function refusalOf(got: Answer): "exhausted" | "unknown-account" | "deleted" | null {
  if (got.status === 409 && code(got) === "quota_exhausted") return "exhausted";
  if (got.status === 404 && code(got) === "unknown_account") return "unknown-account";
  if (got.status === 410 && code(got) === "account_deleted") return "deleted";
  return null;
}

function message(got: Answer): string {
  const m = object(got.body)?.["message"];
  return typeof m === "string" ? m : "";
}

export function linePairs(lines: Lines): Array<[string, number]> {
  const pairs: ReadonlyArray<readonly [string, number]> = Array.isArray(lines)
    ? (lines as ReadonlyArray<readonly [string, number]>)
    : Object.entries(lines as Record<string, number>);
  return pairs.map(([metric, units]) => [metric, units]);
}

/** The error `withSlot` (`withLines`) throws for a refused take, before `fn` runs. */
export function refusalError(took: TakeRefused | TakeLinesRefused): QuotaClientError {
  switch (took.reason) {
    case "exhausted":
      return "short" in took ? new LinesExceededError(took) : new QuotaExceededError(took);
    case "unknown-account":
      return new UnknownAccountError(404, "unknown_account", took.message);
    case "deleted":
      return new AccountDeletedError(410, "account_deleted", took.message);
  }
}

/** Whether a take that threw `error` may have been granted all the same: no answer (after a
 * transport failure) or a 5xx leaves the service's side unknown; an answer that refused it, or a
 * request that could not be sent at all, does not. */
export function mayHold(error: unknown): boolean {
  if (error instanceof ConnectionFailedError) return isTransportFailure(error.cause);
  if (error instanceof ApiError) return error.status >= 500;
  return !(error instanceof QuotaClientError);
}

export function logReleaseError(error: unknown, take: HeldTake): void {
  const which = take.takeId !== null ? `take ${take.takeId}` : `the take with idempotency key ${take.idempotencyKey}`;
  console.warn(
    `quota-client: could not release ${which} (${take.units} units of ${take.metric} for ${take.accountId}): ${String(error)}`,
  );
}

export class QuotaClient {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly retries: number;
  readonly backoffMs: number;
  readonly maxBackoffMs: number;
  readonly deadlineMs: number;
  readonly onReleaseError: OnReleaseError;
  readonly #apiKey: string;
  readonly #fetch: Fetch;

  constructor(options: QuotaClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    new URL(this.baseUrl); // a TypeError now for a base URL no request could use, not a retried failure
    this.#apiKey = options.apiKey;
    this.timeoutMs = options.timeoutMs ?? 5000;
    this.retries = options.retries ?? 3;
    this.backoffMs = options.backoffMs ?? 200;
    this.maxBackoffMs = options.maxBackoffMs ?? 5000;
    this.deadlineMs = options.deadlineMs ?? 30000;
    this.onReleaseError = options.onReleaseError ?? logReleaseError;
    this.#fetch = options.fetch ?? ((input, init) => fetch(input, init));
    if (!Number.isInteger(this.retries) || this.retries < 0) throw new RangeError("retries: an integer >= 0");
  }

  /** The account, its plan, and per metric its effective limit and usage. UnknownAccountError. */
  async account(accountId: string): Promise<Account> {
    const got = await this.#send({ method: "GET", path: `/v1/accounts/${segment(accountId)}` });
    return models.account(ok<Wire<"Account">>(got), got.status);
  }

  /** Create the account or update an existing one's kind; AccountDeletedError for a deleted one. */
  async ensureAccount(
    accountId: string,
    options: { kind?: AccountKind; stripeCustomerId?: string } = {},
  ): Promise<Account> {
    const json: WireRequest<"AccountPut"> = { kind: options.kind ?? "user" };
    if (options.stripeCustomerId !== undefined) json.stripe_customer_id = options.stripeCustomerId;
    const got = await this.#send({ method: "PUT", path: `/v1/accounts/${segment(accountId)}`, json });
    return models.account(ok<Wire<"Account">>(got), got.status);
  }

  /** Per metric: its kind and reset, effective limit (null = unlimited), source, used, remaining. */
  async limits(accountId: string): Promise<Record<string, MetricLimit>> {
    return (await this.account(accountId)).limits;
  }

  /** Units of `metric` used in `period` (a month YYYY-MM, or a day YYYY-MM-DD for a daily metric;
   * default the current one; none for an allocation). */
  async usage(accountId: string, metric: string, options: { period?: string } = {}): Promise<Usage> {
    const params: Record<string, string> = { metric };
    if (options.period !== undefined) params["period"] = options.period;
    const got = await this.#send({ method: "GET", path: `/v1/accounts/${segment(accountId)}/usage`, params });
    return models.usage(ok<Wire<"UsageResponse">>(got), got.status);
  }

  /** Whether a take of `units` would be granted now, with the counter's numbers; takes nothing.
   * UnknownAccountError, AccountDeletedError, ValidationError (an unknown metric). */
  async check(accountId: string, metric: string, options: { units?: number } = {}): Promise<MetricCheck> {
    const params = { metric, units: String(options.units ?? 1) };
    const got = await this.#send({ method: "GET", path: `/v1/accounts/${segment(accountId)}/check`, params });
    return models.metricCheck(ok<Wire<"MetricCheck">>(got), got.status);
  }

  /** Whether the account has the boolean `feature` now, and which rule decided it. */
  async checkFeature(accountId: string, feature: string): Promise<FeatureCheck> {
    const params = { feature };
    const got = await this.#send({ method: "GET", path: `/v1/accounts/${segment(accountId)}/check`, params });
    return models.featureCheck(ok<Wire<"FeatureCheck">>(got), got.status);
  }

  async featureEnabled(accountId: string, feature: string): Promise<boolean> {
    return (await this.checkFeature(accountId, feature)).allowed;
  }

  /** Take `units` (default 1) now. Granted: `{ granted: true, takeId, used, limit, remaining, ... }`.
   * Refused: `{ granted: false, reason }`, "exhausted" (with the numbers), "unknown-account" or
   * "deleted"; nothing was taken. Other refusals throw (ValidationError, ConflictError, AuthError).
   * Every attempt carries one idempotency key, so a take counts once however many it needed. */
  async take(accountId: string, metric: string, options: TakeOptions = {}): Promise<TakeResult> {
    const units = options.units ?? 1;
    const idempotencyKey = options.idempotencyKey ?? newIdempotencyKey();
    const path = `/v1/accounts/${segment(accountId)}/takes`;
    const json: WireRequest<"TakeRequest"> = { metric, units, idempotency_key: idempotencyKey };
    const got = await this.#send({ method: "POST", path, json });
    return takeAnswer(got, { accountId, metric, units, idempotencyKey });
  }

  /** Take every line or none: 1-20 distinct metrics, `{ urls: 1, emails: 5000 }` or pairs. Granted:
   * one take per line, in order, each released on its own. Refused as `take` is, "exhausted" with
   * `short` naming every line that did not fit. One idempotency key for the whole take. */
  async takeLines(accountId: string, lines: Lines, options: { idempotencyKey?: string } = {}): Promise<TakeLinesResult> {
    const asked = linePairs(lines);
    const idempotencyKey = options.idempotencyKey ?? newIdempotencyKey();
    const json: WireRequest<"TakeLinesRequest"> = {
      lines: asked.map(([metric, units]) => ({ metric, units })),
      idempotency_key: idempotencyKey,
    };
    const got = await this.#send({ method: "POST", path: `/v1/accounts/${segment(accountId)}/takes`, json });
    const base = { accountId, lines: asked, idempotencyKey, message: message(got) };
    const refusal = refusalOf(got);
    if (refusal === "exhausted") {
      const short = (object(got.body)?.["lines"] ?? []) as Wire<"LineShortfall">[];
      return { granted: false, reason: "exhausted", ...base, short: short.map(models.lineShortfall) };
    }
    if (refusal !== null) return { granted: false, reason: refusal, ...base };
    const body = ok<Wire<"TakeLinesResponse">>(got);
    const takes = body.takes ?? [];
    if (takes.length !== asked.length) {
      throw new ApiError(got.status, "invalid_response", "the answer has not one take per line");
    }
    const replayed = got.status === 200;
    return {
      granted: true,
      accountId,
      lines: asked,
      idempotencyKey,
      replayed,
      takes: takes.map((t, i) =>
        models.takeGranted(t, { accountId, units: asked[i]![1], idempotencyKey, replayed, status: got.status }),
      ),
    };
  }

  /** Many independent takes (1-1000, of any accounts) in one request, not atomic: per item, in
   * order, what `take` of it would give, or the error `take` would throw, returned rather than
   * thrown. An item without a key gets one here, so a retried batch counts each item once. A body
   * refused whole (no items, more than 1000) throws ValidationError. */
  async takeBatch(items: readonly BatchItem[]): Promise<Array<TakeResult | ApiError>> {
    const keyed = items.map((item) => ({
      accountId: item.accountId,
      metric: item.metric,
      units: item.units ?? 1,
      idempotencyKey: item.idempotencyKey ?? newIdempotencyKey(),
    }));
    const json = {
      items: keyed.map(
        (i): WireRequest<"TakeItem"> => ({
          account_id: i.accountId,
          metric: i.metric,
          units: i.units,
          idempotency_key: i.idempotencyKey,
        }),
      ),
    };
    const got = await this.#send({ method: "POST", path: "/v1/takes/batch", json });
    const results = ok<Wire<"TakeBatchResponse">>(got).results;
    if (!Array.isArray(results) || results.length !== keyed.length) {
      throw new ApiError(got.status, "invalid_response", "the answer has not one result per item");
    }
    return results.map((result, i) => {
      const item = keyed[i]!;
      const { status, ...body } = result;
      if (typeof status !== "number") return new ApiError(0, "invalid_response", "an item's result has no status");
      try {
        return takeAnswer({ status, body, retryAfter: null }, item);
      } catch (error) {
        if (error instanceof ApiError) return error;
        throw error;
      }
    });
  }

  /** Give a take's units back: a granted take (released through its account's route) or a take
   * id. Safe to repeat: a second release answers `released: false, reason: "already_released"`. */
  async release(take: TakeGranted | HeldTake | number): Promise<ReleaseResult> {
    let path: string;
    if (typeof take === "number") {
      path = `/v1/takes/${take}/release`;
    } else {
      if ("granted" in take && take.granted !== true) {
        throw new TypeError("this take was refused; there is nothing to release");
      }
      if (take.takeId === null) {
        throw new TypeError("this take was never confirmed; take again with its idempotencyKey to learn its takeId");
      }
      path = `/v1/accounts/${segment(take.accountId)}/takes/${take.takeId}/release`;
    }
    const got = await this.#send({ method: "POST", path });
    return models.releaseResult(ok<Wire<"ReleaseResponse">>(got), got.status);
  }

  /** Take `units` (default 1) of `metric`, run `fn` with the take, and resolve to what `fn`
   * resolves to; the take is kept. Refused: `fn` never runs, and QuotaExceededError (or
   * UnknownAccountError, AccountDeletedError) is thrown. `fn` throws or rejects: the take is
   * released and `fn`'s error rethrown as it was; a failed release goes to `onReleaseError`, never
   * in its place. The take itself failed without an answer (or with a 5xx): the service may have
   * granted it, so it is found by its idempotency key and released before the error goes on. */
  async withSlot<T>(
    accountId: string,
    metric: string,
    fn: (take: TakeGranted) => T | Promise<T>,
    options: { units?: number } = {},
  ): Promise<T> {
    const units = options.units ?? 1;
    const pending: HeldTake = { accountId, metric, units, idempotencyKey: newIdempotencyKey(), takeId: null };
    let took: TakeResult;
    try {
      took = await this.take(accountId, metric, { units, idempotencyKey: pending.idempotencyKey });
    } catch (error) {
      if (mayHold(error)) await this.#giveBack(pending);
      throw error;
    }
    if (!took.granted) throw refusalError(took);
    try {
      return await fn(took);
    } catch (error) {
      await this.#giveBack(took);
      throw error;
    }
  }

  /** `withSlot` of several lines, taken all or none (`takeLines`): refused, LinesExceededError
   * naming every short line (or UnknownAccountError, AccountDeletedError); `fn` failed, every line
   * is released and its error rethrown. */
  async withLines<T>(accountId: string, lines: Lines, fn: (taken: TakeLinesGranted) => T | Promise<T>): Promise<T> {
    const asked = linePairs(lines);
    const idempotencyKey = newIdempotencyKey();
    let taken: TakeLinesResult;
    try {
      taken = await this.takeLines(accountId, asked, { idempotencyKey });
    } catch (error) {
      if (mayHold(error)) await this.#giveBackLines(accountId, asked, idempotencyKey, null);
      throw error;
    }
    if (!taken.granted) throw refusalError(taken);
    try {
      return await fn(taken);
    } catch (error) {
      await this.#giveBackLines(accountId, asked, idempotencyKey, taken.takes);
      throw error;
    }
  }

  /** Release a take a slot must not keep; one whose answer never arrived (`takeId` null) first
   * learns its id by taking again with its key, which returns the original take, or takes now if
   * the original never arrived (released at once), or is refused. Never throws. */
  async #giveBack(take: HeldTake): Promise<void> {
    let held: HeldTake = take;
    try {
      if (held.takeId === null) {
        const found = await this.take(held.accountId, held.metric, {
          units: held.units,
          idempotencyKey: held.idempotencyKey,
        });
        if (!found.granted) return;
        held = found;
      }
      await this.release(held);
    } catch (error) {
      this.#reportReleaseError(error, held);
    }
  }

  async #giveBackLines(
    accountId: string,
    lines: Array<[string, number]>,
    idempotencyKey: string,
    takes: TakeGranted[] | null,
  ): Promise<void> {
    let held: HeldTake[] = takes ?? lines.map(([metric, units]) => ({ accountId, metric, units, idempotencyKey, takeId: null }));
    if (takes === null) {
      try {
        const found = await this.takeLines(accountId, lines, { idempotencyKey });
        if (!found.granted) return;
        held = found.takes;
      } catch (error) {
        for (const take of held) this.#reportReleaseError(error, take);
        return;
      }
    }
    for (const take of held) {
      try {
        await this.release(take);
      } catch (error) {
        this.#reportReleaseError(error, take);
      }
    }
  }

  /** Hand a failed release to the callback while the work's own error propagates; a failing
   * callback is logged, never thrown. */
  #reportReleaseError(error: unknown, take: HeldTake): void {
    const held: HeldTake = {
      accountId: take.accountId,
      metric: take.metric,
      units: take.units,
      idempotencyKey: take.idempotencyKey,
      takeId: take.takeId,
    };
    try {
      this.onReleaseError(error, "granted" in take ? take : held);
    } catch (callbackError) {
      console.error(`quota-client: onReleaseError failed for take ${take.takeId}:`, callbackError);
    }
  }

  /** The call, retried on no answer and on 429, 502, 503, 504, within the deadline; any other
   * answer is final. Every call of this API is safe to repeat as it is (takes carry their key). */
  async #send(call: Call): Promise<Answer> {
    const started = Date.now();
    for (let attempt = 0; ; attempt++) {
      const left = this.deadlineMs - (Date.now() - started);
      let answer: Answer | null = null;
      let failure: unknown = null;
      try {
        answer = await this.#attempt(call, Math.max(1, Math.min(this.timeoutMs, left)));
      } catch (error) {
        failure = error;
      }
      if (answer !== null && !RETRY_STATUSES.has(answer.status)) return answer;
      const wait = this.#delay(attempt, answer?.retryAfter ?? null);
      const last = attempt >= this.retries || Date.now() - started + wait >= this.deadlineMs;
      if (answer !== null && last) return answer;
      if (answer === null && (last || !isTransportFailure(failure))) {
        throw new ConnectionFailedError(
          `${call.method} ${call.path}: no answer after ${attempt + 1} attempt(s): ${String(failure)}`,
          { cause: failure },
        );
      }
      await sleep(wait);
    }
  }

  #delay(attempt: number, retryAfter: number | null): number {
    if (retryAfter !== null) return Math.max(0, Math.min(this.maxBackoffMs, retryAfter * 1000));
    return Math.random() * Math.min(this.maxBackoffMs, this.backoffMs * 2 ** attempt);
  }

  async #attempt(call: Call, timeoutMs: number): Promise<Answer> {
    const query = call.params ? `?${new URLSearchParams(call.params).toString()}` : "";
    const headers: Record<string, string> = { Authorization: `Bearer ${this.#apiKey}`, Accept: "application/json" };
    const init: RequestInit = { method: call.method, headers, signal: AbortSignal.timeout(timeoutMs) };
    if (call.json !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(call.json);
    }
    const response = await this.#fetch(this.baseUrl + call.path + query, init);
    const text = await response.text(); // under the same signal: a stalled body times out too
    let body: unknown = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = null; // not JSON, e.g. a proxy's error page
    }
    const header = response.headers.get("retry-after");
    const seconds = header === null || header.trim() === "" ? NaN : Number(header);
    return { status: response.status, body, retryAfter: Number.isFinite(seconds) ? seconds : null };
  }
}

/** A take's answer as `take` gives it: granted, refused (an answer), or the error it throws. */
function takeAnswer(
  got: Answer,
  ctx: { accountId: string; metric: string; units: number; idempotencyKey: string },
): TakeResult {
  const refusal = refusalOf(got);
  if (refusal === "exhausted") return models.takeExhausted(object(got.body) as Wire<"Conflict">, ctx);
  if (refusal !== null) return { granted: false, reason: refusal, ...ctx, message: message(got) };
  const body = ok<Wire<"TakeResponse">>(got);
  return models.takeGranted(body, { ...ctx, replayed: got.status === 200, status: got.status });
}
