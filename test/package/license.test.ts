/** One licence, said everywhere a user or a tool looks: LICENSE, package.json, and both OpenAPI documents. */
import { expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { startApp } from '../support/app'
import { createTestDatabase } from '../support/db'

const root = join(import.meta.dir, '..', '..')

test('MIT: the LICENSE file, package.json, and the public and admin OpenAPI documents', async () => {
  expect(readFileSync(join(root, 'LICENSE'), 'utf8')).toStartWith('MIT License')
  expect((JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { license?: string }).license).toBe('MIT')
  const db = await createTestDatabase('license')
  const app = await startApp(db)
  try {
    const publicDoc = (await (await app.fetch('/openapi.json')).json()) as { info: { license?: unknown } }
    expect(publicDoc.info.license).toEqual({ name: 'MIT', identifier: 'MIT' })
    const adminDoc = (await (await app.fetch('/admin/api/openapi.json', { headers: { authorization: 'Bearer test-admin-token-123' } })).json()) as { info: { license?: unknown } }
    expect(adminDoc.info.license).toEqual({ name: 'MIT', identifier: 'MIT' })
  } finally {
    await app.stop()
    await db.drop()
  }
})
