/**
 * One byte-bounded body reader for every admin route: a body announced too
 * large is refused with 413 before a byte of it is read, unauthenticated
 * included; a chunked one as soon as it passes the limit. Raw sockets send
 * the headers only, so a server that waited for the body would never answer.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { connect, type Socket } from 'node:net'
import { MAX_ADMIN_BODY_BYTES } from '../../src/admin/body'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { ADMIN_TOKEN, startServer, type ServerProcess } from '../support/server'
import { api, startAdmin, type AdminServer } from './support'

const HALF_A_GIGABYTE = 500 * 1024 * 1024

let db: TestDatabase
let admin: AdminServer
beforeAll(async () => {
  db = await createTestDatabase('admin_body')
  admin = startAdmin(db.pools)
})
afterAll(async () => {
  await admin?.stop()
  await db?.drop()
})

interface RawAnswer {
  readonly status: number
  readonly headers: string
  readonly socket: Socket
}

/**
 * Writes `head` (and then each of `chunks`, while no answer has come) on a
 * fresh connection; resolves with the answer's status line and headers.
 * Fails, naming what it waited for, if none comes within `timeoutMs`.
 */
function raw(url: string, head: string, chunks: readonly string[] = [], timeoutMs = 10_000): Promise<RawAnswer> {
  const { hostname, port } = new URL(url)
  return new Promise((resolve, reject) => {
    let answered = false
    let data = ''
    const socket = connect(Number(port), hostname, async () => {
      socket.write(head)
      for (const chunk of chunks) {
        if (answered) return
        await new Promise<void>((done) => socket.write(chunk, () => done()))
      }
    })
    const timer = setTimeout(() => { socket.destroy(); reject(new Error(`no answer within ${timeoutMs} ms to ${head.split('\r\n')[0]}`)) }, timeoutMs)
    socket.on('data', (chunk) => {
      data += chunk.toString('latin1')
      const end = data.indexOf('\r\n\r\n')
      if (end < 0 || answered) return
      answered = true
      clearTimeout(timer)
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(data)![1]), headers: data.slice(0, end).toLowerCase(), socket })
    })
    socket.on('error', (error) => { if (!answered) { clearTimeout(timer); reject(error) } })
  })
}

const announce = (path: string, type: string, length: number, extra = '') =>
  `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: ${type}\r\nContent-Length: ${length}\r\n${extra}\r\n`

describe('an announced oversize body', () => {
  test('POST /admin/login announcing 500 MB, unauthenticated, is answered 413 without sending a byte of it', async () => {
    const answer = await raw(admin.url, announce('/admin/login', 'application/x-www-form-urlencoded', HALF_A_GIGABYTE))
    answer.socket.destroy()
    expect(answer.status).toBe(413)
    expect(answer.headers).toContain('content-type: text/html')
    expect(answer.headers).toContain('connection: close')
  })

  test('the JSON API the same, without reading it: 413 with the token, 401 without', async () => {
    for (const [auth, status] of [[`Authorization: Bearer ${ADMIN_TOKEN}\r\n`, 413], ['', 401]] as const) {
      const answer = await raw(admin.url, announce('/admin/api/keys/expire', 'application/json', HALF_A_GIGABYTE, auth))
      answer.socket.destroy()
      expect(answer.status).toBe(status)
      expect(answer.headers).toContain('content-type: application/problem+json')
    }
  })

  test('one byte over the limit is refused; at the limit the form is read', async () => {
    const over = await raw(admin.url, announce('/admin/login', 'application/x-www-form-urlencoded', MAX_ADMIN_BODY_BYTES + 1))
    over.socket.destroy()
    expect(over.status).toBe(413)
    const body = `token=wrong&name=x&pad=${'p'.repeat(MAX_ADMIN_BODY_BYTES - 23)}`
    expect(body.length).toBe(MAX_ADMIN_BODY_BYTES)
    const within = await raw(admin.url, announce('/admin/login', 'application/x-www-form-urlencoded', body.length, 'Origin: http://127.0.0.1\r\n') + body)
    within.socket.destroy()
    expect(within.status).toBe(401) // read, and judged: not the token
  })
})

test('a chunked body is cut off as soon as it passes the limit', async () => {
  const chunk = (text: string) => `${text.length.toString(16)}\r\n${text}\r\n`
  const head = `POST /admin/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n`
  // Far more than the limit, 1 KiB at a time, stopping as soon as the server answers.
  const answer = await raw(admin.url, head, Array.from({ length: 1024 }, () => chunk('x'.repeat(1024))))
  answer.socket.destroy()
  expect(answer.status).toBe(413)
})

test('other content types and malformed JSON are refused before any handler', async () => {
  const xml = await fetch(`${admin.url}/admin/api/keys/expire`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'text/xml' }, body: '<a/>' })
  expect(xml.status).toBe(415)
  expect(await xml.json()).toMatchObject({ code: 'unsupported-media-type' })
  const broken = await fetch(`${admin.url}/admin/api/keys/expire`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' }, body: '{"tenant":' })
  expect(broken.status).toBe(400)
  expect(await broken.json()).toMatchObject({ code: 'invalid-json' })
  const shape = await api(admin.url, '/admin/api/keys/expire', { method: 'POST', body: { tenant: 'acme', key: 'k', lease: 'not-a-lease' } })
  expect(shape.status).toBe(400)
  expect(await shape.json()).toMatchObject({ code: 'invalid-query' })
})

describe('through the service itself', () => {
  let server: ServerProcess
  beforeAll(async () => {
    server = await startServer(db.url)
  })
  afterAll(() => server?.stop())

  test('POST /admin/login announcing 500 MB answers 413 at once, the service\'s body cap and wiring included', async () => {
    const answer = await raw(server.url, announce('/admin/login', 'application/x-www-form-urlencoded', HALF_A_GIGABYTE))
    answer.socket.destroy()
    expect(answer.status).toBe(413)
    // And the service still answers afterwards.
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200)
  })
})
