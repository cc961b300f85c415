/**
 * `bun bench/request-work.ts`: what the service's own JavaScript costs a
 * fresh payment, piece by piece, in isolation (no sockets, no database):
 * the metrics a request feeds, the fingerprint, the body's schema check and
 * parse, an id, and Elysia's routing of a request. Each is timed over many
 * calls, seven times; the least and the median are printed. Set beside the
 * service's CPU per answer (`npm run bench`, about 375 µs on a 2-core VM), it
 * says how much of it a leaner request path could take back.
 */
import { Elysia } from 'elysia'
import { fingerprint } from '../src/core/fingerprint'
import { schemaValidator } from '../src/http/schema-validator'
import { countAnswer, createMetrics, idempotencyHooks, observeProvider } from '../src/metrics/registry'
import { NewPayment } from '../src/payments/schema'
import { paymentBody } from './round-trips'

const RUNS = 7

async function time(name: string, calls: number, call: (i: number) => unknown): Promise<void> {
  const perCall: number[] = []
  for (let run = 0; run < RUNS; run++) {
    const started = Bun.nanoseconds()
    for (let i = 0; i < calls; i++) await call(i)
    perCall.push((Bun.nanoseconds() - started) / calls / 1000)
  }
  perCall.sort((a, b) => a - b)
  console.log(`| ${name} | ${perCall[0]!.toFixed(2)} | ${perCall[RUNS >> 1]!.toFixed(2)} |`)
}

const metrics = createMetrics(undefined, { ttlSeconds: 30 })
const hooks = idempotencyHooks(metrics)
const onAnswer = countAnswer(metrics)
const onProviderCall = observeProvider(metrics)
const bodies = Array.from({ length: 1_000 }, (_, i) => paymentBody(i) as unknown)
const texts = bodies.map((body) => JSON.stringify(body))
const validate = schemaValidator(NewPayment)
const app = new Elysia().post('/api/payments', () => new Response('{}', { status: 201 }))
const request = (i: number) => new Request('http://127.0.0.1/api/payments', {
  method: 'POST',
  headers: { 'content-type': 'application/json', 'idempotency-key': `k-${i}`, authorization: 'Bearer x' },
  body: texts[i % texts.length]!,
})

console.log('| a fresh payment\'s | least µs | median µs |\n| --- | --- | --- |')
await time('metrics: its outcome, its answer, its provider call', 100_000, (i) => {
  hooks.onOutcome!({ route: '/api/payments', outcome: 'created', seconds: 0.01 + (i % 7) / 1_000 })
  onAnswer({ method: 'POST', route: '/api/payments', status: 201, seconds: 0.01 })
  onProviderCall({ outcome: 'ok', seconds: 0.002 })
})
await time('fingerprint (canonical JSON, SHA-256)', 100_000, (i) => fingerprint('POST', '/api/payments', bodies[i % bodies.length]))
await time('body parsed', 100_000, (i) => JSON.parse(texts[i % texts.length]!))
await time('body checked against its schema', 100_000, (i) => validate(bodies[i % bodies.length]))
await time('an id (crypto.randomUUID)', 100_000, () => crypto.randomUUID())
await time('a Request made', 50_000, (i) => request(i))
await time('a Request made and routed by Elysia to a handler', 50_000, (i) => app.handle(request(i)))
