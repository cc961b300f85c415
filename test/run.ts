/**
 * `npm test`: the whole suite, its files on as many worker processes as the
 * machine has cores (`bun test --parallel`), the slowest first
 * (test/timings.json). The files wait on databases, processes and Prometheus
 * more than they compute: on two cores 409 s against 650 s one after another
 * (2026-12-06). Extra arguments go to `bun test` (`npm test -- -t claim`).
 *
 * With DATABASE_URL unset the embedded PostgreSQL is started here, once, and
 * the workers are given its URL. Left to the preload (test/support/setup.ts),
 * each worker would start and stop it around every file it runs, and one
 * worker's stop between two files shut the server down under the other's
 * tests (57P03, seen on the first try).
 */
import { join } from 'node:path'
import type { EmbeddedPostgres } from '../src/store/embedded'
import { startTestServer } from './support/test-server'

const ROOT = join(import.meta.dir, '..')

const embedded: EmbeddedPostgres | undefined = process.env.DATABASE_URL ? undefined : await startTestServer()

const tests = Bun.spawn([
  process.execPath, 'test', '--timeout', '60000', '--parallel', '--timings=test/timings.json',
  '--path-ignore-patterns=test/citus/**', ...process.argv.slice(2),
], {
  cwd: ROOT,
  // Given explicitly: Bun.spawn's default is the environment this process started with, not process.env as changed here.
  env: embedded ? { ...process.env, DATABASE_URL: embedded.url } : process.env,
  stdio: ['inherit', 'inherit', 'inherit'],
})
// A Ctrl-C reaches the whole process group: bun test stops its workers, and this waits for it, then stops the server.
for (const signal of ['SIGINT', 'SIGTERM'] as const) process.on(signal, () => tests.kill(signal))
const code = await tests.exited
await embedded?.stop()
process.exit(code)
