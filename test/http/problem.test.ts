/**
 * One catalogue of problems: every code the service answers with is in it,
 * the README lists exactly it, and an answer carries its entry's status,
 * title and Retry-After.
 */
import { expect, test } from 'bun:test'
import { Glob } from 'bun'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { PROBLEMS, problem, problemResponse, problemType, type ProblemCode } from '../../src/http/problem'

const ROOT = join(import.meta.dir, '..', '..')
const codes = Object.keys(PROBLEMS) as ProblemCode[]

test('the README lists every code with its status, title and Retry-After', () => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  const section = readme.slice(readme.indexOf('## Problem codes'), readme.indexOf('\n## ', readme.indexOf('## Problem codes') + 1))
  const rows = [...section.matchAll(/^\| `([a-z-]+)` \| (\d{3}) \| ([^|]+) \| ([^|]*) \|/gm)]
    .map(([, code, status, title, retryAfter]) => ({ code, status: Number(status), title: title!.trim(), retryAfter: retryAfter!.trim() }))
  expect(rows.map((row) => row.code)).toEqual(codes)
  for (const row of rows) {
    const entry: { status: number; title: string; retryAfterSeconds?: number } = PROBLEMS[row.code as ProblemCode]
    expect({ code: row.code, status: row.status, title: row.title }).toEqual({ code: row.code, status: entry.status, title: entry.title })
    if (row.code === 'in-progress') expect(row.retryAfter).toContain('TTL')
    else expect(row.retryAfter).toBe(entry.retryAfterSeconds === undefined ? '' : String(entry.retryAfterSeconds))
  }
})

test('every problem code written in src is in the catalogue, and no Retry-After is a literal', async () => {
  const unknown: string[] = []
  const literals: string[] = []
  for await (const file of new Glob('src/**/*.{ts,tsx}').scan(ROOT)) {
    if (file.endsWith('http/problem.ts')) continue
    const text = readFileSync(join(ROOT, file), 'utf8')
    for (const [, code] of text.matchAll(/\bcode: '([a-z][a-z-]*)'/g)) if (!(code! in PROBLEMS)) unknown.push(`${file}: ${code}`)
    for (const [, code] of text.matchAll(/\bproblem\('([a-z-]+)'/g)) if (!(code! in PROBLEMS)) unknown.push(`${file}: ${code}`)
    if (/^src\/(http|payments)\/|^src\/server\.ts$/.test(file) && /'retry-after': '\d+'/.test(text)) literals.push(file)
  }
  expect(unknown).toEqual([])
  expect(literals).toEqual([])
})

test('an answer carries its entry: status, type, title, and Retry-After where it has one', async () => {
  for (const code of codes) {
    const entry: { status: number; title: string; retryAfterSeconds?: number } = PROBLEMS[code]
    const response = problemResponse(problem(code))
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
