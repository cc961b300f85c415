/**
 * postgres.js drops the promise of a query of its own (the array-type fetch
 * on every new connection); when that query fails, the rejection is
 * unhandled and Bun exits. Seen through PgBouncer's query_wait_timeout
 * (test/scale/pgbouncer.scale.ts); here a 1 ms statement_timeout makes it fail
 * on any PostgreSQL. Bun then exits 1 (the service, serving, died at once in
 * the PgBouncer run). The service's guard (src/store/driver-guard.ts) logs it.
 */
import { expect, test } from 'bun:test'

async function run(mode: 'guard' | 'bare') {
  const proc = Bun.spawn([process.execPath, 'test/store/fixtures/driver-rejection.ts', mode], { env: { ...process.env }, stdout: 'pipe', stderr: 'pipe' })
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { out, err, code }
}

test('without the guard, the driver\'s own failed query is an unhandled rejection: the process fails (the premise)', async () => {
  const { out, err, code } = await run('bare')
  expect(out).toContain('query failed: 57014')
  expect(err).toContain('canceling statement due to statement timeout')
  expect(code).toBe(1)
})

test('with the guard, it is logged and the process keeps running', async () => {
  const { out, err, code } = await run('guard')
  expect(out).toContain('survived')
  expect(err).not.toContain('canceling statement')
  const line = out.split('\n').find((l) => l.includes("a query of the driver's own"))
  expect(JSON.parse(line!)).toMatchObject({ level: 'warn', error: { name: 'PostgresError', code: '57014' } })
  expect(code).toBe(0)
})
