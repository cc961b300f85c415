/**
 * A hung provider is seen while it hangs (the in-flight gauges), and a call
 * stopped at its deadline reads as what it was (buckets around the deadline).
 */
import { expect, test } from 'bun:test'
import { createMetrics, providerBuckets, providerCallsInFlight, PROVIDER_BUCKETS } from '../../src/metrics/registry'
import { providerClient } from '../../src/provider/client'
import { waitFor } from '../support/wait'
import { sample } from './factories'

// Catches: a gauge that counts a call only once it ended, or never lets go of one.
test('a call that hangs is counted in flight, and its age grows, until it is stopped', async () => {
  const metrics = createMetrics()
  let now = 1_000_000
  const client = providerClient('http://provider.test', {
    begin: providerCallsInFlight(metrics, () => now),
    fetch: ((_url: string, init: RequestInit) => new Promise((_, reject) => init.signal!.addEventListener('abort', () => reject(init.signal!.reason)))) as unknown as typeof fetch,
  })
  const controller = new AbortController()
  const charging = client.charge({ amount: 1, currency: 'EUR', customer: 'c' }, { idempotencyKey: 'k', signal: controller.signal }).catch(() => 'stopped')
  await waitFor(async () => sample(await metrics.registry.metrics(), 'idempotency_provider_calls_in_flight') === 1, 'the call to be in flight')
  now += 300
  const during = await metrics.registry.metrics()
  expect(sample(during, 'idempotency_provider_calls_in_flight')).toBe(1)
  expect(sample(during, 'idempotency_provider_oldest_call_seconds')).toBeGreaterThanOrEqual(0.25)
  controller.abort(new Error('deadline'))
  expect(await charging).toBe('stopped')
  const after = await metrics.registry.metrics()
  expect([sample(after, 'idempotency_provider_calls_in_flight'), sample(after, 'idempotency_provider_oldest_call_seconds')]).toEqual([0, 0])
})

// Catches: buckets that jump from 20 to 30 s over the 28 s deadline of the default TTL (a stopped call read 29.9 s at p99).
test('bounds around the deadline: a 28 s call falls in a bucket that ends within 2 % of it', () => {
  const buckets = providerBuckets(30)
  for (const bound of PROVIDER_BUCKETS) expect(buckets).toContain(bound)
  const upper = buckets.find((bound) => bound >= 28)!
  const lower = [...buckets].reverse().find((bound) => bound < 28)!
  expect(upper - lower).toBeLessThan(28 * 0.06)
  expect(providerBuckets(120)).toContain(120)
})
