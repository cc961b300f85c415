/**
 * The plugin is decoupled from the app: it imports nothing of the app's
 * metrics, store, payments or admin, tells its outcomes through hooks, and
 * the route labels of answer counting come from the app's own list.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { Glob } from 'bun'
import { Type } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { idempotentPost, observed, routeLabeler, type AnswerEvent, type OutcomeEvent } from '../../src/http/index'
import { createTestDatabase, type TestDatabase } from '../support/db'

const ROOT = join(import.meta.dir, '..', '..')

test('src/http imports nothing from the app: metrics, store, payments, admin, provider, config', async () => {
  const offending: string[] = []
  for await (const file of new Glob('src/http/**/*.ts').scan(ROOT))
    for (const [, from] of readFileSync(join(ROOT, file), 'utf8').matchAll(/from '([^']+)'/g))
      if (/\/(metrics|store|payments|admin|provider)\/|\/config$|\/server$/.test(from!)) offending.push(`${file}: ${from}`)
  expect(offending).toEqual([])
})

test('route labels: the app\'s templates, first match wins, anything else is other', () => {
  const label = routeLabeler(['/api/payments', '/api/payments/:id', '/admin/api/*', '/admin/*'])
  expect(label('/api/payments')).toBe('/api/payments')
  expect(label('/api/payments/')).toBe('/api/payments')
  expect(label('/api/payments/0b6c')).toBe('/api/payments/:id')
  expect(label('/api/payments/0b6c/x')).toBe('other')
  expect(label('/admin')).toBe('/admin')
  expect(label('/admin/keys')).toBe('/admin')
  expect(label('/admin/api/keys/expire')).toBe('/admin/api')
  expect(label('/administrator')).toBe('other')
  expect(label('/%2e%2e/etc')).toBe('other')
})

test('observed tells every answer with its template', async () => {
  const heard: AnswerEvent[] = []
  const fetch = observed(['/things/:id'], (event) => heard.push(event), async (request) => new Response(null, { status: new URL(request.url).pathname === '/things/1' ? 204 : 404 }))
  await fetch(new Request('http://app.test/things/1', { method: 'DELETE' }))
  await fetch(new Request('http://app.test/nope', { method: 'PROPFIND' }))
  expect(heard.map(({ method, route, status }) => ({ method, route, status }))).toEqual([
    { method: 'DELETE', route: '/things/:id', status: 204 },
    { method: 'OTHER', route: 'other', status: 404 },
  ])
})

let db: TestDatabase
let app: Elysia
const outcomes: OutcomeEvent[] = []
const others: string[] = []
beforeAll(async () => {
  db = await createTestDatabase('hooks')
  app = new Elysia().use(idempotentPost({
    pools: db.pools,
    tenant: () => 't1',
    hooks: {
      onOutcome: (event) => outcomes.push(event),
      onRelease: ({ route }) => others.push(`release ${route}`),
      onReclaim: ({ route }) => others.push(`reclaim ${route}`),
      onLeaseLost: () => { throw new Error('a hook that throws changes no answer') },
    },
  }, {
    path: '/notes',
    body: Type.Object({ text: Type.String({ maxLength: 10 }) }, { additionalProperties: false }),
    act: async ({ body }) => {
      if (body.text === 'fail') throw new Error('the foreign call failed')
    },
    record: async ({ body }) => ({ status: 201, body }),
  })) as unknown as Elysia
})
afterAll(async () => {
  await db?.drop()
})

const note = (key: string, text: string) => app.handle(new Request('http://app.test/notes', {
  method: 'POST',
  headers: { 'content-type': 'application/json', 'idempotency-key': key },
  body: JSON.stringify({ text }),
}))

test('hooks hear each outcome, with the route and the time it took', async () => {
  expect((await note('a', 'hi')).status).toBe(201)
  expect((await note('a', 'hi')).status).toBe(201)
  expect((await note('a', 'other')).status).toBe(422)
  expect((await note('b', 'far too long a note')).status).toBe(400)
  expect((await note('c', 'fail')).status).toBe(500)
  expect(outcomes.map((event) => event.outcome)).toEqual(['created', 'replayed', 'mismatch', 'invalid', 'failed'])
  expect(outcomes.every((event) => event.route === '/notes' && event.seconds >= 0 && event.seconds < 60)).toBe(true)
  expect(others).toEqual(['release /notes'])
  // The released key runs again on a retry, and is released again.
  expect((await note('c', 'fail')).status).toBe(500)
  expect(outcomes.at(-1)!.outcome).toBe('failed')
  expect(others).toEqual(['release /notes', 'release /notes'])
})
