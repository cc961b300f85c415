/**
 * The problem catalogues: every code the service answers with is in one of
 * them (the plugin's, payments', admin's, the service's own: SERVICE_PROBLEMS),
 * docs/reference/http-api.md lists exactly those, an answer carries its entry's status,
 * title and Retry-After, and an app can add codes of its own without
 * redefining one.
 */
import { expect, test } from 'bun:test'
import { Glob } from 'bun'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { defineProblems, PLUGIN_PROBLEMS, problem, problemResponse, problemResult, problemType } from '../../src/http/problem'
import { GATEWAY_PROBLEMS } from '../../src/gateway/problems'
import { SERVICE_PROBLEMS } from '../../src/problems'

const ROOT = join(import.meta.dir, '..', '..')
const codes = [...SERVICE_PROBLEMS.codes]
const PROBLEMS = SERVICE_PROBLEMS.entries

test('docs/reference/http-api.md lists every code with its status, title and Retry-After', () => {
  const readme = readFileSync(join(ROOT, 'docs', 'reference', 'http-api.md'), 'utf8')
  const section = readme.slice(readme.indexOf('## Problem codes'), readme.indexOf('\n## ', readme.indexOf('## Problem codes') + 1))
  const rows = [...section.matchAll(/^\| `([a-z-]+)` \| (\d{3}) \| ([^|]+) \| ([^|]*) \|/gm)]
    .map(([, code, status, title, retryAfter]) => ({ code, status: Number(status), title: title!.trim(), retryAfter: retryAfter!.trim() }))
  expect(rows.map((row) => row.code)).toEqual(codes)
  for (const row of rows) {
    const entry: { status: number; title: string; retryAfterSeconds?: number } = PROBLEMS[row.code as (typeof codes)[number]]
    expect({ code: row.code, status: row.status, title: row.title }).toEqual({ code: row.code, status: entry.status, title: entry.title })
    if (row.code === 'in-progress') expect(row.retryAfter).toContain('TTL')
    else expect(row.retryAfter).toBe(entry.retryAfterSeconds === undefined ? '' : String(entry.retryAfterSeconds))
  }
})

test('every problem code written in src is in the catalogue, and no Retry-After is a literal', async () => {
  const unknown: string[] = []
  const literals: string[] = []
  for await (const file of new Glob('src/**/*.{ts,tsx}').scan(ROOT)) {
    if (/(^|\/)problems?\.ts$/.test(file)) continue // the catalogues themselves
    const text = readFileSync(join(ROOT, file), 'utf8')
    // The gateway answers from a catalogue of its own (src/gateway/problems.ts), the service from SERVICE_PROBLEMS.
    const catalogue: Readonly<Record<string, unknown>> = file.startsWith('src/gateway/') ? GATEWAY_PROBLEMS.entries : PROBLEMS
    for (const [, code] of text.matchAll(/\bcode: '([a-z][a-z-]*)'/g)) if (!(code! in catalogue)) unknown.push(`${file}: ${code}`)
    for (const [, code] of text.matchAll(/\bproblem\('([a-z-]+)'/g)) if (!(code! in catalogue)) unknown.push(`${file}: ${code}`)
    if (/^src\/(http|payments)\/|^src\/server\.ts$/.test(file) && /'retry-after': '\d+'/.test(text)) literals.push(file)
  }
  expect(unknown).toEqual([])
  expect(literals).toEqual([])
})

test('an answer carries its entry: status, type, title, and Retry-After where it has one', async () => {
  for (const code of codes) {
    const entry: { status: number; title: string; retryAfterSeconds?: number } = PROBLEMS[code]
    const response = problemResponse(SERVICE_PROBLEMS.problem(code))
    expect(response.status).toBe(entry.status)
    expect(response.headers.get('content-type')).toBe('application/problem+json')
    expect(response.headers.get('retry-after')).toBe(entry.retryAfterSeconds === undefined ? null : String(entry.retryAfterSeconds))
    expect(await response.json()).toMatchObject({ type: problemType(code), title: entry.title, status: entry.status, code })
  }
  // in-progress answers with the TTL its claim has left, never less than a whole second.
  expect(problemResponse({ ...problem('in-progress'), retryAfterSeconds: 17 }).headers.get('retry-after')).toBe('17')
  expect(problemResponse({ ...problem('in-progress'), retryAfterSeconds: 0.2 }).headers.get('retry-after')).toBe('1')
  // Extensions go into the body, the Retry-After pace does not.
  const body = await problemResponse(problem('invalid-body', undefined, { errors: ['/amount: too big'] })).json()
  expect(body.errors).toEqual(['/amount: too big'])
  expect(body).not.toHaveProperty('retryAfterSeconds')
})

test('an app registers codes of its own, with its own type URIs; the plugin\'s stay as they are', async () => {
  const orders = defineProblems({
    'out-of-stock': { status: 422, title: 'Out of stock', detail: 'Not enough stock.' },
    'warehouse-down': { status: 503, title: 'Warehouse unavailable', detail: 'Try again.', retryAfterSeconds: 5, type: 'https://orders.example/problems/warehouse-down' },
  }, { typePrefix: 'urn:orders:problem:' })
  const all = PLUGIN_PROBLEMS.with(orders)
  expect(all.codes).toEqual([...PLUGIN_PROBLEMS.codes, 'out-of-stock', 'warehouse-down'])
  expect(all.type('out-of-stock')).toBe('urn:orders:problem:out-of-stock')
  expect(all.type('in-progress')).toBe(problemType('in-progress'))
  const response = problemResponse(all.problem('warehouse-down', 'The warehouse is restarting.'))
  expect(response.status).toBe(503)
  expect(response.headers.get('retry-after')).toBe('5')
  expect(await response.json()).toEqual({ type: 'https://orders.example/problems/warehouse-down', title: 'Warehouse unavailable', status: 503, detail: 'The warehouse is restarting.', code: 'warehouse-down' })
  // What a record step returns: the same body and Retry-After, to be stored and replayed.
  expect(problemResult(orders.problem('out-of-stock'))).toEqual({
    status: 422, headers: {}, body: { type: 'urn:orders:problem:out-of-stock', title: 'Out of stock', status: 422, detail: 'Not enough stock.', code: 'out-of-stock' },
  })
  // A problem carries `instance` in the body when one is set (RFC 9457's order: after detail).
  expect(Object.keys(await problemResponse({ ...problem('not-found'), instance: 'urn:request:1' }).json())).toEqual(['type', 'title', 'status', 'detail', 'instance', 'code'])
})

test('a code defined twice, differently, is refused when merged; the same entry twice is one code', () => {
  const mine = defineProblems({ 'in-progress': { status: 423, title: 'Locked', detail: 'x' } })
  expect(() => PLUGIN_PROBLEMS.with(mine)).toThrow(/in-progress.*defined twice/)
  const same = defineProblems({ 'not-found': PLUGIN_PROBLEMS.entries['not-found'] })
  expect(PLUGIN_PROBLEMS.with(same).codes).toEqual(PLUGIN_PROBLEMS.codes)
  expect(() => defineProblems({ 'Out_Of_Stock': { status: 422, title: 't', detail: 'd' } })).toThrow(/lower-case/)
  expect(() => defineProblems({ 'ok': { status: 200, title: 't', detail: 'd' } })).toThrow(/400\.\.599/)
  expect(() => PLUGIN_PROBLEMS.problem('out-of-stock' as never)).toThrow(/no problem code/)
})
