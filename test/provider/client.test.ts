/**
 * The service's provider client against the real simulator over HTTP:
 * lost answers retried with the same key, 5xx not retried, deadlines obeyed.
 */
import { describe, expect, test } from 'bun:test'
import { IdempotencyError } from '../../src/core/errors'
import { ProviderError, providerClient } from '../../src/provider/client'
import { ORDER, cleanup, draws, started, waitFor } from './helpers'


/** The real fetch, counting the requests it sends: how a test sees what was retried. */
function countingFetch() {
  const counter = { requests: 0 }
  const counted = ((input: RequestInfo | URL, init?: RequestInit) => {
    counter.requests++
    return fetch(input, init)
  }) as typeof fetch
  return Object.assign(counter, { fetch: counted })
}

/** What a promise settled to: its value, or its rejection (so a test can compare identities). */
function settle<T>(promise: Promise<T>): Promise<{ value: T } | { error: unknown }> {
  return promise.then((value) => ({ value }), (error: unknown) => ({ error }))
}

const noDeadline = () => new AbortController().signal

describe('providerClient', () => {
  test('charges once and replays the same charge for the same key', async () => {
    const sim = await started()
    const client = providerClient(sim.url)
    const first = await client.charge(ORDER, { idempotencyKey: 'svc-key-1', signal: noDeadline() })
    expect(first).toMatchObject({ ...ORDER, id: expect.stringMatching(/^ch_/) })
    const again = await client.charge(ORDER, { idempotencyKey: 'svc-key-1', signal: noDeadline() })
    expect(again).toEqual(first)
    expect(sim.charges()).toEqual([first])
  })

  test('a lost answer is retried with the same key and turns into the one charge', async () => {
    // Attempt 1: passes the failure roll (0.9), recorded, answer lost (0.1). Attempt 2: replay, answered (0.9, 0.9).
    const sim = await started({ failureRate: 0.5, lostResponseRate: 0.5, random: draws(0.9, 0.1, 0.9, 0.9) })
    const counter = countingFetch()
    const charge = await providerClient(sim.url, { fetch: counter.fetch }).charge(ORDER, { idempotencyKey: 'svc-lost', signal: noDeadline() })
    expect(counter.requests).toBe(2)
    expect(sim.charges()).toEqual([charge])
  })

  test('answers lost on every attempt: ProviderError after maxAttempts, still exactly one charge', async () => {
    const sim = await started({ lostResponseRate: 1 })
    const counter = countingFetch()
    const outcome = await settle(providerClient(sim.url, { fetch: counter.fetch, maxAttempts: 3 }).charge(ORDER, { idempotencyKey: 'svc-lost-all', signal: noDeadline() }))
    expect(outcome).toEqual({ error: expect.any(ProviderError) })
    const error = (outcome as { error: ProviderError }).error
    expect({ code: error.code, status: error.status, providerStatus: error.providerStatus }).toEqual({ code: 'PROVIDER_FAILED', status: 502, providerStatus: undefined })
    expect(counter.requests).toBe(3)
    expect(sim.charges()).toHaveLength(1)
  })

  test('a 5xx fails fast: one request, ProviderError 502 with the provider status, nothing charged', async () => {
    const sim = await started({ failureRate: 1 })
    const counter = countingFetch()
    const outcome = await settle(providerClient(sim.url, { fetch: counter.fetch }).charge(ORDER, { idempotencyKey: 'svc-503', signal: noDeadline() }))
    const error = (outcome as { error: unknown }).error
    expect(error).toBeInstanceOf(ProviderError)
    expect(error).toBeInstanceOf(IdempotencyError)
    expect(error).toMatchObject({ code: 'PROVIDER_FAILED', status: 502, providerStatus: 503 })
    expect(counter.requests).toBe(1)
    expect(sim.charges()).toEqual([])
  })

  test('the key reused with other terms: PROVIDER_KEY_CONFLICT, not retried', async () => {
    const sim = await started()
    const client = providerClient(sim.url)
    await client.charge(ORDER, { idempotencyKey: 'svc-reused', signal: noDeadline() })
    const outcome = await settle(client.charge({ ...ORDER, amount: 999 }, { idempotencyKey: 'svc-reused', signal: noDeadline() }))
    expect((outcome as { error: unknown }).error).toMatchObject({ name: 'ProviderError', code: 'PROVIDER_KEY_CONFLICT', status: 502, providerStatus: 422 })
    expect(sim.charges()).toHaveLength(1)
  })

  test('a 400 (bad key) is a ProviderError with the provider status', async () => {
    const sim = await started()
    const outcome = await settle(providerClient(sim.url).charge(ORDER, { idempotencyKey: 'x'.repeat(256), signal: noDeadline() }))
    expect((outcome as { error: unknown }).error).toMatchObject({ code: 'PROVIDER_FAILED', providerStatus: 400 })
  })

  test('an abort during a hung charge rejects with the signal\'s own reason, unwrapped', async () => {
    // 10 minutes: without the abort this test could only end by timing out.
    const sim = await started({ delayMs: 600_000 })
    const deadline = new AbortController()
    const reason = new Error('deadline of this request')
    const pending = settle(providerClient(sim.url).charge(ORDER, { idempotencyKey: 'svc-hung', signal: deadline.signal }))
    await waitFor(() => sim.pendingCharges() === 1, 'the charge to reach the provider')
    deadline.abort(reason)
    expect(await pending).toEqual({ error: reason })
    expect((await pending as { error: unknown }).error).toBe(reason)
  })

  test('an already aborted signal sends nothing', async () => {
    const sim = await started()
    const counter = countingFetch()
    const reason = new Error('too late')
    const outcome = await settle(providerClient(sim.url, { fetch: counter.fetch }).charge(ORDER, { idempotencyKey: 'svc-late', signal: AbortSignal.abort(reason) }))
    expect((outcome as { error: unknown }).error).toBe(reason)
    expect(counter.requests).toBe(0)
  })

  test('a 200 that is not the requested charge is refused, never trusted', async () => {
    const answers: unknown[] = [
      'not json',
      { id: 42, ...ORDER, created_at: new Date().toISOString() },
      { id: 'ch_abc', ...ORDER, amount: ORDER.amount + 1, created_at: new Date().toISOString() },
      { id: 'ch_abc', ...ORDER, created_at: 'yesterday' },
      { id: 'ch_abc', ...ORDER },
    ]
    let next = 0
    // A misbehaving provider, over real HTTP: answers 200 with each bad body in turn.
    const liar = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => {
      const body = answers[next++]
      return new Response(typeof body === 'string' ? body : JSON.stringify(body), { headers: { 'content-type': 'application/json' } })
    } })
    cleanup(() => liar.stop(true))
    const client = providerClient(`http://127.0.0.1:${liar.port}`)
    for (const answer of answers) {
      const outcome = await settle(client.charge(ORDER, { idempotencyKey: 'svc-liar', signal: noDeadline() }))
      expect({ answer, error: (outcome as { error: unknown }).error }).toEqual({ answer, error: expect.any(ProviderError) })
    }
    expect(next).toBe(answers.length)
  })

  test('an unreachable provider is a ProviderError after the attempts, not a hang', async () => {
    const sim = await started()
    const url = sim.url
    await sim.stop()
    const outcome = await settle(providerClient(url, { maxAttempts: 2 }).charge(ORDER, { idempotencyKey: 'svc-down', signal: noDeadline() }))
    expect((outcome as { error: unknown }).error).toMatchObject({ code: 'PROVIDER_FAILED', providerStatus: undefined })
  })
})

