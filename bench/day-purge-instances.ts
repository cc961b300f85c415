/**
 * The retention purge of several server processes on one database: what they
 * clear together, and what it costs the traffic, while one of them serves
 * fresh payments at full speed. Interleaved rounds of:
 *
 *   - one instance: the serving service, its own purge running back to back;
 *   - a second process beating without a purge, as an app on the plugin does
 *     beside the service: its heartbeat saying nothing of a purge (as every
 *     heartbeat did before `purges`, and as one that does not say still does),
 *     then saying `purges: false` (here in the bench's own process: a heartbeat
 *     and nothing else);
 *   - two instances: the second purges too (its heartbeat counts it);
 *   - with `--before <checkout>`: two instances of that checkout's code (an
 *     A/B, e.g. a worktree of the commit before a change to the pacing).
 *
 *   bun bench/day-purge-instances.ts --database idem_day_xxxx [--before /tmp/worktree] [--rounds 3] [--seconds 8] [--warmup 2] [--retention 600] [--variants 0,3,4]
 *
 * On a database `npm run bench:day -- --keep` left (seeded over a day): the
 * services run with a retention of `--retention` seconds, so nearly every
 * seeded key is a backlog, and every round purges from it (`--keys 6000000
 * --expired 0.5`: 9 rounds of 2 + 8 s took 2 M of them; 2.5 M ran out).
 */
import { loadavg } from 'node:os'
import { parseArgs } from 'node:util'
import { defaultLoadTool } from './day-load'
import { PURGE_EVERY_MS, purgedKeys, runDayRound, type RoundResult } from './day-rounds'
import { round2 } from './load'
import { startProvider } from './provider'
import { startService, type Service } from './service'
import { startHeartbeat, type ProcessHeartbeat } from '../src/core/processes'
import { openPools, type Pools } from '../src/store/db'
import { median } from './versus-naive'

const { values } = parseArgs({
  options: {
    database: { type: 'string' },
    before: { type: 'string' },
    rounds: { type: 'string', default: '3' },
    seconds: { type: 'string', default: '8' },
    warmup: { type: 'string', default: '2' },
    retention: { type: 'string', default: '600' },
    connections: { type: 'string', default: '32' },
    /** Which variants to run, by their place in the list below (e.g. `0,3,4`); all by default. */
    variants: { type: 'string' },
  },
})
if (!values.database) throw new Error('--database idem_day_xxxx: a database bench:day kept (--keep)')
const base = process.env.DATABASE_URL
if (!base) throw new Error('DATABASE_URL is not set')
const url = Object.assign(new URL(base), { pathname: `/${values.database}` }).toString()
const retentionSeconds = Number(values.retention)

interface Variant {
  readonly name: string
  /**
   * Beside the serving service: a second service (its purge back to back, or `idle`: a day away, so it only
   * lives: probes, heartbeats, pools), or only a heartbeat, with what it says of a purge.
   */
  readonly second?: 'service' | 'idle' | { readonly purges: boolean | undefined }
  readonly cwd?: string | undefined
}
const listed: Variant[] = [
  { name: 'one instance' },
  { name: 'beside a heartbeat that does not say', second: { purges: undefined } },
  { name: 'beside a heartbeat saying purges: false', second: { purges: false } },
  { name: 'two instances', second: 'service' },
  { name: 'beside an idle service', second: 'idle' },
  ...(values.before ? [{ name: `two instances, ${values.before}`, second: 'service' as const, cwd: values.before }] : []),
]
const variants = listed.filter((_, n) => values.variants === undefined || values.variants.split(',').map(Number).includes(n))

async function stopBeating(heartbeat: { beat: ProcessHeartbeat; pools: Pools } | undefined): Promise<void> {
  if (!heartbeat) return
  await heartbeat.beat.stop()
  await heartbeat.pools.close()
}

