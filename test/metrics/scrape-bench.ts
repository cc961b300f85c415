/**
 * Scrape time of /metrics with a large idempotency_keys table (not a test:
 * figures for docs/reference/metrics.md). Run:
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test bun test/metrics/scrape-bench.ts [done-keys]
 * Seeds N done keys over 24 h plus 200 processing keys, starts the server with
 * METRICS_CACHE_MS=0 (every scrape queries) and with the default cache, and
 * times 50 scrapes each.
 */
import { DUPLICATE_WINDOW_KEYS, DUPLICATE_WINDOW_SECONDS } from '../../src/metrics/gauges'
import { DUPLICATES_SQL, duplicatesParameters } from '../../src/metrics/read-duplicates'
import { PROCESSING_GAUGES_SQL, processingGaugeParameters } from '../../src/metrics/read-processing-gauges'
import { createTestDatabase } from '../support/db'
import { startServer } from '../support/server'
import { seedKeys } from './seed'

const DONE = Number(process.argv[2] ?? 1_000_000)
const SCRAPES = 50

const db = await createTestDatabase('scrape_bench')
try {
  let started = performance.now()
  await seedKeys(db.sql, DONE, 200)
  await db.sql`vacuum analyze idempotency_keys`
  const [{ size }] = (await db.sql<{ size: string }[]>`select pg_size_pretty(pg_total_relation_size('idempotency_keys')) as size`) as unknown as [{ size: string }]
  console.log(`seeded ${DONE} done + 200 processing keys in ${((performance.now() - started) / 1000).toFixed(1)} s (table with indexes: ${size})`)

  const explain = async (label: string) => {
    for (const [sql, params] of [[PROCESSING_GAUGES_SQL, processingGaugeParameters()], [DUPLICATES_SQL, duplicatesParameters(DUPLICATE_WINDOW_SECONDS, 30, DUPLICATE_WINDOW_KEYS)]] as const) {
      // as gauges.ts runs them: the duplicates query with its own work_mem
      const rows = await db.sql.begin(async (tx) => {
        await tx`select set_config('work_mem', '32MB', true)`
        return await tx.unsafe(`explain (analyze, buffers, costs off) ${sql}`, params as unknown as never[])
      })
      console.log(`\n--- EXPLAIN ANALYZE (${label}) ---\n${rows.map((r: Record<string, unknown>) => r['QUERY PLAN']).join('\n')}`)
    }
  }
  await explain('all indexes')

  const time = async (url: string) => {
    const times: number[] = []
    for (let i = 0; i < SCRAPES; i++) {
      started = performance.now()
      const text = await (await fetch(`${url}/metrics`)).text()
      times.push(performance.now() - started)
      if (/idempotency_gauges_refresh_failed\{[^}]*\} 1/.test(text)) throw new Error('a refresh failed')
    }
    times.sort((a, b) => a - b)
    return `median ${times[SCRAPES / 2]!.toFixed(1)} ms, p95 ${times[Math.floor(SCRAPES * 0.95)]!.toFixed(1)} ms, max ${times.at(-1)!.toFixed(1)} ms`
  }
  for (const cacheMs of ['0', '5000']) {
    const server = await startServer(db.url, { METRICS_CACHE_MS: cacheMs })
    try {
      await time(server.url) // warm up
      console.log(`\n/metrics, METRICS_CACHE_MS=${cacheMs} (${SCRAPES} scrapes back to back): ${await time(server.url)}`)
    } finally {
      await server.stop()
    }
  }
} finally {
  await db.drop()
}
