/**
 * The yardstick a user would pick: seed 002's check-then-insert written as a
 * small app of its own, plain Elysia on postgres.js, with no idempotency
 * layer beyond SELECT-then-INSERT and none of the product's per-request work
 * (no metrics, no logs, no request ids, no rate limits, no schema library).
 * Its own process and its own database; the bench gives it the same provider
 * process as the service.
 *
 *   POST /payments   SELECT the key; if found, its stored answer. Else call the
 *                    provider, INSERT the payment, INSERT the key with the answer.
 *   POST /baseline   no idempotency at all: call the provider, INSERT the payment.
 *
 * Concurrent retries of one key all pass the SELECT and each charges and
 * inserts (test/bench/naive-app.test.ts shows it): that is what exactly-once
 * is measured against. It is never part of the service.
 *
 *   DATABASE_URL=... PAYMENT_PROVIDER_URL=... PORT=0 bun bench/naive-app.ts
 *
 * (bench/naive-process.ts starts it for the bench and the tests.)
 */
import { Elysia } from 'elysia'
import postgres from 'postgres'
import { BASELINE_DOWNSTREAM_PREFIX, NAIVE_API_KEY, NAIVE_DOWNSTREAM_PREFIX } from './naive-process'


interface NewPayment { amount: number; currency: string; customer: string; description?: string | null }
/** One tenant, as the bench's service has. */
const TENANT = 'bench'

function env(name: string): string {
  const value = process.env[name]
  if (!value) throw new Error(`${name} is required`)
  return value
}

const sql = postgres(env('DATABASE_URL'), { max: 16, onnotice: () => undefined })
const provider = `${env('PAYMENT_PROVIDER_URL').replace(/\/+$/, '')}/v1/charges`

// The same payments table as the service's (sql/service/00001, 00002: its columns, checks and
// index), so both apps store the same row; only the key handling differs.
await sql.unsafe(`
  create table if not exists naive_payments (
    id               uuid        primary key default gen_random_uuid(),
    tenant           text        not null check (length(tenant) between 1 and 64),
    amount           bigint      not null check (amount between 1 and 1000000000000),
    currency         text        not null check (currency ~ '^[A-Z]{3}$'),
    customer         text        not null check (length(customer) between 1 and 64),
    description      text        check (length(description) <= 500),
    status           text        not null check (status in ('succeeded')),
    provider_ref     text        not null check (length(provider_ref) between 1 and 255),
    idempotency_key  text        check (length(idempotency_key) between 1 and 255),
    created_at       timestamptz not null default clock_timestamp()
  );
  create index if not exists naive_payments_tenant_customer_created on naive_payments (tenant, customer, created_at desc, id desc);
  -- No unique index on the key: that is the naive version. Its lookups use this one.
  create table if not exists naive_keys (tenant text not null, key text not null, response text not null);
  create index if not exists naive_keys_key on naive_keys (tenant, key);`)

function valid(body: unknown): body is NewPayment {
  const b = body as Partial<NewPayment> | null
  return typeof b === 'object' && b !== null && Number.isInteger(b.amount) && b.amount! > 0
    && typeof b.currency === 'string' && /^[A-Z]{3}$/.test(b.currency) && typeof b.customer === 'string' && b.customer.length > 0
}

async function charge(payment: NewPayment, downstreamKey: string): Promise<string> {
  const response = await fetch(provider, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': downstreamKey },
    body: JSON.stringify(payment),
    signal: AbortSignal.timeout(30_000),
  })
  if (!response.ok) throw new Error(`provider answered ${response.status}`)
  return ((await response.json()) as { id: string }).id
}

async function insertPayment(payment: NewPayment, providerRef: string, key: string | null): Promise<string> {
  const [row] = await sql<{ id: string; created_at: Date }[]>`
    insert into naive_payments (tenant, amount, currency, customer, description, status, provider_ref, idempotency_key)
    values (${TENANT}, ${payment.amount}, ${payment.currency}, ${payment.customer}, ${payment.description ?? null}, 'succeeded', ${providerRef}, ${key})
    returning id, created_at`
  return JSON.stringify({
    id: row!.id, amount: payment.amount, currency: payment.currency, customer: payment.customer, description: payment.description ?? null,
    status: 'succeeded', provider_reference: providerRef, created_at: row!.created_at.toISOString(),
  })
}

const authorized = (request: Request) => request.headers.get('authorization') === `Bearer ${NAIVE_API_KEY}`
const created = (text: string) => new Response(text, { status: 201, headers: { 'content-type': 'application/json' } })

const app = new Elysia()
  .post('/payments', async ({ request, body, status }) => {
    if (!authorized(request)) return status(401)
    const key = request.headers.get('idempotency-key')
    if (!key || !valid(body)) return status(400)
    const [seen] = await sql<{ response: string }[]>`select response from naive_keys where tenant = ${TENANT} and key = ${key}` // check
    if (seen) return created(seen.response)
    const text = await insertPayment(body, await charge(body, `${NAIVE_DOWNSTREAM_PREFIX}${key}`), key) // process
    await sql`insert into naive_keys (tenant, key, response) values (${TENANT}, ${key}, ${text})` // save the key
    return created(text)
  })
  .post('/baseline', async ({ request, body, status }) => {
    if (!authorized(request)) return status(401)
    if (!valid(body)) return status(400)
    return created(await insertPayment(body, await charge(body, `${BASELINE_DOWNSTREAM_PREFIX}${crypto.randomUUID()}`), null))
  })
  .onError(({ error }) => new Response(String(error), { status: 500 }))

const server = app.listen({ hostname: '127.0.0.1', port: Number(process.env.PORT ?? 0) })
console.log(`naive app listening on http://127.0.0.1:${server.server!.port}`)
process.on('SIGTERM', async () => {
  await server.stop()
  await sql.end({ timeout: 2 })
  process.exit(0)
})
