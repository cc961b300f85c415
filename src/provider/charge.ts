/**
 * The provider's wire shapes and their checks, shared by the simulator (which
 * must refuse bad input) and the client (which must not trust an answer).
 * One home for the rules, so both sides agree on what a charge is.
 */
import { characters } from '../characters'

export interface ChargeRequest {
  readonly amount: number
  readonly currency: string
  readonly customer: string
}

export interface Charge {
  readonly id: string
  readonly amount: number
  readonly currency: string
  readonly customer: string
  readonly created_at: string
}

/** 1..255 printable ASCII (0x21..0x7E), the same rule as our own API's key (docs/reference/http-api.md). */
export const IDEMPOTENCY_KEY = /^[!-~]{1,255}$/
const CURRENCY = /^[A-Z]{3}$/
/** 64, as in our API: a provider's customer reference is an opaque short id. */
export const MAX_CUSTOMER_LENGTH = 64
/** 10^12 minor units, our API's cap; a provider would refuse far less, but never more. */
export const MAX_AMOUNT = 1_000_000_000_000
/** `ch_` plus at least one id character: the prefix tells a charge id from any other id in logs. */
const CHARGE_ID = /^ch_[A-Za-z0-9]{1,128}$/

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

/** Why `body` is not a charge request, or the request it is. Unknown fields are refused, like our API does. */
export function parseChargeRequest(body: unknown): ChargeRequest | string {
  if (!isRecord(body)) return 'the body must be a JSON object'
  const unknown = Object.keys(body).filter((name) => !['amount', 'currency', 'customer'].includes(name))
  if (unknown.length > 0) return `unknown field ${JSON.stringify(unknown[0])}`
  const { amount, currency, customer } = body
  if (typeof amount !== 'number' || !Number.isSafeInteger(amount) || amount < 1 || amount > MAX_AMOUNT)
    return `amount must be a whole number from 1 to ${MAX_AMOUNT}`
  if (typeof currency !== 'string' || !CURRENCY.test(currency)) return 'currency must be three upper-case letters'
  if (typeof customer !== 'string' || customer.length < 1 || characters(customer) > MAX_CUSTOMER_LENGTH || customer.includes('\0'))
    return `customer must be a string of 1 to ${MAX_CUSTOMER_LENGTH} characters`
  return { amount, currency, customer }
}

/** The charge in an answer, or undefined when it is not one: a provider's answer is input like any other. */
export function parseCharge(body: unknown): Charge | undefined {
  if (!isRecord(body)) return undefined
  const { id, amount, currency, customer, created_at } = body
  const request = parseChargeRequest({ amount, currency, customer })
  if (typeof request === 'string') return undefined
  if (typeof id !== 'string' || !CHARGE_ID.test(id)) return undefined
  if (typeof created_at !== 'string' || Number.isNaN(Date.parse(created_at))) return undefined
  return { id, ...request, created_at }
}

/** True when a charge is the one a request asked for: the provider must not charge other terms than ours. */
export function sameTerms(charge: ChargeRequest, request: ChargeRequest): boolean {
  return charge.amount === request.amount && charge.currency === request.currency && charge.customer === request.customer
}
