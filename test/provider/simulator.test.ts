/**
 * The simulator's HTTP contract (the provider API src/provider/client.ts speaks), over real HTTP:
 * idempotent replay, 422 on other terms, 400 on bad input, and its faults.
 */
import { describe, expect, test } from 'bun:test'
import { startSimulator } from '../../src/provider/simulator'
import { ORDER, cleanup, draws, postCharge, started, statusOrLost, tempLedger, waitFor } from './helpers'


describe('charges', () => {
  test('a charge is answered 200 and recorded; the same key and terms replay the same charge', async () => {
    const sim = await started()
    const first = await postCharge(sim.url, 'key-1', ORDER)
    expect(first.status).toBe(200)
    const charge = await first.json()
    expect(charge).toMatchObject({ ...ORDER, id: expect.stringMatching(/^ch_[0-9a-f]{24}$/) })
    expect(Number.isNaN(Date.parse(charge.created_at))).toBe(false)

    const replay = await postCharge(sim.url, 'key-1', { customer: ORDER.customer, currency: ORDER.currency, amount: ORDER.amount })
    expect(replay.status).toBe(200)
    expect(await replay.json()).toEqual(charge)
    expect(sim.charges()).toEqual([charge])
  })

  test('the same key with other terms is 422 and charges nothing more', async () => {
    const sim = await started()
    expect((await postCharge(sim.url, 'key-1', ORDER)).status).toBe(200)
    for (const other of [{ ...ORDER, amount: 1 }, { ...ORDER, currency: 'USD' }, { ...ORDER, customer: 'cus_bob' }]) {
      const response = await postCharge(sim.url, 'key-1', other)
      expect(response.status).toBe(422)
      expect(await response.json()).toEqual({ error: expect.any(String) })
    }
    expect(sim.charges()).toHaveLength(1)
  })

  test('bad keys and bodies are 400 with a small JSON error, and nothing is recorded', async () => {
    const sim = await started()
    const bad: Array<[string | undefined, unknown]> = [
      [undefined, ORDER],
      ['', ORDER],
      ['x'.repeat(256), ORDER],
      ['has space', ORDER],
      ['tab\tin key', ORDER],
      ['k', 'not json'],
      ['k', []],
      ['k', { ...ORDER, amount: 0 }],
      ['k', { ...ORDER, amount: 1.5 }],
      ['k', { ...ORDER, amount: '1250' }],
      ['k', { ...ORDER, currency: 'eur' }],
      ['k', { ...ORDER, currency: 'EURO' }],
      ['k', { ...ORDER, customer: '' }],
      ['k', { ...ORDER, customer: 'c'.repeat(65) }],
      ['k', { amount: 1, currency: 'EUR' }],
      ['k', { ...ORDER, extra: true }],
    ]
    for (const [key, body] of bad) {
      const response = await postCharge(sim.url, key, body)
      expect({ key, body, status: response.status }).toEqual({ key, body, status: 400 })
      expect(await response.json()).toEqual({ error: expect.any(String) })
    }
    expect((await postCharge(sim.url, 'x'.repeat(255), ORDER)).status).toBe(200)
    expect(sim.charges()).toHaveLength(1)
  })

  test('GET /v1/charges lists every charge oldest first, or one customer\'s; /healthz is 200', async () => {
    const sim = await started()
    const made = []
    for (const [key, customer] of [['a', 'cus_1'], ['b', 'cus_2'], ['c', 'cus_1']] as const)
      made.push(await (await postCharge(sim.url, key, { ...ORDER, customer })).json())
    expect(await (await fetch(`${sim.url}/v1/charges`)).json()).toEqual({ data: made })
    expect(await (await fetch(`${sim.url}/v1/charges?customer=cus_1`)).json()).toEqual({ data: [made[0], made[2]] })
    expect(await (await fetch(`${sim.url}/v1/charges?customer=nobody`)).json()).toEqual({ data: [] })
    expect((await fetch(`${sim.url}/healthz`)).status).toBe(200)
    expect((await fetch(`${sim.url}/nowhere`)).status).toBe(404)
  })

  test('concurrent requests with one key make exactly one charge, and all get its id', async () => {
    // The delay holds all of them in flight together before any records.
    const sim = await started({ delayMs: 50 })
    const answers = await Promise.all(Array.from({ length: 25 }, () => postCharge(sim.url, 'same-key', ORDER)))
    const bodies = await Promise.all(answers.map((answer) => answer.json()))
    expect(answers.map((answer) => answer.status)).toEqual(Array(25).fill(200))
    expect(new Set(bodies.map((body) => body.id)).size).toBe(1)
    expect(sim.charges()).toHaveLength(1)
  })
})

