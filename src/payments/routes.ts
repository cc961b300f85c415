import { Elysia } from 'elysia'
import type { Pools } from '../store/db'
import { retryRead } from '../store/read'
import { idempotentPost, type IdempotencyOptions } from '../http/idempotency'
import { problemResponse, problems } from '../http/problem'
import { decodeCursor, encodeCursor, isUuid } from './cursor'
import type { Charge, PaymentProvider } from '../provider/client'
import { validateNewPayment, type NewPayment } from './schema'
import { insertPayment, PAYMENT_COLUMNS, paymentJson, type PaymentRow } from './insert-payment'

export const PAYMENTS_ROUTE = '/api/payments'
/** Page size of the list: 20 by default, 100 at most (SPEC). */
const DEFAULT_LIMIT = 20
const MAX_LIMIT = 100

export interface PaymentsOptions extends IdempotencyOptions {
  readonly pools: Pools
  readonly provider: PaymentProvider
}

/** The reference payments API: idempotent POST, GET by id, list by customer. */
export function paymentsRoutes(options: PaymentsOptions) {
  const { pools, provider, tenant: tenantOf } = options
  const columns = pools.short.unsafe(PAYMENT_COLUMNS)

  const create = idempotentPost<NewPayment, Charge>(options, {
    path: PAYMENTS_ROUTE,
    validate: validateNewPayment,
    // External step: the charge, under the request's deadline and with our
    // downstream key, so a re-execution gets the same charge back.
    act: ({ body, signal, idempotencyKey }) =>
      provider.charge({ amount: body.amount, currency: body.currency, customer: body.customer }, { idempotencyKey, signal }),
    // Recording step: the payment row, committed with the key's completion.
    async record({ body, tx, tenant, key, result: charge }) {
      const payment = paymentJson(await insertPayment(tx, tenant, body, charge.id, key))
      return { status: 201, headers: { location: `${PAYMENTS_ROUTE}/${payment.id}` }, body: payment }
    },
  })

  return new Elysia({ name: 'payments' })
    .use(create)
    .get(`${PAYMENTS_ROUTE}/:id`, async ({ request, params }) => {
      const tenant = tenantOf(request)
      if (tenant === undefined) return problemResponse(problems.unauthorized(), { 'www-authenticate': 'Bearer' })
      // Another tenant's payment is answered exactly like a missing one: no existence leaks.
      if (!isUuid(params.id)) return problemResponse(problems.notFound('No such payment.'))
      const [row] = await retryRead(() => pools.short<PaymentRow[]>`select ${columns} from payments where id = ${params.id} and tenant = ${tenant}`)
      return row ? Response.json(paymentJson(row)) : problemResponse(problems.notFound('No such payment.'))
    })
    .get(PAYMENTS_ROUTE, async ({ request }) => {
      const tenant = tenantOf(request)
      if (tenant === undefined) return problemResponse(problems.unauthorized(), { 'www-authenticate': 'Bearer' })
      const query = new URL(request.url).searchParams
      const customer = query.get('customer')
      if (!customer || customer.length > 64 || customer.includes('\u0000'))
        return problemResponse(problems.badRequest('invalid-query', 'Give ?customer= (1 to 64 characters).'))
      const rawLimit = query.get('limit')
      const limit = rawLimit === null ? DEFAULT_LIMIT : /^\d{1,3}$/.test(rawLimit) ? Number(rawLimit) : NaN
      if (!(limit >= 1 && limit <= MAX_LIMIT))
        return problemResponse(problems.badRequest('invalid-query', `limit must be a whole number from 1 to ${MAX_LIMIT}.`))
      const rawCursor = query.get('cursor')
      const cursor = rawCursor ? decodeCursor(rawCursor) : undefined
      if (rawCursor && !cursor) return problemResponse(problems.badRequest('invalid-query', 'cursor is not one this API gave out.'))
      const rows = await retryRead(() => pools.short<PaymentRow[]>`
        select ${columns} from payments
         where tenant = ${tenant} and customer = ${customer}
           ${cursor ? pools.short`and (created_at, id) < (${cursor.createdAt}::timestamptz, ${cursor.id}::uuid)` : pools.short``}
         order by created_at desc, id desc
         limit ${limit + 1}`)
      const page = rows.slice(0, limit)
      const last = page.at(-1)
      return Response.json({
        data: page.map(paymentJson),
        next_cursor: rows.length > limit && last ? encodeCursor({ createdAt: last.cursor_at, id: last.id }) : null,
      })
    })
}
