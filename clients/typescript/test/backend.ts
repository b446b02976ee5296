/**
 * The backends the contract tests run against: the real service (when the pytest run that started
 * it, tests/client/test_typescript.py, says where, in QUOTA_TEST_* variables) and InMemoryService.
 * As tests/client/conftest.py: on the service side the client goes through FlakyProxy, which can
 * refuse a request (503 without reaching the service), or forward it and then cut the connection
 * (drop) or hold the answer back until the client gives up (stall); the set-up that is not under
 * test (limits, soft delete, feature overrides) goes through the harness's control server.
 */

import { randomUUID } from "node:crypto";

import { QuotaClient } from "@quota-ledger/client";
import type { QuotaClientOptions } from "@quota-ledger/client";
import { InMemoryService } from "@quota-ledger/client/testing";

export interface Backend {
  name: string;
  client(options?: Partial<QuotaClientOptions>): QuotaClient;
  setLimit(accountId: string, metric: string, limit: number | null): Promise<void>;
  setFeature(accountId: string, feature: string, enabled: boolean | null): Promise<void>;
  deleteAccount(accountId: string): Promise<void>;
  /** The next `count` requests are answered 503 without reaching the quota logic. */
  failNext(count: number): Promise<void>;
  /** The next `count` requests are applied, then their connection is cut before the answer. */
  dropNext(count: number): Promise<void>;
  /** The next `count` requests are applied and their answers held back until the client gives up. */
  stallNext(count: number): Promise<void>;
  /** Requests that reached the front of the backend so far, and answers dropped or held back. */
  stats(): Promise<{ requests: number; dropped: number }>;
}

/** Fast retries, as the Python contract tests' FAST. */
export const FAST = { retries: 3, backoffMs: 1, maxBackoffMs: 10, timeoutMs: 10_000 } as const;

/** tests/plans.toml's free plan, which a new account of the service is on; the harness passes the
 * file's own in QUOTA_TEST_FREE_PLAN and a test holds this copy to it. */
export const FREE_PLAN = {
  limits: { urls: 50, api_calls: 1000, seats: 1, exports: 3 },
  metrics: { seats: { kind: "allocation" }, exports: { reset: "day" } },
  features: { export_csv: true, api_access: false, custom_domains: false, sso: false },
} as const;

export const SERVICE = process.env["QUOTA_TEST_URL"]
  ? {
      url: process.env["QUOTA_TEST_URL"],
      direct: process.env["QUOTA_TEST_SERVICE_URL"] ?? process.env["QUOTA_TEST_URL"],
      control: process.env["QUOTA_TEST_CONTROL"] ?? "",
      apiKey: process.env["QUOTA_TEST_API_KEY"] ?? "",
      freePlan: process.env["QUOTA_TEST_FREE_PLAN"] ?? "",
      vocabulary: process.env["QUOTA_TEST_VOCABULARY"] ?? "",
    }
  : null;

export function acc(): string {
  return `acc-${randomUUID().replaceAll("-", "").slice(0, 12)}`;
}

function socketClosed(): TypeError {
  const cause = Object.assign(new Error("other side closed"), { code: "UND_ERR_SOCKET" });
  return new TypeError("fetch failed", { cause });
}

/** InMemoryService that can drop or hold back an answer after applying the call, as FlakyProxy does. */
export class FlakyMemoryService extends InMemoryService {
  dropped = 0;
  // One plan for refusals, drops and stalls, in the order asked, as FlakyProxy's.
  #plan: Array<"drop" | "stall" | number> = [];

  override failNext(count = 1, status = 503): void {
    for (let i = 0; i < count; i++) this.#plan.push(status);
  }

  dropNext(count: number): void {
    for (let i = 0; i < count; i++) this.#plan.push("drop");
  }

  stallNext(count: number): void {
    for (let i = 0; i < count; i++) this.#plan.push("stall");
  }

