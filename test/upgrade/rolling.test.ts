/**
 * A rolling upgrade from the last release under load (SPEC invariant 14,
 * docs/how-to/upgrade.md "Upgrading"): two instances of 0.2.0 (commit 712f2cc,
 * taken out of this clone's own history with `git archive`) serve a retrying
 * load on one database; this release's `npm run migrate` runs while they do
 * (its expand steps apply, its contract step waits for them); they are
 * replaced one at a time (taken out of the balancer, SIGTERM, drain, this
 * release started in their place); then the contract step runs.
 *
 * Every key is sent to two instances at once and retried, like a careful
 * client behind a balancer, to any instance in rotation until it has a 2xx.
 * Counted where it lands: exactly one payment and one charge per key, no
 * key left in processing, no 5xx but the drains' own `503 shutting-down`.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { chargedOnce, paymentsByKey } from '../chaos/clients'
import { payment, type PaymentBody } from '../support/http'
import { spawnProvider, type ProviderProcess } from '../support/provider-process'
import { spawnService, type SpawnedService } from '../support/process'
import { ADMIN_TOKEN, API_KEYS } from '../support/server'
import { signIn } from '../admin/support'
import { waitFor } from '../support/wait'
import { migrationsOf, SERVICE_MIGRATIONS } from '../../src/store/migrate'

/** Release 0.2.0: what users run today. */
const PREVIOUS_RELEASE = '712f2cc'
const ROOT = join(import.meta.dir, '..', '..')

const git = (...args: string[]) => Bun.spawnSync(['git', '-C', ROOT, ...args], { stdout: 'pipe', stderr: 'pipe' })
const history = git('cat-file', '-e', `${PREVIOUS_RELEASE}^{commit}`).exitCode === 0

let temp: string
let previousDir: string
let dbName: string
let dbUrl: string
let sql: postgres.Sql
let provider: ProviderProcess
const started: SpawnedService[] = []

beforeAll(async () => {
  if (!history) return
  temp = mkdtempSync(join(tmpdir(), 'idem-upgrade-'))
  previousDir = join(temp, 'release-0.2.0')
  const archive = Bun.spawnSync(['bash', '-c', `mkdir -p "${previousDir}" && git -C "${ROOT}" archive ${PREVIOUS_RELEASE} | tar -x -C "${previousDir}"`], { stderr: 'pipe' })
  if (archive.exitCode !== 0) throw new Error(`git archive ${PREVIOUS_RELEASE} failed: ${archive.stderr.toString()}`)
  // The same dependencies, at the same versions (package.json: only p-retry moved to "dependencies").
  symlinkSync(join(ROOT, 'node_modules'), join(previousDir, 'node_modules'))
  dbName = `idem_upgrade_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${dbName}"`)
  await admin.end()
  dbUrl = Object.assign(new URL(process.env.DATABASE_URL!), { pathname: `/${dbName}` }).toString()
  sql = postgres(dbUrl, { max: 2, onnotice: () => undefined })
  provider = await spawnProvider({ delayMs: 50 })
}, 60_000)

afterAll(async () => {
  for (const s of started) if (s.proc.exitCode === null) s.proc.kill('SIGKILL')
  await provider?.stop()
  await sql?.end({ timeout: 1 })
  if (dbName) {
    const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
    await admin.unsafe(`drop database if exists "${dbName}" with (force)`)
    await admin.end()
  }
  if (temp) rmSync(temp, { recursive: true, force: true })
})

/** The form new claims take (sql/engine/00020, switched by 00023), and the key table's fillfactor. */
async function keyForm(): Promise<{ form: string | null; fillfactor: string | undefined }> {
  const [row] = await sql<{ form: string | null; options: string[] | null }[]>`
    select (select form from idempotency_key_form where id = 1) as form, (select reloptions from pg_class where oid = 'idempotency_keys'::regclass) as options`
  return { form: row!.form, fillfactor: row!.options?.find((option) => option.startsWith('fillfactor=')) }
}

