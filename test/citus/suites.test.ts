/**
 * The engine, HTTP and exactly-once tests of test/core and test/http, as they
 * are, on the distributed schema (issue 47): one Citus cluster (a coordinator
 * and two workers) for the whole list, and `bun test` over the list with
 * TEST_CITUS_URL set to the coordinator, so each file's createTestDatabase
 * (test/support/db.ts) makes its database on the cluster, migrated and so
 * distributed by tenant, and checks that idempotency_keys is distributed.
 *
 * The list holds the files that passed there three runs in a row; each file
 * left out names why. Run just this with
 * `npm run test:citus -- test/citus/suites.test.ts`.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { spawn } from 'node:child_process'
import postgres from 'postgres'
import { startCitusCluster, type CitusCluster } from '../support/citus'

/** Passed 3 runs in a row on the cluster, the exactly-once ones first. */
export const ON_CITUS = [
  'test/core/engine.test.ts', // claim, completion, fencing, reclaim, release, downstream key
  'test/core/reclaim-race.test.ts',
  'test/core/liveness.test.ts',
  'test/http/storm.test.ts',
  'test/http/contract.test.ts',
  'test/http/running-keys.test.ts',
  'test/http/plugin.test.ts',
  'test/http/hooks.test.ts',
  'test/http/failure-attribution.test.ts',
  'test/http/deadline-margin.test.ts',
  'test/http/openapi.test.ts',
  'test/http/readme.test.ts',
]

/** The files of test/core and test/http left out, each with why. */
export const LEFT_OUT: Readonly<Record<string, string>> = {
  'test/core/batching.test.ts': 'tests the statements form of one PostgreSQL: runs claimBatchSql itself, puts triggers on idempotency_keys, reads HOT counts and the coordinator\'s pg_stat_activity (Citus\'s form: test/citus/request-path.test.ts)',
  'test/core/worker-pools.test.ts': 'its database test asserts that one PostgreSQL opens no worker pool; the rest need no database',
  'test/http/key-lock-isolation.test.ts': 'its first test runs the statements form\'s claim (claimBatchSql) on the distributed table itself, which Citus refuses (0A000); its second passes on Citus since sql/engine/00013',
  'test/http/replay-cache.test.ts': 'the test locks idempotency_keys FOR UPDATE by key alone, across shards (refused by Citus), and watches the coordinator\'s pg_stat_activity',
  'test/http/contract-edges.test.ts': 'its lock test waits for the payment INSERT in the coordinator\'s pg_stat_activity; on Citus that wait is on the worker, inside idempotency_on_shard',
  'test/core/batcher.test.ts, deadline, errors, fingerprint; test/http/auth.test.ts, client-address, idempotency-key, problem, tenant-refusals': 'no database: nothing of them runs on Citus',
}

const RUN_TIMEOUT_MS = 300_000

let cluster: CitusCluster
beforeAll(async () => {
  cluster = await startCitusCluster({ workers: 2 })
})
afterAll(() => cluster?.stop())

test('the listed engine and HTTP tests pass on the distributed schema', async () => {
  // Another list, and a test name pattern, for a look at one file: TEST_CITUS_FILES, TEST_CITUS_NAME.
  const files = process.env.TEST_CITUS_FILES?.split(/\s+/).filter(Boolean) ?? ON_CITUS
  const name = process.env.TEST_CITUS_NAME ? ['-t', process.env.TEST_CITUS_NAME] : []
  const code = await new Promise<number | null>((resolve, reject) => {
    const child = spawn(process.execPath, ['test', '--timeout', '60000', ...name, ...files], {
      stdio: ['ignore', 'inherit', 'inherit'],
      // DATABASE_URL too: nothing of the run touches the plain server, and no embedded one starts (test/support/setup.ts).
      env: { ...process.env, TEST_CITUS_URL: cluster.coordinatorUrl, DATABASE_URL: cluster.coordinatorUrl },
    })
    child.on('error', reject)
    child.on('exit', (exitCode) => resolve(exitCode))
  })
  expect(code).toBe(0)
  // Every database the run made was dropped by its file.
  const sql = postgres(cluster.coordinatorUrl, { max: 1, onnotice: () => undefined })
  try {
    const left = await sql<{ datname: string }[]>`select datname from pg_database where datname like 'idem\\_%'`
    expect(left.map((row) => row.datname)).toEqual([])
  } finally {
    await sql.end()
  }
}, RUN_TIMEOUT_MS)
