/** A database of this run's own on an existing server, migrated directly (never through a pooler), dropped at the end. */
import postgres from 'postgres'
import { migrateService } from '../../../src/store/migrate'

/** The machine's PostgreSQL (trust auth on loopback), unless SCALE_POSTGRES_URL or DATABASE_URL says otherwise. */
export function serverUrl(): string {
  return process.env.SCALE_POSTGRES_URL || process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/test'
}

export interface OwnDatabase {
  readonly name: string
  /** Direct to PostgreSQL. */
  readonly url: string
  readonly host: string
  readonly port: number
  readonly user: string
  drop(): Promise<void>
}

export async function createDatabase(label: string, server = serverUrl()): Promise<OwnDatabase> {
  const name = `idem_scale_${label}_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(server, { max: 1, onnotice: () => undefined })
  try {
    await admin.unsafe(`create database "${name}"`)
  } finally {
    await admin.end({ timeout: 1 })
  }
  const url = new URL(server)
  url.pathname = `/${name}`
  // Migrations take a session advisory lock: they must run on a real session, not through PgBouncer.
  await migrateService(url.toString())
  return {
    name,
    url: url.toString(),
    host: url.hostname,
    port: Number(url.port || 5432),
    user: decodeURIComponent(url.username || 'postgres'),
    async drop() {
      const cleanup = postgres(server, { max: 1, onnotice: () => undefined })
      try {
        await cleanup.unsafe(`drop database if exists "${name}" with (force)`)
      } finally {
        await cleanup.end({ timeout: 1 })
      }
    },
  }
}
