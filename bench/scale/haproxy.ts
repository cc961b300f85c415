/**
 * 409 latency through HAProxy: three instances behind it (round robin,
 * /readyz checks), one PostgreSQL; while a first request waits 800 ms at the
 * provider, one client asks again and again (each answer a 409), then a storm
 * of 300 at once. Latency on this shared machine is an upper bound.
 */
import { createDatabase } from '../../test/scale/support/database'
import { HAProxy } from '../../test/scale/support/haproxy'
import { ms, percentile, post, storm } from '../../test/scale/support/load'
import { PostgresServer } from '../../test/scale/support/postgres-server'
import { cleanupAll } from '../../test/scale/support/processes'
import { startInstance, startProvider } from '../../test/scale/support/world'
import type { Section } from './report'

const PROVIDER_DELAY_MS = 800
const ROUNDS = 5

export async function haproxyLatency(): Promise<Section> {
  const pg = PostgresServer.init('bench-haproxy-pg')
  await pg.start()
  try {
    const db = await createDatabase('bench_haproxy', pg.url())
    const provider = await startProvider(PROVIDER_DELAY_MS)
    const instances = await Promise.all([1, 2, 3].map((i) => startInstance(`s${i}`, { databaseUrl: db.url, providerUrl: provider.url, ttlSeconds: 3 })))
    const proxy = await HAProxy.start(instances.map((i) => ({ name: i.name, port: i.port })))
    const single: number[] = []
    for (let round = 0; round < ROUNDS; round++) {
      const key = `bench-ha-${crypto.randomUUID()}`
      const body = { amount: 1250, currency: 'EUR', customer: `cus_bench_ha_${round}` }
      const first = post(proxy.url, key, body)
      const until = performance.now() + PROVIDER_DELAY_MS - 200
      while (performance.now() < until) {
        const answer = await post(proxy.url, key, body)
        if (answer.status === 409) single.push(answer.ms)
      }
      await first
    }
    const key = `bench-ha-storm-${crypto.randomUUID()}`
    const answers = await storm(proxy.url, key, 300, { amount: 1250, currency: 'EUR', customer: 'cus_bench_ha_storm' })
    const conflicts = answers.filter((a) => a.status === 409).map((a) => a.ms)
    const created = answers.find((a) => a.status === 201 && !a.replayed)
    return {
      title: '409 latency through HAProxy (3 instances, provider delay 800 ms)',
      columns: ['load', '409s', 'p50', 'p99', 'max', 'the 201'],
      rows: [
        ['one client asking again, no storm', String(single.length), ms(percentile(single, 50)), ms(percentile(single, 99)), ms(Math.max(...single)), ''],
        ['300 at once, one key', String(conflicts.length), ms(percentile(conflicts, 50)), ms(percentile(conflicts, 99)), ms(Math.max(...conflicts)), created ? ms(created.ms) : 'none'],
      ],
    }
  } finally {
    await cleanupAll()
  }
}
