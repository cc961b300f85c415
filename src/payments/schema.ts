import { Type, type Static } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { integerLiteralsOnly } from '../http/body'
import type { Validation } from '../http/idempotency'

/** The largest amount in minor units: 10^12 (ten billion in a two-decimal currency). */
export const MAX_AMOUNT = 1_000_000_000_000

export const NewPayment = Type.Object(
  {
    amount: Type.Integer({ minimum: 1, maximum: MAX_AMOUNT }),
    currency: Type.String({ pattern: '^[A-Z]{3}$' }),
    customer: Type.String({ minLength: 1, maxLength: 64 }),
    description: Type.Optional(Type.String({ maxLength: 500 })),
  },
  { additionalProperties: false },
)
export type NewPayment = Static<typeof NewPayment>

// Compiled once: TypeBox's checker is a generated function, ~50x faster than interpreting the schema.
const check = TypeCompiler.Compile(NewPayment)

/** `text` is the body as sent: an amount written `12.0` or `1e3` is not an integer, whatever it parses to. */
export function validateNewPayment(body: unknown, text?: string): Validation<NewPayment> {
  if (text !== undefined && !integerLiteralsOnly(text)) return { ok: false, errors: ['/amount: must be written as a whole number (no fraction, no exponent)'] }
  if (check.Check(body)) return { ok: true, value: body }
  const errors = [...check.Errors(body)].slice(0, 10).map((error) => `${error.path || '/'}: ${error.message}`)
  return { ok: false, errors }
}
