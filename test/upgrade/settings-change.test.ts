/**
 * A change of IDEMPOTENCY_RETENTION_SECONDS rolling through the instances:
 * for a while two instances on one database run with different retentions.
 * Decided (docs/how-to/upgrade.md, "Changing the TTL or the retention"): a key is
 * protected for the shorter one. The instance with the shorter retention
 * answers a retry past it as a new request (SPEC: past its retention a key is
 * new), while the one with the longer retention still replays the answer it
 * has; the instance that starts with other settings than the last one says
 * so, once, so the operator finishes the roll.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { spawnProvider, type ProviderProcess } from '../support/provider-process'
import { startService, type ServiceProcess } from '../support/service-process'
import { waitFor } from '../support/wait'

let db: TestDatabase
let provider: ProviderProcess
let long: ServiceProcess
let short: ServiceProcess
beforeAll(async () => {
  db = await createTestDatabase('settings_change')
  provider = await spawnProvider()
  long = await startService(db.url, provider.url, { IDEMPOTENCY_TTL_SECONDS: '2', IDEMPOTENCY_RETENTION_SECONDS: '60' })
  short = await startService(db.url, provider.url, { IDEMPOTENCY_TTL_SECONDS: '2', IDEMPOTENCY_RETENTION_SECONDS: '2', PURGE_INTERVAL_MS: '100000' })
})
afterAll(async () => {
  await long?.stop()
  await short?.stop()
  await provider?.stop()
  await db?.drop()
})

test('the instance started with another retention says so; the shorter retention rules while both run', async () => {
  const warning = short.output().split('\n').find((line) => line.includes('settings differ from those the last instance started with'))
  expect(warning).toBeDefined()
  expect(JSON.parse(warning!)).toMatchObject({ level: 'warn', previous_retention_seconds: 60 })
  expect(warning).toContain('IDEMPOTENCY_RETENTION_SECONDS 60 -> 2')
  expect(long.output()).not.toContain('settings differ')

  const key = `retention-${crypto.randomUUID()}`
  const body = payment({ customer: `cus_${key}` })
  const first = await postPayment(long.url, body, { key })
  expect(first.status).toBe(201)
  const paid = (await first.json() as { id: string }).id
  await waitFor(async () => (await db.sql`
    select 1 from idempotency_key_states where key = ${key} and clock_timestamp() > completed_at + interval '2.3 seconds'`).length === 1,
  'the key past the short retention (2 s) by the database\'s clock', 10_000)
  // Past the short retention: the long instance replays its answer; the short one takes the key as new.
  const onLong = await postPayment(long.url, body, { key })
  expect({ status: onLong.status, replayed: onLong.headers.get('idempotent-replayed'), id: (await onLong.json() as { id: string }).id })
    .toEqual({ status: 201, replayed: 'true', id: paid })
  const onShort = await postPayment(short.url, body, { key })
  expect({ status: onShort.status, replayed: onShort.headers.get('idempotent-replayed') }).toEqual({ status: 201, replayed: null })
  expect((await onShort.json() as { id: string }).id).not.toBe(paid)
}, 30_000)
