import { Elysia } from 'elysia'
import type { Pools } from '../store/db'
import { readJsonBody } from '../http/body'
import { problemResponse, problems } from '../http/problem'
import type { Charge } from './provider'
import { validateNewPayment } from './schema'

interface PaymentRow {
  id: string
  amount: string
  currency: string
  customer: string
  description: string | null
  status: string
  provider_ref: string
  created_at: Date
}

/** Exists only with BENCH_BASELINE_ROUTE=1 (`npm run bench` sets it); never in normal operation. */
export const BENCH_BASELINE_ROUTE = '/bench/payments-baseline'

export interface BenchBaselineOptions {
  readonly pools: Pools
  readonly charge: Charge
  readonly tenant: (request: Request) => string | undefined
  readonly maxBodyBytes: number
}

/**
 * The benchmark's yardstick: the same payment as POST /api/payments (same
 * auth, body checks, schema, provider call and row) but without idempotency,
 * as one INSERT in autocommit. The ratio of the idempotent route's throughput
 * to this one is the price of exactly-once.
 */
export function benchBaselineRoute(options: BenchBaselineOptions) {
  const { pools, charge, tenant: tenantOf, maxBodyBytes } = options
  return new Elysia({ name: 'bench-baseline' }).post(BENCH_BASELINE_ROUTE, async ({ request }) => {
    const tenant = tenantOf(request)
    if (tenant === undefined) return problemResponse(problems.unauthorized(), { 'www-authenticate': 'Bearer' })
    const body = await readJsonBody(request, maxBodyBytes)
    if (!body.ok) return problemResponse(body.problem)
    const valid = validateNewPayment(body.value)
    if (!valid.ok) return problemResponse(problems.badRequest('invalid-body', 'The body does not match the schema.', valid.errors))
    const payment = valid.value
    const { reference } = await charge()
    // The same statement and RETURNING list as the idempotent handler (payments/routes.ts).
    const [row] = await pools.work<PaymentRow[]>`
      insert into payments (tenant, amount, currency, customer, description, status, provider_ref, idempotency_key)
      values (${tenant}, ${payment.amount}, ${payment.currency}, ${payment.customer}, ${payment.description ?? null}, 'succeeded', ${reference}, 'bench-baseline')
      returning id, amount, currency, customer, description, status, provider_ref, created_at, created_at::text as cursor_at`
    const json = {
      id: row!.id,
      amount: Number(row!.amount),
      currency: row!.currency,
      customer: row!.customer,
      description: row!.description,
      status: row!.status,
      provider_reference: row!.provider_ref,
      created_at: row!.created_at.toISOString(),
    }
    return new Response(JSON.stringify(json), { status: 201, headers: { 'content-type': 'application/json', location: `/api/payments/${json.id}` } })
  }, { parse: 'none' })
}
