/**
 * Who the client is, behind TRUST_PROXY (issue 27): the entry our N-th proxy
 * wrote, never a client-chosen one when there are fewer hops than trusted; a
 * proxy's `ip:port` without its port; "unknown" ignored; and one spelling per
 * address, so an IPv4-mapped or differently written IPv6 address is one
 * throttle bucket, not many.
 */
import { expect, test } from 'bun:test'
import fc from 'fast-check'
import { clientMeta, normalizeAddress, pathOfUrl } from '../../src/http/client'

const from = (forwarded: string | undefined) => new Request('http://service.test/api/payments', { headers: forwarded === undefined ? {} : { 'x-forwarded-for': forwarded } })
const address = (forwarded: string | undefined, trust: number, socket = '10.0.0.9') => clientMeta(from(forwarded), socket, trust).address

test('the N-th entry from the right, and nothing client-chosen when the header has fewer', () => {
  expect(address('6.6.6.6, 1.2.3.4, 10.0.0.1', 2)).toBe('1.2.3.4')
  expect(address('6.6.6.6, 1.2.3.4', 1)).toBe('1.2.3.4')
  expect(address('1.2.3.4', 2)).toBe('10.0.0.9') // one entry for two trusted hops: the leftmost would be the client's word
  expect(address(undefined, 1)).toBe('10.0.0.9')
  expect(address('6.6.6.6, 1.2.3.4', 0)).toBe('10.0.0.9') // TRUST_PROXY unset: the header is nobody's word
})

test('a proxy\'s ip:port and [v6]:port without the port; unknown or garbage ignored', () => {
  expect(address('1.2.3.4:5678', 1)).toBe('1.2.3.4')
  expect(address('[2001:DB8::1]:443', 1)).toBe('2001:db8::1')
  expect(address('[2001:db8::1]', 1)).toBe('2001:db8::1')
  expect(address('unknown', 1)).toBe('10.0.0.9')
  expect(address('<script>', 1)).toBe('10.0.0.9')
})

test('one spelling per address: IPv4-mapped IPv6 in any form is the IPv4 address, IPv6 canonical', () => {
  for (const spelling of ['::ffff:1.2.3.4', '::FFFF:1.2.3.4', '0:0:0:0:0:ffff:1.2.3.4', '::ffff:0102:0304', '0000:0000:0000:0000:0000:ffff:0102:0304'])
    expect({ spelling, address: normalizeAddress(spelling) }).toEqual({ spelling, address: '1.2.3.4' })
  expect(normalizeAddress('2001:0DB8:0000:0000:0000:0000:0000:0001')).toBe('2001:db8::1')
  expect(normalizeAddress(' 127.0.0.1 ')).toBe('127.0.0.1')
  expect(address('::ffff:203.0.113.7', 1)).toBe('203.0.113.7')
})

// Catches: a path sliced from the URL that differs from what the URL parser says (a query or a fragment kept, an
// authority with a port, userinfo or an IPv6 host cut wrong): the edge's /metrics check, the route label and the
// database gate all read it.
test('the path sliced from a request\'s URL is the URL parser\'s, for any path, query and authority', () => {
  const authorities = ['h', 'h:8080', 'user:pa%40ss@h', '[2001:db8::1]:3000', '127.0.0.1', 'xn--nxasmq6b.example']
  const paths = ['/', '/api/payments', '/api/payments/', '/x/../metrics', '/api//payments', '/a%2Fb', '/%7E?x=1', '/api/payments?q=/x#f', '/p#frag?x', '/metrics/.', '/a b', '/é', '/api/payments?']
  for (const authority of authorities)
    for (const path of paths) {
      const url = new Request(`http://${authority}${path}`).url
      expect({ url, path: pathOfUrl(url) }).toEqual({ url, path: new URL(url).pathname })
    }
  fc.assert(fc.property(fc.webUrl({ withQueryParameters: true, withFragments: true }), (raw) => {
    const url = new Request(raw).url
    expect(pathOfUrl(url)).toBe(new URL(url).pathname)
  }), { numRuns: 2_000 })
})

// Catches: the socket's address asked for on every request (it cost a tenth of a replay), or asked twice.
test('the client\'s address is found when first read, once', () => {
  let asked = 0
  const meta = clientMeta(from('1.2.3.4'), () => { asked++; return '10.0.0.9' }, 1)
  expect({ asked, secure: meta.secure, pathname: meta.pathname }).toEqual({ asked: 0, secure: false, pathname: '/api/payments' })
  expect([meta.address, meta.address]).toEqual(['1.2.3.4', '1.2.3.4'])
  expect(asked).toBe(0) // behind one trusted proxy its entry is the address: the socket is not asked
  const direct = clientMeta(from(undefined), () => { asked++; return '::ffff:10.0.0.9' }, 0)
  expect([direct.address, direct.address, asked]).toEqual(['10.0.0.9', '10.0.0.9', 1])
})
