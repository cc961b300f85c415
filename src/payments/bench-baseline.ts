import { Elysia } from 'elysia'
import type { Pools } from '../store/db'
import { readJsonBody } from '../http/body'
import { problemResponse, problems } from '../http/problem'
import type { PaymentProvider } from '../provider/client'
import { validateNewPayment } from './schema'
import { insertPayment, paymentJson } from './insert-payment'
import { benchNaiveRoute } from './bench-naive'

/** Exists only with BENCH_BASELINE_ROUTE=1 (`npm run bench` sets it); never in normal operation. */
export const BENCH_BASELINE_ROUTE = '/bench/payments-baseline'

export interface BenchBaselineOptions {
  readonly pools: Pools
  readonly provider: PaymentProvider
  readonly tenant: (request: Request) => string | undefined
  readonly maxBodyBytes: number
}

/**
 * The benchmark's yardsticks. This one: the same payment as POST /api/payments
 * (same auth, body checks, schema, provider call and row) but without
 * idempotency, as one INSERT in autocommit. The ratio of the idempotent
 * route's throughput to this one is the price of exactly-once. Beside it, on
 * the same switch, the naive check-then-insert (bench-naive.ts): the price of
 * doing it right over doing it wrong.
 */
export function benchBaselineRoute(options: BenchBaselineOptions) {
  const { pools, provider, tenant: tenantOf, maxBodyBytes } = options
  return new Elysia({ name: 'bench-baseline' }).use(benchNaiveRoute(options)).post(BENCH_BASELINE_ROUTE, async ({ request }) => {
    const tenant = tenantOf(request)
    if (tenant === undefined) return problemResponse(problems.unauthorized(), { 'www-authenticate': 'Bearer' })
    const body = await readJsonBody(request, maxBodyBytes)
    if (!body.ok) return problemResponse(body.problem)
    const valid = validateNewPayment(body.value, body.text)
    if (!valid.ok) return problemResponse(problems.badRequest('invalid-body', 'The body does not match the schema.', valid.errors))
    const payment = valid.value
    // The same provider call as the idempotent route's, with a key of its own per request.
    const charge = await provider.charge(
      { amount: payment.amount, currency: payment.currency, customer: payment.customer },
      { idempotencyKey: `bench_${crypto.randomUUID()}`, signal: AbortSignal.timeout(30_000) },
    )
    // The same statement as the idempotent handler's (insert-payment.ts), in autocommit.
    const json = paymentJson(await insertPayment(pools.work, tenant, payment, charge.id, 'bench-baseline'))
    return new Response(JSON.stringify(json), { status: 201, headers: { 'content-type': 'application/json', location: `/api/payments/${json.id}` } })
  }, { parse: 'none' })
}
