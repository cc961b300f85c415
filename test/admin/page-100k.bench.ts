/**
 * Render time of the admin page with 100k keys in processing (not part of
 * `bun test`: a measurement, with no thresholds). Run:
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test bun test/admin/page-100k.bench.ts
 * Prints the server's own time (Server-Timing: db + render) and the client's
 * round trip for the first page, a deep page (after row 90,000), and a
 * filtered deep page, as medians of 20 requests after 5 warm-ups.
 */
import { createTestDatabase } from '../support/db'
import { startServer } from '../support/server'
import { signIn } from './support'
import { encodeCursor } from '../../src/operations/cursor'

const ROWS = 100_000
const db = await createTestDatabase('page_100k')
const sameInstant = process.argv.includes('--same-locked-at')
await db.sql.unsafe(`
  insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at)
  select case when i % 10 = 0 then 'globex' else 'acme' end, 'key-' || i, 'POST', '/api/payments', repeat('a', 64), 'processing',
         now() - interval '3 hours',
         ${sameInstant ? "now() - interval '2 hours'" : "now() - interval '3 hours' + i * interval '100 milliseconds'"}
    from generate_series(1, ${ROWS}) i`)
await db.sql`analyze idempotency_keys`
const server = await startServer(db.url)
const admin = await signIn(server.url)

async function measure(label: string, path: string): Promise<void> {
  const server_: number[] = []
  const db_: number[] = []
  const render: number[] = []
  const client: number[] = []
  let rows = 0
  for (let i = 0; i < 25; i++) {
    const started = performance.now()
    const response = await fetch(`${server.url}${path}`, { headers: { cookie: admin.cookie } })
    const html = await response.text()
    const elapsed = performance.now() - started
    if (response.status !== 200) throw new Error(`${label}: ${response.status}`)
    if (i < 5) continue
    const timing = response.headers.get('server-timing') ?? ''
    const [dbMs = 0, renderMs = 0] = [...timing.matchAll(/dur=([\d.]+)/g)].map((match) => Number(match[1]))
    server_.push(dbMs + renderMs)
    db_.push(dbMs)
    render.push(renderMs)
    client.push(elapsed)
    rows = (html.match(/<td data-label="Key" class="key">/g) ?? []).length
  }
  const median = (values: number[]) => values.sort((a, b) => a - b)[Math.floor(values.length / 2)]!.toFixed(2)
  console.log(`${label.padEnd(30)} server ${median(server_)} ms (queries ${median(db_)}, render ${median(render)})  round trip ${median(client)} ms  (${rows} key cells)`)
}

const [deep] = await db.sql<{ l: string; tenant: string; key: string }[]>`
  select stale_at::text as l, tenant, key from idempotency_processing
   order by stale_at, tenant, key offset 90000 limit 1`
const cursor = await encodeCursor(db.sql, 'keys', { at: deep!.l, tenant: deep!.tenant, key: deep!.key })
console.log(`${ROWS} processing keys${sameInstant ? ', all with the same locked_at' : ''}`)
await measure('first page', '/admin')
await measure('deep page (after row 90,000)', `/admin?after=${cursor}`)
await measure('tenant filter, deep page', `/admin?tenant=globex&after=${cursor}`)
await measure('stale only, first page', '/admin?stale=1')
await measure('key search, first page', '/admin?key=key-9999')
await server.stop()
await db.drop()
