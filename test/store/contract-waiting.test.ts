/**
 * Who a pending contract step waits for, in the words main.ts and
 * `npm run migrate` print: an app on the plugin or the engine, whose
 * heartbeat says nothing of the schema, is not "an older release".
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startHeartbeat } from '../../src/engine'
import { describeWaiting, migrate, type MigrationLine } from '../../src/store/migrate'
import { createTestDatabase, type TestDatabase } from '../support/db'

let db: TestDatabase
let dir: string
let line: MigrationLine
beforeAll(async () => {
  db = await createTestDatabase('contract_waiting')
  dir = mkdtempSync(join(tmpdir(), 'idem-line-shop-'))
  writeFileSync(join(dir, '00001_orders.sql'), 'create table shop_orders (id int primary key, note text);')
  writeFileSync(join(dir, '00002_notes.sql'), '-- @contract requires shop 1\nupdate shop_orders set note = \'\' where note is null;')
  line = { name: 'shop', table: 'shop_migrations', dir }
})
afterAll(async () => {
  await db?.drop()
  if (dir) rmSync(dir, { recursive: true, force: true })
})

// Catches: "1 live process(es) of an older release still serve" about an app on the plugin, which no upgrade will ever stop.
test('a plugin app\'s heartbeat (no schemaKnown) is not called an older release; a process that knows too little is', async () => {
  const plugin = await startHeartbeat(db.pools.short) // as an app on the plugin or the engine starts it
  try {
    const first = (await migrate(db.url, { lines: [line] })).pending?.[0]
    expect(first).toMatchObject({ waitingFor: 1, unsaid: 1 })
    expect(describeWaiting(first!)).not.toContain('older release')
    expect(describeWaiting(first!)).toContain('schemaKnown')
    await db.sql`insert into idempotency_processes (id, pid, hostname, schema_known) values (${crypto.randomUUID()}, 2, 'old-release', ${db.sql.json({ shop: 0 })})`
    const both = (await migrate(db.url, { lines: [line] })).pending?.[0]
    expect(both).toMatchObject({ waitingFor: 2, unsaid: 1 })
    expect(describeWaiting(both!)).toMatch(/^1 live process\(es\) of an older release and 1 live process\(es\) that do not say/)
  } finally {
    await plugin.stop()
  }
})
