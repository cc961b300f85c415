/**
 * `npm start`'s own path: DATABASE_URL unset, so the service runs its
 * embedded PostgreSQL (here in a temp dir on a free port, via EMBEDDED_PG_DIR
 * and EMBEDDED_PG_PORT). A SIGKILL of the whole process group leaves the
 * detached PostgreSQL running; the next start adopts it. A PostgreSQL killed
 * too leaves a stale lock file; the next start clears it and PostgreSQL
 * recovers from its WAL. Every answered payment survives, and a SIGTERM then
 * exits 0 with the embedded database stopped last (here with WORKERS=2).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { freePort } from '../chaos/clients'
import { payment, postPayment } from '../support/http'
import { waitFor } from '../support/wait'
import { alive, startDetached, waitWhileStarting, type GroupProcess } from './spawn'

let temp: string
let env: Record<string, string | undefined>
const services: GroupProcess[] = []
beforeAll(() => {
  temp = mkdtempSync(join(tmpdir(), 'idem-embedded-'))
  chmodSync(temp, 0o755) // as root, PostgreSQL runs as `postgres` and must reach its data dir
  env = { DATABASE_URL: undefined, EMBEDDED_PG_DIR: join(temp, 'pg'), EMBEDDED_PG_PORT: String(freePort()), IDEMPOTENCY_TTL_SECONDS: '1', PAYMENT_PROVIDER_DELAY_MS: '300', PAYMENT_PROVIDER_LEDGER: join(temp, 'ledger.sqlite') }
})
afterAll(async () => {
  for (const s of services) if (s.proc.exitCode === null) try { process.kill(-s.proc.pid, 'SIGKILL') } catch { /* gone */ }
  const pid = postmasterPid()
  if (pid && alive(pid)) {
    process.kill(pid, 'SIGQUIT')
    await waitFor(() => !alive(pid), 'the embedded PostgreSQL to stop')
  }
  if (temp) rmSync(temp, { recursive: true, force: true })
})

function postmasterPid(): number | undefined {
  const file = join(temp, 'pg', 'postmaster.pid')
  return existsSync(file) ? Number(readFileSync(file, 'utf8').split('\n')[0]) : undefined
}

async function start(extra: Record<string, string> = {}): Promise<GroupProcess> {
  const service = await startDetached([process.execPath, 'src/main.ts'], { ...env, ...extra })
  services.push(service)
  return service
}

async function pay(service: GroupProcess, key: string): Promise<{ status: number; id?: string }> {
  const response = await postPayment(service.url, payment({ customer: 'embedded' }), { key })
  const body = await response.json() as { id?: string }
  return { status: response.status, ...(body.id ? { id: body.id } : {}) }
}

/** How many of `keys` are in processing (past the TTL, when `stale`), read from the embedded database itself. */
async function processing(keys: string[], stale = false): Promise<number> {
  const sql = postgres(`postgres://postgres:postgres@127.0.0.1:${env.EMBEDDED_PG_PORT}/postgres`, { max: 1, onnotice: () => undefined })
  try {
    const [row] = await sql<{ n: number }[]>`
      select count(*)::int as n from idempotency_key_states where key in ${sql(keys)} and status = 'processing'
         and (not ${stale} or locked_at <= now() - make_interval(secs => ${Number(env.IDEMPOTENCY_TTL_SECONDS)}))`
    return row!.n
  } finally {
    await sql.end({ timeout: 1 })
  }
}

async function killGroup(service: GroupProcess): Promise<void> {
  process.kill(-service.proc.pid, 'SIGKILL')
  await service.proc.exited
}

