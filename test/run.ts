/**
 * `npm test`: the whole suite, its files on as many worker processes as the
 * machine has cores (`bun test --parallel`), the slowest first
 * (test/timings.json). The files wait on databases, processes and Prometheus
 * more than they compute: on two cores 409 s against 650 s one after another
 * (2026-12-06). Then the files listed in ALONE, one at a time. Extra
 * arguments go to one `bun test --parallel` run (`npm test -- -t claim`).
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

/**
 * Files whose bounds are about latency under injected faults, run after the
 * others, one at a time: a neighbour's load is not their fault model. The
 * terminate loop's 5xx bound (1 in 1,000 sends) held on an idle and on a
 * CPU-starved machine (stress-ng), and failed once beside another file in a
 * CI run: 92 claims in one 300 ms window waited out their 5 s budget, in the
 * second the file beside it started 26 Bun processes at once (PostgreSQL's
 * log: about 170 process ids used in 1.5 s).
 */
const ALONE = ['test/chaos/terminate-loop.test.ts']
const args = process.argv.slice(2)
// Given explicitly: Bun.spawn's default is the environment this process started with, not process.env as changed here.
const env = embedded ? { ...process.env, DATABASE_URL: embedded.url } : process.env

let current: ReturnType<typeof Bun.spawn> | undefined
function bunTest(extra: string[], more: Record<string, string> = {}): Promise<number> {
  current = Bun.spawn([process.execPath, 'test', '--timeout', '60000', '--path-ignore-patterns=test/citus/**', ...extra], { cwd: ROOT, env: { ...env, ...more }, stdio: ['inherit', 'inherit', 'inherit'] })
  return current.exited
}
// A Ctrl-C reaches the whole process group: bun test stops its workers, and this waits for it, then stops the server.
let stopped = false
for (const signal of ['SIGINT', 'SIGTERM'] as const) process.on(signal, () => { stopped = true; current?.kill(signal) })

const parallel = ['--parallel', '--timings=test/timings.json']
// With arguments (a file, -t): one run of what they choose. Without: the suite, then the files that run alone.
let code = await bunTest(args.length > 0 ? [...parallel, ...args] : [...parallel, ...ALONE.map((file) => `--path-ignore-patterns=${file}`)])
if (args.length === 0 && !stopped) code = Math.max(code, await bunTest(ALONE))
// The engine and the operators' reads again with every key in the old form: a database whose switch to the new
// one (sql/engine/00023) waits for an older release's processes, and the keys claimed before it. The same
// exactly-once, fencing and take-over tests on a key whose answer is on its row.
if (args.length === 0 && !stopped) code = Math.max(code, await bunTest(['--parallel', 'test/core', 'test/operations'], { TEST_KEY_FORM: 'old' }))
await embedded?.stop()
process.exit(code)
