/**
 * The client's types against the running service's /openapi.json: every object schema of src/wire.ts
 * (from which the TypeScript types are inferred) is its OpenAPI component, field for field, with
 * the same types, enums and nullability; every request field the client sends is one the service
 * takes; every error code the client tells apart is one the service answers. Runs when the harness
 * (tests/client/test_typescript.py) gives the service's URL.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { ERROR_CODES, requests, schemas } from "@quota-ledger/client";
import type { FieldSchema } from "@quota-ledger/client";

import { SERVICE } from "./backend.js";

type Doc = { components: { schemas: Record<string, Json> }; paths: Record<string, unknown> };
type Json = Record<string, unknown>;

function resolve(doc: Doc, schema: Json): Json {
  const ref = schema["$ref"];
  if (typeof ref === "string") return doc.components.schemas[ref.replace("#/components/schemas/", "")]!;
  return schema;
}

/** The differences between the client's schema and the document's, as "where: what" lines. */
function compare(doc: Doc, ours: FieldSchema, theirs: Json, where: string, request: boolean): string[] {
  const problems: string[] = [];
  const schema = resolve(doc, theirs);
  const ref = typeof theirs["$ref"] === "string" ? (theirs["$ref"] as string).split("/").pop() : null;
  const nullable = schema["nullable"] === true;
  switch (ours.type) {
    case "object": {
      if (ref !== null && ref !== ours.name) problems.push(`${where}: is ${ref}, the client reads it as ${ours.name}`);
      if (schema["type"] !== "object") return [...problems, `${where}: not an object in the document`];
      const properties = (schema["properties"] ?? {}) as Record<string, Json>;
      for (const [name, field] of Object.entries(ours.properties)) {
        const other = properties[name];
        if (other === undefined) problems.push(`${where}.${name}: the client declares it, the document does not`);
        else problems.push(...compare(doc, field, other, `${where}.${name}`, request));
      }
      if (!request) {
        for (const name of Object.keys(properties)) {
          if (!(name in ours.properties)) problems.push(`${where}.${name}: in the document, not in the client's types`);
        }
      }
      return problems;
    }
    case "array":
      if (schema["type"] !== "array") return [`${where}: not an array in the document`];
      return compare(doc, ours.items, schema["items"] as Json, `${where}[]`, request);
    case "map":
      if (schema["type"] !== "object" || typeof schema["additionalProperties"] !== "object") {
        return [`${where}: not a map (additionalProperties) in the document`];
      }
      return compare(doc, ours.values, schema["additionalProperties"] as Json, `${where}{}`, request);
    case "boolean":
      return schema["type"] === "boolean" ? [] : [`${where}: boolean here, ${String(schema["type"])} there`];
    case "integer":
    case "string": {
      if (schema["type"] !== ours.type) problems.push(`${where}: ${ours.type} here, ${String(schema["type"])} there`);
      if ((ours.nullable === true) !== nullable) problems.push(`${where}: nullable ${ours.nullable === true} here, ${nullable} there`);
      const theirEnum = Array.isArray(schema["enum"]) ? (schema["enum"] as unknown[]).filter((v) => v !== null) : null;
      const ourEnum = ours.type === "string" && ours.enum ? [...ours.enum] : null;
      if (ourEnum !== null || (theirEnum !== null && !request)) {
        const a = JSON.stringify([...(ourEnum ?? [])].sort());
        const b = JSON.stringify([...(theirEnum ?? [])].map(String).sort());
        if (a !== b) problems.push(`${where}: enum ${a} here, ${b} there`);
      }
      return problems;
    }
  }
}

/** Every `error` enum of every refusal the document lists. */
function errorCodes(value: unknown, found = new Set<string>()): Set<string> {
  if (Array.isArray(value)) for (const v of value) errorCodes(v, found);
  else if (value !== null && typeof value === "object") {
    const o = value as Json;
    const error = (o["properties"] as Json | undefined)?.["error"] as Json | undefined;
    if (error && Array.isArray(error["enum"])) for (const c of error["enum"]) found.add(String(c));
    for (const v of Object.values(o)) errorCodes(v, found);
  }
  return found;
}

test("openapi: the client's types are the service's documented answers", { skip: !SERVICE }, async (t) => {
  const r = await fetch(`${SERVICE!.direct}/openapi.json`);
  assert.equal(r.status, 200);
  const doc = (await r.json()) as Doc;

  await t.test("every response schema, field for field", () => {
    const problems: string[] = [];
    for (const schema of Object.values(schemas)) {
      const theirs = doc.components.schemas[schema.name];
      if (theirs === undefined) problems.push(`${schema.name}: no such component`);
      else problems.push(...compare(doc, schema, { $ref: `#/components/schemas/${schema.name}` }, schema.name, false));
    }
    assert.deepEqual(problems, []);
  });

  await t.test("every request field the client sends", () => {
    const problems: string[] = [];
    for (const schema of Object.values(requests)) {
      const theirs = doc.components.schemas[schema.name];
      if (theirs === undefined) problems.push(`${schema.name}: no such component`);
      else problems.push(...compare(doc, schema, theirs, schema.name, true));
    }
    assert.deepEqual(problems, []);
  });

  await t.test("every error code the client tells apart", () => {
    const known = errorCodes(doc.paths);
    assert.deepEqual(ERROR_CODES.filter((c) => !known.has(c)), []);
  });

  await t.test("the routes the client calls", () => {
    const routes: Array<[string, string]> = [
      ["get", "/v1/accounts/{id}"],
      ["put", "/v1/accounts/{id}"],
      ["get", "/v1/accounts/{id}/usage"],
      ["get", "/v1/accounts/{id}/check"],
      ["post", "/v1/accounts/{id}/takes"],
      ["post", "/v1/accounts/{id}/takes/{take_id}/release"],
      ["post", "/v1/takes/{take_id}/release"],
      ["post", "/v1/takes/batch"],
    ];
    const paths = doc.paths as Record<string, Record<string, unknown>>;
    assert.deepEqual(routes.filter(([method, path]) => paths[path]?.[method] === undefined), []);
  });
});
