import { Elysia } from 'elysia'
import { characters } from '../characters'
import type { Pools } from '../store/db'
import { retryRead } from '../store/read'
import type { RetryCause } from '../core/recovery'
import { notify } from '../http/outcomes'
import { idempotentPost, type IdempotencyOptions } from '../http/idempotency'
import { detail, problemAnswer, problemAnswers } from '../http/operation'
import { problem, problemResponse, problems } from '../http/problem'
import { PAYMENT_PROBLEMS } from './problems'
import { cursorKey, decodeCursor, encodeCursor, isUuid } from './cursor'
import { bearerToken } from '../http/auth'
import type { Charge, PaymentProvider } from '../provider/client'
import { CUSTOMER_MAX_LENGTH, DEFAULT_LIMIT, MAX_LIMIT, NewPayment, Payment, PaymentListQuery, PaymentPage, validateNewPayment } from './schema'
import { newPayment, PAYMENT_COLUMNS, paymentJson, type PaymentRow } from './insert-payment'

export const PAYMENTS_ROUTE = '/api/payments'
/** The route templates of this API, for the metrics' `route` label (http/observe.ts). */
export const PAYMENTS_ROUTES = [PAYMENTS_ROUTE, `${PAYMENTS_ROUTE}/:id`] as const

export interface PaymentsOptions extends IdempotencyOptions {
  readonly pools: Pools
  readonly provider: PaymentProvider
}

const TAGS = ['payments']
const json = (schema: unknown) => ({ 'application/json': { schema } })
const unauthorized = problemAnswer(['unauthorized'], 'No or wrong API key.')
const paymentAnswer = problemAnswers(PAYMENT_PROBLEMS)

/** The reference payments API: idempotent POST, GET by id, list by customer. */
export function paymentsRoutes(options: PaymentsOptions) {
  const { pools, provider, tenant: tenantOf } = options
  const columns = pools.short.unsafe(PAYMENT_COLUMNS)
  // A read run again after its connection failed is counted as the POST's statements are.
  const readRetried = (route: string) => (cause: RetryCause) => notify('onRetry', options.hooks?.onRetry, { route, statement: 'read', cause })

  const create = idempotentPost<NewPayment, Charge>(options, {
    path: PAYMENTS_ROUTE,
    body: NewPayment,
    validate: validateNewPayment,
    problems: PAYMENT_PROBLEMS,
    docs: {
      summary: 'Create a payment, once per Idempotency-Key',
      tags: TAGS,
      operationId: 'createPayment',
      responses: {
        201: {
          description: 'The payment was made (or, with `Idempotent-Replayed: true`, the first answer of this key again).',
          headers: { Location: { description: 'The new payment: `/api/payments/{id}`.', required: true, schema: { type: 'string' } } },
          content: json(Payment),
        },
        502: paymentAnswer(['provider-failed', 'provider-key-conflict'], 'The payment provider failed or refused; the key was released, so a retry runs again.'),
      },
    },
    // What the admin shows of a key before its payment exists: who and how much, to look it up at the provider.
    summary: (body) => ({ customer: body.customer, amount: body.amount, currency: body.currency }),
    // External step: the charge, under the request's deadline and with our
    // downstream key, so a re-execution gets the same charge back.
    act: ({ body, signal, idempotencyKey }) =>
      provider.charge({ amount: body.amount, currency: body.currency, customer: body.customer }, { idempotencyKey, signal }),
    // Recording step: the payment row, written with the key's completion in one statement.
    recordRows({ body, tenant, key, result: charge }) {
      const payment = newPayment(tenant, body, charge.id, key)
      return { status: 201, headers: { location: `${PAYMENTS_ROUTE}/${payment.json.id}` }, body: payment.json, insert: { payments: [payment.row] } }
    },
  })

  return new Elysia({ name: 'payments' })
    .use(create)
    .get(`${PAYMENTS_ROUTE}/:id`, async ({ request, params }) => {
      const tenant = tenantOf(request)
      if (tenant === undefined) return problemResponse(problems.unauthorized(), { 'www-authenticate': 'Bearer' })
      // Another tenant's payment is answered exactly like a missing one: no existence leaks.
      if (!isUuid(params.id)) return problemResponse(problems.notFound('No such payment.'))
      const [row] = await retryRead(() => pools.short<PaymentRow[]>`select ${columns} from payments where id = ${params.id} and tenant = ${tenant}`, readRetried(`${PAYMENTS_ROUTE}/:id`))
      return row ? Response.json(paymentJson(row)) : problemResponse(problems.notFound('No such payment.'))
    }, {
      detail: detail({
        summary: 'One payment',
        tags: TAGS,
        operationId: 'getPayment',
        responses: {
          200: { description: 'The payment.', content: json(Payment) },
          401: unauthorized,
          404: problemAnswer(['not-found'], 'No such payment for this tenant (another tenant\'s is answered the same way), or a malformed id.'),
          503: problemAnswer(['database-unavailable']),
        },
      }),
    })
    .get(PAYMENTS_ROUTE, async ({ request }) => {
      const tenant = tenantOf(request)
      if (tenant === undefined) return problemResponse(problems.unauthorized(), { 'www-authenticate': 'Bearer' })
      const query = new URL(request.url).searchParams
      const customer = query.get('customer')
      if (!customer || characters(customer) > CUSTOMER_MAX_LENGTH || customer.includes('\u0000'))
        return problemResponse(problem('invalid-query', `Give ?customer= (1 to ${CUSTOMER_MAX_LENGTH} characters).`))
      const rawLimit = query.get('limit')
      const limit = rawLimit === null ? DEFAULT_LIMIT : /^\d{1,3}$/.test(rawLimit) ? Number(rawLimit) : NaN
      if (!(limit >= 1 && limit <= MAX_LIMIT))
        return problemResponse(problem('invalid-query', `limit must be a whole number from 1 to ${MAX_LIMIT}.`))
      const rawCursor = query.get('cursor')
      // Signed for the key that asks (tenantOf found it, so the request has one).
      const signing = cursorKey(bearerToken(request)!)
      const cursor = rawCursor ? decodeCursor(rawCursor, signing) : undefined
      if (rawCursor && !cursor) return problemResponse(problem('invalid-query', 'cursor is not one this API gave out.'))
      // The cursor's instant as text: a timestamptz parameter becomes a JS Date in postgres.js, to the millisecond (rows skipped).
      const rows = await retryRead(() => pools.short<PaymentRow[]>`
        select ${columns} from payments
         where tenant = ${tenant} and customer = ${customer}
           ${cursor ? pools.short`and (created_at, id) < (${cursor.createdAt}::text::timestamptz, ${cursor.id}::uuid)` : pools.short``}
         order by created_at desc, id desc
         limit ${limit + 1}`, readRetried(PAYMENTS_ROUTE))
      const page = rows.slice(0, limit)
      const last = page.at(-1)
      return Response.json({
        data: page.map(paymentJson),
        next_cursor: rows.length > limit && last ? encodeCursor({ createdAt: last.cursor_at, id: last.id }, signing) : null,
      })
    }, {
      detail: detail({
        summary: 'A customer\'s payments, newest first',
        tags: TAGS,
        operationId: 'listPayments',
        parameters: Object.entries(PaymentListQuery).map(([name, { required, schema }]) => ({ name, in: 'query' as const, required, schema })),
        responses: {
          200: { description: 'A page of payments.', content: json(PaymentPage) },
          400: problemAnswer(['invalid-query']),
          401: unauthorized,
          503: problemAnswer(['database-unavailable']),
        },
      }),
    })
}
