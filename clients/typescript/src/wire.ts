/**
 * The service's JSON as it travels, described once as values from which the TypeScript types are
 * inferred (`Wire<"TakeResponse">`). Each object schema is named after the component of the
 * service's /openapi.json it mirrors, field for field; test/openapi.test.ts holds every one of
 * them to the running service's document (same fields, types, enums and nullability), so the
 * client's types cannot drift from what the service answers.
 */

export type FieldSchema =
  | { readonly type: "integer"; readonly nullable?: boolean }
  | { readonly type: "boolean" }
  | {
      readonly type: "string";
      readonly nullable?: boolean;
      readonly enum?: readonly string[];
    }
  | { readonly type: "array"; readonly items: FieldSchema }
  | { readonly type: "map"; readonly values: FieldSchema }
  | ObjectSchema;

export interface ObjectSchema {
  readonly type: "object";
  /** The component's name in the OpenAPI document. */
  readonly name: string;
  readonly properties: { readonly [field: string]: FieldSchema };
}

type OrNull<S, T> = S extends { readonly nullable: true } ? T | null : T;

/** The TypeScript type of a schema. Object fields are optional: the service's response schemas
 * require none (a refused release, for one, has no counter), so a parser checks what it needs. */
export type Infer<S> = S extends { readonly type: "integer" }
  ? OrNull<S, number>
  : S extends { readonly type: "boolean" }
    ? boolean
    : S extends { readonly type: "string"; readonly enum: readonly (infer E)[] }
      ? OrNull<S, E>
      : S extends { readonly type: "string" }
        ? OrNull<S, string>
        : S extends { readonly type: "array"; readonly items: infer I }
          ? Infer<I>[]
          : S extends { readonly type: "map"; readonly values: infer V }
            ? Record<string, Infer<V>>
            : S extends { readonly type: "object"; readonly properties: infer P }
              ? { -readonly [K in keyof P]?: Infer<P[K]> }
              : never;

const integer = { type: "integer" } as const;
const nullableInteger = { type: "integer", nullable: true } as const;
const boolean = { type: "boolean" } as const;
const string = { type: "string" } as const;
const nullableString = { type: "string", nullable: true } as const;

function oneOf<const E extends readonly string[]>(...values: E) {
  return { type: "string", enum: values } as const;
}

function object<const P extends { readonly [field: string]: FieldSchema }>(name: string, properties: P) {
  return { type: "object", name, properties } as const;
}

// The service's words (service/vocabulary.py), as its document lists them.
export const LIMIT_SOURCES = ["override", "free_fallback", "plan"] as const;
export const ACCOUNT_KINDS = ["user", "team"] as const;
export const SUBSCRIPTION_STATUSES = [
  "none",
  "trialing",
  "active",
  "past_due",
  "unpaid",
  "incomplete",
  "paused",
  "canceled",
  "expired",
] as const;
export const METRIC_KINDS = ["consumable", "allocation"] as const;
export const RESETS = ["month", "day"] as const;
export const RELEASE_REASONS = ["already_released", "period_closed"] as const;

const limitSource = oneOf(...LIMIT_SOURCES);

/** A counter as a take, a release, a refusal and a check show it. */
const counter = {
  limit: nullableInteger,
  limit_source: limitSource,
  used: integer,
  remaining: nullableInteger,
  period: nullableString,
} as const;

const errorFields = { error: string, message: string } as const;
const fieldMessages = { type: "map", values: { type: "array", items: string } } as const;

const MetricLimit = object("MetricLimit", {
  ...counter,
  kind: oneOf(...METRIC_KINDS),
  reset: { type: "string", nullable: true, enum: RESETS },
  resets_at: nullableString,
  over_limit: boolean,
  credits: integer,
});

const FeatureState = object("FeatureState", { enabled: boolean, source: limitSource });

const Account = object("Account", {
  id: string,
  kind: oneOf(...ACCOUNT_KINDS),
  plan: string,
  subscription_status: oneOf(...SUBSCRIPTION_STATUSES),
  deleted: boolean,
  limits: { type: "map", values: MetricLimit },
  features: { type: "map", values: FeatureState },
});

const TakeResponse = object("TakeResponse", {
  ...counter,
  take_id: integer,
  metric: string,
  units: integer,
  from_credits: integer,
});

const LineShortfall = object("LineShortfall", {
  metric: string,
  units: integer,
  remaining: nullableInteger,
  limit: nullableInteger,
});

const BatchResult = object("BatchResult", {
  ...counter,
  ...errorFields,
  fields: fieldMessages,
  take_id: integer,
  metric: string,
  units: integer,
  from_credits: integer,
  grant_id: integer,
  lines: { type: "array", items: LineShortfall },
  status: integer,
});

/** Every response schema the client reads, by its OpenAPI component name. */
export const schemas = {
  Account,
  MetricLimit,
  FeatureState,
  MetricCheck: object("MetricCheck", {
    ...counter,
    allowed: boolean,
    metric: string,
    units: integer,
    resets_at: nullableString,
  }),
  FeatureCheck: object("FeatureCheck", { allowed: boolean, feature: string, source: limitSource }),
  UsageResponse: object("UsageResponse", { metric: string, period: nullableString, used: integer }),
  TakeResponse,
  TakeLinesResponse: object("TakeLinesResponse", { takes: { type: "array", items: TakeResponse } }),
  LineShortfall,
  ReleaseResponse: object("ReleaseResponse", {
    ...counter,
    take_id: integer,
    metric: string,
    units: integer,
    released: boolean,
    reason: oneOf(...RELEASE_REASONS),
  }),
  Error: object("Error", errorFields),
  InvalidRequest: object("InvalidRequest", { ...errorFields, fields: fieldMessages }),
  Conflict: object("Conflict", {
    ...counter,
    ...errorFields,
    take_id: integer,
    grant_id: integer,
    lines: { type: "array", items: LineShortfall },
  }),
  BatchResult,
  TakeBatchResponse: object("TakeBatchResponse", { results: { type: "array", items: BatchResult } }),
} as const;

/** The request bodies the client sends: only their fields' names and types are checked. */
export const requests = {
  AccountPut: object("AccountPut", { kind: oneOf(...ACCOUNT_KINDS), stripe_customer_id: nullableString }),
  TakeRequest: object("TakeRequest", { metric: string, units: integer, idempotency_key: nullableString }),
  TakeLine: object("TakeLine", { metric: string, units: integer }),
  TakeLinesRequest: object("TakeLinesRequest", {
    lines: { type: "array", items: object("TakeLine", { metric: string, units: integer }) },
    idempotency_key: nullableString,
  }),
  TakeItem: object("TakeItem", {
    account_id: string,
    metric: string,
    units: integer,
    idempotency_key: nullableString,
  }),
} as const;

export type Wire<N extends keyof typeof schemas> = Infer<(typeof schemas)[N]>;
export type WireRequest<N extends keyof typeof requests> = Infer<(typeof requests)[N]>;

/** The error codes the client tells apart; the test finds each among the document's refusals. */
export const ERROR_CODES = [
  "quota_exhausted",
  "unknown_account",
  "account_deleted",
  "unknown_take",
  "idempotency_key_reused",
  "metric_kind_changed",
  "not_resettable",
  "validation_failed",
  "unknown_metric",
  "unknown_feature",
] as const;
