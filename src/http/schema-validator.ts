import { TransformKind, type TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import type { Validation } from './route'

/**
 * The check of a TypeBox body schema, compiled once (TypeBox's checker is a
 * generated function, ~50x faster than interpreting). A schema with
 * transforms (Elysia's `t.Integer()`, `t.Numeric()` take "4" and mean 4) is
 * decoded too, so `act` gets the type the schema says: before, `"4"` passed
 * the check and reached `act` as a string while TypeScript said number.
 */
export function schemaValidator<Body>(schema: (TSchema & { static: Body }) | undefined): (body: unknown) => Validation<Body> {
  if (!schema) throw new TypeError('idempotentPost: give the route a body schema or a validate function')
  const check = TypeCompiler.Compile(schema)
  const decodes = hasTransform(schema)
  return (body) => check.Check(body)
    ? { ok: true, value: (decodes ? check.Decode(body) : body) as Body }
    : { ok: false, errors: [...check.Errors(body)].slice(0, 10).map((error) => `${error.path || '/'}: ${error.message}`) }
}

/** Whether `schema`, or any schema inside it, transforms what it checks. */
function hasTransform(schema: unknown, seen = new Set<unknown>()): boolean {
  if (typeof schema !== 'object' || schema === null || seen.has(schema)) return false
  seen.add(schema)
  if (TransformKind in schema) return true
  return Object.values(schema).some((inner) => hasTransform(inner, seen))
}