  override async fetch(input: string, init: RequestInit = {}): Promise<Response> {
    const action = this.#plan.shift();
    if (typeof action === "number") super.failNext(1, action);
    const answer = await super.fetch(input, init);
    if (action === undefined || typeof action === "number") return answer;
    this.dropped += 1;
    if (action === "stall") {
      const signal = init.signal;
      await new Promise<void>((resolve) => {
        if (!signal || signal.aborted) return resolve();
        // AbortSignal.timeout's timer does not keep the process alive; a real socket would.
        const alive = setInterval(() => {}, 1000);
        signal.addEventListener("abort", () => (clearInterval(alive), resolve()), { once: true });
      });
      throw signal?.reason ?? socketClosed();
    }
    throw socketClosed();
  }
}

export class MemoryBackend implements Backend {
  readonly name = "memory";
  readonly service = new FlakyMemoryService(structuredClone(FREE_PLAN) as never);

  client(options: Partial<QuotaClientOptions> = {}): QuotaClient {
    return new QuotaClient({
      baseUrl: "http://quota.in-memory",
      apiKey: "in-memory",
      ...FAST,
      ...options,
      fetch: (input, init) => this.service.fetch(input, init),
    });
  }
  async setLimit(accountId: string, metric: string, limit: number | null): Promise<void> {
    this.service.setLimit(accountId, metric, limit);
  }
  async setFeature(accountId: string, feature: string, enabled: boolean | null): Promise<void> {
    if (enabled === null) this.service.clearFeature(accountId, feature);
    else this.service.setFeature(accountId, feature, enabled);
  }
  async deleteAccount(accountId: string): Promise<void> {
    this.service.deleteAccount(accountId);
  }
  async failNext(count: number): Promise<void> {
    this.service.failNext(count);
  }
  async dropNext(count: number): Promise<void> {
    this.service.dropNext(count);
  }
  async stallNext(count: number): Promise<void> {
    this.service.stallNext(count);
  }
  async stats(): Promise<{ requests: number; dropped: number }> {
    return { requests: this.service.requests, dropped: this.service.dropped };
  }
}

export class ServiceBackend implements Backend {
  readonly name = "service";
  constructor(readonly service: NonNullable<typeof SERVICE>) {}

  client(options: Partial<QuotaClientOptions> = {}): QuotaClient {
    return new QuotaClient({ baseUrl: this.service.url, apiKey: this.service.apiKey, ...FAST, ...options });
  }
  async #control(action: string, body: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    const r = await fetch(`${this.service.control}/${action}`, { method: "POST", body: JSON.stringify(body) });
    const answer = (await r.json()) as Record<string, unknown>;
    if (r.status !== 200) throw new Error(`control ${action}: ${r.status} ${JSON.stringify(answer)}`);
    return answer;
  }
  async setLimit(accountId: string, metric: string, limit: number | null): Promise<void> {
    await this.#control("set_limit", { account_id: accountId, metric, limit });
  }
  async setFeature(accountId: string, feature: string, enabled: boolean | null): Promise<void> {
    await this.#control("set_feature", { account_id: accountId, feature, enabled });
  }
  async deleteAccount(accountId: string): Promise<void> {
    await this.#control("delete", { account_id: accountId });
  }
  async failNext(count: number): Promise<void> {
    await this.#control("refuse", { count });
  }
  async dropNext(count: number): Promise<void> {
    await this.#control("drop", { count });
  }
  async stallNext(count: number): Promise<void> {
    await this.#control("stall", { count });
  }
  async stats(): Promise<{ requests: number; dropped: number }> {
    const s = await this.#control("stats");
    return { requests: s["requests"] as number, dropped: s["dropped"] as number };
  }
  async reset(): Promise<void> {
    await this.#control("reset");
  }
}

/** The backends of this run: InMemoryService always, the real service when the harness gives it.
 * Each test gets a fresh one (the service's FlakyProxy plan reset). */
export const BACKENDS: Array<{ name: string; make: () => Promise<Backend> }> = [
  { name: "memory", make: async () => new MemoryBackend() },
  ...(SERVICE
    ? [
        {
          name: "service",
          make: async () => {
            const b = new ServiceBackend(SERVICE);
            await b.reset();
            return b;
          },
        },
      ]
    : []),
];
