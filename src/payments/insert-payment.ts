import type { NewPayment, Payment } from './schema'

/** A payments row as selected with PAYMENT_COLUMNS. */
export interface PaymentRow {
  id: string
  amount: string
  currency: string
  customer: string
  description: string | null
  status: string
  provider_ref: string
  created_at: Date
  /** created_at as PostgreSQL's text, microseconds included, for the list's cursor. */
  cursor_at: string
}

export const PAYMENT_COLUMNS = 'id, amount, currency, customer, description, status, provider_ref, created_at, created_at::text as cursor_at'

/** The payment as the API shows it. */
export function paymentJson(row: PaymentRow): Payment {
  return {
    id: row.id,
    amount: Number(row.amount), // at most 10^12: exact as a JSON number
    currency: row.currency,
    customer: row.customer,
    description: row.description,
    status: row.status as Payment['status'],
    provider_reference: row.provider_ref,
    created_at: row.created_at.toISOString(),
  }
}

/**
 * A new payment, as the row to insert and the JSON to answer with. Its id and
 * created_at come from the service, not from column defaults: the answer
 * stored with the key must name the row before the statement that writes
 * both runs (core/complete-rows.ts), and no gen_random_uuid() or clock runs
 * in the database's statement (a distributed table's shard needs that too:
 * docs/explanation/scaling.md).
 */
export function newPayment(tenant: string, payment: NewPayment, providerRef: string, idempotencyKey: string): { row: Record<string, string | number | null>; json: Payment } {
  const id = crypto.randomUUID()
  const createdAt = new Date().toISOString()
  const row = {
    id, tenant, amount: payment.amount, currency: payment.currency, customer: payment.customer,
    description: payment.description ?? null, status: 'succeeded', provider_ref: providerRef, idempotency_key: idempotencyKey, created_at: createdAt,
  }
  const json: Payment = {
    id, amount: payment.amount, currency: payment.currency, customer: payment.customer, description: payment.description ?? null,
    status: 'succeeded', provider_reference: providerRef, created_at: createdAt,
  }
  return { row, json }
}
