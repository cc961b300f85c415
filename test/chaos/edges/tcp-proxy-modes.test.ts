/**
 * The fault tool itself (test/support/tcp-proxy.ts), through postgres.js as
 * the service uses it: a reset is an RST (the client sees ECONNRESET, not
 * the CONNECTION_CLOSED of a FIN), and a held reply is a real lost answer
 * (the statement committed, the client never heard). The fault tests rest on
 * both. The clients here fetch no types: a connection fault during that
 * query would be an unhandled rejection in this process (issue 16, item 1).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { createTestDatabase, type TestDatabase } from '../../support/db'
import { startTcpProxy, type TcpProxy } from '../../support/tcp-proxy'
import { waitFor } from '../../support/wait'

let db: TestDatabase
let proxy: TcpProxy

beforeAll(async () => {
  db = await createTestDatabase('edges_proxy')
  await db.sql`create table proxy_probe (id int primary key)`
  proxy = await startTcpProxy(db.url)
})
afterAll(async () => {
  proxy?.stop()
  await db?.drop()
})

const client = (name: string) => postgres(proxy.url, { max: 1, fetch_types: false, onnotice: () => undefined, connection: { application_name: name } })
const errorOf = (query: Promise<unknown>) => query.then(() => undefined, (error: { code?: string; errno?: number }) => error.code)

test('action reset: the statement never reaches the server, and the client sees ECONNRESET', async () => {
  const sql = client('probe-reset')
  try {
    await sql`select 1`
    const trap = proxy.trap({ before: /insert into proxy_probe/, action: 'reset' })
    const failed = errorOf(sql`insert into proxy_probe values (1)`)
    const hit = await trap
    expect(await failed).toBe('ECONNRESET')
    expect(hit.connection.open).toBe(false)
    expect((await db.sql`select count(*)::int as n from proxy_probe where id = 1`)[0]!.n).toBe(0)
  } finally {
    await sql.end({ timeout: 0 })
  }
})

test('action hold-reply: the server commits the statement, its answer is held; a reset then loses it (ECONNRESET); the backend is found by client_port', async () => {
  const sql = client('probe-hold')
  try {
    await sql`select 1`
    const trap = proxy.trap({ before: /insert into proxy_probe/, action: 'hold-reply' })
    const failed = errorOf(sql`insert into proxy_probe values (2)`)
    const hit = await trap
    await hit.reply!.complete
    expect((await db.sql`select count(*)::int as n from proxy_probe where id = 2`)[0]!.n).toBe(1) // committed
    const [backend] = await db.sql<{ query: string }[]>`select query from pg_stat_activity where client_port = ${hit.connection.serverSidePort!} and datname = current_database()`
    expect(backend?.query).toBe(hit.statement)
    hit.connection.reset()
    expect(await failed).toBe('ECONNRESET')
  } finally {
    await sql.end({ timeout: 0 })
  }
})

test('hold-reply, then pg_terminate_backend and drop(): the answer is lost, the client sees the connection end', async () => {
  const sql = client('probe-drop')
  try {
    await sql`select 1`
    const trap = proxy.trap({ before: /insert into proxy_probe/, action: 'hold-reply' })
    const failed = errorOf(sql`insert into proxy_probe values (3)`)
    const hit = await trap
    await hit.reply!.complete
    await db.sql`select pg_terminate_backend(pid) from pg_stat_activity where client_port = ${hit.connection.serverSidePort!} and datname = current_database()`
    hit.reply!.drop()
    // The FATAL (57P01) and the close pass; postgres.js reports one or the other, never the answer.
    expect(['57P01', 'CONNECTION_CLOSED']).toContain((await failed)!)
    expect((await db.sql`select count(*)::int as n from proxy_probe where id = 3`)[0]!.n).toBe(1)
  } finally {
    await sql.end({ timeout: 0 })
  }
})

test('reset(filter) resets just the chosen connections: the chosen client sees its connection close, the other keeps its own', async () => {
  // The next query waits until the driver has seen the close: a query written to a reset
  // connection before that is another matter (driver-after-reset.test.ts).
  let closes = 0
  const chosen = postgres(proxy.url, { max: 1, fetch_types: false, onnotice: () => undefined, onclose: () => { closes++ }, connection: { application_name: 'probe-chosen' } })
  const other = client('probe-other')
  try {
    await Promise.all([chosen`select 1`, other`select 1`])
    const reset = proxy.reset((c) => c.startup.application_name === 'probe-chosen')
    expect(reset.map((c) => c.startup.application_name)).toEqual(['probe-chosen'])
    expect(proxy.connections().map((c) => c.startup.application_name)).toContain('probe-other')
    await waitFor(() => closes === 1, 'the chosen client to see its connection close')
    expect((await chosen`select 3 as n`)[0]!.n).toBe(3) // on a new connection
    expect((await other`select 4 as n`)[0]!.n).toBe(4) // untouched
  } finally {
    await Promise.all([chosen.end({ timeout: 0 }), other.end({ timeout: 0 })])
  }
})
