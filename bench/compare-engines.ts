/**
 * `bun bench/compare-engines.ts <other checkout>`: replays and 409s of this
 * checkout's service against another checkout's (an older engine), in one
 * run, interleaved (A B B A A B), so both see the same machine. Figures from
 * different runs on a shared machine do not compare; these do.
 *
 * The other checkout needs its node_modules (a symlink to ours will do), e.g.
 *   mkdir /tmp/old && git archive 0b13d6d | tar -x -C /tmp/old && ln -s "$PWD/node_modules" /tmp/old/node_modules
 * It gets a database of its own, migrated by its own `bun src/main.ts` at start.
 *
 * The in-flight key behind the 409s is the one each engine's live worker
 * leaves: a young `processing` row; for an engine before atomic phases
 * (before commit c38bc09, `--locked-old`, the default) also its row lock,
 * held FOR UPDATE by an open transaction, as that engine's workers held it.
 */
import postgres from 'postgres'
import { fingerprint } from '../src/core/fingerprint'
import { spawnService, type SpawnedService } from '../test/support/process'
import { measureCpu } from './cpu'
import { freshDatabase } from './database'
import { runLoad } from './load'
import { startProvider } from './provider'
import { paymentBody } from './round-trips'
import { BENCH_ADMIN_TOKEN, BENCH_API_KEY, BENCH_METRICS_TOKEN, BENCH_TENANT } from './service'

const other = process.argv[2]
if (!other) throw new Error('usage: bun bench/compare-engines.ts <other checkout> [--unlocked-old]')
const lockOld = !process.argv.includes('--unlocked-old')
const ROUND_SECONDS = Number(process.env.BENCH_ROUND_SECONDS ?? 4)
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32)
/** Completed keys the replays cycle through. */
const KEYS = 2_000
const ORDER = ['old', 'new', 'new', 'old', 'old', 'new'] as const
type Engine = (typeof ORDER)[number]

const base = process.env.DATABASE_URL
if (!base) throw new Error('set DATABASE_URL (the other engine needs a server of its own choosing too)')
const headers = { authorization: `Bearer ${BENCH_API_KEY}`, 'content-type': 'application/json' }
const env = { API_KEYS: `${BENCH_TENANT}:${BENCH_API_KEY}`, ADMIN_TOKEN: BENCH_ADMIN_TOKEN, METRICS_TOKEN: BENCH_METRICS_TOKEN, NODE_ENV: 'production' }

