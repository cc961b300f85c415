/**
 * `npm run example:orders`: the orders app on DATABASE_URL, or, when it is
 * unset, on an embedded PostgreSQL of its own (data in .data/orders/pg, port
 * 54331: apart from the one `npm start` runs, so either can stop without the
 * other), and a fake warehouse. PORT (default 3100) is where it listens.
 */
import { startEmbedded } from '../../src/store/embedded'
import { createOrdersApp } from './app'
import { startWarehouse } from './warehouse'

const embedded = process.env.DATABASE_URL ? undefined : await startEmbedded({ dir: '.data/orders/pg', port: 54331, log: (line) => console.log(line) })
const warehouse = startWarehouse({ 'sku-1': 10 })
const { app, close } = await createOrdersApp({
  databaseUrl: process.env.DATABASE_URL || embedded!.url,
  warehouseUrl: warehouse.url,
  apiKeys: new Map([['shop-key', 'shop']]),
})
app.listen({ hostname: '127.0.0.1', port: Number(process.env.PORT ?? 3100) })
console.log(`orders: http://127.0.0.1:${app.server?.port}/orders (Authorization: Bearer shop-key)${embedded ? ` on the embedded PostgreSQL (${embedded.dir})` : ''}`)

async function stop() {
  await app.stop()
  await close()
  warehouse.stop()
  await embedded?.stop()
  process.exit(0)
}
process.once('SIGINT', () => void stop())
process.once('SIGTERM', () => void stop())
