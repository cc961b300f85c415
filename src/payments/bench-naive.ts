import { Elysia } from 'elysia'
import type postgres from 'postgres'
import type { Pools } from '../store/db'
import { readJsonBody } from '../http/body'
import { IdempotencyKey } from '../http/operation'
import { problem, problemResponse } from '../http/problem'
import type { PaymentProvider } from '../provider/client'
import { validateNewPayment } from './schema'
import { insertPayment, paymentJson } from './insert-payment'

/** Exists only with BENCH_BASELINE_ROUTE=1, beside the non-idempotent baseline (bench-baseline.ts). */
export const BENCH_NAIVE_ROUTE = '/bench/payments-naive'
/** Its own table, made by the route on first use: it is no part of the product's schema (sql/). */
export const NAIVE_KEYS_TABLE = 'bench_naive_keys'
/** The downstream keys it sends the provider start with this, so the bench can tell its charges apart in a ledger. */
export const NAIVE_DOWNSTREAM_PREFIX = 'naive_'

const KEY_PATTERN = new RegExp(IdempotencyKey.pattern!)

export interface BenchNaiveOptions {
  readonly pools: Pools
  readonly provider: PaymentProvider
  readonly tenant: (request: Request) => string | undefined
  readonly maxBodyBytes: number
}

interface StoredAnswer {
  response_status: number
  response_headers: Record<string, string>
  response_body: string
}

/**
 * Makes the naive route's table if it is missing. Several processes (WORKERS>1,
 * or a bench and a test) may get here at once, and two concurrent `create
 * table if not exists` can both pass the check and one then fails on the
 * catalog's unique index: the transaction-scoped advisory lock serialises them.
 */
export async function ensureNaiveKeysTable(sql: postgres.Sql<Record<string, never>>): Promise<void> {
  await sql.begin(async (tx) => {
    await tx`select pg_advisory_xact_lock(hashtext(${NAIVE_KEYS_TABLE}))`
    await tx.unsafe(`
      create table if not exists ${NAIVE_KEYS_TABLE} (
        tenant           text        not null,
        key              text        not null,
        response_status  smallint    not null,
        response_headers jsonb       not null,
        response_body    text        not null,
        created_at       timestamptz not null default now(),
        primary key (tenant, key)
      )`)
  })
}

/**
 * The downstream key: the client's key, scoped by tenant (two tenants' equal
 * keys must not get one charge) and hashed to a fixed length, as the real
 * route's is (core/downstream-key.ts) minus the request id.
 */
function naiveDownstreamKey(tenant: string, key: string): string {
  return `${NAIVE_DOWNSTREAM_PREFIX}${new Bun.CryptoHasher('sha256').update(`${tenant}\u0000${key}`).digest('base64url')}`
}

/**
 * The benchmark's second yardstick: "doing it wrong", the check-then-insert of
 * the usual articles (seed 002). SELECT the key; if found, answer what it
 * stored; else call the provider (the real route's call, same client, with the
 * request's key passed downstream), INSERT the payment, INSERT the key with its
 * answer. Three autocommit statements in three round trips, two commits.
 *
 * No claim, no fence, no release: concurrent requests with one key all pass
 * the SELECT and each makes a payment (test/bench/naive-route.test.ts shows
 * it); a failed request leaves nothing and is simply run again. It checks
 * what the real route checks before its claim (tenant, body, key, schema),
 * but not that a retry's body matches the first one's (the articles' version
 * does not either). The ratio of the idempotent route's throughput to this
 * one's is what exactly-once costs over the common wrong answer.
 */
export function benchNaiveRoute(options: BenchNaiveOptions) {
  const { pools, provider, tenant: tenantOf, maxBodyBytes } = options
  let tableReady: Promise<void> | undefined
  let ready = false
  const ensureTable = async () => {
    tableReady ??= ensureNaiveKeysTable(pools.work).catch((error: unknown) => {
      tableReady = undefined // the next request tries again
      throw error
    })
    await tableReady
    ready = true
  }

  return new Elysia({ name: 'bench-naive' }).post(BENCH_NAIVE_ROUTE, async ({ request }) => {
    const tenant = tenantOf(request)
    if (tenant === undefined) return problemResponse(problem('unauthorized'), { 'www-authenticate': 'Bearer' })
    const key = request.headers.get('idempotency-key')
    const body = await readJsonBody(request, maxBodyBytes)
    if (!body.ok) return problemResponse(body.problem)
    if (key === null) return problemResponse(problem('missing-idempotency-key'))
    if (!KEY_PATTERN.test(key)) return problemResponse(problem('invalid-idempotency-key'))
    const valid = validateNewPayment(body.value, body.text)
    if (!valid.ok) return problemResponse(problem('invalid-body', undefined, { errors: valid.errors }))
    if (!ready) await ensureTable()

    // Check.
    const [seen] = await pools.short<StoredAnswer[]>`
      select response_status, response_headers, response_body from bench_naive_keys where tenant = ${tenant} and key = ${key}`
    if (seen) return new Response(seen.response_body, { status: seen.response_status, headers: { ...seen.response_headers, 'idempotent-replayed': 'true' } })

    // Act: the same provider call as the real route's.
    const payment = valid.value
    const charge = await provider.charge(
      { amount: payment.amount, currency: payment.currency, customer: payment.customer },
      { idempotencyKey: naiveDownstreamKey(tenant, key), signal: AbortSignal.timeout(30_000) },
    )
    // Insert the payment, then the key with its answer: two statements, each its own commit.
    const json = paymentJson(await insertPayment(pools.work, tenant, payment, charge.id, key))
    const headers = { 'content-type': 'application/json', location: `/api/payments/${json.id}` }
    const text = JSON.stringify(json)
    // A concurrent request with the same key may have stored its answer first: the first one stays.
    await pools.work`
      insert into bench_naive_keys (tenant, key, response_status, response_headers, response_body)
      values (${tenant}, ${key}, 201, ${pools.work.json(headers)}, ${text})
      on conflict (tenant, key) do nothing`
    return new Response(text, { status: 201, headers })
  }, { parse: 'none' })
}
