/** The gateway's pure parts: which fields cross, the route table, the settings, the stored form of an answer, the tenant. */
import { expect, test } from 'bun:test'
import { rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ConfigError } from '../../src/config/constants'
import { loadGatewayConfig } from '../../src/gateway/config'
import { replay, toStored } from '../../src/gateway/stored'
import { gatewayFingerprint } from '../../src/gateway/fingerprint'
import { DEFAULT_UNREPLAYED_HEADERS, requestHeadersForUpstream, responseHeadersForClient, storedHeaders } from '../../src/gateway/headers'
import { compilePattern, routeFor, routeTable } from '../../src/gateway/routes'
import { tenantOf } from '../../src/gateway/tenant'

test('hop-by-hop fields (RFC 9110 §7.6.1) and the ones Connection names are dropped both ways; Forwarded is appended; the key is replaced', () => {
  const incoming = new Headers({
    connection: 'close, x-hop', 'x-hop': '1', 'keep-alive': 'timeout=5', 'proxy-connection': 'keep-alive', te: 'trailers', trailer: 'x', upgrade: 'h2c',
    'transfer-encoding': 'chunked', host: 'gateway.example', 'content-length': '3', authorization: 'Bearer a', 'idempotency-key': 'client-key',
    forwarded: 'for=10.0.0.1', 'x-other': 'kept',
  })
  const out = requestHeadersForUpstream(incoming, { client: '::1', host: 'gateway.example', proto: 'http' }, 'idp_derived')
  expect([...new Map(Object.entries(Object.fromEntries(out as unknown as Iterable<[string, string]>))).keys()].sort())
    .toEqual(['authorization', 'forwarded', 'idempotency-key', 'x-other'])
  expect(out.get('authorization')).toBe('Bearer a')
  expect(out.get('idempotency-key')).toBe('idp_derived')
  expect(out.get('forwarded')).toBe('for=10.0.0.1, for="[::1]";host=gateway.example;proto=http')

  const answer = new Headers({ connection: 'x-conn', 'x-conn': '1', 'keep-alive': 'timeout=5', 'content-type': 'application/json', 'content-length': '2', date: 'Mon' })
  answer.append('set-cookie', 'a=1')
  answer.append('set-cookie', 'b=2')
  const forClient = responseHeadersForClient(answer)
  expect(forClient.has('x-conn')).toBe(false)
  expect(forClient.has('keep-alive')).toBe(false)
  expect(forClient.getSetCookie()).toEqual(['a=1', 'b=2'])
  // A replay repeats neither the cookies nor the Date of the first answer.
  expect(storedHeaders(forClient, new Set(DEFAULT_UNREPLAYED_HEADERS))).toEqual({ 'content-type': 'application/json' })
})

test('a body that is not UTF-8, or has a NUL, is stored as base64 and replayed byte for byte', async () => {
  for (const body of [new Uint8Array([0xff, 0x00, 0x10, 0x80]), new TextEncoder().encode('a\u0000b'), new TextEncoder().encode('{"é":"ü"}')]) {
    const stored = toStored(201, new Headers({ 'content-type': 'application/octet-stream' }), body, new Set())
    const again = replay(stored)
    expect(new Uint8Array(await again.arrayBuffer())).toEqual(body)
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(again.headers.has('idempotency-gateway-body-encoding')).toBe(false)
  }
})