const env = () => ({ DATABASE_URL: dbUrl, PAYMENT_PROVIDER_URL: provider.url, API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test' })

async function start(release: 'previous' | 'this'): Promise<SpawnedService> {
  const service = await spawnService({ env: env(), ...(release === 'previous' ? { cwd: previousDir } : {}), timeoutMs: 30_000 })
  started.push(service)
  return service
}

/** `npm run migrate` of one release, as an operator runs it. */
async function migrateWith(release: 'previous' | 'this'): Promise<string> {
  const proc = Bun.spawn([process.execPath, 'src/store/migrate-cli.ts'], { cwd: release === 'previous' ? previousDir : ROOT, env: { ...process.env, ...env() }, stdout: 'pipe', stderr: 'pipe' })
  const [out, errOut, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  if (code !== 0) throw new Error(`npm run migrate (${release}) exited ${code}:\n${out}${errOut}`)
  return out
}

/**
 * Payments through per phase of the roll, instead of a fixed 2 s: about 2 s of this load on an idle
 * machine (measured: 100 in 0.73 to 1.08 s), and as long as it takes on a busy one.
 */
const LOAD_PER_PHASE = 250

interface Sent {
  readonly status: number | 'network-error'
  readonly code?: string
  readonly paymentId?: string
  readonly location?: string
}

/** The balancer in front of the instances: its rotation, and whether an instance is still in it. */
interface Balancer {
  pick(): string
  serves(url: string): boolean
}

/**
 * To one instance, or through the balancer. A network error on an instance that has left the rotation (it
 * is draining: a connection refused once its listener closed, or reset as it closed an idle keep-alive
 * connection the request had just been written to) is sent to the next pick, as a balancer does; the
 * request carries its Idempotency-Key, so a resend is a retry like any other. A network error of an
 * instance in the rotation counts, with its code.
 */
async function post(to: string | Balancer, key: string, body: PaymentBody, resent = 0): Promise<Sent> {
  const target = typeof to === 'string' ? to : to.pick()
  try {
    const response = await fetch(`${target}/api/payments`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer acme-key', 'idempotency-key': key },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(15_000),
    })
    const answer = await response.json() as { id?: string; code?: string }
    const location = response.headers.get('location')
    return {
      status: response.status, ...(answer.code ? { code: answer.code } : {}), ...(response.ok && answer.id ? { paymentId: answer.id } : {}),
      ...(location ? { location } : {}),
    }
  } catch (error) {
    const code = (error as { code?: string }).code ?? String(error)
    if (typeof to !== 'string' && !to.serves(target) && resent < 5) return post(to, key, body, resent + 1)
    return { status: 'network-error', code }
  }
}

test.skipIf(!history)('0.2.0 → this release, one instance at a time under a retrying load: one payment and one charge per key, no 5xx but the drains\' 503s', async () => {
  expect(await migrateWith('previous')).toContain('schema at migrations')
  const a = await start('previous')
  const b = await start('previous')
  // The balancer's rotation: an instance leaves it before it is stopped, and joins once it listens.
  let rotation = [a.url, b.url]
  const balancer: Balancer = { pick: () => rotation[Math.floor(Math.random() * rotation.length)]!, serves: (url) => rotation.includes(url) }

  const bodies = new Map<string, PaymentBody>()
  const answers: Sent[] = []
  let loading = true
  const client = async (n: number) => {
    for (let i = 0; loading; i++) {
      const key = `upgrade-${n}-${i}-${crypto.randomUUID().slice(0, 8)}`
      const body = payment({ customer: `cus_${key}` })
      bodies.set(key, body)
      // Sent to two instances at once, then retried to any until a 2xx.
      const first = await Promise.all([post(balancer, key, body), post(balancer, key, body)])
      answers.push(...first)
      let done = first.some((s) => typeof s.status === 'number' && s.status < 300)
      for (let attempt = 0; !done && attempt < 200; attempt++) {
        await Bun.sleep(20 + Math.random() * 40)
        const again = await post(balancer, key, body)
        answers.push(again)
        done = typeof again.status === 'number' && again.status < 300
      }
      if (!done) throw new Error(`key ${key}: no 2xx after 200 retries`)
    }
  }
  const clients = Array.from({ length: 12 }, (_, n) => client(n))
  // Each phase runs under load: it lasts until the clients got LOAD_PER_PHASE more payments through.
  const paid = () => answers.filter((s) => typeof s.status === 'number' && s.status < 300).length
  const underLoad = async (phase: string) => {
    const from = paid()
    await waitFor(() => paid() >= from + LOAD_PER_PHASE, () => `${LOAD_PER_PHASE} payments ${phase} (${paid() - from} so far)`, 60_000)
  }
  await underLoad('while 0.2.0 serves alone')

  // Expand, while 0.2.0 serves: its online steps apply; the contract step waits for the 0.2.0 processes.
  const expanded = await migrateWith('this')
  expect(expanded).toMatch(/contract step service 5 \(session_credentials_required\) not applied: 2 live process\(es\)/)
  // And the switch to the key's new form (sql/engine/00023), which 0.2.0 would misread: keys stay in the old form.
  expect(expanded).toMatch(/contract step engine 23 \(claims_apart\) not applied: 2 live process\(es\)/)
  // The key table keeps its room for the old form's completions (the engine's 32: the service's steps after its
  // pending contract step wait too).
  expect(await keyForm()).toEqual({ form: 'old', fillfactor: 'fillfactor=32' })
  // 0.2.0 keeps writing what the contract step would forbid (a session without its credential): it still can.
  const signedIn = await signIn(a.url)
  expect((await fetch(`${a.url}/admin`, { headers: { cookie: signedIn.cookie } })).status).toBe(200)
  await underLoad('on the expanded schema')

  // Deploy: replace each 0.2.0 instance by this release, one at a time.
  const replaced: SpawnedService[] = []
  for (const old of [a, b]) {
    rotation = rotation.filter((url) => url !== old.url)
    old.proc.kill('SIGTERM')
    expect(await old.proc.exited).toBe(0)
    const next = await start('this')
    replaced.push(next)
    rotation = [...rotation, next.url]
    await underLoad(`after ${next.url} joined`)
  }
  loading = false
  await Promise.all(clients)

  // Contract, once no 0.2.0 process is left.
  const contracted = await migrateWith('this')
  expect(contracted).not.toContain('not applied')
  const [recorded] = await sql<{ version: number }[]>`select max(version)::int as version from service_migrations`
  expect(recorded!.version).toBe(migrationsOf(SERVICE_MIGRATIONS).length)
  expect(await keyForm()).toEqual({ form: 'new', fillfactor: 'fillfactor=100' })
  // This release serves on after it: a new key in the new form, and a key completed before in the old form replayed.
  const after = `after-contract-${crypto.randomUUID()}`
  bodies.set(after, payment({ customer: `cus_${after}` }))
  const last = await post(replaced[0]!.url, after, bodies.get(after)!)
  expect(last.status).toBe(201)
  const [before] = [...bodies.keys()]
  const again = await post(replaced[1]!.url, before!, bodies.get(before!)!)
  const [forms] = await sql<{ after: boolean; before: boolean }[]>`
    select (select digest is not null from idempotency_keys where key = ${after}) as after,
           (select digest is not null from idempotency_keys where key = ${before!}) as before`
  expect({ ...forms, replayed: again.status, same: again.paymentId === (await paymentsByKey(sql)).get(before!)?.[0] })
    .toEqual({ after: true, before: false, replayed: 201, same: true })
  // The new key's answer was stored without its location (sql/engine/00025, once 0.2.0 had left), and the other
  // process, whose replay cache never saw it, replays it with the location it was created with.
  const retried = await post(replaced[1]!.url, after, bodies.get(after)!)
  const [stored] = await sql<{ headers: string }[]>`
    select a.response_headers as headers from idempotency_answers a join idempotency_keys k on k.tenant = a.tenant and k.request_id = a.request_id
     where k.key = ${after}`
  expect({ stored: stored?.headers, retried }).toEqual({ stored: '+{}', retried: { ...last, location: `/api/payments/${last.paymentId}` } })

  const tally: Record<string, number> = {}
  for (const s of answers) tally[`${s.status}${s.code ? ` ${s.code}` : ''}`] = (tally[`${s.status}${s.code ? ` ${s.code}` : ''}`] ?? 0) + 1
  console.log(`[upgrade] ${bodies.size} keys, ${answers.length} answers ${JSON.stringify(tally)}`)
  const unexpected = answers.filter((s) => s.status === 'network-error' || (s.status >= 500 && s.code !== 'shutting-down'))
  expect(unexpected).toEqual([])

  const payments = await paymentsByKey(sql)
  const problems = [...bodies.keys()].filter((key) => payments.get(key)?.length !== 1).map((key) => `${key}: ${payments.get(key)?.length ?? 0} payments`)
  expect(problems).toEqual([])
  expect(await chargedOnce(sql, provider, new Map([...bodies].map(([key, body]) => [key, body.customer])))).toEqual([])
  const [left] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where status = 'processing'`
  expect(left!.n).toBe(0)
  for (const s of replaced) s.proc.kill('SIGTERM')
  expect(await Promise.all(replaced.map((s) => s.proc.exited))).toEqual([0, 0])
}, 120_000)
