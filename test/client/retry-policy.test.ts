/**
 * The client's retry policy, with an injected fetch, sleep, random and clock:
 * which answers are retried, how long it waits, when it gives up. The live
 * service with real faults is in live.test.ts.
 */
import { describe, expect, test } from 'bun:test'
import { fullJitter, idempotentFetch, retryAfterMs, RetriesExhaustedError, type FetchLike } from '../../src/client'

interface Sent {
  url: string
  method: string
  key: string | null
  body: string
}

/** A scripted server: each call answers with the next step (a Response, or an Error to throw). */
function scripted(steps: (Response | Error | (() => Response))[]) {
  const sent: Sent[] = []
  const fetch: FetchLike = async (input, init) => {
    const headers = new Headers(init.headers)
    sent.push({ url: String(input), method: init.method ?? 'GET', key: headers.get('idempotency-key'), body: String(init.body) })
    const step = steps[Math.min(sent.length - 1, steps.length - 1)]!
    if (step instanceof Error) throw step
    return typeof step === 'function' ? step() : step.clone()
  }
  return { fetch, sent }
}

/** A fake clock that only sleep moves: the tests never wait. */
function fakeTime(start = 1_700_000_000_000) {
  let now = start
  const waits: number[] = []
  return {
    now: () => now,
    sleep: async (ms: number) => {
      waits.push(ms)
      now += ms
    },
    waits,
  }
}

const problem = (status: number, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify({ status, title: 'x' }), { status, headers: { 'content-type': 'application/problem+json', ...headers } })
const created = () => new Response('{"id":"p1"}', { status: 201, headers: { 'content-type': 'application/json' } })
const networkError = () => Object.assign(new TypeError('fetch failed'), { code: 'ECONNRESET' })

const URL_ = 'http://payments.test/api/payments'
const BODY = { method: 'POST', body: '{"amount":1}', headers: { 'content-type': 'application/json' } }

describe('one key per logical operation', () => {
  test('every retry carries the same generated key, the body and method unchanged', async () => {
    const server = scripted([networkError(), problem(503), problem(409, { 'retry-after': '1' }), created()])
    const time = fakeTime()
    const response = await idempotentFetch(URL_, BODY, { fetch: server.fetch, ...time, random: () => 0.5 })
    expect(response.status).toBe(201)
    expect(await response.json()).toEqual({ id: 'p1' })
    expect(server.sent).toHaveLength(4)
    const keys = new Set(server.sent.map((s) => s.key))
    expect(keys.size).toBe(1)
    expect([...keys][0]).toMatch(/^[0-9a-f-]{36}$/)
    expect(server.sent.every((s) => s.method === 'POST' && s.body === '{"amount":1}')).toBe(true)
  })

  test('two operations get two keys; a given key is used as is', async () => {
    const server = scripted([created()])
    await idempotentFetch(URL_, BODY, { fetch: server.fetch })
    await idempotentFetch(URL_, BODY, { fetch: server.fetch })
    await idempotentFetch(URL_, BODY, { fetch: server.fetch, key: 'order-42' })
    expect(server.sent[0]!.key).not.toBe(server.sent[1]!.key)
    expect(server.sent[2]!.key).toBe('order-42')
  })

  test('a key that the server would refuse, or two different keys, fail before sending', async () => {
    const server = scripted([created()])
    await expect(idempotentFetch(URL_, BODY, { fetch: server.fetch, key: 'has space' })).rejects.toThrow(TypeError)
    await expect(idempotentFetch(URL_, { ...BODY, headers: { 'idempotency-key': 'a' } }, { fetch: server.fetch, key: 'b' })).rejects.toThrow(TypeError)
    await expect(idempotentFetch('ftp://x/y', BODY, { fetch: server.fetch })).rejects.toThrow(TypeError)
    expect(server.sent).toHaveLength(0)
  })
})

describe('what is retried', () => {
  for (const status of [409, 429, 500, 502, 503, 504]) {
    test(`${status} is retried`, async () => {
      const server = scripted([problem(status), created()])
      const response = await idempotentFetch(URL_, BODY, { fetch: server.fetch, ...fakeTime() })
      expect(response.status).toBe(201)
      expect(server.sent).toHaveLength(2)
    })
  }

  for (const status of [400, 401, 404, 413, 415, 422, 501, 505]) {
    test(`${status} is returned at once, never retried`, async () => {
      const server = scripted([problem(status), created()])
      const response = await idempotentFetch(URL_, BODY, { fetch: server.fetch, ...fakeTime() })
      expect(response.status).toBe(status)
      expect(server.sent).toHaveLength(1)
    })
  }

  test('a body cut mid-way is a network error, retried', async () => {
    let calls = 0
    const cut = (): Response => {
      calls += 1
      const stream = new ReadableStream({
        pull(controller) {
          controller.enqueue(new TextEncoder().encode('{"id":'))
          controller.error(new Error('socket closed'))
        },
      })
      return new Response(stream, { status: 201 })
    }
    const fetch: FetchLike = async () => (calls === 0 ? cut() : created())
    const response = await idempotentFetch(URL_, BODY, { fetch, ...fakeTime() })
    expect(response.status).toBe(201)
    expect(await response.text()).toBe('{"id":"p1"}')
  })

  test('the caller aborting stops at once, without another attempt', async () => {
    const controller = new AbortController()
    const server = scripted([problem(503)])
    const time = fakeTime()
    const sleep = async (ms: number) => {
      await time.sleep(ms)
      controller.abort(new Error('user left'))
    }
    await expect(idempotentFetch(URL_, BODY, { fetch: server.fetch, now: time.now, sleep, signal: controller.signal })).rejects.toThrow('user left')
    expect(server.sent).toHaveLength(1)
  })
})

