import postgres from 'postgres'
import { migrate } from '../../src/store/migrate'
import { openPools, type Pools } from '../../src/store/db'

export interface TestDatabase {
  readonly url: string
  readonly pools: Pools
  /** One connection for assertions and for putting rows in any state. */
  readonly sql: postgres.Sql
  drop(): Promise<void>
}

function baseUrl(): string {
  const url = process.env.DATABASE_URL
  if (!url) throw new Error('DATABASE_URL is not set (test/support/setup.ts should have set it)')
  return url
}

/** A fresh, migrated database for one test file: files never see each other's rows. */
export async function createTestDatabase(label = 'test'): Promise<TestDatabase> {
  const name = `idem_${label.replace(/\W/g, '_').slice(0, 30)}_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(baseUrl(), { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${name}"`)
  await admin.end()
  const url = new URL(baseUrl())
  url.pathname = `/${name}`
  await migrate(url.toString())
  const pools = openPools(url.toString(), { applicationName: `test:${label}`, shortMax: 10, workMax: 20 })
  const sql = postgres(url.toString(), { max: 4, onnotice: () => undefined })
  return {
    url: url.toString(),
    pools,
    sql,
    async drop() {
      await pools.close(1)
      await sql.end({ timeout: 1 })
      const cleanup = postgres(baseUrl(), { max: 1, onnotice: () => undefined })
      await cleanup.unsafe(`drop database if exists "${name}" with (force)`)
      await cleanup.end()
    },
  }
}