const newDb = await freshDatabase(() => undefined)
const oldName = `idem_bench_old_${crypto.randomUUID().slice(0, 8)}`
const admin = postgres(base, { max: 1, onnotice: () => undefined })
await admin.unsafe(`create database "${oldName}"`)
const oldUrl = new URL(base)
oldUrl.pathname = `/${oldName}`
const provider = await startProvider(0)
const services: SpawnedService[] = []
const held: postgres.ReservedSql[] = []
const dbs = { old: postgres(oldUrl.toString(), { max: 2, onnotice: () => undefined }), new: postgres(newDb.url, { max: 2, onnotice: () => undefined }) }
try {
  const svc: Record<Engine, SpawnedService> = {
    // Both providers are ours: an older engine that has no PAYMENT_PROVIDER_URL uses its in-process one, delay 0.
    old: await spawnService({ cwd: other, env: { ...env, DATABASE_URL: oldUrl.toString(), PAYMENT_PROVIDER_URL: provider.url, PAYMENT_PROVIDER_DELAY_MS: '0' }, timeoutMs: 30_000 }),
    new: await spawnService({ env: { ...env, DATABASE_URL: newDb.url, PAYMENT_PROVIDER_URL: provider.url }, timeoutMs: 30_000 }),
  }
  services.push(svc.old, svc.new)
  const names: Record<Engine, string> = { old: oldName, new: new URL(newDb.url).pathname.slice(1) }
  const inFlight = paymentBody(0)
  for (const engine of ['old', 'new'] as const) {
    const seeded = await runLoad({ url: `${svc[engine].url}/api/payments`, connections: 16, amount: KEYS, headers, request: (n) => ({ body: JSON.stringify(paymentBody(n)), key: `w-${n}` }) })
    if (seeded.byStatus['201'] !== KEYS) throw new Error(`${engine}: seeding answered ${JSON.stringify(seeded.byStatus)}`)
    await dbs[engine]`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status)
      values (${BENCH_TENANT}, 'storm-key', 'POST', '/api/payments', ${fingerprint('POST', '/api/payments', inFlight)}, 'processing')`
  }
  if (lockOld) {
    const worker = await dbs.old.reserve()
    held.push(worker)
    await worker`begin`
    await worker`select 1 from idempotency_keys where tenant = ${BENCH_TENANT} and key = 'storm-key' for update`
  }

  const lines: string[] = []
  for (const kind of ['replay', '409'] as const) {
    const sums: Record<Engine, { requests: number; seconds: number; service: number; postgres: number }> = {
      old: { requests: 0, seconds: 0, service: 0, postgres: 0 },
      new: { requests: 0, seconds: 0, service: 0, postgres: 0 },
    }
    for (const engine of ORDER) {
      // Young, so it never turns stale (reclaimable). Not the old engine's while its row is held: that would wait on the lock.
      if (engine === 'new' || !lockOld) await dbs[engine]`update idempotency_keys set locked_at = now() where tenant = ${BENCH_TENANT} and key = 'storm-key'`
      const { result, cpu } = await measureCpu(dbs[engine], names[engine], { service: svc[engine].proc.pid, provider: provider.pid }, () => runLoad({
        url: `${svc[engine].url}/api/payments`, connections: CONNECTIONS, durationS: ROUND_SECONDS, headers,
        request: (n) => kind === 'replay'
          ? { body: JSON.stringify(paymentBody(n % KEYS)), key: `w-${n % KEYS}` }
          : { body: JSON.stringify(inFlight), key: 'storm-key' },
      }))
      const expected = kind === 'replay' ? '201' : '409'
      if ((result.byStatus[expected] ?? 0) !== result.requests) throw new Error(`${engine} ${kind}: ${JSON.stringify(result.byStatus)}`)
      const s = sums[engine]
      s.requests += result.requests
      s.seconds += result.seconds
      s.service += cpu.serviceUs
      s.postgres += cpu.postgresUs
      console.error(`${kind} ${engine}: ${Math.round(result.rps)}/s, machine ${Math.round(cpu.machineBusyShare * 100)}% busy`)
    }
    const row = (engine: Engine) => {
      const s = sums[engine]
      return { rps: Math.round(s.requests / s.seconds), service: Math.round(s.service / s.requests), postgres: Math.round(s.postgres / s.requests) }
    }
    const [o, n] = [row('old'), row('new')]
    lines.push(`| ${kind} | ${o.rps} | ${n.rps} | ${Math.round((n.rps / o.rps) * 100) / 100}× | ${o.service} / ${o.postgres} | ${n.service} / ${n.postgres} |`)
  }
  console.log(`${CONNECTIONS} connections, ${ORDER.length / 2} rounds of ${ROUND_SECONDS} s per engine and kind; CPU µs per answer: service / its PostgreSQL backends\n`)
  console.log(`| kind | other (${other}) req/s | this checkout req/s | this / other | other CPU µs | this CPU µs |`)
  console.log('| --- | --- | --- | --- | --- | --- |')
  for (const line of lines) console.log(line)
} finally {
  for (const worker of held) {
    await worker`rollback`.catch(() => undefined)
    worker.release()
  }
  for (const service of services) {
    service.proc.kill('SIGTERM')
    await service.proc.exited
  }
  await dbs.old.end()
  await dbs.new.end()
  await provider.stop()
  await admin.unsafe(`drop database if exists "${oldName}" with (force)`)
  await admin.end()
  await newDb.drop()
}