const provider = await startProvider(0)
const results = new Map<string, RoundResult[]>(variants.map((v) => [v.name, []]))
try {
  for (let round = 0; round < Number(values.rounds); round++) {
    const order = round % 2 === 0 ? variants : [...variants].reverse()
    for (const variant of order) {
      // The second process: same database, same retention, its purge back to back, no traffic.
      let second: Service | undefined
      let heartbeat: { beat: ProcessHeartbeat; pools: Pools } | undefined
      if (variant.second === 'service' || variant.second === 'idle') {
        const purgeEvery = variant.second === 'idle' ? String(86_400_000) : PURGE_EVERY_MS
        // Its purged count is read from its /metrics, as the measured seconds start and end. A scrape refreshes the
        // database gauges, whose duplicates query reads every completion of the last hour (about 1 s on this table):
        // computed once here, before the round, and cached past it, so no scrape of it runs a query in the round.
        second = await startService(url, provider.url, { PURGE_INTERVAL_MS: purgeEvery, IDEMPOTENCY_RETENTION_SECONDS: String(retentionSeconds), METRICS_CACHE_MS: '3600000' }, [], variant.cwd)
        await purgedKeys(second.url)
      } else if (variant.second) {
        // Its own pool, closed with it: the round waits for every backend on the database to leave.
        const { purges } = variant.second
        const pools = openPools(url, { applicationName: 'bench:beating', shortMax: 1, workMax: 1 })
        heartbeat = { beat: await startHeartbeat(pools.short, purges === undefined ? {} : { purges }), pools }
      }
      try {
        const result = await runDayRound({
          url, provider, tool: defaultLoadTool(), connections: Number(values.connections),
          warmupSeconds: Number(values.warmup), seconds: Number(values.seconds),
          tag: `inst${round}${variants.indexOf(variant)}${Date.now() % 100_000}`, purge: true, retentionSeconds, cwd: variant.cwd,
          // The second stops with the measured seconds: the round then waits for every backend on the database to leave.
          beside: heartbeat ? () => ({ stop: async () => { await stopBeating(heartbeat); heartbeat = undefined; return 0 } }) : second && (() => {
            const before = purgedKeys(second!.url)
            return {
              stop: async () => {
                // Read before stopping it: a drain takes seconds, while the serving process's purge goes on.
                const purged = (await purgedKeys(second!.url)) - await before
                const stopping = second!.stop()
                second = undefined
                await stopping
                return purged
              },
            }
          }),
        })
        results.get(variant.name)!.push(result)
        console.error(`round ${round + 1}, ${variant.name}: ${Math.round(result.load.rps)} payments/s, p99 ${result.load.p99} ms, `
          + `purged ${result.purgedPerSecond}/s, ${result.expiredLeft} left, exactly once ${result.exactlyOnce.ok}, load ${loadavg()[0]!.toFixed(2)}`)
      } finally {
        await second?.stop()
        await stopBeating(heartbeat)
      }
    }
  }
} finally {
  await provider.stop()
}

console.log('| instances | payments/s | p99 ms | keys purged/s, all processes | purged / ingest | rounds (purged/s) | exactly once |')
console.log('| --- | --- | --- | --- | --- | --- | --- |')
for (const variant of variants) {
  const rounds = results.get(variant.name)!
  const rps = median(rounds.map((r) => r.load.rps))
  const purged = median(rounds.map((r) => r.purgedPerSecond))
  const once = rounds.every((r) => r.exactlyOnce.ok)
  console.log(`| ${variant.name} | ${Math.round(rps)} | ${round2(median(rounds.map((r) => r.load.p99)))} | ${Math.round(purged)} | ${round2(purged / rps)}× `
    + `| ${rounds.map((r) => r.purgedPerSecond).join(', ')} | ${once ? 'holds' : 'BROKEN'} (${rounds.reduce((s, r) => s + r.exactlyOnce.payments, 0)} payments, ${rounds.reduce((s, r) => s + r.exactlyOnce.charges, 0)} charges) |`)
}
console.log(`\nload average after: ${loadavg().map((l) => l.toFixed(2)).join(' ')}`)
