/** `npm run migrate`: applies sql/ to DATABASE_URL, or to the embedded PostgreSQL when unset. */
import { startEmbedded } from './embedded'
import { migrate } from './migrate'

const embedded = process.env.DATABASE_URL ? undefined : await startEmbedded({ log: console.log })
try {
  const { applied, version } = await migrate(process.env.DATABASE_URL || embedded!.url)
  console.log(`schema at migration ${version} (${applied} applied)`)
} catch (error) {
  console.error(`migration failed: ${error instanceof Error ? error.message : error}`)
  process.exitCode = 1
} finally {
  await embedded?.stop()
}
