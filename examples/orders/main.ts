/** DATABASE_URL=postgres://... bun examples/orders/main.ts */
import { createOrdersApp } from './app'
import { startWarehouse } from './warehouse'

const warehouse = startWarehouse({ 'sku-1': 10 })
const { app } = await createOrdersApp({
  databaseUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
  warehouseUrl: warehouse.url,
  apiKeys: new Map([['shop-key', 'shop']]),
})
app.listen({ hostname: '127.0.0.1', port: Number(process.env.PORT ?? 3100) })
console.log(`orders: http://127.0.0.1:${app.server?.port}/orders (Authorization: Bearer shop-key)`)
