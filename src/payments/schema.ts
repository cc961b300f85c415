import { Type, type Static } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { characters } from '../characters'
import { integerLiteralsOnly } from '../http/body'
import type { Validation } from '../http/idempotency'

/** The largest amount in minor units: 10^12 (ten billion in a two-decimal currency). */
export const MAX_AMOUNT = 1_000_000_000_000
/** Page size of the list: 20 by default, 100 at most (docs/reference/http-api.md). */
export const DEFAULT_LIMIT = 20
export const MAX_LIMIT = 100
/** A customer id: 1 to 64 characters (the payments table checks the same). */
export const CUSTOMER_MAX_LENGTH = 64
/** The payments table checks the same. */
export const DESCRIPTION_MAX_LENGTH = 500
/** The payments table's provider_ref: any provider's charge id, not only our simulator's. */
const PROVIDER_REFERENCE_MAX_LENGTH = 255

const Amount = Type.Integer({ minimum: 1, maximum: MAX_AMOUNT, description: 'Minor units (cents), written as a whole number: no fraction, no exponent.' })
const Currency = Type.String({ pattern: '^[A-Z]{3}$', description: 'ISO 4217 code, upper case.', examples: ['EUR'] })
const Customer = Type.String({ minLength: 1, maxLength: CUSTOMER_MAX_LENGTH })

/** The body of POST /api/payments: checks every request, and is the body of the OpenAPI document. */
export const NewPayment = Type.Object(
  {
    amount: Amount,
    currency: Currency,
    customer: Customer,
    // null, what every answer carries when there is none, means none: a client may send back what it got.
    description: Type.Optional(Type.Union([Type.String({ maxLength: DESCRIPTION_MAX_LENGTH }), Type.Null()], { description: 'Up to 500 characters; null or absent: none.' })),
  },
  { additionalProperties: false, title: 'NewPayment' },
)
export type NewPayment = Static<typeof NewPayment>

/**
 * Lengths are characters (Unicode code points), as JSON Schema and
 * PostgreSQL's length() count them; TypeBox counts UTF-16 units, so 40 emoji
 * (80 units) failed a 64-character bound. The compiled check allows twice the
 * units (no string of n code points has more than 2n), and `lengthErrors`
 * then counts code points.
 */
const NewPaymentUnits = Type.Object(
  {
    amount: Amount,
    currency: Currency,
    customer: Type.String({ minLength: 1, maxLength: 2 * CUSTOMER_MAX_LENGTH }),
    description: Type.Optional(Type.Union([Type.String({ maxLength: 2 * DESCRIPTION_MAX_LENGTH }), Type.Null()])),
  },
  { additionalProperties: false },
)

function lengthErrors(payment: NewPayment): string[] {
  const errors: string[] = []
  if (characters(payment.customer) > CUSTOMER_MAX_LENGTH) errors.push(`/customer: Expected string length less or equal to ${CUSTOMER_MAX_LENGTH} characters`)
  if (typeof payment.description === 'string' && characters(payment.description) > DESCRIPTION_MAX_LENGTH)
    errors.push(`/description: Expected string length less or equal to ${DESCRIPTION_MAX_LENGTH} characters`)
  return errors
}

const UUID_PATTERN = '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'

/** A payment as the API shows it (insert-payment.ts builds it; the OpenAPI document and the contract tests use this). */
export const Payment = Type.Object(
  {
    id: Type.String({ pattern: UUID_PATTERN }),
    amount: Amount,
    currency: Currency,
    customer: Customer,
    description: Type.Union([Type.String({ maxLength: DESCRIPTION_MAX_LENGTH }), Type.Null()]),
    status: Type.Literal('succeeded'),
    provider_reference: Type.String({ minLength: 1, maxLength: PROVIDER_REFERENCE_MAX_LENGTH, description: 'The payment provider\'s charge id.' }),
    created_at: Type.String({ format: 'date-time', description: 'RFC 3339 (ISO 8601) in UTC, with milliseconds.', examples: ['2026-12-01T00:50:46.069Z'] }),
  },
  { additionalProperties: false, title: 'Payment' },
)
export type Payment = Static<typeof Payment>

/** A page of GET /api/payments. */
export const PaymentPage = Type.Object(
  {
    data: Type.Array(Payment, { description: 'Newest first.' }),
    next_cursor: Type.Union([Type.String(), Type.Null()], { description: 'Pass as `cursor` for the next page; null on the last.' }),
  },
  { additionalProperties: false, title: 'PaymentPage' },
)

/** The list's query parameters, as documented; routes.ts checks them with these bounds. */
export const PaymentListQuery = {
  customer: { required: true, schema: Customer },
  limit: { required: false, schema: Type.Integer({ minimum: 1, maximum: MAX_LIMIT, default: DEFAULT_LIMIT }) },
  cursor: { required: false, schema: Type.String({ pattern: '^[A-Za-z0-9_-]{1,200}$', description: 'next_cursor of the previous page.' }) },
} as const

// Compiled once: TypeBox's checker is a generated function, ~50x faster than interpreting the schema.
const check = TypeCompiler.Compile(NewPaymentUnits)

/** `text` is the body as sent: an amount written `12.0` or `1e3` is not an integer, whatever it parses to. */
export function validateNewPayment(body: unknown, text?: string): Validation<NewPayment> {
  if (text !== undefined && !integerLiteralsOnly(text)) return { ok: false, errors: ['/amount: must be written as a whole number (no fraction, no exponent)'] }
  if (check.Check(body)) {
    const errors = lengthErrors(body)
    return errors.length === 0 ? { ok: true, value: body } : { ok: false, errors }
  }
  const errors = [...check.Errors(body)].slice(0, 10).map((error) => `${error.path || '/'}: ${error.message}`)
  return { ok: false, errors }
}
