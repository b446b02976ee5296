/**
 * Errors the client throws; `code` is the service's error code. A take refused because the quota is
 * spent, the account is unknown or deleted is not here: `take` answers it (`granted: false`), and
 * only `withSlot` turns it into QuotaExceededError, UnknownAccountError or AccountDeletedError.
 */

import type { LineShortfall, TakeExhausted, TakeLinesExhausted } from "./models.js";

/** Base of every error this client throws. */
export class QuotaClientError extends Error {
  override name = "QuotaClientError";
}

/** The service answered with an error: `status`, its `code` and `message`, and any `details`. */
export class ApiError extends QuotaClientError {
  override name = "ApiError";
  readonly status: number;
  readonly code: string;
  readonly details: Record<string, unknown>;

  constructor(status: number, code: string, message: string, details: Record<string, unknown> = {}) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

/** The API key is missing, unknown, revoked or past its rotation grace (401), or its role may not do
 * this (403). */
export class AuthError extends ApiError {
  override name = "AuthError";
}

/** The service refused the request as invalid (400, 422); `fields` has the messages per field. */
export class ValidationError extends ApiError {
  override name = "ValidationError";
  get fields(): Record<string, string[]> {
    const fields = this.details["fields"];
    return fields && typeof fields === "object" ? (fields as Record<string, string[]>) : {};
  }
}

/** The service knows no such thing (404). */
export class NotFoundError extends ApiError {
  override name = "NotFoundError";
}

/** No account has this id (create it with `ensureAccount`). */
export class UnknownAccountError extends NotFoundError {
  override name = "UnknownAccountError";
}

/** No take has this id (on this account, for a take released through its account). */
export class UnknownTakeError extends NotFoundError {
  override name = "UnknownTakeError";
}

/** The account was deleted: it takes nothing (410). */
export class AccountDeletedError extends ApiError {
  override name = "AccountDeletedError";
}

/** The request conflicts with stored state (409), e.g. an idempotency key already used for a
 * different take on this account (`code` "idempotency_key_reused"). */
export class ConflictError extends ApiError {
  override name = "ConflictError";
}

/** The service's plan config changed this metric's kind or reset while the account's counter still
 * holds usage counted the old way; an operator converts such counters (409). */
export class MetricKindChangedError extends ConflictError {
  override name = "MetricKindChangedError";
}

/** An allocation (seats) is never reset (409). */
export class NotResettableError extends ConflictError {
  override name = "NotResettableError";
}

/** The service failed (5xx): a 500 at once, a 502, 503 or 504 after every retry. */
export class ServerError extends ApiError {
  override name = "ServerError";
}

/** No answer from the service (connection refused or dropped, timeout) through every retry, or the
 * request could not be sent at all (`cause` says which). A take may or may not have been applied;
 * taken again with the same idempotency key it still counts once. */
export class ConnectionFailedError extends QuotaClientError {
  override name = "ConnectionFailedError";
}

/** "." and ".." are valid account ids, but a URL cannot name them: fetch (WHATWG URL) reads them,
 * even percent-encoded, as path steps. Thrown before anything is sent. */
export class UnaddressableAccountError extends QuotaClientError {
  override name = "UnaddressableAccountError";
  constructor(readonly accountId: string) {
    super(`account id ${JSON.stringify(accountId)} cannot be named in a URL that fetch sends`);
  }
}

/** `withSlot` was refused: the quota is spent. `take` has the numbers (used, limit, remaining). */
export class QuotaExceededError extends QuotaClientError {
  override name = "QuotaExceededError";
  constructor(readonly take: TakeExhausted) {
    super(
      `${take.metric} of ${take.accountId}: ${take.units} more would exceed the limit ` +
        `(used ${take.used}, limit ${take.limit}, remaining ${take.remaining})`,
    );
  }
  get used(): number {
    return this.take.used;
  }
  get limit(): number | null {
    return this.take.limit;
  }
  get remaining(): number | null {
    return this.take.remaining;
  }
}

/** `withLines` was refused: a quota is spent and nothing was taken; `lines` names every line that did
 * not fit. */
export class LinesExceededError extends QuotaClientError {
  override name = "LinesExceededError";
  constructor(readonly result: TakeLinesExhausted) {
    const short = result.short.map((s) => `${s.metric} (${s.units} asked, ${s.remaining} remaining)`);
    super(`lines of ${result.accountId} that would exceed their limits: ${short.join(", ")}`);
  }
  get lines(): LineShortfall[] {
    return this.result.short;
  }
}

type ApiErrorClass = new (
  status: number,
  code: string,
  message: string,
  details?: Record<string, unknown>,
) => ApiError;

const BY_CODE: Record<string, ApiErrorClass> = {
  unknown_account: UnknownAccountError,
  unknown_take: UnknownTakeError,
  account_deleted: AccountDeletedError,
  metric_kind_changed: MetricKindChangedError,
  not_resettable: NotResettableError,
};

const BY_STATUS: Record<number, ApiErrorClass> = {
  400: ValidationError,
  401: AuthError,
  403: AuthError,
  404: NotFoundError,
  409: ConflictError,
  410: AccountDeletedError,
  422: ValidationError,
};

/** The error for an error answer: by the service's code first, then by status. */
export function apiError(status: number, body: unknown): ApiError {
  const b = body && typeof body === "object" && !Array.isArray(body) ? (body as Record<string, unknown>) : {};
  const code = typeof b["error"] === "string" ? b["error"] : `http_${status}`;
  const message = typeof b["message"] === "string" ? b["message"] : "no message";
  const details: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(b)) if (k !== "error" && k !== "message") details[k] = v;
  const cls = BY_CODE[code] ?? BY_STATUS[status] ?? (status >= 500 ? ServerError : ApiError);
  return new cls(status, code, message, details);
}
