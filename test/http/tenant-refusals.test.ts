/** The sampled log and the admin's view of refused tenants (src/http/tenant-refusals.ts), on a clock the test moves. */
import { expect, test } from 'bun:test'
import { createLogger } from '../../src/log'
import { TenantRefusals } from '../../src/http/tenant-refusals'

// Catches: a line per refusal (a throttled tenant is thousands a minute), or none after the first.
test('one line when a tenant is first held, a sum once a window while it lasts, a new first line after a pause', () => {
  let now = 0
  const lines: { msg: string; refused?: Record<string, number> }[] = []
  const refusals = new TenantRefusals(undefined, createLogger({ sink: (line) => lines.push(JSON.parse(line)) }), () => now)
  const request = new Request('http://service.test/api/payments')
  for (; now < 50_000; now += 100) refusals.refused(request, 'acme', 'rate_limited')
  expect(lines.map((line) => line.msg)).toEqual([expect.stringContaining('tenant acme held at its limit (rate_limited)')])
  now = 61_000
  refusals.refused(request, 'acme', 'too_many_in_flight')
  expect(lines.at(-1)).toMatchObject({ msg: expect.stringContaining('tenant acme still held at its limits: 500 request(s) refused in the last 61 s'), refused: { rate_limited: 500, too_many_in_flight: 0 } })
  expect(refusals.held()).toEqual([{ tenant: 'acme', refused: { rate_limited: 0, too_many_in_flight: 1 }, lastAt: 61_000 }])
  now = 200_000 // quiet for over a window: gone from the page, and the next refusal is a new episode
  expect(refusals.held()).toEqual([])
  refusals.refused(request, 'acme', 'rate_limited')
  expect(lines).toHaveLength(3)
  expect(lines.at(-1)!.msg).toContain('tenant acme held at its limit (rate_limited)')
})