test('crash (SIGKILL of the group, then of PostgreSQL too), restart, data intact; SIGTERM stops the database last', async () => {
  // 1. First start: initdb, migrations, payments answered 201.
  let service = await start()
  expect(service.output()).toContain(`embedded PostgreSQL ready (data in ${env.EMBEDDED_PG_DIR}`)
  const answered = new Map<string, string>()
  for (let i = 0; i < 5; i++) {
    const key = `emb-${i}-${crypto.randomUUID()}`
    const { status, id } = await pay(service, key)
    expect(status).toBe(201)
    answered.set(key, id!)
  }
  // Three more are in flight when the whole group is SIGKILLed.
  const stranded = Array.from({ length: 3 }, () => `emb-stranded-${crypto.randomUUID()}`)
  const lost = stranded.map((key) => pay(service, key).catch(() => ({ status: 0 })))
  await waitFor(async () => (await processing(stranded)) === stranded.length, 'the 3 stranded keys in processing')
  await killGroup(service)
  await Promise.all(lost)
  const pg = postmasterPid()!
  expect(alive(pg)).toBe(true) // detached by design: it outlives our group

  // 2. The next start adopts the running PostgreSQL; answered payments are there.
  service = await start()
  expect(service.output()).toContain(`adopting the PostgreSQL server (pid ${pg})`)
  for (const [key, id] of answered) expect(await pay(service, key)).toEqual({ status: 201, id })
  // The stranded keys: once past the 1 s TTL, a retry reclaims them; one payment each.
  await waitFor(async () => (await processing(stranded, true)) === stranded.length, 'the 3 stranded keys to be stale')
  for (const key of stranded) {
    const first = await pay(service, key)
    expect(first.status).toBe(201)
    answered.set(key, first.id!)
  }

  // 3. Now PostgreSQL dies too (SIGKILL): a stale postmaster.pid is left behind.
  await killGroup(service)
  process.kill(pg, 'SIGKILL')
  await waitFor(() => !alive(pg), 'the embedded PostgreSQL to die')
  expect(postmasterPid()).toBe(pg) // the stale lock file
  service = await start({ WORKERS: '2' }) // and this time as a supervisor of two workers
  const both = service
  await waitWhileStarting(both, () => both.output().match(/listening on \S+ \(pid/g)?.length === 2, 'both workers to listen')
  expect(service.output()).not.toContain('adopting')
  for (const [key, id] of answered) expect(await pay(service, key)).toEqual({ status: 201, id })
  const list = await fetch(`${service.url}/api/payments?customer=embedded&limit=100`, { headers: { authorization: 'Bearer acme-key' } })
  const { data } = await list.json() as { data: { id: string }[] }
  expect(data.map((p) => p.id).sort()).toEqual([...answered.values()].sort()) // nothing lost, nothing doubled

  // 4. A clean stop of the supervisor: exit 0; both workers closed their pools,
  //    then the supervisor stopped the embedded database, last; it is gone.
  const newPg = postmasterPid()!
  expect(newPg).not.toBe(pg)
  process.kill(service.proc.pid, 'SIGTERM')
  expect(await service.exited()).toBe(0)
  const out = service.output()
  expect(out.match(/pools closed/g)).toHaveLength(2)
  expect(out.indexOf('all workers stopped')).toBeGreaterThan(out.lastIndexOf('pools closed'))
  expect(out.indexOf('embedded PostgreSQL stopped')).toBeGreaterThan(out.indexOf('all workers stopped'))
  expect(alive(newPg)).toBe(false)
  expect(existsSync(join(temp, 'pg', 'postmaster.pid'))).toBe(false) // a clean shutdown removes it
}, 90_000)

test('two `npm start` of one checkout: the second shares the first one\'s database, and its SIGTERM leaves it running for the first', async () => {
  const first = await start()
  const pg = postmasterPid()!
  const second = await start()
  expect(second.output()).toContain(`sharing the PostgreSQL server (pid ${pg})`)
  expect((await pay(second, `emb-second-${crypto.randomUUID()}`)).status).toBe(201)
  process.kill(second.proc.pid, 'SIGTERM')
  expect(await second.exited()).toBe(0)
  expect(second.output()).toContain('embedded PostgreSQL left running: another process of this checkout still uses it')
  expect(alive(pg)).toBe(true)
  // The first one never noticed: ready, and it takes payments.
  expect((await fetch(`${first.url}/readyz`)).status).toBe(200)
  expect((await pay(first, `emb-first-${crypto.randomUUID()}`)).status).toBe(201)
  process.kill(first.proc.pid, 'SIGTERM')
  expect(await first.exited()).toBe(0)
  expect(first.output()).toContain('embedded PostgreSQL stopped')
  expect(alive(pg)).toBe(false)
}, 60_000)
