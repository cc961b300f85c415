/** API keys looked up by digest (src/http/auth.ts): the right tenant, nothing for a near miss, one digest per request. */
import { expect, test } from 'bun:test'
import { bearerTenant } from '../../src/http/auth'

test('a key finds its tenant; a near miss, another scheme or none finds nothing; a request is looked up once', () => {
  const tenantOf = bearerTenant(new Map([['acme-key-0123456789', 'acme'], ['globex-key-0123456789', 'globex']]))
  const asking = (authorization?: string) => new Request('http://service.test/api/payments', authorization ? { headers: { authorization } } : {})
  expect(tenantOf(asking('Bearer acme-key-0123456789'))).toBe('acme')
  expect(tenantOf(asking('bearer globex-key-0123456789'))).toBe('globex')
  for (const miss of ['Bearer acme-key-012345678', 'Bearer acme-key-01234567890', 'Basic acme-key-0123456789', 'acme-key-0123456789', undefined])
    expect({ miss, tenant: tenantOf(asking(miss)) }).toEqual({ miss, tenant: undefined })
  const request = asking('Bearer acme-key-0123456789')
  let hashed = 0
  const original = Bun.SHA256.hash
  Bun.SHA256.hash = ((...args: Parameters<typeof original>) => { hashed++; return original(...args) }) as typeof original
  try {
    tenantOf(request)
    tenantOf(request)
  } finally {
    Bun.SHA256.hash = original
  }
  expect(hashed).toBe(1)
})