describe('how long it waits', () => {
  test('full jitter: uniform under a ceiling that doubles from the base up to the cap', () => {
    expect([0, 1, 2, 3, 4, 5, 6, 7].map((retry) => fullJitter(retry, 100, 5_000, () => 0.999999))).toEqual([99, 199, 399, 799, 1599, 3199, 4999, 4999])
    expect(fullJitter(3, 100, 5_000, () => 0)).toBe(0)
    expect(fullJitter(3, 100, 5_000, () => 0.5)).toBe(400)
    expect(fullJitter(2_000, 100, 5_000, () => 0.5)).toBe(2_500) // no overflow
  })

  test('backoff waits are drawn with the injected random', async () => {
    const server = scripted([networkError(), networkError(), networkError(), created()])
    const time = fakeTime()
    const draws = [0.5, 0.25, 1 - 1e-9]
    await idempotentFetch(URL_, BODY, { fetch: server.fetch, ...time, random: () => draws.shift()!, baseDelayMs: 100, maxDelayMs: 300 })
    expect(time.waits).toEqual([50, 50, 299])
  })

  test('Retry-After in seconds is honoured instead of the backoff, up to maxRetryAfterMs', async () => {
    const server = scripted([problem(409, { 'retry-after': '2' }), problem(503, { 'retry-after': '120' }), created()])
    const time = fakeTime()
    await idempotentFetch(URL_, BODY, { fetch: server.fetch, ...time, random: () => 0.5, maxRetryAfterMs: 10_000, deadlineMs: 60_000 })
    expect(time.waits).toEqual([2_000, 10_000])
  })

  test('Retry-After as an HTTP date', async () => {
    const time = fakeTime(Date.parse('2026-01-01T00:00:00Z'))
    const server = scripted([problem(503, { 'retry-after': 'Thu, 01 Jan 2026 00:00:03 GMT' }), problem(503, { 'retry-after': 'Wed, 31 Dec 2025 23:00:00 GMT' }), created()])
    await idempotentFetch(URL_, BODY, { fetch: server.fetch, ...time })
    expect(time.waits).toEqual([3_000, 0])
  })

  test('an unreadable Retry-After falls back to the backoff', () => {
    expect(retryAfterMs('-5', 0)).toBeUndefined()
    expect(retryAfterMs('1.5', 0)).toBeUndefined()
    expect(retryAfterMs('soon', 0)).toBeUndefined()
    expect(retryAfterMs(null, 0)).toBeUndefined()
    expect(retryAfterMs(' 7 ', 0)).toBe(7_000)
  })
})

describe('giving up', () => {
  test('after the deadline, with the last status, body, attempt count and key', async () => {
    const server = scripted([problem(503, { 'retry-after': '4' })])
    const time = fakeTime()
    const error = await idempotentFetch(URL_, BODY, { fetch: server.fetch, ...time, deadlineMs: 10_000, key: 'k-1' }).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(RetriesExhaustedError)
    const gaveUp = error as RetriesExhaustedError
    expect(gaveUp.reason).toBe('deadline')
    expect(gaveUp.attempts).toBe(3) // at 0, 4 and 8 s; a fourth at 12 s would start past the deadline
    expect(gaveUp.lastStatus).toBe(503)
    expect(gaveUp.lastBody).toContain('"status":503')
    expect(gaveUp.key).toBe('k-1')
    expect(gaveUp.message).toContain('deadline')
    expect(time.waits).toEqual([4_000, 4_000])
  })

  test('after maxAttempts, with the last network error', async () => {
    const server = scripted([networkError()])
    const error = (await idempotentFetch(URL_, BODY, { fetch: server.fetch, ...fakeTime(), maxAttempts: 4 }).catch((e: unknown) => e)) as RetriesExhaustedError
    expect(error).toBeInstanceOf(RetriesExhaustedError)
    expect(error.reason).toBe('attempts')
    expect(error.attempts).toBe(4)
    expect(error.lastStatus).toBeUndefined()
    expect((error.lastError as Error).message).toBe('fetch failed')
    expect(server.sent).toHaveLength(4)
  })

  test('a hung attempt times out and counts as a network error', async () => {
    let calls = 0
    const fetch: FetchLike = (_url, init) => {
      calls += 1
      if (calls > 1) return Promise.resolve(created())
      return new Promise((_resolve, reject) => init.signal?.addEventListener('abort', () => reject(init.signal?.reason)))
    }
    const response = await idempotentFetch(URL_, BODY, { fetch, attemptTimeoutMs: 20, sleep: async () => undefined })
    expect(response.status).toBe(201)
    expect(calls).toBe(2)
  })
})

test('the package exports the helper as idempotent-post/client', async () => {
  const exported = await import('idempotent-post/client')
  expect(exported.idempotentFetch).toBe(idempotentFetch)
  expect(exported.RetriesExhaustedError).toBe(RetriesExhaustedError)
})
