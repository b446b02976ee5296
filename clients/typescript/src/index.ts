/**
 * TypeScript client of the quota ledger service.
 *
 *     import { QuotaClient } from "@quota-ledger/client";
 *
 *     const quota = new QuotaClient({ baseUrl: "http://quota.internal:8000", apiKey });
 *     await quota.withSlot("acc-1", "urls", () => shorten(url));
 *
 * `@quota-ledger/client/testing` has `InMemoryQuota`, the same client over an in-memory service.
 */

export { QuotaClient, isTransportFailure, logReleaseError, newIdempotencyKey, RETRY_STATUSES } from "./client.js";
export type { Fetch, OnReleaseError, QuotaClientOptions, TakeOptions } from "./client.js";
export {
  AccountDeletedError,
  ApiError,
  AuthError,
  ConflictError,
  ConnectionFailedError,
  LinesExceededError,
  MetricKindChangedError,
  NotFoundError,
  NotResettableError,
  QuotaClientError,
  QuotaExceededError,
  ServerError,
  UnaddressableAccountError,
  UnknownAccountError,
  UnknownTakeError,
  ValidationError,
} from "./errors.js";
export type * from "./models.js";
export { schemas, requests, ERROR_CODES } from "./wire.js";
export type { FieldSchema, Infer, ObjectSchema, Wire } from "./wire.js";
