// app.ts: an idempotent POST /orders. Needs a PostgreSQL: by default the embedded one a running `npm start` serves.
import { Type } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import { bearerTenant, idempotentPost, migrate, openPools } from 'idempotent-post'

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres:postgres@127.0.0.1:54329/postgres'
await migrate(databaseUrl)           // the engine's tables: safe on every start, from many processes at once
const pools = openPools(databaseUrl) // the two postgres.js pools the plugin takes
await pools.short`create table if not exists cafe_orders (id serial primary key, tenant text not null, item text not null, quantity int not null, total_cents int not null)`
const PRICES = { tea: 450, cake: 375 } // cents

const app = new Elysia().use(idempotentPost({ pools, tenant: bearerTenant(new Map([['dev-key', 'cafe']])) }, {
  path: '/orders',
  body: Type.Object({ item: Type.Union([Type.Literal('tea'), Type.Literal('cake')]), quantity: Type.Integer({ minimum: 1, maximum: 20 }) }),
  // The work, with no connection held: here a sum; a call to another service would pass on `idempotencyKey` and `signal`.
  act: async ({ body }) => ({ totalCents: PRICES[body.item] * body.quantity }),
  // Your writes, in the transaction that completes the key: made once, and every retry gets this answer back.
  async record({ body, result, tenant, tx }) {
    const [order] = await tx<{ id: number }[]>`insert into cafe_orders (tenant, item, quantity, total_cents)
      values (${tenant}, ${body.item}, ${body.quantity}, ${result.totalCents}) returning id`
    return { status: 201, body: { id: order!.id, ...body, ...result } }
  },
})).listen({ hostname: '127.0.0.1', port: Number(process.env.PORT ?? 3200) })

console.log(`listening on http://127.0.0.1:${app.server!.port}/orders (Authorization: Bearer dev-key)`)
