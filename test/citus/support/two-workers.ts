/**
 * The cluster of the worker-fault tests: a coordinator and two workers, a
 * migrated database of 8 shards, and tenants placed on each worker, so a test
 * can stop the first worker and keep the second. Connecting to a stopped
 * worker fails at once (refused); citus.node_connection_timeout bounds a
 * half-open one.
 */
import postgres from 'postgres'
import { migrateService } from '../../../src/store/migrate'
import { startCitusCluster, type CitusCluster, type CitusDatabase } from '../../support/citus'
import { tenantsOn } from './tenants'

export interface TwoWorkers {
  readonly cluster: CitusCluster
  readonly db: CitusDatabase
  readonly sql: postgres.Sql
  /** Tenants whose shards are on the first worker (the one a test stops). */
  readonly downTenants: string[]
  /** Tenants whose shards are on the second worker (the one that stays up). */
  readonly upTenants: string[]
}

export async function startTwoWorkers(database: string, tenantsPerWorker: number): Promise<TwoWorkers> {
  const cluster = await startCitusCluster({ workers: 2, settings: { 'citus.node_connection_timeout': '2000' } })
  const db = await cluster.createDatabase(database, { shardCount: 8 })
  await migrateService(db.url)
  const sql = postgres(db.url, { max: 4, onnotice: () => undefined })
  const placed = await tenantsOn(sql, cluster.workers.map((w) => w.port), tenantsPerWorker)
  return { cluster, db, sql, downTenants: placed.get(cluster.workers[0]!.port)!, upTenants: placed.get(cluster.workers[1]!.port)! }
}