describe('faults', () => {
  test('failure rate 1: every charge is 503 and nothing is recorded', async () => {
    const sim = await started({ failureRate: 1 })
    for (const key of ['k1', 'k2', 'k1']) {
      const response = await postCharge(sim.url, key, ORDER)
      expect(response.status).toBe(503)
      expect(await response.json()).toEqual({ error: expect.any(String) })
    }
    expect(sim.charges()).toEqual([])
  })

  test('lost response rate 1: fetch rejects, yet the charge is recorded; the same key later returns that charge', async () => {
    const ledger = tempLedger()
    cleanup(() => ledger.remove())
    const lossy = await startSimulator({ port: 0, ledgerPath: ledger.path, delayMs: 0, failureRate: 0, lostResponseRate: 1 })
    let stopped = false
    cleanup(() => (stopped ? undefined : lossy.stop()))
    expect(await statusOrLost(postCharge(lossy.url, 'lost-key', ORDER))).toBe('lost')
    const recorded = lossy.charges()
    expect(recorded).toHaveLength(1)
    // Replays lose their answer too: a real provider can lose any answer.
    expect(await statusOrLost(postCharge(lossy.url, 'lost-key', ORDER))).toBe('lost')
    await lossy.stop()
    stopped = true

    const healthy = await startSimulator({ port: 0, ledgerPath: ledger.path, delayMs: 0, failureRate: 0, lostResponseRate: 0 })
    cleanup(() => healthy.stop())
    const retry = await postCharge(healthy.url, 'lost-key', ORDER)
    expect(retry.status).toBe(200)
    expect((await retry.json()).id).toBe(recorded[0]!.id)
    expect(healthy.charges()).toHaveLength(1)
  })

  test('faults draw in order: failure roll after the delay, loss roll after recording', async () => {
    // Draws: [fail 0.1 → 503], [fail 0.9, loss 0.1 → recorded, dropped], [fail 0.9, loss 0.9 → 200].
    const sim = await started({ failureRate: 0.5, lostResponseRate: 0.5, random: draws(0.1, 0.9, 0.1, 0.9, 0.9) })
    expect((await postCharge(sim.url, 'k', ORDER)).status).toBe(503)
    expect(sim.charges()).toHaveLength(0)
    expect(await statusOrLost(postCharge(sim.url, 'k', ORDER))).toBe('lost')
    expect(sim.charges()).toHaveLength(1)
    const answer = await postCharge(sim.url, 'k', ORDER)
    expect(answer.status).toBe(200)
    expect((await answer.json()).id).toBe(sim.charges()[0]!.id)
  })

  test('a caller that gives up during the delay does not stop the charge', async () => {
    const sim = await started({ delayMs: 300 })
    const caller = new AbortController()
    const pending = postCharge(sim.url, 'impatient', ORDER, { signal: caller.signal })
    await waitFor(() => sim.pendingCharges() === 1, 'the charge to be in its delay')
    caller.abort()
    expect(await statusOrLost(pending)).toBe('lost')
    await waitFor(() => sim.charges().length === 1, 'the abandoned charge to be recorded after its delay')
  })
})

