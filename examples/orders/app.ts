/**
 * An orders API whose POST /orders is idempotent: a retried order reserves
 * stock once and is stored once, however often the client sends it.
 */
import { Type } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import { migrate, openPools, startHeartbeat, startRetentionPurge } from 'idempotent-post/engine'
import { bearerTenant, defineProblems, idempotentPost, InFlight, problemResult } from 'idempotent-post/plugin'

const NewOrder = Type.Object({
  sku: Type.String({ minLength: 1, maxLength: 32 }),
  quantity: Type.Integer({ minimum: 1, maximum: 100 }),
}, { additionalProperties: false })

/** This app's own problem codes, next to the plugin's: a client switches on `type` or `code`. */
export const ORDER_PROBLEMS = defineProblems({
  'out-of-stock': { status: 422, title: 'Out of stock', detail: 'The warehouse does not have that many of this item.' },
}, { typePrefix: 'urn:orders:problem:' })

/** How long a completed order's answer is replayed to a retry; the purge deletes its key after that. */
const RETENTION_SECONDS = 86_400

export interface OrdersOptions {
  readonly databaseUrl: string
  readonly warehouseUrl: string
  /** API key → tenant (a shop). */
  readonly apiKeys: ReadonlyMap<string, string>
}

export async function createOrdersApp({ databaseUrl, warehouseUrl, apiKeys }: OrdersOptions) {
  await migrate(databaseUrl) // the engine's tables; safe to run on every start
  const pools = openPools(databaseUrl)
  await pools.short`
    create table if not exists orders (
      id              uuid        primary key default gen_random_uuid(),
      shop            text        not null,
      sku             text        not null,
      quantity        int         not null check (quantity between 1 and 100),
      reservation     text        not null,
      idempotency_key text        not null,
      created_at      timestamptz not null default now()
    )`

  // This process's heartbeat, listing the requests it runs: an operator can then tell
  // a dead worker's key from a live one's, and force-expire it before its TTL.
  const inFlight = new InFlight()
  const heartbeat = await startHeartbeat(pools.short, { leases: () => inFlight.leaseIds(), purges: true, retentionSeconds: RETENTION_SECONDS })
  // Deletes the keys past their retention in the background; without it they stay forever.
  // Told the heartbeat, it takes turns with the other processes that purge: one purges at a time.
  const purge = startRetentionPurge({ sql: pools.short, retentionSeconds: RETENTION_SECONDS, processId: heartbeat.id })

  const app = new Elysia().use(idempotentPost({ pools, tenant: bearerTenant(apiKeys), inFlight, owner: () => heartbeat.id, retentionSeconds: RETENTION_SECONDS }, {
    path: '/orders',
    body: NewOrder,
    problems: ORDER_PROBLEMS,
    // The foreign call: no database connection is held while it runs. The
    // warehouse gets our idempotencyKey, the same on every re-execution of
    // this order, so a retry after a crash gets the same reservation back.
    async act({ body, idempotencyKey, signal }) {
      const answer = await fetch(`${warehouseUrl}/reservations`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': idempotencyKey },
        body: JSON.stringify(body),
        signal,
      })
      if (answer.status === 409) return { reserved: false as const }
      if (!answer.ok) throw new Error(`the warehouse answered ${answer.status}`) // 500, the key released: a retry runs again
      return { reserved: true as const, reservation: (await answer.json() as { id: string }).id }
    },
    // Our writes, in the transaction that completes the key: stored once, with the answer.
    async record({ body, tenant, key, result, tx }) {
      if (!result.reserved) // A business refusal: stored and replayed like a success.
        return problemResult(ORDER_PROBLEMS.problem('out-of-stock', `Not ${body.quantity} of ${body.sku} in stock.`))
      const [order] = await tx`
        insert into orders (shop, sku, quantity, reservation, idempotency_key)
        values (${tenant}, ${body.sku}, ${body.quantity}, ${result.reservation}, ${key})
        returning id, sku, quantity, reservation`
      return { status: 201, headers: { location: `/orders/${order!.id}` }, body: order }
    },
  }))

  // After app.stop() (in-flight requests finish): the purge, the heartbeat, then the pools.
  const close = async () => {
    await purge.stop()
    await heartbeat.stop()
    await pools.close()
  }
  return { app, purge, close }
}
