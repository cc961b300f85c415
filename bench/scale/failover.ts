/**
 * Failover figures:
 * - the relay failover (test/scale/support/relay-failover.ts), synchronous and
 *   asynchronous: promotion time, kill to the next new payment, and what the
 *   asynchronous run loses (answered payments, charges made twice on retry,
 *   leases handed out twice);
 * - a 3-node Patroni cluster under 32 retrying clients (multi-host URL and
 *   HAProxy on /primary): a switchover and a SIGKILL failover, end to end,
 *   detection by Patroni's ttl and loop_wait included.
 */
import { createDatabase } from '../../test/scale/support/database'
import { PrimaryProxy } from '../../test/scale/support/haproxy'
import { ContinuousLoad, ms } from '../../test/scale/support/load'
import { PatroniCluster } from '../../test/scale/support/patroni'
import { cleanupAll, waitFor } from '../../test/scale/support/processes'
import { relayFailover } from '../../test/scale/support/relay-failover'
import { adminClient, checkLedgers, startInstance, startProvider } from '../../test/scale/support/world'
import type { Section } from './report'

export async function relayFailovers(): Promise<Section> {
  const rows: string[][] = []
  for (const mode of ['synchronous', 'asynchronous'] as const) {
    const f = await relayFailover(mode)
    rows.push([mode, String(f.payments), String(f.charges), String(f.lost), String(f.duplicatedCharges), String(f.leasesHandedOutTwice.length), ms(f.promoteMs), ms(f.failoverMs)])
  }
  return {
    title: 'Failover with a test-controlled link (250 keys, 1 s of lag, SIGKILL, pg_ctl promote at once)',
    columns: ['replication', 'payments', 'charges', 'answered 2xx lost', 'charged twice on retry', 'leases handed out twice', 'promote', 'kill to next new 201'],
    rows,
  }
}

const PATHS = ['multi-host', 'haproxy'] as const

export async function patroniFailovers(): Promise<Section> {
  const rows: string[][] = []
  try {
    const cluster = await PatroniCluster.start()
    const leader = (await cluster.leader())!
    const db = await createDatabase('bench_patroni', leader.url())
    const proxy = await PrimaryProxy.start([{ name: 'pg', servers: cluster.nodes.map((n) => ({ name: n.name, port: n.pgPort, checkPort: n.restPort })) }])
    const provider = await startProvider(50)
    const urls = { 'multi-host': cluster.multiHostUrl(db.name), haproxy: `postgres://postgres@127.0.0.1:${proxy.port('pg')}/${db.name}` }
    const instances = Object.fromEntries(await Promise.all(PATHS.map(async (p) => [p, await startInstance(p, { databaseUrl: urls[p], providerUrl: provider.url, ttlSeconds: 3 })] as const)))
    const { ttl, loopWait } = cluster.timing
    for (const fault of ['switchover', 'failover'] as const) {
      const run = new ContinuousLoad({ clients: 32, targets: PATHS.map((p) => ({ name: p, url: () => instances[p]!.url })), prefix: `bench-${fault}-${crypto.randomUUID().slice(0, 6)}`, thinkMs: 200 }).start()
      await waitFor('60 payments under load', () => run.paid() >= 60, 60_000, 50)
      const members = await cluster.waitHealthy()
      const from = members.find((m) => m.role === 'leader')!.name
      const to = members.find((m) => m.role === 'sync_standby')!.name
      const at = performance.now()
      if (fault === 'switchover') cluster.switchover(from, to)
      else await cluster.node(from).kill()
      const promoted = await waitFor('a new primary', async () => (await cluster.node(to).isPrimary()) && performance.now(), 60_000, 100)
      const served = await waitFor('both paths served again', () => PATHS.every((p) => run.fresh(at, p).length >= 15) && performance.now(), 90_000, 100)
      await run.stop()
      const sql = adminClient(cluster.node(to).url(db.name))
      const check = await checkLedgers(sql, provider, run.ledgerKeys())
      await sql.end({ timeout: 1 })
      for (const p of PATHS) {
        const first = Math.min(...run.fresh(at, p).map((a) => a.at - at))
        rows.push([fault, p, `ttl ${ttl} s, loop_wait ${loopWait} s`, ms(promoted - at), ms(first), ms(run.longestGap(at, served, p)), `${check.lost} lost, ${check.duplicatedCharges} charged twice, ${run.keys.length} keys`])
      }
      if (fault === 'failover') break
      await cluster.waitHealthy()
    }
  } finally {
    await cleanupAll()
  }
  return {
    title: 'Patroni (3 nodes, synchronous mode) under 32 retrying clients, provider delay 50 ms',
    columns: ['fault', 'path', 'Patroni timing', 'to new primary', 'to first new 201', 'longest gap without a 2xx', 'ledger'],
    rows,
  }
}
