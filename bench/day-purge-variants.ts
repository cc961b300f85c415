/**
 * How fast the purge could clear a backlog while the service serves at full
 * speed, by its pacing: the purge's own statement (core/purge.ts), looped from
 * this process beside a service whose own purge is off, in interleaved rounds:
 *
 *   - none: no purge (the p99 to compare with);
 *   - landed: batches of 500 from where the last one ended, each full one followed by a
 *     pause three times its time (a quarter of a connection: retention-purge.ts purgePauseMs);
 *   - the same pacing with batches of 200 and of 100: shorter stalls beside the
 *     requests, at more statements per key;
 *   - the landed purge with its session's WAL page images compressed (lz4).
 * (The variants of earlier questions, a fixed 50 ms pause and batches of 2,000, are in
 * BENCHMARKS.md with their figures.)
 *
 *   bun bench/day-purge-variants.ts --database idem_day_xxxx [--rounds 3] [--seconds 10] [--warmup 3] [--load wrk] [--purge-retention 43200] [--variants 1,4]
 *
 * On a database the day-of-traffic bench kept (`--keep`): it deletes keys
 * older than `--purge-retention` (12 h: a backlog for every round; the
 * service keeps its one-day retention). The server's autovacuum decides how
 * long the deleted keys stay dead at the head of idempotency_keys_created_at.
 */
import { loadavg } from 'node:os'
import { parseArgs } from 'node:util'
import postgres from 'postgres'
import { expired, releasedExpired, retentionCandidate } from '../src/core/policy'
import { purgeExpired } from '../src/core/purge'
import { purgePauseMs } from '../src/maintenance/retention-purge'
import { defaultLoadTool, type LoadTool } from './day-load'
import { runDayRound, type RoundResult } from './day-rounds'
import { round2 } from './load'
import { startProvider } from './provider'
import { median } from './versus-naive'

const RETENTION_SECONDS = 86_400

interface Variant {
  readonly name: string
  readonly batchSize: number
  /** The pause after a full batch that took `ms`. */
  readonly pauseMs: (ms: number) => number
  /** Each batch starts where the last one stopped (created_at), not at the head of the index. */
  readonly cursor?: boolean
  /** The purge's session compresses the page images its WAL carries (`wal_compression`, a superuser's setting). */
  readonly walCompression?: string
}

const VARIANTS: readonly (Variant | undefined)[] = [
  undefined,
  { name: 'landed: 500, a quarter', batchSize: 500, pauseMs: (ms) => purgePauseMs(ms), cursor: true },
  { name: '200, a quarter', batchSize: 200, pauseMs: (ms) => purgePauseMs(ms), cursor: true },
  { name: '100, a quarter', batchSize: 100, pauseMs: (ms) => purgePauseMs(ms), cursor: true },
  { name: '500, a quarter, its WAL\'s page images compressed (lz4)', batchSize: 500, pauseMs: (ms) => purgePauseMs(ms), cursor: true, walCompression: 'lz4' },
]

/**
 * purgeExpired's statement (core/purge.ts) with one more bound: created_at at
 * or after the newest key the previous batch deleted. The index range then
 * starts past the keys already deleted (dead until vacuum) instead of walking
 * them again in every batch. Returns the deleted keys' created_at.
 */
async function purgeFrom(sql: postgres.Sql, retentionSeconds: number, batchSize: number, from: Date | null): Promise<Date[]> {
  const rows = await sql<{ created_at: Date }[]>`
    with gone as (
      select k.ctid, k.created_at from idempotency_keys k
       where ${retentionCandidate(sql, null, retentionSeconds)}
         and k.created_at >= coalesce(${from}::timestamptz, '-infinity')
         and (${expired(sql, null, retentionSeconds)} or ${releasedExpired(sql, null, retentionSeconds)})
       order by k.created_at
       limit ${batchSize}
         for update of k skip locked
    )
    delete from idempotency_keys k
     using gone
     where k.ctid = gone.ctid and k.status in ('done', 'released')
    returning gone.created_at`
  return rows.map((row) => row.created_at)
}

