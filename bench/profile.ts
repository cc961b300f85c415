/**
 * `bun bench/profile.ts <kind> [seconds] [connections] [provider ms]`: one
 * kind alone, profiled, so a profile shows that kind's costs and nothing
 * else's. The provider answers at once unless given its delay (200 for the
 * bench's slow cell, at 256 connections). Kinds: fresh, replay (the yardstick is an app
 * of its own, bench/naive-app.ts: profile it with `bun --cpu-prof-md`).
 *
 * - The service runs with Bun's sampling profiler (`--cpu-prof-md`, the
 *   Markdown form: self and total time per function) and writes it to
 *   .data/bench-profile/ when it stops. BENCH_PROFILE_FORMAT=cpuprofile writes
 *   Chrome DevTools' .cpuprofile instead (`--cpu-prof`), for a flame graph.
 * - BENCH_PERF=1: `perf record -g` of the service process over the measured
 *   seconds too (kernel and runtime frames: syscalls, the loopback TCP path),
 *   to .data/bench-profile/perf-<kind>.data; read it with `perf report -i`.
 * - When the server has pg_stat_statements loaded (the bench's own embedded
 *   cluster does, bench/server.ts), PostgreSQL's side: each statement's
 *   calls, time and WAL per call.
 * - CPU per answer of each side, from /proc, as in `npm run bench`.
 */
import { mkdirSync } from 'node:fs'
import postgres from 'postgres'
import { measureCpu } from './cpu'
import { freshDatabase } from './database'
import { percentile, round2, runLoad } from './load'
import { readStatements, resetStatements } from './pg-statements'
import { startProvider } from './provider'
import { paymentBody } from './round-trips'
import { BENCH_API_KEY, startService } from './service'

const KINDS = ['fresh', 'replay'] as const
type Kind = (typeof KINDS)[number]
const kind = process.argv[2] as Kind
if (!KINDS.includes(kind)) throw new Error(`usage: bun bench/profile.ts <${KINDS.join('|')}> [seconds=10] [connections=32] [provider ms=0]`)
const seconds = Number(process.argv[3] ?? 10)
const connections = Number(process.argv[4] ?? 32)
const providerMs = Number(process.argv[5] ?? 0)
const DIR = '.data/bench-profile'
/** Completed keys the replays cycle through, made before the measured seconds. */
const REPLAY_KEYS = 2_000

const headers = { authorization: `Bearer ${BENCH_API_KEY}`, 'content-type': 'application/json' }
const path = '/api/payments'
const request = (prefix: string, modulo?: number) => (n: number) => {
  const k = modulo ? n % modulo : n
  return { body: JSON.stringify(paymentBody(k)), key: `${prefix}-${k}` }
}

mkdirSync(DIR, { recursive: true })
const db = await freshDatabase((line) => console.error(line))
const sql = postgres(db.url, { max: 2, onnotice: () => undefined })
const provider = await startProvider(providerMs)
const profiler = process.env.BENCH_PROFILE_FORMAT === 'cpuprofile' ? ['--cpu-prof'] : ['--cpu-prof-md']
const service = await startService(db.url, provider.url, {}, [...profiler, `--cpu-prof-dir=${DIR}`, `--cpu-prof-name=${kind}-${Date.now()}.${profiler[0] === '--cpu-prof' ? 'cpuprofile' : 'md'}`])
try {
  // Warm-up (and, for replays, the keys to replay): not profiled out, but not measured either.
  const replays = kind.endsWith('replay')
  const warm = await runLoad({ url: `${service.url}${path}`, connections, amount: replays ? REPLAY_KEYS : connections * 20, headers, request: request('warm') })
  if ((warm.byStatus['201'] ?? 0) !== warm.requests) throw new Error(`warm-up answered ${JSON.stringify(warm.byStatus)}`)
  const statements = await resetStatements(sql)
  const perf = process.env.BENCH_PERF === '1'
    ? Bun.spawn(['perf', 'record', '-F', '499', '-g', '-o', `${DIR}/perf-${kind}.data`, '-p', String(service.proc.pid)], { stdout: 'ignore', stderr: 'ignore' })
    : undefined
  const { result, cpu } = await measureCpu(sql, new URL(db.url).pathname.slice(1), { service: service.proc.pid, provider: provider.pid }, () =>
    runLoad({ url: `${service.url}${path}`, connections, durationS: seconds, headers, request: replays ? request('warm', REPLAY_KEYS) : request('m') }))
  if (perf) {
    perf.kill('SIGINT')
    await perf.exited
  }
  const per = (us: number) => Math.round(us / Math.max(1, result.requests))
  console.log(`${kind}: ${Math.round(result.rps)}/s at ${connections} connections for ${seconds} s, provider ${providerMs} ms, p50 ${round2(percentile(result.latencies.get(201) ?? [], 50))} ms (${JSON.stringify(result.byStatus)})`)
  console.log(`CPU µs per answer: service ${per(cpu.serviceUs)}, PostgreSQL ${per(cpu.postgresUs)}, provider ${per(cpu.providerUs)}, load generator ${per(cpu.loadGeneratorUs)}; machine ${Math.round(cpu.machineBusyShare * 100)}% busy, others ${Math.round(cpu.othersUs / 1e4 / cpu.seconds) / 100} CPUs`)
  if (perf) console.log(`perf: ${DIR}/perf-${kind}.data (perf report -i ${DIR}/perf-${kind}.data --no-children)`)
  if (statements.ok) {
    console.log('\n| statement | calls | mean ms | share of time | WAL bytes per call |\n| --- | --- | --- | --- | --- |')
    for (const st of await readStatements(sql)) console.log(`| \`${st.query.slice(0, 100)}\` | ${st.calls} | ${st.meanMs} | ${st.percent}% | ${st.walBytesPerCall} |`)
  } else console.log(`PostgreSQL statements: ${statements.note}`)
} finally {
  await service.stop()
  console.log(`service profile: ${DIR}/ (written when the service stopped)`)
  await provider.stop()
  await sql.end()
  await db.drop()
}
