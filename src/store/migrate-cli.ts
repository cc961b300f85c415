/** `npm run migrate`: applies sql/engine and sql/service to DATABASE_URL, or to the embedded PostgreSQL when unset. */
import { startEmbedded } from './embedded'
import { describeVersions, migrateService } from './migrate'

const embedded = process.env.DATABASE_URL ? undefined : await startEmbedded({ log: console.log })
try {
  const { applied, versions, adopted } = await migrateService(process.env.DATABASE_URL || embedded!.url)
  if (adopted) console.log('the single-line layout of earlier releases (table migrations) was recorded in idempotency_migrations and service_migrations')
  console.log(`schema at migrations ${describeVersions(versions)} (${applied} applied)`)
} catch (error) {
  console.error(`migration failed: ${error instanceof Error ? error.message : error}`)
  process.exitCode = 1
} finally {
  await embedded?.stop()
}