/** The retention purge's loop (retention-purge.ts purgeRun), its batch and pause given, until stopped. */
function loopPurge(url: string, variant: Variant): () => { stop(): Promise<number> } {
  return () => {
    const sql = postgres(url, { max: 1, onnotice: () => undefined, ...(variant.walCompression ? { connection: { wal_compression: variant.walCompression } } : {}) })
    let stopped = false
    let deleted = 0
    let from: Date | null = null
    const loop = (async () => {
      while (!stopped) {
        const started = performance.now()
        let n: number
        if (variant.cursor) {
          const times = await purgeFrom(sql, purgeRetention, variant.batchSize, from)
          n = times.length
          if (n > 0) from = new Date(Math.max(...times.map((t) => t.getTime())))
        } else {
          n = await purgeExpired(sql, { retentionSeconds: purgeRetention, batchSize: variant.batchSize })
        }
        deleted += n
        if (n < variant.batchSize) throw new Error(`the backlog ran out (${n} in the last batch): the rate would be the supply's`)
        await Bun.sleep(variant.pauseMs(performance.now() - started))
      }
    })()
    loop.catch(() => undefined) // handled by stop(), which awaits it
    return {
      async stop() {
        stopped = true
        try {
          await loop
        } finally {
          await sql.end()
        }
        return deleted
      },
    }
  }
}

const { values } = parseArgs({
  options: {
    database: { type: 'string' },
    rounds: { type: 'string', default: '3' },
    seconds: { type: 'string', default: '10' },
    warmup: { type: 'string', default: '3' },
    connections: { type: 'string', default: '32' },
    load: { type: 'string' },
    /** The purge's retention (the service keeps its day): shorter, so the backlog lasts every round. */
    'purge-retention': { type: 'string', default: '43200' },
    /** The variants to run besides none, by their position in VARIANTS (1-based), e.g. `1,4`. @default all */
    variants: { type: 'string' },
  },
})
const purgeRetention = Number(values['purge-retention'])
const base = process.env.DATABASE_URL
if (!base || !values.database) throw new Error('needs DATABASE_URL and --database (a database kept by bench/day-of-traffic.ts --keep)')
const url = Object.assign(new URL(base), { pathname: `/${values.database}` }).toString()
const tool = (values.load ?? defaultLoadTool()) as LoadTool
const provider = await startProvider(0)
/** `none` and the variants `--variants` names by position (all without it). */
function chosenVariants(list: string | undefined): readonly (Variant | undefined)[] {
  if (!list) return VARIANTS
  return [undefined, ...list.split(',').map((n) => {
    const variant = VARIANTS[Number(n)]
    if (!variant) throw new Error(`no variant ${n} (1 to ${VARIANTS.length - 1})`)
    return variant
  })]
}
const chosen = chosenVariants(values.variants)
const results = new Map<string, RoundResult[]>(chosen.map((v) => [v?.name ?? 'none', []]))
const admin = postgres(base, { max: 1, onnotice: () => undefined })
try {
  for (let round = 1; round <= Number(values.rounds); round++) {
    for (const variant of round % 2 === 1 ? chosen : [...chosen].reverse()) {
      await admin`checkpoint`
      const name = variant?.name ?? 'none'
      const result = await runDayRound({
        url, provider, tool, connections: Number(values.connections), warmupSeconds: Number(values.warmup), seconds: Number(values.seconds),
        tag: `pv_${crypto.randomUUID().slice(0, 6)}`, purge: false, retentionSeconds: RETENTION_SECONDS,
        beside: variant ? loopPurge(url, variant) : undefined,
      })
      results.get(name)!.push(result)
      console.error(`[purge-variants load ${round2(loadavg()[0]!)}] round ${round} ${name}: ${Math.round(result.load.rps)}/s, p99 ${result.load.p99} ms, purged ${result.purgedPerSecond}/s, ${result.seqScans} seq scans, exactly once ${result.exactlyOnce.ok ? 'holds' : 'BROKEN'} (${result.exactlyOnce.payments}/${result.exactlyOnce.charges})`)
    }
  }
  const none = results.get('none')!
  const p99None = median(none.map((r) => r.load.p99))
  console.log('| purge | payments/s | p99 ms (× none) | keys purged/s | purged / ingest | rounds (purged/s) | exactly once |')
  console.log('| --- | --- | --- | --- | --- | --- | --- |')
  for (const [name, rounds] of results) {
    const rps = median(rounds.map((r) => r.load.rps))
    const p99 = median(rounds.map((r) => r.load.p99))
    const purged = median(rounds.map((r) => r.purgedPerSecond))
    const ratio = median(rounds.map((r) => r.purgedPerSecond / r.load.rps))
    console.log(`| ${name} | ${Math.round(rps)} | ${round2(p99)} (${round2(p99 / p99None)}×) | ${Math.round(purged)} | ${round2(ratio)}× | ${rounds.map((r) => r.purgedPerSecond).join(', ')} | ${rounds.every((r) => r.exactlyOnce.ok) ? 'holds' : 'BROKEN'} (${rounds.reduce((s, r) => s + r.exactlyOnce.payments, 0)} / ${rounds.reduce((s, r) => s + r.exactlyOnce.charges, 0)}) |`)
  }
} finally {
  await provider.stop().catch(() => undefined)
  await admin.end()
}