test('route patterns, and the first matching route by method and path', () => {
  expect(compilePattern('*')('/anything/at/all')).toBe(true)
  expect(compilePattern('/items')('/items')).toBe(true)
  expect(compilePattern('/items')('/items/')).toBe(true)
  expect(compilePattern('/items')('/items/1')).toBe(false)
  expect(compilePattern('/items/:id')('/items/7')).toBe(true)
  expect(compilePattern('/items/:id')('/items/7/x')).toBe(false)
  expect(compilePattern('/api/*')('/api')).toBe(true)
  expect(compilePattern('/api/*')('/api/v1/x')).toBe(true)
  expect(compilePattern('/api/*')('/apix')).toBe(false)
  const defaults = { upstream: 'http://127.0.0.1:1', ttlSeconds: 30, maxBodyBytes: 1024, maxStoredBytes: 2048 }
  const table = routeTable({ routes: [{ path: '/orders/:id/pay', methods: ['put'], upstream: 'http://127.0.0.1:2/', unknown: 'release', on4xx: 'release' }, { path: '*' }] }, defaults)
  expect(routeFor(table, 'PUT', '/orders/9/pay')).toMatchObject({ upstream: 'http://127.0.0.1:2', unknown: 'release', on4xx: 'release', on5xx: 'release', ttlSeconds: 30 })
  expect(routeFor(table, 'POST', '/orders/9/pay')).toMatchObject({ name: '*', unknown: 'hold', on4xx: 'store' })
  expect(routeFor(table, 'GET', '/orders')).toBeUndefined()
})

test('settings: UPSTREAM_URL required, a bad route file and bad values refused in one start, naming each', () => {
  expect(() => loadGatewayConfig({})).toThrow(/UPSTREAM_URL: is required/)
  const file = join(tmpdir(), `gateway-routes-${crypto.randomUUID()}.json`)
  writeFileSync(file, JSON.stringify({ routes: [{ path: '/x', upstream: 'http://127.0.0.1:9', unknown: 'maybe' }] }))
  let refused: ConfigError | undefined
  try {
    loadGatewayConfig({ UPSTREAM_URL: 'ftp://x', GATEWAY_ROUTES: file, GATEWAY_REQUIRE_KEY: '2', IDEMPOTENCY_TTL_SECONDS: 'x' })
  } catch (error) {
    refused = error as ConfigError
  } finally {
    rmSync(file, { force: true })
  }
  expect(refused).toBeInstanceOf(ConfigError)
  for (const name of ['UPSTREAM_URL', 'GATEWAY_ROUTES', 'GATEWAY_REQUIRE_KEY', 'IDEMPOTENCY_TTL_SECONDS']) expect(refused!.message).toContain(name)
  expect(refused!.message).toContain('unknown must be one of hold, release')
  const config = loadGatewayConfig({ UPSTREAM_URL: 'http://127.0.0.1:8080/' })
  expect(config.routes).toHaveLength(1)
  expect(config.routes[0]).toMatchObject({ methods: ['POST', 'PATCH'], upstream: 'http://127.0.0.1:8080', unknown: 'hold', on4xx: 'store', on5xx: 'release', ttlSeconds: 30 })
  expect(config.tenantHeader).toBe('authorization')
})

test('the tenant is a digest of the credential, never the credential; the fingerprint counts method, path with query, and body', () => {
  const request = (auth?: string) => new Request('http://gw/items', { headers: auth ? { authorization: auth } : {} })
  const a = tenantOf(request('Bearer secret-a'), 'authorization')
  expect(a).toMatch(/^gw:[\w-]{32}$/)
  expect(a).not.toContain('secret')
  expect(tenantOf(request('Bearer secret-b'), 'authorization')).not.toBe(a)
  expect(tenantOf(request(), 'authorization')).toBe('gw:anonymous')
  const json = (text: string) => new TextEncoder().encode(text)
  const base = gatewayFingerprint('POST', '/items?a=1', 'application/json', json('{"a":1,"b":2}'))
  expect(gatewayFingerprint('POST', '/items?a=1', 'application/json; charset=utf-8', json('{ "b": 2, "a": 1 }'))).toBe(base)
  expect(gatewayFingerprint('POST', '/items?a=2', 'application/json', json('{"a":1,"b":2}'))).not.toBe(base)
  expect(gatewayFingerprint('PATCH', '/items?a=1', 'application/json', json('{"a":1,"b":2}'))).not.toBe(base)
  expect(gatewayFingerprint('POST', '/items?a=1', 'text/plain', json('{"a":1,"b":2}'))).not.toBe(gatewayFingerprint('POST', '/items?a=1', 'text/plain', json('{"b":2,"a":1}')))
})
